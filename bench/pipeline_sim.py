"""The discrete-event simulation behind bench/pipeline_model.py: one pipeline (generation
engines, a reward role, a trainer; a step's sequences admitted once the published version
is at least step - K) on given resources, step by step; its module docstring says what is
modelled and how the model is calibrated.

    result = simulate(Spec(engines=2, slots=256, tau0=0.01, decode_fixed=0.07, lengths=...,
                           group_size=8, reward_s=0.1, update_s=0.5, sync_s=0.0, staleness=1, cores=2))
    result.step_s    # steady-state seconds per step

Pure Python (heapq); no polyrl imports.
"""

from __future__ import annotations

import heapq
import statistics
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Spec:
    """Everything `simulate` needs: one pipeline on given resources (times in seconds)."""

    engines: int
    slots: int
    tau0: float
    """seconds of a decode step with every slot busy"""
    decode_fixed: float
    lengths: tuple[tuple[int, ...], ...]
    """completion lengths of every step's sequences"""
    group_size: int
    reward_s: float
    update_s: float
    sync_s: float
    staleness: int
    cores: int | None = None
    """None: each role on its own resources; n: all roles share n cores (processor sharing)"""
    update_parallel: float = 1.0
    reward_parallel: float = 1.0
    pause_during_sync: bool = True
    contention: float = 0.0
    """with cores: speed lost by every role while the demand exceeds the cores"""


@dataclass
class Result:
    step_s: float
    """steady-state seconds per step (publish to publish, without the first and last `warmup` steps)"""
    rollout_s: float
    """mean seconds from a step's first admitted sequence to its last finished one"""
    gen_busy: float
    """share of time an engine had sequences running (mean over engines)"""
    published: list[float] = field(repr=False, default_factory=list)
    """when each step's version was published"""
    started: list[float] = field(repr=False, default_factory=list)
    """when each step's sequences were admitted"""


# ---- the discrete-event simulation ------------------------------------------------------------------


class _Engine:
    """A generation engine: a token clock every running sequence advances on together."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.waiting: deque[tuple[int, int]] = deque()  # (length, step)
        self.running: list[tuple[float, int, int]] = []  # heap of (token clock at finish, id, step)
        self.tokens = 0.0
        self.last = 0.0
        self.speed = 1.0
        self.paused = False
        self.stamp = 0
        self.busy_time = 0.0

    def load(self) -> int:
        return len(self.waiting) + len(self.running)

    def rate(self) -> float:
        """Tokens per second of each running sequence."""
        if self.paused or not self.running:
            return 0.0
        b, s = len(self.running), self.spec
        return self.speed / (s.tau0 * (s.decode_fixed + (1 - s.decode_fixed) * b / s.slots))

    def settle(self, now: float) -> None:
        if self.running and not self.paused:
            self.busy_time += now - self.last
        self.tokens += self.rate() * (now - self.last)
        self.last = now

    def demand(self) -> float:
        return 1.0 if self.running and not self.paused else 0.0


class _Task:
    """A reward or update task: work in seconds at full speed; demand in cores kept busy."""

    def __init__(self, kind: str, step: int, work: float, demand: float) -> None:
        self.kind, self.step, self.remaining, self.demand_cores = kind, step, work, demand
        self.speed, self.last, self.stamp = 1.0, 0.0, 0

    def settle(self, now: float) -> None:
        self.remaining -= self.speed * (now - self.last)
        self.last = now

    def demand(self) -> float:
        return self.demand_cores


def amdahl(cores: float, parallel: float) -> float:
    """Speed-up on `cores` against one core (Amdahl's law, parallel fraction `parallel`)."""
    return 1 / ((1 - parallel) + parallel / cores)


def simulate(spec: Spec, warmup: int | None = None) -> Result:
    """Run every step of spec.lengths through the pipeline; the steady-state step time."""
    steps = len(spec.lengths)
    warmup = max(1, steps // 4) if warmup is None else warmup
    assert steps >= 2 * warmup + 1 and warmup >= 1
    engines = [_Engine(spec) for _ in range(spec.engines)]
    events: list[tuple[float, int, str, object, int]] = []
    counter = 0
    now = 0.0
    outstanding = [len(lengths) for lengths in spec.lengths]
    rollout_start, rollout_end, published = [0.0] * steps, [0.0] * steps, [0.0] * steps
    reward_queue: list[int] = []  # heaps of step numbers: oldest first
    update_queue: list[int] = []
    tasks: list[_Task] = []
    state = {"version": 0, "next": 0, "reward_busy": False, "trainer_busy": False, "seq": 0}

    def push(t: float, kind: str, obj: object, stamp: int) -> None:
        nonlocal counter
        counter += 1
        heapq.heappush(events, (t, counter, kind, obj, stamp))

    def predict_engine(e: _Engine) -> None:
        e.stamp += 1
        r = e.rate()
        if r > 0:
            push(now + max(0.0, e.running[0][0] - e.tokens) / r, "engine", e, e.stamp)

    def predict_task(t: _Task) -> None:
        t.stamp += 1
        if t.speed > 0:
            push(now + max(0.0, t.remaining) / t.speed, "task", t, t.stamp)

    def reshare() -> None:
        """Processor sharing on one machine: new speeds for everything active (cores is not None)."""
        if spec.cores is None:
            return
        active = [e for e in engines if e.demand() > 0] + tasks
        demand = sum(x.demand() for x in active)
        speed = min(1.0, spec.cores / max(1e-12, demand)) * (1 - spec.contention if demand > spec.cores else 1.0)
        for x in active:
            x.settle(now)
            x.speed = speed
            if isinstance(x, _Engine):
                predict_engine(x)
            else:
                predict_task(x)

    def fill(e: _Engine) -> bool:
        """Start waiting sequences in free slots; True when the engine went from idle to busy."""
        was_idle = not e.running
        while e.waiting and len(e.running) < spec.slots:
            length, step = e.waiting.popleft()
            state["seq"] += 1
            heapq.heappush(e.running, (e.tokens + length, state["seq"], step))
        return was_idle and bool(e.running)

    def admit() -> None:
        touched: dict[_Engine, None] = {}  # ordered: the same run every time
        loads = [(e.load(), i) for i, e in enumerate(engines)]
        heapq.heapify(loads)
        while state["next"] < steps and state["next"] - spec.staleness <= state["version"]:
            step = state["next"]
            state["next"] += 1
            rollout_start[step] = now
            lengths = spec.lengths[step]
            for g in range(0, len(lengths), spec.group_size):  # a group to the least loaded engine
                load, i = heapq.heappop(loads)
                group = lengths[g:g + spec.group_size]
                engines[i].waiting.extend((length, step) for length in group)
                heapq.heappush(loads, (load + len(group), i))
                touched[engines[i]] = None
        woke = False
        for e in touched:
            e.settle(now)
            woke |= fill(e)
            predict_engine(e)
        if woke:
            reshare()

    def start_task(kind: str, step: int) -> None:
        work, p = (spec.reward_s, spec.reward_parallel) if kind == "reward" else (spec.update_s, spec.update_parallel)
        t = _Task(kind, step, work, amdahl(spec.cores, p) if spec.cores else 1.0)
        t.last = now
        tasks.append(t)
        predict_task(t)
        reshare()

    def try_reward() -> None:
        if not state["reward_busy"] and reward_queue:
            state["reward_busy"] = True
            start_task("reward", heapq.heappop(reward_queue))

    def try_update() -> None:
        if not state["trainer_busy"] and update_queue and update_queue[0] == state["version"]:
            state["trainer_busy"] = True
            start_task("update", heapq.heappop(update_queue))

    def set_paused(paused: bool) -> None:
        for e in engines:
            e.settle(now)
            e.paused = paused
            predict_engine(e)
        reshare()

    def publish(step: int) -> None:
        published[step] = now
        state["version"] = step + 1
        state["trainer_busy"] = False
        admit()
        try_update()

    admit()
    while events:
        t, _, kind, obj, stamp = heapq.heappop(events)
        if kind != "sync" and obj.stamp != stamp:
            continue  # a prediction made before the speeds changed
        now = t
        if kind == "engine":
            e = obj
            e.settle(now)
            e.tokens = max(e.tokens, e.running[0][0])  # the predicted finish, whatever the rounding
            while e.running and e.running[0][0] <= e.tokens * (1 + 1e-12):
                _, _, step = heapq.heappop(e.running)
                outstanding[step] -= 1
                if outstanding[step] == 0:
                    rollout_end[step] = now
                    heapq.heappush(reward_queue, step)
            fill(e)
            predict_engine(e)
            if not e.running:
                reshare()  # an idle engine frees its core
            try_reward()
        elif kind == "task":
            task = obj
            task.settle(now)
            tasks.remove(task)
            task.stamp += 1
            reshare()
            if task.kind == "reward":
                state["reward_busy"] = False
                heapq.heappush(update_queue, task.step)
                try_reward()
                try_update()
            elif spec.sync_s > 0:
                if spec.pause_during_sync:
                    set_paused(True)
                push(now + spec.sync_s, "sync", task, 0)
            else:
                publish(task.step)
        else:  # the end of a weight sync
            if spec.pause_during_sync:
                set_paused(False)
            publish(obj.step)

    assert all(o == 0 for o in outstanding), "the pipeline stalled"
    window = published[warmup - 1:steps - warmup + 1]  # no start-up, and no drain (the last steps' updates
    # run without generation beside them)
    step_s = (window[-1] - window[0]) / (len(window) - 1)
    total = published[-1]
    return Result(step_s, statistics.mean(rollout_end[i] - rollout_start[i] for i in range(steps)),
                  statistics.mean(e.busy_time for e in engines) / total if total else 0.0, published, rollout_start)
