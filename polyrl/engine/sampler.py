"""Next-token sampling: temperature, top-k, top-p, and the logprob of the chosen token.

`sample_next` serves the dense engine (one setting per call, torch generator);
`sample_batch` the paged engine (per-row settings, counter-based uniforms).

The logprob we report is log softmax(logits / temperature) at the sampled token, taken
BEFORE top-k/top-p truncation: that is the quantity the trainer recomputes from the
same weights, so engine and trainer logprobs agree (tested). Greedy (temperature 0)
reports the untempered log softmax.
"""

from __future__ import annotations

import torch


def sample_next(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (B, V) float32 -> (tokens (B,), logprobs (B,))."""
    if temperature == 0:
        logprobs = torch.log_softmax(logits, dim=-1)
        tokens = logits.argmax(dim=-1)
        return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)
    logprobs = torch.log_softmax(logits / temperature, dim=-1)  # (B, V)
    filtered = logprobs
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(filtered, top_k, dim=-1).values[:, -1:]  # (B, 1)
        filtered = filtered.masked_fill(filtered < kth, float("-inf"))
    if top_p < 1.0:
        sorted_lp, order = filtered.sort(dim=-1, descending=True)
        cum = sorted_lp.exp().cumsum(dim=-1)
        drop_sorted = (cum - sorted_lp.exp()) >= top_p  # mass before this token already reaches top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        filtered = filtered.masked_fill(drop, float("-inf"))
    probs = torch.softmax(filtered, dim=-1)
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


# ---- Batched sampling for the paged engine: per-row parameters, counter-based noise ----

_MASK64 = (1 << 64) - 1


def _signed(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


_GOLDEN, _M1, _M2 = _signed(0x9E3779B97F4A7C15), _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)


def request_seed(seed: int, index: int) -> int:
    """Seed of sample `index` of a call seeded with `seed` (a splitmix64 step, as int64)."""
    x = (seed * 0x9E3779B97F4A7C15 + index * 0xD1B54A32D192ED03 + 1) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return _signed(x ^ (x >> 31))


def _srl(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def counter_uniforms(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """u(0,1) float64 (M,) from int64 seeds (M,) and counters (M,): splitmix64 of
    seed + counter * golden; int64 multiplication wraps, so this is exact and portable."""
    x = seeds + (counters + 1) * _GOLDEN
    x = (x ^ _srl(x, 30)) * _M1
    x = (x ^ _srl(x, 27)) * _M2
    x = x ^ _srl(x, 31)
    return _srl(x, 11).double() * (1.0 / (1 << 53))


def processed_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None,
                    top_p: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The distribution a row samples from, as `sample_batch` builds it (also what the
    speculative verifier compares draft tokens against: speculative/rejection.py).

    logits (M, V) float32; temperature (M,) (0 = greedy: scaled by 1); top_k (M,) long
    (0 = off) or None; top_p (M,) (1 = off) or None. Returns the temperature-scaled
    logprobs before truncation (M, V) and the probabilities after top-k/top-p truncation
    (M, V), NOT renormalised (a truncated token has probability 0)."""
    greedy = temperature == 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature)
    logprobs = torch.log_softmax(logits / t[:, None], dim=-1)  # (M, V)
    probs = logprobs.exp()  # (M, V)
    if top_k is not None or top_p is not None:
        # Truncation is decided in sorted order and applied in vocabulary order, so that the
        # CDF is always taken in vocabulary order: a row's sample never depends on whether
        # another row in the batch truncates.
        sorted_probs, order = probs.sort(dim=-1, descending=True)  # (M, V)
        keep = torch.ones_like(sorted_probs, dtype=torch.bool)
        if top_k is not None:
            rank = torch.arange(probs.shape[-1])[None, :]
            keep &= (rank < top_k[:, None]) | (top_k[:, None] == 0)
        if top_p is not None:
            keep &= (sorted_probs.cumsum(dim=-1) - sorted_probs) < top_p[:, None]  # mass before a token < top_p
        probs = probs.masked_fill(~torch.empty_like(keep).scatter_(-1, order, keep), 0.0)
    return logprobs, probs


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """probs (M, V) >= 0, not necessarily normalised; u (M,) float64 in [0, 1) -> tokens (M,):
    the first index whose cumulative mass reaches u * total, in vocabulary order."""
    cdf = probs.cumsum(dim=-1)  # (M, V)
    # A zero-probability token never comes first, and u < 1 keeps the target within the
    # last cdf value.
    target = (u * cdf[:, -1].double()).float()[:, None]  # (M, 1)
    return torch.searchsorted(cdf, target).clamp_(max=cdf.shape[-1] - 1).squeeze(-1)  # (M,)


def sample_batch(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None,
                 top_p: torch.Tensor | None, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row sampling by inverse CDF with given uniforms.

    logits (M, V) float32; temperature (M,) (0 = greedy); top_k (M,) long (0 = off) or
    None when no row truncates by k; top_p (M,) (1 = off) or None; u (M,) float64.
    Returns tokens (M,), their logprobs (M,) and the full logprobs (M, V), all under the
    temperature-scaled distribution before truncation (untempered for greedy rows), as
    `sample_next` reports them.
    """
    greedy = temperature == 0
    if bool(greedy.all()):
        logprobs = torch.log_softmax(logits, dim=-1)  # (M, V)
        tokens = logits.argmax(dim=-1)
        return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1), logprobs
    logprobs, probs = processed_probs(logits, temperature, top_k, top_p)
    sampled = inverse_cdf(probs, u)  # (M,)
    tokens = torch.where(greedy, logits.argmax(dim=-1), sampled) if bool(greedy.any()) else sampled
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1), logprobs
