"""The trainer over several processes: rank 0 runs the loop, the other ranks follow its collectives.

One process (WORLD_SIZE unset or 1) is the common case, and nothing here communicates
then. Launched on N processes, every process runs the same `polyrl train` command
(`polyrl train RUN.yaml --nproc N`, which starts them: launch.py; or `torchrun
--nproc-per-node N -m polyrl.cli train RUN.yaml`), joins one process group (gloo on CPU,
nccl on CUDA: distributed.py) and holds a shard of the policy (FSDP2). Rank 0 alone opens
the run directory, runs the rollout and reward roles, evaluates, and writes metrics,
checkpoints and state.

Every call that touches the sharded policy is a collective that all ranks make in the
same order: the update, the full weights for the engine or a checkpoint, the full
training state for the resume file, loading that state back. So the loop never calls the
policy directly: it calls `Trainer`, whose every method on rank 0 first broadcasts a
command (the method's name and its arguments, the step's batch for an update) and then
makes the collective; `follow`, on the other ranks, receives the command and makes the
same call on its own `Trainer`. The loop's control flow (dropped groups, flags,
evaluations, when to checkpoint) thus stays on rank 0, and no rank ever waits on a
collective that rank 0 will not make.

Endings: the other ranks ignore Ctrl-C (it reaches every rank at once; rank 0 ends
the run at the next step boundary, which still needs them). Rank 0 sends a last command
on every way out (`Leader.stop`, an ExitStack callback), errors included, except in the
middle of a collective, where the other ranks are inside a call that a broadcast would
not match; there, and when rank 0's process dies, their pending collective fails as its
peer disconnects, and they exit with that error.

Resume: the state file holds the full (unsharded) policy and optimizer state, gathered
to rank 0 (`torch.distributed.checkpoint.state_dict`, keyed by parameter name) and
loaded back with a broadcast from rank 0; it records the world size, and a run is
resumed with the world size it was started with (a clear error otherwise).
"""

from __future__ import annotations

import copy
import signal
from pathlib import Path
from typing import Any, Callable

import torch

from polyrl.config import RunConfig
from polyrl.models.loading import load_policy
from polyrl.train.distributed import DataParallel, SingleProcess
from polyrl.train.update import update


class Leader:
    """Rank 0's channel to the other ranks: names each collective before it is made."""

    def __init__(self, dp: SingleProcess) -> None:
        self.dp = dp
        self.stopped = False
        self.in_collective = False
        """True from a command's broadcast until its collective returns (see `stop`)."""

    def say(self, name: str, *args: Any) -> None:
        if self.dp.world_size > 1:
            assert not self.stopped, f"{name} after the other ranks were stopped"
            self.dp.broadcast((name, *args))
            self.in_collective = True

    def done(self) -> None:
        self.in_collective = False

    def stop(self) -> None:
        """End the other ranks (once); skipped mid-collective, where they fail on their own."""
        if self.dp.world_size > 1 and not self.stopped and not self.in_collective:
            self.dp.broadcast(("stop",))
            self.dp.barrier()  # no rank tears its process group down while another still talks to it
        self.stopped = True


class Trainer:
    """The policy, its reference model and optimizer, on this rank: every method is a
    collective when there are several ranks (rank 0 names it first through `leader`)."""

    def __init__(self, cfg: RunConfig, dp: SingleProcess, model_dir: Path, uses_kl: bool,
                 leader: Leader | None = None) -> None:
        policy, self.tokenizer = load_policy(model_dir, cfg.model.dtype)
        self.cfg, self.dp, self.leader = cfg, dp, leader
        self.model_cfg = policy.cfg
        """the policy's architecture (a checkpoint's config.json)"""
        self.ref = dp.wrap(copy.deepcopy(policy).eval().requires_grad_(False)) if uses_kl else None
        self.policy = dp.wrap(policy)  # on trainer.device
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=cfg.trainer.lr, betas=(0.9, 0.99),
                                           weight_decay=cfg.trainer.weight_decay)

    def update(self, batch: Any, step: int) -> dict:
        """One optimizer step on the step's batch (update.py); its stats."""
        with self._collective("update", batch, step):
            return update(self.policy, self.ref, self.optimizer, batch, self.cfg, step, dp=self.dp)

    def weights(self) -> dict[str, torch.Tensor]:
        """A copy of the full weights on the CPU (on rank 0; {} on the others): the rollout
        role's and a checkpoint's, while the trainer goes on changing its own tensors."""
        with self._collective("weights"):
            if isinstance(self.dp, DataParallel):
                return self.dp.engine_weights(self.policy)
            return {k: v.detach().to("cpu", copy=True) for k, v in self.policy.state_dict().items()}

    def state(self) -> dict[str, Any]:
        """The policy's and optimizer's full state for the resume file (on rank 0; empty
        dicts on the others)."""
        with self._collective("state"):
            if not isinstance(self.dp, DataParallel):
                return {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(),
                        "world_size": 1}
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

            policy, optimizer = get_state_dict(self.policy, self.optimizer,
                                               options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            return {"policy": policy, "optimizer": optimizer, "world_size": self.dp.world_size}

    def load(self, state: dict[str, Any]) -> None:
        """Load `state` (what `state` returned, given on rank 0; {} on the others)."""
        saved = state.get("world_size", 1) if self.dp.rank == 0 else self.dp.world_size
        if saved != self.dp.world_size:  # checked before the others are told to load
            raise RuntimeError(f"this run was saved by {saved} trainer process(es); resume it with as many "
                               f"(now {self.dp.world_size}: polyrl train --nproc, or torchrun's --nproc-per-node)")
        with self._collective("load", {}):
            if not isinstance(self.dp, DataParallel):
                self.policy.load_state_dict(state["policy"])
                self.optimizer.load_state_dict(state["optimizer"])
                return
            from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                                 set_optimizer_state_dict)

            # One call each: set_state_dict skips the model on a rank given an empty model state
            # (it reads that as "optimizer only"), and the ranks' broadcasts would not match.
            full = state if self.dp.rank == 0 else {"policy": {}, "optimizer": {}}
            options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
            set_model_state_dict(self.policy, dict(full["policy"]), options=options)
            set_optimizer_state_dict(self.policy, self.optimizer, dict(full["optimizer"]), options=options)

    def _collective(self, name: str, *args: Any) -> _Named:
        return _Named(self.leader, name, args)


class _Named:
    """Around one collective on rank 0: its command first, then `done` once it returned."""

    def __init__(self, leader: Leader | None, name: str, args: tuple) -> None:
        self.leader, self.name, self.args = leader, name, args

    def __enter__(self) -> None:
        if self.leader is not None:
            self.leader.say(self.name, *self.args)

    def __exit__(self, kind, exc, tb) -> None:
        if self.leader is not None and kind is None:
            self.leader.done()


def follow(cfg: RunConfig, dp: SingleProcess, log: Callable[[str], None]) -> None:
    """A rank > 0's whole run: build the same Trainer as rank 0, then make each collective
    rank 0 names, until it says stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches every rank: rank 0 ends the run at a step boundary
    command = dp.broadcast(None)
    if command[0] == "stop":  # rank 0 ended before training began (a bad run directory, ...)
        dp.barrier()
        return
    _, model_dir, uses_kl = command
    torch.manual_seed(cfg.seed)
    trainer = Trainer(cfg, dp, Path(model_dir), uses_kl)
    log(f"rank {dp.rank}: following rank 0's updates ({dp.world_size} trainer processes)")
    while True:
        name, *args = dp.broadcast(None)
        if name == "stop":
            dp.barrier()
            return
        getattr(trainer, name)(*args)


def lead(cfg: RunConfig, dp: SingleProcess, leader: Leader, model_dir: Path, uses_kl: bool) -> Trainer:
    """Rank 0's Trainer (the only one in one process), built after telling the others to build theirs."""
    leader.say("build", str(model_dir), uses_kl)
    leader.done()
    return Trainer(cfg, dp, model_dir, uses_kl, leader)
