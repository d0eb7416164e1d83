"""The roles as Ray actors in one placement group (cluster.backend: ray).

Each role is built inside its actor from the run config (RolloutRole with its engine and
engine workers; RewardRole with its sandbox pool and reward models), on the resources
the run file's `cluster.rollout` / `cluster.reward` ask for. The driver keeps the trainer
and talks to the actors through proxies with the roles' own methods, so the pipeline
(stream.py) does not know which backend it drives.

Weights travel once per version: the rollout proxy puts them in Ray's object store
(`ray.put`) and hands the actor a reference, which every actor of a larger rollout pool
would share. On GPUs the same seam takes a collective instead: the trainer broadcasts
the tensors over NCCL (`ray.util.collective`, or torch.distributed in a group the trainer
and the engines join) and the ticket carries only the version, or, with trainer and
engine on one GPU, CUDA IPC handles (`torch.multiprocessing.reductions.reduce_tensor`);
`RolloutRole.sync(weights, version)` is the call either one ends in. Neither is built
here (there is no GPU on this project's machines).

With `cluster.rollout_replicas: N`, N rollout actors share each step (RayRolloutPool): the
step's prompts are split among them and their batches merged in prompt order. With
`cluster.reward_replicas: M`, M reward actors share its scoring (RayRewardPool): the step's
groups are dealt among them and put back in order; reward actor i writes its code executions
to a log of its own (executions-i.jsonl beside executions.jsonl, ids "xi-000042":
sandbox/execution_log.py), so no two processes append to one file.

The trainer stays in the driver process unless `cluster.trainer_actors` puts it in actors
of its own (train/ray_trainer.py). Out of scope: actors on machines that do not share the
run directory's file system (the execution logs are written by the reward actors).
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from polyrl.config import RunConfig
from polyrl.pipeline.backend import Roles
from polyrl.pipeline.cluster import RoleResources
from polyrl.pipeline.roles import EvalBatch, RewardRole, RolloutBatch, RolloutRole, Ticket, merge_shards
from polyrl.types import Task

PLACEMENT_TIMEOUT_S = 120
"""How long to wait for the cluster to fit the placement group before giving up."""


def start_ray_roles(cfg: RunConfig, model_dir: Path, heldout: Mapping[str, list[Task]],
                    executions: Path | None) -> Roles:
    try:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    except ImportError:
        raise RuntimeError("cluster.backend: ray needs Ray: pip install -e '.[ray]'") from None

    closers = []
    if not ray.is_initialized():
        if cfg.cluster.address is None:  # a local cluster of this machine, for this run only
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            need = (cfg.cluster.rollout.num_cpus * cfg.cluster.rollout_replicas
                    + cfg.cluster.reward.num_cpus * cfg.cluster.reward_replicas
                    + cfg.cluster.trainer.num_cpus * cfg.cluster.trainer_actors)
            ray.init(num_cpus=max(os.cpu_count() or 1, int(need + 0.999)), include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        else:
            ray.init(address=cfg.cluster.address, log_to_driver=False, configure_logging=False)
        closers.append(ray.shutdown)
    replicas, rewards = cfg.cluster.rollout_replicas, cfg.cluster.reward_replicas
    roles = [("reward", cfg.cluster.reward)] * rewards + [("rollout", cfg.cluster.rollout)] * replicas
    group = place([r for _, r in roles], closers, "the roles'", "cluster.rollout / cluster.reward / "
                  "cluster.rollout_replicas / cluster.reward_replicas")
    actor = ray.remote(RoleActor)
    handles = []
    for i, (name, res) in enumerate(roles):
        args = (cfg, model_dir, heldout) if name == "rollout" else (cfg, executions, i)  # i: its log (shard_log)
        handles.append(actor.options(
            num_cpus=res.num_cpus, num_gpus=res.num_gpus, name=None, max_concurrency=1,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i),
        ).remote(name, *args))
    reward_actors, rollout_actors = handles[:rewards], handles[rewards:]
    rollout, reward = RayRolloutPool(rollout_actors), RayRewardPool(reward_actors)
    try:  # building a role fails loudly here, not at its first call
        ray.get([h.ready.remote() for h in handles])
    except BaseException:
        close_all(closers)
        raise
    closers += [lambda a=a: close_actor(a) for a in handles]
    return Roles(rollout, reward, closers)


def place(resources: list[RoleResources], closers: list, whose: str, knobs: str) -> Any:
    """A placement group of one bundle per entry, ready (its removal added to `closers`), or
    a RuntimeError naming the run file's `knobs` to lower."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundles = [{"CPU": r.num_cpus, **({"GPU": r.num_gpus} if r.num_gpus else {})} for r in resources]
    group = placement_group(bundles, strategy="PACK")
    closers.append(lambda: remove_placement_group(group))
    ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        close_all(closers)
        raise RuntimeError(f"the Ray cluster cannot place {whose} resources {bundles} within "
                           f"{PLACEMENT_TIMEOUT_S} s; lower {knobs} or add nodes")
    return group


class RoleActor:
    """A role inside a Ray actor: `call(method, *args)` runs the role's method."""

    def __init__(self, kind: str, *args: Any) -> None:
        self.role = RolloutRole(*args) if kind == "rollout" else RewardRole(*args)

    def ready(self) -> bool:
        return True

    def close(self) -> None:
        self.role.close()

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.role, method)(*args)

    def run_with(self, ticket: Ticket, weights: Any) -> Any:
        """RolloutRole.run with the weights resolved from the object store."""
        return self.role.run(replace(ticket, weights=weights))


class RemoteRole:
    """A proxy: role.method(*args) runs in the actor and returns its answer."""

    def __init__(self, actor: Any) -> None:
        self._actor = actor

    def __getattr__(self, method: str):
        import ray

        return lambda *args: ray.get(self._actor.call.remote(method, *args))


class RayRolloutPool(RemoteRole):
    """The rollout proxy over one or more rollout actors. A ticket's prompts are split among
    them (Ticket.shard) and their batches merged (roles.merge_shards); its evaluation runs on
    the first actor beside the others' rollouts. The weights of a version go into the object
    store once, and every actor takes them from there. Other calls (the evaluations before and
    after training) go to the first actor."""

    def __init__(self, actors: list[Any]) -> None:
        super().__init__(actors[0])
        self.actors = actors

    def run(self, ticket: Ticket) -> list[RolloutBatch | EvalBatch]:
        import ray

        ref = None if ticket.weights is None else ray.put(ticket.weights)
        n = len(self.actors)
        calls = []
        for i, actor in enumerate(self.actors):
            shard = replace(ticket, weights=None, shard=(i, n), eval_step=ticket.eval_step if i == 0 else None)
            calls.append(actor.call.remote("run", shard) if ref is None else actor.run_with.remote(shard, ref))
        answers = ray.get(calls)
        evaluations = [item for items in answers for item in items if isinstance(item, EvalBatch)]
        batches = [item for items in answers for item in items if isinstance(item, RolloutBatch)]
        return evaluations + [batches[0] if n == 1 else merge_shards(batches)]

    def sync(self, weights: Any, version: int) -> float:
        import ray

        ref = ray.put(weights)
        return max(ray.get([a.call.remote("sync", ref, version) for a in self.actors]))


class RayRewardPool(RemoteRole):
    """The reward proxy over one or more reward actors. A rollout batch's groups are dealt
    round-robin among them (group k to actor k mod n), scored at once, and put back in order,
    with every actor's observability records; an evaluation, and every other call, goes to
    the first actor (its held-out tasks are scored against one set of verifiers, as the
    curriculum reads them)."""

    def __init__(self, actors: list[Any]) -> None:
        super().__init__(actors[0])
        self.actors = actors

    def finish(self, item: RolloutBatch | EvalBatch) -> RolloutBatch | EvalBatch:
        import ray

        n = min(len(self.actors), len(item.groups)) if isinstance(item, RolloutBatch) else 1
        if n <= 1:
            return ray.get(self.actors[0].call.remote("finish", item))
        start = time.perf_counter()
        shards = ray.get([actor.call.remote("finish", replace(item, groups=item.groups[i::n], records=[]))
                          for i, actor in enumerate(self.actors[:n])])
        groups: list = [None] * len(item.groups)
        for i, shard in enumerate(shards):
            groups[i::n] = shard.groups
        return replace(item, groups=groups, records=item.records + [r for shard in shards for r in shard.records],
                       reward_seconds=time.perf_counter() - start)


def close_actor(actor: Any) -> None:
    """Its `close()`, then the actor killed."""
    import ray

    try:
        ray.get(actor.close.remote(), timeout=60)
    except Exception:  # noqa: BLE001 - closing is best effort; the actor is killed anyway
        pass
    ray.kill(actor)


def close_all(closers: list) -> None:
    for close in reversed(closers):
        close()
