"""Context-parallel training: one long sequence's loss and gradients over P processes.

`trainer.context_parallel: P` splits a sequence too long for one process's activations
across the P ranks of a torch.distributed group (gloo on CPU, nccl on CUDA; the same
code). The forward is models/context_parallel.py's: each rank runs its shard of the tokens
(zigzag by default: chunks r and 2P-1-r of 2P, equal causal work) and gathers keys and
values per layer. Here is what makes the ranks' pieces add
up to the one-process step:
- the loss: every per-token loss of rl/loss.py is a sum over counted tokens divided by a
  count. Each rank sums its own tokens and divides by the GLOBAL count (an all-reduce of
  the ranks' masks), so the ranks' losses add up to the one-process loss (`policy_loss`);
- the gradients: each rank's backward gives its tokens' share of every parameter's
  gradient (the reduce-scatter inside the K/V gather routes the other ranks' attention
  gradients to the rank whose tokens made those keys), and `all_reduce_grads` sums the
  shares, so every rank holds the one-process gradient and takes the same optimizer step.
Tested (tests/test_context_parallel.py) on CPU with gloo, P = 2 and 4 on an 8,192-token
sequence, both layouts: loss and every parameter gradient equal one process's to 1e-5.

Launching: like train/distributed.py, from the environment torchrun sets (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT), with WORLD_SIZE = P: `torchrun --nproc-per-node P
SCRIPT`, every process running the same script on the same sequence. `polyrl train` does not
use it yet (loop.py refuses a run that sets context_parallel > 1); the wiring into update.py
is the next part: one row per pass, sharded, beside FSDP on a 2-D (data, context) mesh.

Untested here (no GPU): nccl, CUDA, bf16 autocast. Out of scope: combining with FSDP or
data parallelism (a 2-D mesh), packed rows, ring attention.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import Tensor

from polyrl.models.context_parallel import SequenceShard, sharded_hidden
from polyrl.rl.loss import policy_loss as token_policy_loss
from polyrl.train.batch import token_logprobs
from polyrl.train.device import resolve_device
from polyrl.train.distributed import ENV, join_process_group


class ContextParallel:
    """This process's part of a context-parallel group: rank `rank` of `world_size`.
    layout, kernel: how the sequence is dealt and the attention kernel (models/context_parallel.py
    LAYOUTS, KERNELS)."""

    def __init__(self, rank: int, world_size: int, device: torch.device, group: dist.ProcessGroup | None = None,
                 layout: str = "zigzag", kernel: str = "auto") -> None:
        assert dist.is_initialized() and dist.get_world_size(group) == world_size and dist.get_rank(group) == rank
        self.rank, self.world_size, self.device, self.group = rank, world_size, device, group
        self.layout, self.kernel = layout, kernel

    def shard(self, length: int) -> SequenceShard:
        """This rank's part of a sequence of `length` tokens."""
        return SequenceShard(self.rank, self.world_size, length, self.layout)

    def sum(self, t: Tensor) -> Tensor:
        """t summed over the ranks, detached."""
        x = t.detach().to(self.device, copy=True)
        dist.all_reduce(x, group=self.group)
        return x.to(t.device)

    def logprobs(self, model, input_ids: Tensor, targets: Tensor, temperature: float) -> Tensor:
        """input_ids, targets (B, T) the whole sequence (on every rank) -> (B, S) log p(target)
        of this rank's tokens (a collective); pad positions past T have target 0."""
        shard = self.shard(input_ids.shape[1])
        ids = shard.take(input_ids).to(self.device)  # (B, S)
        hidden = sharded_hidden(model, ids, shard, self.group, self.kernel)  # (B, S, D)
        logits = model.lm_head(hidden).float()  # (B, S, V)
        return token_logprobs(logits, shard.take(targets).to(self.device), temperature)

    def all_reduce_grads(self, model: torch.nn.Module) -> None:
        """Sum every parameter's gradient over the ranks (one flat buffer, one collective).
        A parameter without a gradient on this rank contributes zeros."""
        params = list(model.parameters())
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.group)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset:offset + n].view_as(p).clone()
            offset += n

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def policy_loss(cp: ContextParallel, model, input_ids: Tensor, targets: Tensor, old_logp: Tensor, adv: Tensor,
                mask: Tensor, clip_low: float, clip_high: float, temperature: float) -> tuple[Tensor, float]:
    """rl/loss.py's token-level clipped policy loss of a whole sequence batch, context-parallel.

    input_ids, targets, old_logp, mask: (B, T), adv: (B,), the same on every rank. Returns
    (this rank's loss, to call backward on; the whole loss, equal on every rank). After
    backward, `cp.all_reduce_grads(model)` leaves the one-process gradient on every rank."""
    shard = cp.shard(input_ids.shape[1])
    logp = cp.logprobs(model, input_ids, targets, temperature)  # (B, S)
    mine = shard.take(mask.float()).to(logp.device)  # pad positions count 0
    count = cp.sum(mine.sum()).clamp(min=1.0)  # the whole sequence batch's tokens
    loss, _ = token_policy_loss(logp, shard.take(old_logp).to(logp.device), adv.to(logp.device), mine,
                                clip_low, clip_high, count)
    return loss, float(cp.sum(loss))


def init_from_env(size: int, device: str = "auto", layout: str = "zigzag",
                  kernel: str = "auto") -> ContextParallel:
    """The context-parallel group of trainer.context_parallel = size > 1 ranks, from the
    environment torchrun sets (WORLD_SIZE must equal size). CPU: gloo; CUDA: nccl on
    cuda:LOCAL_RANK. layout, kernel: see ContextParallel."""
    assert size > 1, "context_parallel 1 is the ordinary one-process forward"
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size != size:
        raise RuntimeError(f"trainer.context_parallel: {size} needs a launch with WORLD_SIZE={size} (torchrun "
                           f"--nproc-per-node {size}); this process has WORLD_SIZE={os.environ.get('WORLD_SIZE')}")
    missing = [k for k in ENV if k not in os.environ]
    if missing:
        raise RuntimeError(f"trainer.context_parallel: {size} but {', '.join(missing)} not set: launch with torchrun")
    rank, dev = join_process_group(world_size, resolve_device(device))
    return ContextParallel(rank, world_size, dev, layout=layout, kernel=kernel)
