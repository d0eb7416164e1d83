"""Per-row sampling settings of a step, as tensors: what every decode backend samples with.

Each sequence brings its own temperature, top-k, top-p, seed and top-logprob count;
`RowSampling` turns those into (M,) tensors once per step or burst, draws each row's
counter-based noise (sampler.counter_uniforms: a row's noise depends on its seed and
token index only), and samples with sampler.sample_batch. `plain` says when no row
truncates or asks for top logprobs: what the fused sampler (cpu_kernels.c) covers.

Out of scope: the sampling arithmetic itself (sampler.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from polyrl.engine.sampler import counter_uniforms, sample_batch
from polyrl.engine.sequence import Sequence


class RowSampling:
    """The sampling settings of the rows that sample, as tensors, built once per step or burst."""

    def __init__(self, seqs: list[Sequence]) -> None:
        self.params = [s.params for s in seqs]
        params = self.params
        self.temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32)  # (M,)
        self.top_k = torch.tensor([p.top_k for p in params]) if any(p.top_k for p in params) else None
        self.top_p = (torch.tensor([p.top_p for p in params], dtype=torch.float32)
                      if any(p.top_p < 1 for p in params) else None)
        self.seeds = torch.tensor([s.seed for s in seqs])  # (M,)
        self.counters = torch.tensor([s.num_completion_tokens for s in seqs])  # (M,) index of the next token
        self.sampled = any(p.temperature > 0 for p in params)
        self.num_top = max(p.logprobs for p in params)
        self.plain = self.top_k is None and self.top_p is None and not self.num_top
        """No truncation and no top logprobs: what the fused sampler covers."""

    def uniforms(self, passes: int) -> Tensor:
        """(passes, M) float64: the noise of each row's next `passes` tokens (zeros if all greedy)."""
        if not self.sampled:
            return torch.zeros(passes, len(self.params), dtype=torch.float64)
        counters = self.counters[None, :] + torch.arange(passes)[:, None]  # (passes, M)
        return counter_uniforms(self.seeds[None, :].expand(passes, -1), counters)

    def sample(self, logits: Tensor, u: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """logits (M, V) -> tokens (M,), logprobs (M,), and the top logprobs (2, M, k) as
        (values, indices) when any row asked for them, else None."""
        tokens, logprobs, full = sample_batch(logits, self.temperature, self.top_k, self.top_p, u)
        if not self.num_top:
            return tokens, logprobs, None
        values, indices = full.topk(min(self.num_top, full.shape[-1]), dim=-1)  # (M, k)
        return tokens, logprobs, torch.stack([values, indices.to(values.dtype)])

    def top_dicts(self, top: Tensor) -> list[list[dict[int, float]]]:
        """top (passes, 2, M, k) -> per row, per pass {token: logprob} of its own top count."""
        values, indices = top[:, 0].tolist(), top[:, 1].long().tolist()
        return [[dict(zip(indices[k][i][:p.logprobs], values[k][i][:p.logprobs])) if p.logprobs else {}
                 for k in range(len(values))] for i, p in enumerate(self.params)]


def stop_table(seqs: list[Sequence]) -> Tensor:
    """(S, m) stop token ids of each sequence, padded with -1 (never a token)."""
    m = max(1, max(len(s.stop_ids) for s in seqs))
    return torch.tensor([sorted(s.stop_ids) + [-1] * (m - len(s.stop_ids)) for s in seqs], dtype=torch.long)
