"""The draft-model proposer: a smaller model with the target's tokenizer guesses k tokens.

Each speculating sequence has its own dense KV cache in the draft model (`DraftKV`, one
row, grown by doubling). A proposal first rolls the cache back to the longest prefix it
shares with the sequence's tokens (the length pointer: drafts the target rejected are
simply forgotten), runs the tokens the draft has not seen yet in one pass (the prompt,
or the target's corrected token and bonus), then k - 1 single-token passes. Greedy
sequences get the draft's argmax (one-hot q); sampled ones a sample from the draft's
distribution processed with the sequence's own temperature, top-k and top-p
(sampler.processed_probs), whose probabilities q go to the verifier. The draft's noise
is a stream of its own (seed ^ DRAFT_SALT, token index), independent of the verifier's.

`load_draft_model` resolves `speculative.draft_model` (builtin:tiny-draft or a Hugging
Face directory) and checks that the vocabularies agree.

Out of scope: batching the draft's passes across sequences (speculation pays at small
batch; speculator.py switches it off above max_batch_size), a paged cache for the draft.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from polyrl.engine.sampler import counter_uniforms, inverse_cdf, processed_probs
from polyrl.engine.sequence import Sequence
from polyrl.engine.speculative.proposers import EMPTY, Draft
from polyrl.models.transformer import Transformer

DRAFT_SALT = 0x5DEECE66D
"""Xor-ed into a sequence's seed for the draft's sampling noise."""


class DraftKV:
    """AttentionBackend over one sequence's draft K/V: (layers, n_kv, capacity, hd)."""

    def __init__(self, model: Transformer) -> None:
        cfg = model.cfg
        dtype = next(model.parameters()).dtype
        self.k = torch.zeros(cfg.num_hidden_layers, cfg.num_key_value_heads, 64, cfg.head_dim, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.tokens: list[int] = []
        """The tokens whose K/V the cache holds, in position order."""
        self.start = 0
        """Position of the first token of the pass being run."""

    def reserve(self, length: int) -> None:
        cap = self.k.shape[2]
        if length > cap:
            new = max(length, 2 * cap)
            pad = (0, 0, 0, new - cap)
            self.k, self.v = F.pad(self.k, pad), F.pad(self.v, pad)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        # q: (1, nh, T, hd); k, v: (1, n_kv, T, hd) at positions start .. start + T
        T = q.shape[2]
        start = self.start
        self.k[layer, :, start:start + T] = k[0]
        self.v[layer, :, start:start + T] = v[0]
        keys, values = self.k[layer, :, :start + T][None], self.v[layer, :, :start + T][None]  # (1, n_kv, L, hd)
        mask = None if T == 1 else torch.ones(T, start + T, dtype=torch.bool).tril(diagonal=start)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)


class DraftModelProposer:
    """Proposals from a draft model (see the module docstring)."""

    def __init__(self, model: Transformer) -> None:
        self.model = model.eval()
        self.caches: dict[int, DraftKV] = {}

    def release(self, seq_ids: list[int]) -> None:
        for i in seq_ids:
            self.caches.pop(i, None)

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], budgets: list[int]) -> list[Draft]:
        return [self._propose(s, k) if k > 0 else EMPTY for s, k in zip(seqs, budgets)]

    def _propose(self, seq: Sequence, k: int) -> Draft:
        cache = self.caches.get(seq.seq_id)
        if cache is None:
            cache = self.caches[seq.seq_id] = DraftKV(self.model)
        tokens = seq.token_ids
        keep = 0  # roll back to the longest common prefix (never the last token: its logits are needed)
        limit = min(len(cache.tokens), len(tokens) - 1)
        while keep < limit and cache.tokens[keep] == tokens[keep]:
            keep += 1
        cache.tokens = cache.tokens[:keep]
        cache.reserve(len(tokens) + k)
        p = seq.params
        temperature = torch.tensor([p.temperature], dtype=torch.float32)
        top_k = torch.tensor([p.top_k]) if p.top_k else None
        top_p = torch.tensor([p.top_p], dtype=torch.float32) if p.top_p < 1 else None
        u = (counter_uniforms(torch.full((k,), seq.seed ^ DRAFT_SALT),
                              seq.num_completion_tokens + torch.arange(k)) if p.temperature > 0 else None)
        new = tokens[keep:]
        out: list[int] = []
        probs: list[Tensor] = []
        for j in range(k):
            logits = self._run(cache, new)  # (1, V)
            if p.temperature == 0:
                token = int(logits.argmax(-1))
            else:
                _, q = processed_probs(logits, temperature, top_k, top_p)
                q = q / q.sum(-1, keepdim=True)
                token = int(inverse_cdf(q, u[j:j + 1]))
                probs.append(q[0])
            out.append(token)
            new = [token]
        return Draft(out, torch.stack(probs) if probs else None)

    def _run(self, cache: DraftKV, new: list[int]) -> Tensor:
        """Run `new` at the positions after the cache's tokens; logits (1, V) of the last."""
        cache.start = len(cache.tokens)
        ids = torch.tensor(new, dtype=torch.long)[None]  # (1, T)
        positions = torch.arange(cache.start, cache.start + len(new))[None]  # (1, T)
        hidden = self.model.hidden(ids, positions, cache)[0, -1:]  # (1, D)
        cache.tokens.extend(new)
        return self.model.lm_head(hidden).float()


def load_draft_model(path: str, target: Transformer) -> Transformer:
    """The draft model named by speculative.draft_model, in the target's dtype; a ValueError
    when its vocabulary is not the target's (the verifier compares their distributions)."""
    from polyrl.models.loading import load_policy, resolve_model_dir

    dtype = str(next(target.parameters()).dtype).removeprefix("torch.")
    model_dir = resolve_model_dir(path)
    model, _ = load_policy(model_dir, dtype)
    if model.cfg.vocab_size != target.cfg.vocab_size:
        raise ValueError(f"speculative.draft_model {path!r}: vocabulary of {model.cfg.vocab_size} tokens, but the "
                         f"target's has {target.cfg.vocab_size}; a draft model must share the target's tokenizer")
    return model
