"""Group-relative advantages (GRPO), normalised per domain, and dynamic sampling.

Each prompt's G samples form a group; a sample's advantage is its reward minus the
group mean. Instead of dividing by each group's own std (which blows up near-unanimous
groups, the bias Dr. GRPO points out), we divide by the std of the centred rewards over
all groups of the same domain, so domains with different reward scales contribute
comparably to one batch. Groups whose rewards are all equal carry no signal: they are
dropped and counted (DAPO's dynamic sampling, without the re-sampling).
"""

from __future__ import annotations

import torch


def zero_variance_groups(rewards: torch.Tensor, atol: float = 1e-6) -> torch.Tensor:
    """rewards (N, G) -> (N,) bool, True where every sample of the group scored the same."""
    return (rewards.max(dim=1).values - rewards.min(dim=1).values) <= atol


def group_advantages(rewards: torch.Tensor, domains: list[str], eps: float = 1e-6) -> torch.Tensor:
    """rewards (N, G), domains (N,) names -> advantages (N, G).

    A = (r - mean_group(r)) / (std over the domain's centred rewards + eps).
    """
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # (N, G)
    adv = torch.zeros_like(centred)
    for domain in sorted(set(domains)):
        rows = torch.tensor([d == domain for d in domains])
        block = centred[rows]
        scale = block.pow(2).mean().sqrt()  # population std: the centred block has mean 0
        adv[rows] = block / (scale + eps)
    return adv
