"""The run file's `cluster:` section: where the pipeline's roles run (pipeline/backend.py
reads it), beside the other sections' schemas in polyrl/config.py."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

_STRICT = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True, allow_inf_nan=False)


class RoleResources(BaseModel):
    """What one role's Ray actor asks of the cluster."""

    model_config = _STRICT

    num_cpus: float = Field(1.0, ge=0, le=1024)
    """CPU cores reserved for the actor (0..1024)"""
    num_gpus: float = Field(0.0, ge=0, le=64)
    """GPUs reserved for the actor (0..64; fractions share one)"""


class ClusterConfig(BaseModel):
    """Where the pipeline's roles run (polyrl/pipeline/backend.py)."""

    model_config = _STRICT

    backend: Literal["local", "inline", "ray"] = "local"
    """"local": every role in this process, each in its own thread; "inline": in this process, one
    after another in the trainer's thread (no overlap: debugging, profiling); "ray": rollout and
    reward roles as Ray actors in one placement group (pip install -e .[ray])"""
    address: str | None = None
    """Ray cluster to join ("auto", "ray://host:10001"); null starts a local one on this machine"""
    rollout: RoleResources = Field(default_factory=RoleResources)
    """the rollout role's actor (engine workers run inside it)"""
    reward: RoleResources = Field(default_factory=RoleResources)
    """the reward role's actor (sandbox pool and reward-model scorers)"""
    rollout_replicas: int = Field(1, ge=1, le=1024)
    """rollout actors (ray only; 1..1024), each with its own engine and `rollout` resources: a step's
    prompts are split among them, and the weights of a version are put in the object store once"""
    trainer: RoleResources = Field(default_factory=RoleResources)
    """each trainer actor (ray with trainer_actors >= 1: one GPU each on a GPU cluster)"""
    trainer_actors: int = Field(0, ge=0, le=1024)
    """0: the trainer runs in the driver process, beside the run directory; N (ray only; 1..1024): N
    trainer actors, the policy sharded among them with FSDP (polyrl/train/ray_trainer.py)"""
    split_cores: bool = False
    """local backend: the trainer's threads on half of this machine's cores, the engine workers,
    sandboxes and role threads on the other half (pipeline/cores.py), so that with max_staleness > 0
    the overlapped phases stop taking turns on the same cores"""
    reward_replicas: int = Field(1, ge=1, le=1024)
    """reward actors (ray only; 1..1024), each with its own verifiers (sandbox pool, reward models) and
    `reward` resources: a step's groups are split among them and scored at once"""

    @model_validator(mode="after")
    def _replicas_need_ray(self) -> ClusterConfig:
        for name, n, local, what in (("rollout_replicas", self.rollout_replicas, 1, "one engine"),
                                     ("reward_replicas", self.reward_replicas, 1, "one set of verifiers"),
                                     ("trainer_actors", self.trainer_actors, 0, "the trainer in this process")):
            if n > local and self.backend != "ray":
                raise ValueError(f"{name}: {n} needs backend: ray (the local backends run {what}); "
                                 "set it here or run `polyrl train RUN --ray`")
        if self.split_cores and self.backend != "local":
            raise ValueError(f"split_cores: true needs backend: local (with {self.backend!r} "
                             + ("the roles are one after another in one thread)" if self.backend == "inline"
                                else "Ray places each actor on the cores its resources ask for)"))
        return self
