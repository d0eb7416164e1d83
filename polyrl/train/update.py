"""The update: ppo_epochs passes of minibatch optimizer steps over one rollout batch.

The loss is the token-level clipped policy loss plus each sample's domain's KL penalty
to the reference (rl/loss.py); a minibatch runs as pieces (packing.py) whose gradients
add up to the whole minibatch's. What comes back is the step's statistics over every
minibatch of every epoch, each computed one way: means of the optimizer steps' loss and
gradient norm, and token-weighted means of per-token values (ratio, clip, KL, entropy).

Where it runs: on the policy's device (train/device.py; the batch stays on the host and
each piece's tensors move as it runs, bf16 autocast on CUDA), in one process or as one rank
of a data-parallel group (`dp`, train/distributed.py: each rank runs its share of every
minibatch's rows, normalised by the whole minibatch's token count, and the statistics are
the group's).

Out of scope: where the batch comes from (loop.py), and moving the new weights to the
engine (the caller does, with a version).
"""

from __future__ import annotations

import torch

from polyrl.config import RunConfig
from polyrl.rl.loss import clipped_tokens, kl_k3, kl_penalty, policy_loss
from polyrl.rl.offpolicy import decoupled_policy_loss, importance_weights, mismatch_kl
from polyrl.train.batch import token_entropy, token_logprobs
from polyrl.train.device import autocast, module_device
from polyrl.train.distributed import ONE_PROCESS, SingleProcess
from polyrl.train.packing import piece_logits, plan
from polyrl.train.setup import step_seed


def update(policy, ref, optimizer, batch, cfg: RunConfig, step: int, dp: SingleProcess = ONE_PROCESS) -> dict:
    """ppo_epochs passes of minibatch updates over one rollout batch.

    Each minibatch is one optimizer step over its pieces (train/packing.py: shared prefixes
    computed once, rows in length-sorted micro-batches of at most trainer.micro_batch_tokens),
    whose gradients add up to the whole minibatch's. Returns the step's statistics over
    every minibatch of every epoch: the mean loss and gradient norm (before clipping) of its
    optimizer steps, and token-weighted means of the ratio, clip fraction, KL and entropy,
    overall and per domain ("domains"). With dp a DataParallel group, every rank passes the
    same batch and gets the same statistics."""
    tc = cfg.trainer
    temperature = cfg.engine.temperature
    device = module_device(policy)
    policy.train()
    ref_logp = reference_logprobs(ref, batch, tc, temperature, dp) if ref is not None else None
    # asynchronous steps (max_staleness > 0): the proximal policy is this step's starting weights
    prox_logp = reference_logprobs(policy, batch, tc, temperature, dp) if tc.max_staleness > 0 else None
    g = torch.Generator().manual_seed(step_seed(cfg.seed, step, "minibatch"))
    losses, grad_norms = [], []
    sums = TokenSums()
    for _ in range(tc.ppo_epochs):
        order = torch.randperm(len(batch), generator=g)
        for rows in order.chunk(tc.minibatches):
            rows = dp.my_rows(rows, batch.lengths)  # this process's share of the minibatch
            mb = batch.select(rows)
            mb_ref = ref_logp[rows] if ref_logp is not None else None
            count = dp.sum(mb.mask.sum()).clamp(min=1.0)  # the whole minibatch's tokens, over all ranks
            pieces = plan(mb, tc.micro_batch_tokens, tc.shared_prefix and dp.prefix_pass)
            idle = dp.idle_passes(len(pieces))
            optimizer.zero_grad(set_to_none=True)
            loss_sum = 0.0
            for piece in pieces:
                mask, targets, old_logp = (piece.take(x).to(device) for x in (mb.mask, mb.targets, mb.old_logp))
                adv, coef = mb.advantages[piece.rows].to(device), mb.kl_coef[piece.rows].to(device)
                with autocast(device):
                    logits = piece_logits(policy, piece, piece.take(mb.input_ids).to(device))  # (b, S, V)
                logp = token_logprobs(logits, targets, temperature)
                if prox_logp is None:
                    loss, _ = policy_loss(logp, old_logp, adv, mask, tc.clip_low, tc.clip_high, count)
                    anchor = old_logp
                else:  # trust region around the proximal policy, sampling corrected (rl/offpolicy.py)
                    anchor = piece.take(prox_logp[rows]).to(device)
                    loss = decoupled_policy_loss(logp, anchor, old_logp, adv, mask, tc.clip_low, tc.clip_high,
                                                 tc.iw_cap, count)
                piece_ref = piece.take(mb_ref).to(device) if mb_ref is not None else None
                if piece_ref is not None:
                    loss = loss + kl_penalty(logp, piece_ref, coef, mask, count)
                dp.backward(loss)
                loss_sum += loss.item()
                with torch.no_grad():
                    sums.add([mb.domains[i] for i in piece.rows.tolist()], mask, {
                        "kl": kl_k3(logp, piece_ref) if piece_ref is not None else torch.zeros_like(logp),
                        "entropy": token_entropy(logits, temperature),
                        "clip_frac": clipped_tokens(logp, anchor, adv, tc.clip_low, tc.clip_high),
                        "ratio": torch.exp(logp - anchor),
                        **(off_policy_values(anchor, old_logp, tc.iw_cap) if prox_logp is not None else {})})
            for _ in range(idle):  # as many passes as the busiest rank: FSDP's collectives pair up
                dp.idle_pass(policy, backward=True)
            grad_norms.append(dp.clip_grad_norm_(policy, tc.max_grad_norm))
            losses.append(loss_sum)
            optimizer.step()
    policy.eval()
    losses = dp.sum(torch.tensor(losses, dtype=torch.float64)).tolist()  # the ranks' parts add up
    sums = TokenSums.combine(dp.gather(sums))
    overall = sums.means()
    out = {"loss": sum(losses) / len(losses), "grad_norm": sum(grad_norms) / len(grad_norms),
           "ratio_mean": overall["ratio"], "clip_frac": overall["clip_frac"],
           "domains": {d: {k: m[k] for k in ("kl", "entropy", "clip_frac")} for d, m in sums.means_by_domain().items()}}
    if prox_logp is not None:  # token means over every pass, as the others
        out["iw"] = {"mean": overall["iw"], "capped_frac": overall["iw_capped"]}
        out["mismatch_kl"] = overall["mismatch_kl"]
    return out


def off_policy_values(prox_logp: torch.Tensor, behav_logp: torch.Tensor, cap: float) -> dict[str, torch.Tensor]:
    """Per token: the clamped importance weight, whether the clamp bit, and KL(mu || pi_prox)."""
    raw = torch.exp(prox_logp - behav_logp)
    return {"iw": importance_weights(prox_logp, behav_logp, cap), "iw_capped": (raw > cap).float(),
            "mismatch_kl": mismatch_kl(behav_logp, prox_logp)}


@torch.no_grad()
def reference_logprobs(ref, batch, tc, temperature: float, dp: SingleProcess = ONE_PROCESS) -> torch.Tensor:
    """(B, T) the reference policy's logprobs of the batch's targets, in the batch's layout, on
    the host. In a data-parallel group each rank computes its share of the rows."""
    device = module_device(ref)
    rows = dp.my_rows(torch.arange(len(batch)), batch.lengths)
    part = batch.select(rows)
    out = torch.zeros_like(part.old_logp)
    pieces = plan(part, tc.micro_batch_tokens, tc.shared_prefix and dp.prefix_pass)
    idle = dp.idle_passes(len(pieces))
    for piece in pieces:
        with autocast(device):
            logits = piece_logits(ref, piece, piece.take(part.input_ids).to(device))
        piece.put(out, token_logprobs(logits, piece.take(part.targets).to(device), temperature).to(out.device))
    for _ in range(idle):
        dp.idle_pass(ref, backward=False)
    full = torch.zeros_like(batch.old_logp)
    full[rows] = out
    return dp.sum(full)


class TokenSums:
    """Token-weighted sums of per-token values, per domain, over a step's passes."""

    def __init__(self) -> None:
        self.by_domain: dict[str, dict[str, float]] = {}

    def add(self, domains: list[str], mask: torch.Tensor, values: dict[str, torch.Tensor]) -> None:
        """Add values (b, S) over each row's masked tokens; domains[i] is row i's domain."""
        for d in set(domains):
            m = mask * torch.tensor([x == d for x in domains], dtype=torch.float32, device=mask.device)[:, None]
            acc = self.by_domain.setdefault(d, {"tokens": 0.0})
            acc["tokens"] += float(m.sum())
            for key, value in values.items():
                acc[key] = acc.get(key, 0.0) + float((value * m).sum())

    @staticmethod
    def combine(parts: list[TokenSums]) -> TokenSums:
        """One TokenSums with the sums of all parts (the ranks' of a data-parallel group)."""
        out = parts[0]
        for part in parts[1:]:
            for d, acc in part.by_domain.items():
                mine = out.by_domain.setdefault(d, {})
                for key, value in acc.items():
                    mine[key] = mine.get(key, 0.0) + value
        return out

    def means_by_domain(self) -> dict[str, dict[str, float]]:
        return {d: {k: v / max(acc["tokens"], 1.0) for k, v in acc.items() if k != "tokens"}
                for d, acc in self.by_domain.items()}

    def means(self) -> dict[str, float]:
        tokens = max(sum(acc["tokens"] for acc in self.by_domain.values()), 1.0)
        keys = {k for acc in self.by_domain.values() for k in acc if k != "tokens"}
        return {k: sum(acc.get(k, 0.0) for acc in self.by_domain.values()) / tokens for k in keys}
