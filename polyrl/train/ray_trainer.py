"""The trainer as Ray actors (cluster.backend: ray with cluster.trainer_actors: N).

With N >= 1 the policy, its reference model and optimizer live in N Ray actors of a
placement group of their own (`cluster.trainer` resources each: a GPU apiece on a GPU
cluster), instead of in the driver. The actors form one torch.distributed group (the
driver asks actor 0 for its node's address and a free port, and every actor sets RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT before `init_from_env`, as
ray.train's TorchTrainer does), each holds an FSDP shard of the policy (N > 1), and the
driver's loop talks to them through `RayTrainer`, which answers Trainer's calls (ranks.py):
every call goes to all actors at once, so their collectives match, and rank 0's answer
comes back. The driver keeps the loop, the run directory and the checkpoints.

A step's batch goes into the object store once and every actor reads it from there; the
full weights for the rollout role come back from rank 0 through the object store (on GPUs
the NCCL broadcast of ray_roles.py's docstring would skip that hop: not built here).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from polyrl.config import RunConfig
from polyrl.pipeline.ray_roles import close_actor, close_all, place
from polyrl.train.launch import free_port


class TrainerActor:
    """One trainer rank inside a Ray actor: `start` joins the group and builds its Trainer."""

    def __init__(self, cfg: RunConfig, model_dir: str, uses_kl: bool, rank: int, world_size: int) -> None:
        self.cfg, self.model_dir, self.uses_kl, self.rank, self.world_size = cfg, model_dir, uses_kl, rank, world_size
        self.dp = self.trainer = None

    def address(self) -> tuple[str, int]:
        """This node's address and a free port on it (asked of rank 0: the group's rendezvous)."""
        import ray

        return ray.util.get_node_ip_address(), free_port("")

    def start(self, master_addr: str, master_port: int) -> None:
        import torch

        from polyrl.train.distributed import init_from_env
        from polyrl.train.ranks import Trainer

        gpus = self.cfg.cluster.trainer.num_gpus > 0  # Ray shows each actor its own GPU as cuda:0
        os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.world_size), MASTER_ADDR=master_addr,
                          MASTER_PORT=str(master_port), LOCAL_RANK="0" if gpus else str(self.rank))
        self.dp = init_from_env(self.cfg.trainer.device)
        torch.manual_seed(self.cfg.seed)
        self.trainer = Trainer(self.cfg, self.dp, Path(self.model_dir), self.uses_kl)

    def model_cfg(self) -> Any:
        return self.trainer.model_cfg

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.trainer, method)(*args)

    def close(self) -> None:
        if self.dp is not None:
            self.dp.close()


class RayTrainer:
    """The driver's handle on the trainer actors, with Trainer's methods (ranks.py)."""

    def __init__(self, actors: list[Any], closers: list) -> None:
        import ray

        self.actors, self.closers = actors, closers
        self.model_cfg = ray.get(actors[0].model_cfg.remote())

    def update(self, batch: Any, step: int) -> dict:
        import ray

        return self._all("update", ray.put(batch), step)

    def weights(self) -> dict:
        return self._all("weights")

    def state(self) -> dict:
        return self._all("state")

    def load(self, state: dict) -> None:
        import ray

        ray.get([a.call.remote("load", state if i == 0 else {}) for i, a in enumerate(self.actors)])

    def close(self) -> None:
        close_all(self.closers)
        self.closers = []

    def _all(self, method: str, *args: Any) -> Any:
        """The call on every actor at once (their collectives meet); rank 0's answer."""
        import ray

        return ray.get([a.call.remote(method, *args) for a in self.actors])[0]


def start_ray_trainer(cfg: RunConfig, model_dir: Path, uses_kl: bool) -> RayTrainer:
    """cfg.cluster.trainer_actors actors on the Ray cluster the roles joined (ray_roles.py)."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    n, res = cfg.cluster.trainer_actors, cfg.cluster.trainer
    closers: list = []
    group = place([res] * n, closers, "the trainer's", "cluster.trainer / cluster.trainer_actors")
    actor = ray.remote(TrainerActor)
    actors = [actor.options(num_cpus=res.num_cpus, num_gpus=res.num_gpus, max_concurrency=1,
                            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i))
              .remote(cfg, str(model_dir), uses_kl, i, n) for i in range(n)]
    closers += [lambda a=a: close_actor(a) for a in actors]
    try:
        addr, port = ray.get(actors[0].address.remote())
        ray.get([a.start.remote(addr, port) for a in actors])  # init_process_group waits for all of them
        return RayTrainer(actors, closers)
    except BaseException:
        close_all(closers)
        raise
