"""Where the roles live: in this process, or as Ray actors. The pipeline is the same code.

    roles = start_roles(cfg, model_dir, heldout, executions)   # cfg.cluster.backend
    roles.rollout.run(ticket); roles.reward.finish(batch)       # the same calls either way
    roles.close()

"local" builds RolloutRole and RewardRole here; "ray" builds each inside a Ray actor of a
placement group and hands back proxies whose methods wait for the actor's answer
(ray_roles.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from polyrl.config import RunConfig
from polyrl.pipeline.cores import CoreSplit
from polyrl.pipeline.cores import available as cores_available
from polyrl.pipeline.roles import RewardRole, RolloutRole
from polyrl.types import Task


@dataclass
class Roles:
    rollout: Any
    """a RolloutRole, or a proxy answering the same calls"""
    reward: Any
    """a RewardRole, or a proxy answering the same calls"""
    closers: list[Callable[[], None]]

    def close(self) -> None:
        for close in reversed(self.closers):
            close()


def one_thread_roles(cfg: RunConfig) -> tuple[str, ...]:
    """The roles whose threads beside the trainer need no OpenMP team of their own
    (stream.py, openmp.py): those whose heavy work runs elsewhere. The reward role's work is
    in sandboxes and small reward-model passes; the rollout role's, in engine worker
    processes, vLLM or Ray actors, unless its engine decodes in the role's own thread
    (the native engine with one worker, on the local backend), which keeps torch's threads."""
    decodes_here = cfg.cluster.backend != "ray" and cfg.engine.backend == "native" and cfg.engine.native.workers == 1
    return ("reward",) if decodes_here else ("rollout", "reward")


def split_cores(cfg: RunConfig, log: Callable[[str], None]) -> tuple[CoreSplit | None, Callable[[], None]]:
    """cluster.split_cores applied (cores.py): this process's threads on the trainer's cores, its
    child processes on the roles'; (None, a no-op) when not asked for, or where it cannot be done
    (said). The callable puts this process's threads back as they were."""
    if not cfg.cluster.split_cores:
        return None, lambda: None
    split = CoreSplit.halves(os.sched_getaffinity(0)) if cores_available() else None
    if split is None:
        log("cluster.split_cores: needs Linux and at least 2 cores; the roles share every core")
        return None, lambda: None
    undo = split.apply()
    log(f"cluster.split_cores: trainer on cores {sorted(split.trainer)}, rollout and reward on {sorted(split.roles)}")
    return split, undo


def start_roles(cfg: RunConfig, model_dir: Path, heldout: Mapping[str, list[Task]], executions: Path | None) -> Roles:
    if cfg.cluster.backend == "ray":
        from polyrl.pipeline.ray_roles import start_ray_roles

        return start_ray_roles(cfg, model_dir, heldout, executions)
    rollout = RolloutRole(cfg, model_dir, heldout)
    try:
        reward = RewardRole(cfg, executions)
    except BaseException:
        rollout.close()
        raise
    return Roles(rollout, reward, [rollout.close, reward.close])
