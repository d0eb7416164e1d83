"""The verify pass: the target runs [last token, d1..dk] of every speculating sequence at once.

Like a prefill chunk with logits at every query position: the runner's packed forward
over PagedAttention, drafted sequences in the prefill group (keys gathered from the
pool's blocks, causal within the chunk), sequences without drafts in the decode group.
The drafts' K/V are written to the slots the scheduler allocated for them; the verifier
(rejection.py) then decides what is kept, and the scheduler's postprocess advances each
sequence's computed-length pointer over the kept tokens only, so rejected positions are
stale slots that the next pass overwrites (and the prefix cache never hashes them: only
blocks full of computed tokens are registered).

A drafted sequence's decode-cache row (decode_cache.py) misses the K/V this pass wrote
to the pool, so it is dropped here; the sequence gets a fresh row, filled from the pool,
when it next decodes plainly.

Noise: the token sampled after the kept drafts uses the plain sampler's uniforms for that
token index (seed, index), so a sequence without drafts samples exactly as in a plain
step; the accept tests use a stream of their own (seed ^ ACCEPT_SALT, index).

Out of scope: running the verify pass on the fused decode kernels.
"""

from __future__ import annotations

from typing import Any

import torch

from polyrl.engine.runner.row_sampling import RowSampling
from polyrl.engine.sampler import counter_uniforms
from polyrl.engine.scheduler import ScheduledBatch
from polyrl.engine.speculative.rejection import verify

ACCEPT_SALT = 0x2545F4914F6CDD1D
"""Xor-ed into a sequence's seed for the verifier's accept tests."""


def forget_decode_rows(cache: Any, seqs: list) -> None:
    """Drop the decode-cache rows of `seqs` (their K/V changed in the pool behind the cache)."""
    for seq in seqs:
        row = cache.row_of.pop((seq.seq_id, seq.admissions), None)
        if row is not None:
            cache.owner[row] = None


@torch.inference_mode()
def verify_pass(runner: Any, batch: ScheduledBatch) -> tuple[list[list[int]], list[list[float]],
                                                            list[list[dict[int, float]]] | None]:
    """Run the speculative step `batch` (every sequence samples; batch.drafts set) on the
    runner's model: per sequence, the tokens it emits, their logprobs and top logprobs."""
    assert batch.drafts is not None and all(batch.sampling)
    seqs, drafts = batch.seqs, batch.drafts
    bs, scratch = runner.block_size, runner.pool.scratch_slot
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    starts: list[int] = []
    for seq, draft, n in zip(seqs, drafts, batch.num_new_tokens):
        c, table = seq.num_computed_tokens, seq.block_table
        assert c + 1 == len(seq.token_ids) and n == 1 + len(draft)
        starts.append(len(ids))
        ids += [seq.token_ids[c]] + draft.tokens
        positions += range(c, c + n)
        slots += [scratch if p < seq.num_cached_tokens else table[p // bs] * bs + p % bs for p in range(c, c + n)]
    runner.attention.slot_mapping = torch.tensor(slots, dtype=torch.long)
    runner.attention.groups = runner._groups(batch)
    hidden = runner.model.hidden(torch.tensor(ids)[None], torch.tensor(positions)[None], runner.attention)[0]
    logits = runner.model.lm_head(hidden).float()  # (N, V)
    if runner.decode_cache is not None:
        forget_decode_rows(runner.decode_cache, [s for s, d in zip(seqs, drafts) if len(d)])

    S, V = len(seqs), logits.shape[-1]
    num_drafts = torch.tensor([len(d) for d in drafts])  # (S,)
    K = int(num_drafts.max())
    j = torch.arange(K + 1)[None, :]  # (1, K1)
    rows = torch.tensor(starts)[:, None] + torch.minimum(j, num_drafts[:, None])  # (S, K1) padding repeats the last
    padded = logits.index_select(0, rows.view(-1)).view(S, K + 1, V)  # (S, K1, V)
    tokens = torch.tensor([d.tokens + [0] * (K - len(d)) for d in drafts], dtype=torch.long)  # (S, K)
    q = None
    if any(d.probs is not None for d in drafts):
        q = torch.zeros(S, K, V)
        for s, d in enumerate(drafts):
            if d.probs is not None:
                q[s, :len(d)] = d.probs
            elif len(d):
                q[s, torch.arange(len(d)), tokens[s, :len(d)]] = 1.0  # deterministic proposal: one-hot
    sampling = RowSampling(seqs)
    u_sample = sampling.uniforms(K + 1).T.contiguous()  # (S, K1): the plain sampler's noise per token index
    if sampling.sampled:
        index = sampling.counters[:, None] + torch.arange(K)[None, :]  # (S, K)
        u_accept = counter_uniforms((sampling.seeds ^ ACCEPT_SALT)[:, None].expand(S, K), index)
    else:
        u_accept = torch.zeros(S, K, dtype=torch.float64)
    verdict = verify(padded, tokens, num_drafts, q, sampling.temperature, sampling.top_k, sampling.top_p,
                     u_accept, u_sample)
    n = verdict.num_emitted.tolist()
    out_tokens = [row[:m] for row, m in zip(verdict.tokens.tolist(), n)]
    out_lp = [row[:m] for row, m in zip(verdict.logprobs.tolist(), n)]
    top = None
    if sampling.num_top:
        values, indices = verdict.full_logprobs.topk(min(sampling.num_top, V), dim=-1)  # (S, K1, k)
        values, indices = values.tolist(), indices.tolist()
        top = [[dict(zip(indices[s][i][:p.logprobs], values[s][i][:p.logprobs])) if p.logprobs else {}
                for i in range(n[s])] for s, p in enumerate(sampling.params)]
    return out_tokens, out_lp, top
