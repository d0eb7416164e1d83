"""Groups -> padded training tensors.

Each row is one of a sample's training rows (rollout/groups.py, `sample.rows()`),
right-padded: prompt then completion for a single-turn sample, each segment of an
episode for an agent sample. Position t of `targets` holds
token t+1, so the model's logits at t score it; `mask` is 1 exactly on the tokens the
policy generated (prompt, tool results, padding and masked samples are 0).
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
    lengths: torch.Tensor     # (B,) tokens in each row before its padding
    groups: torch.Tensor      # (B,) index of the group each row's sample belongs to

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows: torch.Tensor) -> "TrainBatch":
        return TrainBatch(self.input_ids[rows], self.targets[rows], self.mask[rows], self.old_logp[rows],
                          self.advantages[rows], self.kl_coef[rows], [self.domains[i] for i in rows.tolist()],
                          self.lengths[rows], self.groups[rows])


def build_batch(groups: list[Group], advantages: list[list[float]], sample_weight: list[list[float]],
                kl_coef: dict[str, float]) -> TrainBatch:
    """One row per training row of every sample of every group given (`sample.rows()`: one
    for a single-turn sample, one per segment of an episode); advantages/sample_weight are
    per group, per sample, and apply to all of a sample's rows."""
    rows = [(gi, g, a, w, row) for gi, (g, g_adv, g_w) in enumerate(zip(groups, advantages, sample_weight))
            for x, a, w in zip(g.samples, g_adv, g_w) for row in x.rows()]
    T = max(len(ids) for *_, (ids, _, _) in rows)
    B = len(rows)
    input_ids = torch.zeros(B, T, dtype=torch.long)
    targets = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T)
    old_logp = torch.zeros(B, T)
    adv = torch.zeros(B)
    coef = torch.zeros(B)
    domains = []
    lengths = torch.tensor([len(ids) for *_, (ids, _, _) in rows])
    group_of = torch.tensor([gi for gi, *_ in rows])
    for b, (_, g, a, w, (ids, loss_mask, logps)) in enumerate(rows):
        n = len(ids)
        input_ids[b, :n] = torch.tensor(ids)
        targets[b, :n - 1] = torch.tensor(ids[1:])
        # Token t is predicted from position t - 1.
        mask[b, :n - 1] = torch.tensor(loss_mask[1:], dtype=torch.float32) * w
        old_logp[b, :n - 1] = torch.tensor(logps[1:])
        adv[b] = a
        coef[b] = kl_coef[g.task.domain]
        domains.append(g.task.domain)
    return TrainBatch(input_ids, targets, mask, old_logp, adv, coef, domains, lengths, group_of)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits (B, T, V), targets (B, T) -> log p(target) (B, T) at the sampling temperature."""
    scaled = logits / temperature if temperature > 0 else logits
    return torch.log_softmax(scaled, dim=-1).gather(-1, targets[..., None]).squeeze(-1)


def token_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """(B, T, V) -> (B, T) entropy of the sampling distribution, in nats."""
    logp = torch.log_softmax(logits / temperature if temperature > 0 else logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)
