"""Decoupled PPO: the clipped policy loss for samples drawn by an older policy.

Three policies meet in an asynchronous step:

    mu       the behaviour policy: the engine's weights that sampled the tokens (its
             logprobs come back with every completion), up to max_staleness versions old;
    pi_prox  the proximal policy: the trainer's weights at the start of this step (their
             logprobs are recomputed before the first optimizer step);
    pi       the policy being optimized.

The trust region is taken around pi_prox, not mu, and the distance between mu and
pi_prox is corrected by an importance weight w = pi_prox / mu, clamped at `iw_cap` and
carrying no gradient:

    L = -(1/N) sum_t m_t * min(w_t, C) * min(r_t * A, clip(r_t, 1 - eps_low, 1 + eps_high) * A),
    r_t = pi(t) / pi_prox(t)

(Hilton et al., "Batch size-invariance for policy optimization"; AReaL's decoupled
objective with the truncated weight of TIS). When mu == pi_prox (a synchronous step)
w = 1 and this is exactly rl/loss.py's policy_loss.
"""

from __future__ import annotations

import torch

from polyrl.rl.loss import masked_mean


def importance_weights(prox_logp: torch.Tensor, behav_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """(B, T) min(pi_prox / mu, cap), detached: the correction for sampling with mu."""
    return torch.exp(prox_logp - behav_logp).clamp(max=cap).detach()


def decoupled_policy_loss(logp: torch.Tensor, prox_logp: torch.Tensor, behav_logp: torch.Tensor, adv: torch.Tensor,
                          mask: torch.Tensor, clip_low: float, clip_high: float, iw_cap: float,
                          count: float | None = None) -> torch.Tensor:
    """The decoupled PPO loss above. logp, prox_logp, behav_logp, mask: (B, T); adv: (B,).
    Averaged over counted tokens (count, as in rl/loss.py, when the tensors are a piece of
    the batch)."""
    ratio = torch.exp(logp - prox_logp)
    a = adv[:, None]
    surrogate = torch.minimum(ratio * a, ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * a)
    return masked_mean(-importance_weights(prox_logp, behav_logp, iw_cap) * surrogate, mask, count)


def mismatch_kl(behav_logp: torch.Tensor, prox_logp: torch.Tensor) -> torch.Tensor:
    """(B, T) k3 estimate of KL(mu || pi_prox) from mu's samples: how far the behaviour
    policy was from the proximal one, token by token (>= 0; 0 when they agree)."""
    d = prox_logp - behav_logp
    return torch.exp(d) - d - 1.0
