"""The mixed-load scheduler: who gets the engine workers' next free slots.

Three loads share the same engine workers: "train" (training rollouts), "eval" (held-out
evaluation) and "interactive" (requests from a server or a load generator). The workers
run at most `capacity` sequences at once; a slot is one running sequence (a GRPO group of
G samples takes G slots). `MixedLoadPolicy.admit` is a pure function of the loads' state
and the time: it says how many of each load's queued sequences to start now. The front
that applies it to a real engine is shared_engine.py; tests drive it on a simulated clock.

The rules, in the order `admit` applies them to the free slots:

1. Guarantees. A load with work queued and fewer running sequences than its share of the
   slots (`floor(share * capacity)`) gets free slots up to its share first; several such
   loads are served by priority, then by how long their oldest sequence has waited.
2. Reserves. A load with nothing left waiting keeps `reserve` of its share (less what it
   runs) free, so that its next requests start at once instead of waiting for a slot to
   free (the latency lever).
3. Lending. The remaining slots go to the loads that still have work, above their share:
   higher priority first; equal priorities take turns, the load using the least of its
   share first. So an idle load's slots are lent to the busy ones (elastic).

Reclaiming needs no preemption. A load whose work arrives while its slots are lent gets
every slot that frees from then on (rule 1 runs first), so it is back at its share once
that many borrowed sequences have finished: at most one sequence lifetime (max_tokens
decode steps) after its work arrived. Preempting running sequences would discard their
KV and waste their tokens to shorten that wait; the reserve shortens it without waste.

Latency bound of a load (interactive), from the rules above: while fewer than its
reserved slots are in use, a request starts at the next decision (the front decides
between engine steps, so within one decode burst); while fewer than its share are in
use, it starts when the first running sequence of any load finishes, at the latest one
sequence lifetime later. Beyond its share it competes by priority.

Out of scope: preemption, per-request priorities inside a load (each load is FIFO),
memory (the engine's own scheduler still preempts by recompute when KV blocks run out),
several engines with different weights (one policy per engine).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

LOADS = ("train", "eval", "interactive")
"""The loads that share the engine workers, as the run file's `scheduler:` section names them."""

_STRICT = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


class LoadConfig(BaseModel):
    """One load's claim on the engine workers."""

    model_config = _STRICT

    priority: int = Field(0, ge=0, le=100)
    """order of the loads for slots beyond their share, and for reclaiming shares: higher first"""
    share: float = Field(0.0, ge=0, le=1)
    """fraction of the worker slots this load keeps while it has work queued; lent to others while it has none"""
    reserve: float = Field(0.0, ge=0, le=1)
    """fraction of its share kept free (not lent) while the load is idle, so its next requests start at once"""


class SchedulerConfig(BaseModel):
    """How training rollouts, evaluation and interactive requests share the engine workers."""

    model_config = _STRICT

    capacity: int | None = Field(None, gt=0)
    """sequences the engine workers run at once, shared by the loads; null = the engine's own
    (engine.native.max_num_seqs x engine.native.workers)"""
    train: LoadConfig = Field(default_factory=lambda: LoadConfig(priority=1, share=0.5))
    """training rollouts"""
    eval: LoadConfig = Field(default_factory=lambda: LoadConfig(priority=0, share=0.25))
    """held-out evaluation beside training"""
    interactive: LoadConfig = Field(default_factory=lambda: LoadConfig(priority=2, share=0.25))
    """requests from a server or a load generator"""

    @model_validator(mode="after")
    def _shares_fit(self) -> "SchedulerConfig":
        total = sum(load.share for load in self.loads().values())
        if total > 1 + 1e-9:
            parts = " + ".join(f"{name} {load.share:g}" for name, load in self.loads().items())
            raise ValueError(f"shares sum to {total:g} ({parts}); they must sum to at most 1, "
                             "since each is a fraction of the same workers: lower one")
        return self

    def loads(self) -> dict[str, LoadConfig]:
        """Each load's settings by name, in LOADS order."""
        return {name: getattr(self, name) for name in LOADS}


@dataclass(frozen=True)
class LoadState:
    """What the policy sees of one load at a decision."""

    queued: int = 0
    """sequences waiting that could start now"""
    running: int = 0
    """sequences of this load in the workers"""
    oldest: float | None = None
    """arrival time of the oldest queued sequence (clock seconds); None when nothing is queued"""


class MixedLoadPolicy:
    """The rules of the module docstring: `admit(now, state)` -> sequences to start per load."""

    def __init__(self, loads: Mapping[str, LoadConfig], capacity: int) -> None:
        assert capacity > 0 and loads
        self.loads = dict(loads)
        self.capacity = capacity
        self.guaranteed = {name: math.floor(cfg.share * capacity + 1e-9) for name, cfg in self.loads.items()}
        """slots each load keeps while it has work (floor, so the guarantees never exceed capacity)"""
        self.reserved = {name: math.ceil(cfg.reserve * self.guaranteed[name] - 1e-9) for name, cfg in self.loads.items()}
        """slots kept free for each load while it is idle"""

    @classmethod
    def from_config(cls, config: SchedulerConfig, capacity: int | None = None) -> "MixedLoadPolicy":
        """The policy of a run file's `scheduler:` section; capacity overrides config.capacity."""
        capacity = capacity or config.capacity
        if capacity is None:
            raise ValueError("scheduler.capacity: not set and not given by the engine")
        return cls(config.loads(), capacity)

    def admit(self, now: float, state: Mapping[str, LoadState]) -> dict[str, int]:
        """How many queued sequences of each load to start now (0 for loads missing from state)."""
        st = {name: state.get(name, LoadState()) for name in self.loads}
        free = self.capacity - sum(s.running for s in st.values())
        grant = {name: 0 for name in self.loads}
        if free <= 0:
            return grant

        def waited(name: str) -> float:
            oldest = st[name].oldest
            return now - oldest if oldest is not None else 0.0

        # 1. guarantees: loads below their share with work queued, by priority, then longest wait
        for name in sorted(self.loads, key=lambda n: (-self.loads[n].priority, -waited(n), n)):
            below = self.guaranteed[name] - st[name].running
            take = min(st[name].queued, max(0, below), free)
            grant[name] += take
            free -= take
        # 2. reserves: a load with nothing left waiting keeps its reserve, less what it runs, free
        free -= sum(max(0, self.reserved[n] - st[n].running - grant[n]) for n in self.loads if grant[n] == st[n].queued)
        # 3. the rest, lent: by priority; equal priorities by use of their share, one slot at a time
        while free > 0:
            wanting = [n for n in self.loads if grant[n] < st[n].queued]
            if not wanting:
                break
            top = max(self.loads[n].priority for n in wanting)
            tied = [n for n in wanting if self.loads[n].priority == top]
            if len(tied) == 1:
                take = min(st[tied[0]].queued - grant[tied[0]], free)
                grant[tied[0]] += take
                free -= take
                continue
            name = min(tied, key=lambda n: ((st[n].running + grant[n]) / max(self.loads[n].share, 1e-9), n))
            grant[name] += 1
            free -= 1
        assert all(0 <= grant[n] <= st[n].queued for n in grant)
        return grant
