"""One engine shared by several loads: callers in many threads, one policy, one driver thread.

    shared = SharedEngine(engine, SchedulerConfig())          # owns `engine` from here on
    train = shared.client("train")                            # an Engine, as Rollout expects
    groups = Rollout(train, tokenizer, specs).groups(...)      # from the rollout thread
    with shared.hold_version(v):                              # optional: pin the eval to v
        evaluate(Rollout(shared.client("eval"), ...), ...)    # from an eval thread, beside it
    shared.update_weights(weights, version=v + 1)             # waits for a safe point
    shared.close()

Every `generate` call is split into sequences (sample j of prompt i), queued FIFO under its
load, and admitted into worker slots by `MixedLoadPolicy` (scheduler.py) from one driver
thread, which is the only thread that touches the engine. How sequences reach the engine
is chosen once, at construction, by what the engine offers:

- step mode (engines with the step API: PagedEngine): each admitted sequence is added with
  `add_request` between engine steps, so sequences of every load run in the same batch
  (continuous batching) and a finished sequence's slot is reused at the next step. Each
  sequence keeps the seed `PagedEngine.generate` would give it (`request_seed(call seed,
  i * n + j)`), so a seeded call returns the same tokens as the engine alone, whatever
  else runs beside it.
- round mode (any other Engine: DataParallelEngine, vLLM, a remote server): the driver
  admits one round of up to `capacity` sequences, runs it as one `generate` call per call
  (seedless calls with equal sampling, of any loads, are merged into one), highest
  priority first, and admits the next round when all have returned. A call admitted whole is passed through
  unchanged (same tokens as the engine alone); a call split over rounds runs each part
  with n=1 and the seed of its first sequence, which is reproducible for the same split
  but not the engine-alone tokens. A request arriving mid-round waits for the round.

Weights. `update_weights` waits until it can be applied: between engine steps (step mode:
running sequences keep their KV and go on with the new weights, engine/paged.py "keep") or
between rounds, and not while a `hold_version` is open on the current version. A hold
pins a whole evaluation (several calls) to one version: training rollouts go on beside it
on that version, and the trainer's update waits for the hold to close.

Out of scope: preemption (see scheduler.py), cancelling a call, several engines behind one
front (use one SharedEngine per engine), streaming partial outputs.
"""

from __future__ import annotations

import math
import threading
import time
import traceback
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from polyrl.engine.base import SamplingParams, check_prompts
from polyrl.engine.sampler import request_seed
from polyrl.pipeline.scheduler import LOADS, LoadState, MixedLoadPolicy, SchedulerConfig
from polyrl.types import Completion

LATENCY_MEMORY = 10_000
"""Call latencies kept per load for stats() (the most recent)."""


@dataclass(eq=False)
class _Call:
    """One caller's generate call, waiting for its sequences."""

    load: str
    prompts: list[list[int]]
    n: int
    sampling: SamplingParams
    base_seed: int | None
    submitted: float
    results: list[Completion | None]
    remaining: int
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


@dataclass(eq=False)
class _Seq:
    """Sample j of prompt i of a call: one slot while it runs."""

    call: _Call
    index: int
    """i * n + j: its place in the call's results"""
    prompt_index: int
    seed: int | None
    arrival: float


@dataclass
class _Update:
    weights: Mapping[str, torch.Tensor]
    version: int
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


@dataclass
class _LoadStats:
    calls: int = 0
    sequences: int = 0
    tokens: int = 0
    latencies: deque = field(default_factory=lambda: deque(maxlen=LATENCY_MEMORY))


class SharedEngine:
    """An Engine's slots shared by the loads of a SchedulerConfig (see the module docstring)."""

    def __init__(self, engine: Any, config: SchedulerConfig | None = None, clock: Callable[[], float] = time.monotonic,
                 capacity: int | None = None, policy: MixedLoadPolicy | None = None) -> None:
        """engine: any polyrl Engine (owned from here on). capacity overrides config.capacity;
        with neither, the engine's max_num_seqs x workers. clock: seconds, for latencies and
        the policy's waiting times. policy: another admission rule over the same loads (a
        benchmark's control); None = config's MixedLoadPolicy."""
        self.engine = engine
        self.config = config or SchedulerConfig()
        self.clock = clock
        self.step_mode = all(hasattr(engine, name) for name in ("add_request", "step", "has_unfinished"))
        self.capacity = policy.capacity if policy else capacity or self.config.capacity or _engine_capacity(engine)
        self.policy = policy or MixedLoadPolicy.from_config(self.config, self.capacity)
        self._cond = threading.Condition()
        self._queues: dict[str, deque[_Seq]] = {name: deque() for name in LOADS}
        self._running: dict[str, int] = {name: 0 for name in LOADS}
        self._stats: dict[str, _LoadStats] = {name: _LoadStats() for name in LOADS}
        self._inflight: dict[int, _Seq] = {}
        self._updates: deque[_Update] = deque()
        self._holds: dict[int, int] = {}
        self._applying = False
        self._failure: BaseException | None = None
        self._closed = False
        self._driver = threading.Thread(target=self._drive, name="polyrl-shared-engine", daemon=True)
        self._driver.start()

    # ---- what callers use ----------------------------------------------------------------------

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def client(self, load: str) -> "LoadClient":
        """An Engine whose generate calls run as `load` ("train", "eval" or "interactive")."""
        if load not in LOADS:
            raise ValueError(f"load: got {load!r}; must be one of {', '.join(LOADS)}")
        return LoadClient(self, load)

    def generate(self, load: str, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams) -> list[Completion]:
        """n completions per prompt, grouped as Engine.generate's, run as `load`; blocks until done."""
        if load not in LOADS:
            raise ValueError(f"load: got {load!r}; must be one of {', '.join(LOADS)}")
        check_prompts(prompts, n)
        check_prompt = getattr(self.engine, "check_prompt", None)
        for p in prompts if check_prompt else ():
            check_prompt(p)  # a prompt past the KV pool fails its caller here, not the shared driver
        base = sampling.seed
        if self.step_mode and base is None:
            base = int(torch.randint(0, 2**62, (1,)))
        now = self.clock()
        call = _Call(load, [list(p) for p in prompts], n, sampling, base, now, [None] * (len(prompts) * n),
                     len(prompts) * n)
        seqs = [_Seq(call, i * n + j, i, request_seed(base, i * n + j) if base is not None else None, now)
                for i in range(len(prompts)) for j in range(n)]
        with self._cond:
            self._check_open()
            self._queues[load].extend(seqs)
            self._stats[load].calls += 1
            self._cond.notify_all()
        call.done.wait()
        if call.error is not None:
            raise call.error
        return call.results  # type: ignore[return-value]

    def update_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """Load new weights at the next safe point (module docstring); returns once loaded."""
        update = _Update(weights, version)
        with self._cond:
            self._check_open()
            self._updates.append(update)
            self._cond.notify_all()
        update.done.wait()
        if update.error is not None:
            raise update.error

    @contextmanager
    def hold_version(self, version: int | None = None) -> Iterator[int]:
        """Keep the engine on `version` (None: the current one) until the block ends; updates
        wait. Raises ValueError when that version is no longer, or not yet, loaded."""
        with self._cond:
            while self._applying:
                self._cond.wait()
            self._check_open()
            current = self.engine.weight_version
            version = current if version is None else version
            if version != current:
                raise ValueError(f"version {version} is not loaded (the engine holds version {current}); "
                                 "hold a version while it is the engine's")
            self._holds[version] = self._holds.get(version, 0) + 1
        try:
            yield version
        finally:
            with self._cond:
                self._holds[version] -= 1
                if not self._holds[version]:
                    del self._holds[version]
                self._cond.notify_all()

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per load: queued and running sequences now; calls, sequences and tokens done; call
        latency p50/p99 (seconds, over the last LATENCY_MEMORY calls; None before any)."""
        with self._cond:
            out = {}
            for name in LOADS:
                s = self._stats[name]
                lat = sorted(s.latencies)
                out[name] = {"queued": len(self._queues[name]), "running": self._running[name], "calls": s.calls,
                             "sequences": s.sequences, "tokens": s.tokens,
                             "latency_p50": _quantile(lat, 0.5), "latency_p99": _quantile(lat, 0.99)}
            return out

    def close(self) -> None:
        """Stop the driver, fail what is still queued, close the engine. Closing twice is harmless."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._driver.join()
        with self._cond:
            self._fail_all(RuntimeError("SharedEngine closed"))
        self.engine.close()

    # ---- the driver thread -----------------------------------------------------------------------

    def _drive(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._closed and not self._has_work():
                        self._cond.wait()
                    if self._closed:
                        return
                    update = self._ready_update()
                    self._applying = update is not None  # holds wait: the version is changing
                if update is not None:
                    self._apply(update)
                    continue
                with self._cond:
                    admitted = self._admit()
                    if not admitted and not self._inflight:  # queued work the policy keeps waiting
                        self._cond.wait()  # (reserves of idle loads): only a new call or close changes that
                        continue
                if self.step_mode:
                    self._step(admitted)
                else:
                    self._round(admitted)
        except BaseException as exc:  # noqa: BLE001 - the engine is unusable: every caller hears why
            failure = RuntimeError(f"shared engine failed:\n{traceback.format_exc()}")
            failure.__cause__ = exc
            with self._cond:
                self._failure = failure
                self._fail_all(failure)

    def _has_work(self) -> bool:
        return bool(self._inflight or self._ready_update() or any(self._queues.values()))

    def _ready_update(self) -> _Update | None:
        """The oldest waiting update, if nothing holds the current version."""
        if self._updates and self.engine.weight_version not in self._holds:
            return self._updates[0]
        return None

    def _apply(self, update: _Update) -> None:
        try:
            self.engine.update_weights(update.weights, update.version)
        except Exception as exc:  # noqa: BLE001 - the trainer's mistake (missing tensors): its error
            update.error = exc
        with self._cond:
            self._updates.popleft()
            self._applying = False
            self._cond.notify_all()
        update.done.set()

    def _admit(self) -> list[_Seq]:
        """The policy's decision, taken off the queues (under the lock)."""
        for queue in self._queues.values():  # sequences of calls that failed meanwhile
            while queue and queue[0].call.error is not None:
                queue.popleft()
        state = {name: LoadState(len(q), self._running[name], q[0].arrival if q else None)
                 for name, q in self._queues.items()}
        grant = self.policy.admit(self.clock(), state)
        admitted = []
        for name in sorted(LOADS, key=lambda n: -self.policy.loads[n].priority):
            for _ in range(grant[name]):
                admitted.append(self._queues[name].popleft())
            self._running[name] += grant[name]
        return admitted

    def _step(self, admitted: list[_Seq]) -> None:
        """Step mode: add the admitted sequences, run one engine step, hand back the finished."""
        for seq in admitted:
            rid = self.engine.add_request(seq.call.prompts[seq.prompt_index], seq.call.sampling, seed=seq.seed,
                                          prompt_index=seq.prompt_index)
            self._inflight[rid] = seq
        finished = self.engine.step() if self.engine.has_unfinished() else []
        with self._cond:
            for rid, completion in finished:
                self._finish(self._inflight.pop(rid), completion)

    def _round(self, admitted: list[_Seq]) -> None:
        """Round mode: the admitted sequences as generate calls, interactive first; see the docstring."""
        with self._cond:  # in flight until their call returns (so a failure reaches their callers)
            self._inflight.update((id(seq), seq) for seq in admitted)
        chunks: dict[Any, list[_Seq]] = {}
        for seq in admitted:
            sampling = seq.call.sampling
            key = sampling if sampling.seed is None else seq.call  # seedless: any load, any n, one call
            chunks.setdefault(key, []).append(seq)
        for chunk in chunks.values():
            call = chunk[0].call
            try:
                if len(chunk) == len(call.results) and all(s.call is call for s in chunk):
                    outs = self.engine.generate(call.prompts, call.n, call.sampling)
                else:
                    sampling = replace(call.sampling, seed=chunk[0].seed)
                    outs = self.engine.generate([s.call.prompts[s.prompt_index] for s in chunk], 1, sampling)
                error = None
            except Exception as exc:  # noqa: BLE001 - this call's failure, reported to its callers
                outs, error = [None] * len(chunk), exc
            with self._cond:
                for seq, out in zip(chunk, outs):
                    self._inflight.pop(id(seq))
                    if error is not None:
                        self._running[seq.call.load] -= 1
                        self._fail(seq.call, error)
                    else:
                        self._finish(seq, replace(out, prompt_index=seq.prompt_index))

    def _finish(self, seq: _Seq, completion: Completion) -> None:
        call = seq.call
        self._running[call.load] -= 1
        stats = self._stats[call.load]
        stats.sequences += 1
        stats.tokens += len(completion.token_ids)
        if call.error is not None:
            return
        call.results[seq.index] = completion
        call.remaining -= 1
        if call.remaining == 0:
            stats.latencies.append(self.clock() - call.submitted)
            call.done.set()

    def _fail_all(self, error: BaseException) -> None:
        """Every queued and running call, and every waiting update, ends with `error` (under the lock)."""
        for seq in [s for queue in self._queues.values() for s in queue] + list(self._inflight.values()):
            self._fail(seq.call, error)
        for queue in self._queues.values():
            queue.clear()
        self._inflight.clear()
        for update in self._updates:
            update.error = error
            update.done.set()
        self._updates.clear()

    @staticmethod
    def _fail(call: _Call, error: BaseException) -> None:
        if call.error is None:
            call.error = error
            call.done.set()

    def _check_open(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise RuntimeError("SharedEngine closed")


class LoadClient:
    """The Engine interface for one load of a SharedEngine (what Rollout and evaluate take)."""

    def __init__(self, shared: SharedEngine, load: str) -> None:
        self.shared, self.load = shared, load

    @property
    def weight_version(self) -> int:
        return self.shared.weight_version

    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams) -> list[Completion]:
        return self.shared.generate(self.load, prompts, n, sampling)

    def update_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        self.shared.update_weights(weights, version)

    def close(self) -> None:
        """A client owns nothing: the SharedEngine's owner closes it."""


def _engine_capacity(engine: Any) -> int:
    """Sequences the engine runs at once: its max_num_seqs times its worker processes."""
    config = getattr(engine, "config", None)
    seats = getattr(config, "max_num_seqs", None)
    if seats is None:
        raise ValueError(f"scheduler.capacity: {type(engine).__name__} does not say how many sequences it runs "
                         "at once; set scheduler.capacity")
    return seats * getattr(engine, "workers", 1)


def _quantile(sorted_values: list[float], q: float) -> float | None:
    """The q-quantile (nearest rank) of sorted values; None for none."""
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]
