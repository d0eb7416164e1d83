"""The update: ppo_epochs passes of minibatch optimizer steps over one rollout batch.

The loss is the token-level clipped policy loss plus each sample's domain's KL penalty
to the reference (rl/loss.py); a minibatch runs as pieces (packing.py) whose gradients
add up to the whole minibatch's. What comes back is the step's statistics over every
minibatch of every epoch, each computed one way: means of the optimizer steps' loss and
gradient norm, and token-weighted means of per-token values (ratio, clip, KL, entropy).

Out of scope: where the batch comes from (loop.py), and moving the new weights to the
engine (the caller does, with a version).
"""

from __future__ import annotations

import torch

from polyrl.config import RunConfig
from polyrl.rl.loss import clipped_tokens, kl_k3, kl_penalty, policy_loss
from polyrl.train.batch import token_entropy, token_logprobs
from polyrl.train.packing import piece_logits, plan
from polyrl.train.setup import step_seed


def update(policy, ref, optimizer, batch, cfg: RunConfig, step: int) -> dict:
    """ppo_epochs passes of minibatch updates over one rollout batch.

    Each minibatch is one optimizer step over its pieces (train/packing.py: shared prefixes
    computed once, rows in length-sorted micro-batches of at most trainer.micro_batch_tokens),
    whose gradients add up to the whole minibatch's. Returns the step's statistics over
    every minibatch of every epoch: the mean loss and gradient norm (before clipping) of its
    optimizer steps, and token-weighted means of the ratio, clip fraction, KL and entropy,
    overall and per domain ("domains")."""
    tc = cfg.trainer
    temperature = cfg.engine.temperature
    policy.train()
    ref_logp = reference_logprobs(ref, batch, tc, temperature) if ref is not None else None
    g = torch.Generator().manual_seed(step_seed(cfg.seed, step, "minibatch"))
    losses, grad_norms = [], []
    sums = TokenSums()
    for _ in range(tc.ppo_epochs):
        order = torch.randperm(len(batch), generator=g)
        for rows in order.chunk(tc.minibatches):
            mb = batch.select(rows)
            mb_ref = ref_logp[rows] if ref_logp is not None else None
            count = mb.mask.sum().clamp(min=1.0)
            optimizer.zero_grad(set_to_none=True)
            loss_sum = 0.0
            for piece in plan(mb, tc.micro_batch_tokens, tc.shared_prefix):
                mask, targets, old_logp = piece.take(mb.mask), piece.take(mb.targets), piece.take(mb.old_logp)
                adv, coef = mb.advantages[piece.rows], mb.kl_coef[piece.rows]
                logits = piece_logits(policy, piece, piece.take(mb.input_ids))  # (b, S, V)
                logp = token_logprobs(logits, targets, temperature)
                loss, _ = policy_loss(logp, old_logp, adv, mask, tc.clip_low, tc.clip_high, count)
                piece_ref = piece.take(mb_ref) if mb_ref is not None else None
                if piece_ref is not None:
                    loss = loss + kl_penalty(logp, piece_ref, coef, mask, count)
                loss.backward()
                loss_sum += loss.item()
                with torch.no_grad():
                    sums.add([mb.domains[i] for i in piece.rows.tolist()], mask, {
                        "kl": kl_k3(logp, piece_ref) if piece_ref is not None else torch.zeros_like(logp),
                        "entropy": token_entropy(logits, temperature),
                        "clip_frac": clipped_tokens(logp, old_logp, adv, tc.clip_low, tc.clip_high),
                        "ratio": torch.exp(logp - old_logp)})
            grad_norms.append(torch.nn.utils.clip_grad_norm_(policy.parameters(), tc.max_grad_norm).item())
            losses.append(loss_sum)
            optimizer.step()
    policy.eval()
    overall = sums.means()
    return {"loss": sum(losses) / len(losses), "grad_norm": sum(grad_norms) / len(grad_norms),
            "ratio_mean": overall["ratio"], "clip_frac": overall["clip_frac"],
            "domains": {d: {k: m[k] for k in ("kl", "entropy", "clip_frac")} for d, m in sums.means_by_domain().items()}}


@torch.no_grad()
def reference_logprobs(ref, batch, tc, temperature: float) -> torch.Tensor:
    """(B, T) the reference policy's logprobs of the batch's targets, in the batch's layout."""
    out = torch.zeros_like(batch.old_logp)
    for piece in plan(batch, tc.micro_batch_tokens, tc.shared_prefix):
        logits = piece_logits(ref, piece, piece.take(batch.input_ids))
        piece.put(out, token_logprobs(logits, piece.take(batch.targets), temperature))
    return out


class TokenSums:
    """Token-weighted sums of per-token values, per domain, over a step's passes."""

    def __init__(self) -> None:
        self.by_domain: dict[str, dict[str, float]] = {}

    def add(self, domains: list[str], mask: torch.Tensor, values: dict[str, torch.Tensor]) -> None:
        """Add values (b, S) over each row's masked tokens; domains[i] is row i's domain."""
        for d in set(domains):
            m = mask * torch.tensor([x == d for x in domains], dtype=torch.float32)[:, None]
            acc = self.by_domain.setdefault(d, {"tokens": 0.0})
            acc["tokens"] += float(m.sum())
            for key, value in values.items():
                acc[key] = acc.get(key, 0.0) + float((value * m).sum())

    def means_by_domain(self) -> dict[str, dict[str, float]]:
        return {d: {k: v / max(acc["tokens"], 1.0) for k, v in acc.items() if k != "tokens"}
                for d, acc in self.by_domain.items()}

    def means(self) -> dict[str, float]:
        tokens = max(sum(acc["tokens"] for acc in self.by_domain.values()), 1.0)
        keys = {k for acc in self.by_domain.values() for k in acc if k != "tokens"}
        return {k: sum(acc.get(k, 0.0) for acc in self.by_domain.values()) / tokens for k in keys}
