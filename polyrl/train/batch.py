"""Groups -> padded training tensors: the only place that knows how a sample is laid out.

Each sample is prompt ids followed by completion ids, right-padded. Position t of
`targets` holds token t+1, so the model's logits at t score it; `mask` is 1 exactly on
the completion's tokens (prompt, padding and masked samples are 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from polyrl.rollout.groups import Group


@dataclass
class TrainBatch:
    input_ids: torch.Tensor   # (B, T) prompt + completion, right-padded
    targets: torch.Tensor     # (B, T) next token at each position (0 where unused)
    mask: torch.Tensor        # (B, T) float, 1 on completion tokens that count
    old_logp: torch.Tensor    # (B, T) engine logprobs of the targets under the sampling policy
    advantages: torch.Tensor  # (B,)
    kl_coef: torch.Tensor     # (B,) per-sample KL weight (its domain's coefficient)
    domains: list[str]        # (B,)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows: torch.Tensor) -> "TrainBatch":
        return TrainBatch(self.input_ids[rows], self.targets[rows], self.mask[rows], self.old_logp[rows],
                          self.advantages[rows], self.kl_coef[rows], [self.domains[i] for i in rows.tolist()])


def build_batch(groups: list[Group], advantages: list[list[float]], sample_weight: list[list[float]],
                kl_coef: dict[str, float]) -> TrainBatch:
    """One row per completion of every group given; advantages/sample_weight are per group, per sample."""
    rows = [(g, j) for g in groups for j in range(len(g.completions))]
    T = max(len(g.prompt_ids) + len(g.completions[j].token_ids) for g, j in rows)
    B = len(rows)
    input_ids = torch.zeros(B, T, dtype=torch.long)
    targets = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T)
    old_logp = torch.zeros(B, T)
    adv = torch.zeros(B)
    coef = torch.zeros(B)
    domains = []
    flat_adv = [a for per_group in advantages for a in per_group]
    flat_w = [w for per_group in sample_weight for w in per_group]
    for b, (g, j) in enumerate(rows):
        c = g.completions[j]
        P, C = len(g.prompt_ids), len(c.token_ids)
        seq = torch.tensor(g.prompt_ids + c.token_ids)
        input_ids[b, :P + C] = seq
        targets[b, :P + C - 1] = seq[1:]
        # Completion token k sits at position P + k and is predicted from position P + k - 1.
        mask[b, P - 1:P + C - 1] = flat_w[b]
        old_logp[b, P - 1:P + C - 1] = torch.tensor(c.logprobs)
        adv[b] = flat_adv[b]
        coef[b] = kl_coef[g.task.domain]
        domains.append(g.task.domain)
    return TrainBatch(input_ids, targets, mask, old_logp, adv, coef, domains)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits (B, T, V), targets (B, T) -> log p(target) (B, T) at the sampling temperature."""
    scaled = logits / temperature if temperature > 0 else logits
    return torch.log_softmax(scaled, dim=-1).gather(-1, targets[..., None]).squeeze(-1)


def token_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """(B, T, V) -> (B, T) entropy of the sampling distribution, in nats."""
    logp = torch.log_softmax(logits / temperature if temperature > 0 else logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)
