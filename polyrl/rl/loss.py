"""Token-level clipped policy loss with asymmetric clipping, and the k3 KL estimator.

All functions take per-token tensors (B, T) with a float mask (1 = a generated token
that counts, 0 = padding, prompt, masked overlong sample or tool output) and return
scalars averaged over every counted token of the batch (DAPO's token-level mean: long
answers are not down-weighted per token as with a per-sample mean). `count` is that
number of tokens when the tensors hold only part of the batch (train/packing.py's
pieces): the parts' losses then add up to the whole batch's.
"""

from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor, count: float | None = None) -> torch.Tensor:
    """sum(x * mask) / count, where count defaults to sum(mask) (at least 1)."""
    return (x * mask).sum() / (mask.sum().clamp(min=1.0) if count is None else count)


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                clip_low: float, clip_high: float, count: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip surrogate with ratio clipped to [1 - clip_low, 1 + clip_high] (clip-higher).

    logp, old_logp, mask: (B, T); adv: (B,) per-sample advantage, broadcast over tokens.
    Returns (loss, stats) where stats has the fraction of tokens whose ratio was clipped
    and the mean ratio (both, like the loss, as sums over these tokens divided by count).
    """
    ratio = torch.exp(logp - old_logp)  # (B, T)
    a = adv[:, None]
    unclipped = ratio * a
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * a
    loss = masked_mean(-torch.minimum(unclipped, clipped), mask, count)
    with torch.no_grad():
        stats = {"clip_frac": float(masked_mean(clipped_tokens(logp, old_logp, adv, clip_low, clip_high), mask, count)),
                 "ratio_mean": float(masked_mean(ratio, mask, count))}
    return loss, stats


def clipped_tokens(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
                   clip_low: float, clip_high: float) -> torch.Tensor:
    """(B, T) float, 1 where policy_loss's min picked the clipped branch (no gradient flows)."""
    ratio = torch.exp(logp - old_logp)
    a = adv[:, None]
    return ((ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * a) < ratio * a).float()


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || ref) from samples of pi: e^(ref-logp) - (ref-logp) - 1.

    Unbiased, always >= 0, lower variance than log-ratio (Schulman, "Approximating KL").
    """
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, coef: torch.Tensor, mask: torch.Tensor,
               count: float | None = None) -> torch.Tensor:
    """sum over tokens of coef_sample * k3, averaged over counted tokens; coef: (B,) per-sample
    coefficient, which is how each domain gets its own KL weight in one batch."""
    return masked_mean(coef[:, None] * kl_k3(logp, ref_logp), mask, count)
