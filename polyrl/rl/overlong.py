"""Overlong completions (cut by max_tokens): mask them from the loss, or penalise them.

A truncated answer is neither clearly good nor bad; training on its reward teaches
noise (DAPO, "overlong filtering"). `mask` zeroes the sample's loss mask; `penalty`
subtracts a linear penalty over the last `soft_cache` tokens before the limit (DAPO's
soft overlong punishment); `none` leaves both alone.
"""

from __future__ import annotations


def overlong_mask(finish_reasons: list[str], mode: str) -> list[float]:
    """Per-sample loss weight: 0.0 for truncated samples when mode == "mask", else 1.0."""
    return [0.0 if mode == "mask" and f == "length" else 1.0 for f in finish_reasons]


def overlong_penalty(lengths: list[int], max_tokens: int, soft_cache: int, penalty: float = 1.0) -> list[float]:
    """Reward adjustment (<= 0) per sample: 0 up to max_tokens - soft_cache, then linear
    down to -penalty at max_tokens."""
    start = max_tokens - soft_cache
    return [-penalty * min(1.0, max(0, n - start) / soft_cache) if soft_cache > 0 else 0.0 for n in lengths]
