"""The first native engine: batched generation over a dense (contiguous) KV cache.

Each call left-pads its prompts into one batch, prefills every distinct prompt once,
copies that prompt cache to the prompt's n samples (a GRPO group computes its prompt
once), then decodes all rows in lock-step, dropping rows from the batch as they finish.

Out of scope here: requests joining mid-flight (continuous batching), block sharing
across calls (prefix caching), preemption and top-k logprobs; the paged engine
(paged.py, the trainer's default) adds those behind the same Engine interface. This
one stays as the simple reference the paged engine is tested against.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch
import torch.nn.functional as F

from polyrl.engine.base import SamplingParams, check_prompts, copy_weights_
from polyrl.engine.sampler import sample_next
from polyrl.engine.text import hits_stop_string, visible_text
from polyrl.models.tokenizer import Tokenizer
from polyrl.models.transformer import Transformer
from polyrl.types import Completion


class DenseKVCache:
    """AttentionBackend storing keys/values of all rows at shared column offsets.

    Rows are left-padded, so column c holds token c of every row's padded sequence;
    `key_valid` marks which columns are real tokens for each row.
    """

    def __init__(self, model: Transformer, batch: int, max_len: int, key_valid: torch.Tensor):
        cfg = model.cfg
        dtype = next(model.parameters()).dtype
        shape = (batch, cfg.num_key_value_heads, max_len, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.key_valid = key_valid  # (B, max_len) bool
        self.length = 0  # columns written so far

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q: (B, nh, T, hd); k, v: (B, nkv, T, hd)
        T, end = q.shape[2], self.length + q.shape[2]
        self.k[layer][:, :, self.length:end] = k
        self.v[layer][:, :, self.length:end] = v
        keys, values = self.k[layer][:, :, :end], self.v[layer][:, :, :end]
        causal = torch.ones(T, end, dtype=torch.bool).tril(diagonal=self.length)  # (T, end)
        mask = causal[None, None] & self.key_valid[:, None, None, :end]  # (B, 1, T, end)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)

    def advance(self, num_tokens: int) -> None:
        self.length += num_tokens

    def select(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (index tensor), in that order: used to fan out and to drop rows."""
        self.k = [k.index_select(0, rows) for k in self.k]
        self.v = [v.index_select(0, rows) for v in self.v]
        self.key_valid = self.key_valid.index_select(0, rows)


class DenseEngine:
    """Engine over an in-process Transformer. `model` is owned by the engine: the trainer
    passes new weights through update_weights, never by sharing parameters."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, weight_version: int = 0):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.weight_version = weight_version

    @torch.no_grad()
    def update_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        copy_weights_(self.model, weights)
        self.weight_version = version

    def close(self) -> None:
        """Nothing to stop: the engine holds no processes, and no cache between calls."""

    @torch.inference_mode()
    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams) -> list[Completion]:
        check_prompts(prompts, n)
        generator = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
        eos = set() if sampling.ignore_eos else set(self.tokenizer.stop_token_ids())
        stop_ids = torch.tensor(sorted(eos | set(sampling.stop_token_ids)), dtype=torch.long)

        # Prefill each distinct prompt once, left-padded to a common length.
        P, Lp = len(prompts), max(len(p) for p in prompts)
        max_len = Lp + sampling.max_tokens
        ids = torch.zeros(P, Lp, dtype=torch.long)
        key_valid = torch.zeros(P, max_len, dtype=torch.bool)
        prompt_len = torch.tensor([len(p) for p in prompts])
        for i, p in enumerate(prompts):
            ids[i, Lp - len(p):] = torch.tensor(p)
            key_valid[i, Lp - len(p):] = True
        positions = (torch.arange(Lp)[None, :] - (Lp - prompt_len)[:, None]).clamp(min=0)  # (P, Lp)
        cache = DenseKVCache(self.model, P, max_len, key_valid)
        hidden = self.model.hidden(ids, positions, cache)  # (P, Lp, D)
        cache.advance(Lp)
        logits = self.model.lm_head(hidden[:, -1]).float()  # (P, V)

        # Fan out: row r is sample r % n of prompt r // n.
        fan = torch.arange(P).repeat_interleave(n)
        cache.select(fan)
        logits, next_pos = logits[fan], prompt_len[fan]
        B = P * n
        rows = torch.arange(B)  # original row id of each active batch row
        out_tokens: list[list[int]] = [[] for _ in range(B)]
        out_logprobs: list[list[float]] = [[] for _ in range(B)]
        finish = ["length"] * B

        for step in range(sampling.max_tokens):
            tokens, logprobs = sample_next(logits, sampling.temperature, sampling.top_k, sampling.top_p, generator)
            done = torch.isin(tokens, stop_ids)
            for i, (r, t, lp) in enumerate(zip(rows.tolist(), tokens.tolist(), logprobs.tolist())):
                out_tokens[r].append(t)
                out_logprobs[r].append(lp)
                if done[i]:
                    finish[r] = "stop"
                elif sampling.stop and hits_stop_string(self.tokenizer, out_tokens[r], sampling.stop):
                    finish[r] = "stop"
                    done[i] = True
            keep = (~done).nonzero().squeeze(-1)
            if len(keep) == 0 or step == sampling.max_tokens - 1:
                break
            if len(keep) < len(rows):
                cache.select(keep)
                rows, tokens, next_pos = rows[keep], tokens[keep], next_pos[keep]
            cache.key_valid[:, cache.length] = True
            hidden = self.model.hidden(tokens[:, None], next_pos[:, None], cache)  # (B', 1, D)
            cache.advance(1)
            logits = self.model.lm_head(hidden[:, -1]).float()
            next_pos = next_pos + 1

        return [
            Completion(
                prompt_index=r // n,
                text=visible_text(self.tokenizer, out_tokens[r], finish[r], stop_ids.tolist(), sampling.stop),
                token_ids=out_tokens[r],
                logprobs=out_logprobs[r],
                finish_reason=finish[r],
                weight_version=self.weight_version,
            )
            for r in range(B)
        ]
