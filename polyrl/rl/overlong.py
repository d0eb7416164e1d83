"""Overlong completions (cut by max_tokens): mask them from the loss, or penalise them.

A truncated answer is neither clearly good nor bad; training on its reward teaches
noise (DAPO, "overlong filtering"). `mask` zeroes the sample's loss weight; `penalty`
keeps it in the loss with reward 0, so the policy learns to finish within the limit;
`none` leaves both alone.
"""

from __future__ import annotations


def overlong_mask(finish_reasons: list[str], mode: str) -> list[float]:
    """Per-sample loss weight: 0.0 for truncated samples when mode == "mask", else 1.0."""
    return [0.0 if mode == "mask" and f == "length" else 1.0 for f in finish_reasons]


def overlong_rewards(rewards: list[float], finish_reasons: list[str], mode: str) -> list[float]:
    """Rewards that enter the advantage: 0.0 for truncated samples when mode == "penalty"."""
    return [0.0 if mode == "penalty" and f == "length" else r for r, f in zip(rewards, finish_reasons)]
