"""The roles running beside the trainer: one thread drives the rollout role, one the reward role.

    stream = Stream(rollout_role, reward_role, depth=K + 1)
    stream.submit(ticket)             # the trainer admits a step (staleness.py)
    item = stream.next()              # the next scored RolloutBatch or EvalBatch, in ticket order
    stream.close()

The threads only call role methods; the work happens in engine worker processes,
sandboxes, torch kernels or Ray actors, which do not hold the interpreter. Items come out
in the order their tickets went in, so a run is the same whatever the timing. The queues
between the roles hold at most `depth` items each; a role that waits, for work or for
room, counts that time as idle (`idle_seconds`). A role that fails stops the stream: its
exception is raised by the trainer's next `next()`.

A role whose heavy work runs elsewhere has its thread's torch kernels held to one OpenMP
thread (`one_thread`, backend.one_thread_roles): a second OpenMP team in the process would
slow every kernel of the trainer's update (openmp.py says why).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from polyrl.pipeline.cores import CoreSplit
from polyrl.pipeline.openmp import one_thread_here
from polyrl.pipeline.roles import EvalBatch, RolloutBatch, Ticket

_POLL = 0.05
"""Seconds a blocked put or get waits before checking whether the stream is closing."""


@dataclass
class _Failed:
    role: str
    error: BaseException


_DONE = object()


class Stream:
    def __init__(self, rollout: Any, reward: Any, depth: int, one_thread: tuple[str, ...] = (),
                 cores: CoreSplit | None = None) -> None:
        """one_thread: the roles ("rollout", "reward") whose threads run torch's kernels on one
        OpenMP thread (openmp.py): those whose heavy work happens elsewhere. cores: the roles'
        threads pin themselves to cores.roles (cores.py)."""
        self.rollout, self.reward = rollout, reward
        self.one_thread, self.cores = one_thread, cores
        self.tickets: queue.Queue = queue.Queue()
        self.rolled: queue.Queue = queue.Queue(maxsize=depth)
        self.scored: queue.Queue = queue.Queue(maxsize=depth)
        self.idle = {"rollout": 0.0, "reward": 0.0, "trainer": 0.0}
        self._closing = threading.Event()
        self._threads = [threading.Thread(target=self._rollout_loop, name="polyrl-rollout", daemon=True),
                         threading.Thread(target=self._reward_loop, name="polyrl-reward", daemon=True)]
        for t in self._threads:
            t.start()

    # ---- the trainer's side

    def submit(self, ticket: Ticket) -> None:
        self.tickets.put(ticket)

    def next(self) -> RolloutBatch | EvalBatch:
        item = self._get(self.scored, "trainer")
        if isinstance(item, _Failed):
            raise RuntimeError(f"the {item.role} role failed: {item.error}") from item.error
        if item is _DONE:
            raise RuntimeError("the pipeline stopped before the step arrived")
        return item

    def depths(self) -> dict[str, int]:
        """Items waiting between the roles right now."""
        return {"tickets": self.tickets.qsize(), "rolled": self.rolled.qsize(), "scored": self.scored.qsize()}

    def close(self) -> None:
        """Stop both roles after the item each is working on; items in the queues are dropped."""
        self._closing.set()
        self.tickets.put(_DONE)
        for t in self._threads:
            t.join(timeout=600)

    # ---- the roles' threads

    def _rollout_loop(self) -> None:
        if self.cores:
            self.cores.pin_role_thread()
        if "rollout" in self.one_thread:
            one_thread_here()
        while True:
            ticket = self._get(self.tickets, "rollout")
            if ticket is _DONE or ticket is None:
                return self._put(self.rolled, _DONE, "rollout")
            try:
                items = self.rollout.run(ticket)
            except BaseException as e:  # noqa: BLE001 - handed to the trainer, which raises it
                return self._put(self.rolled, _Failed("rollout", e), "rollout")
            for item in items:
                if not self._put(self.rolled, item, "rollout"):
                    return

    def _reward_loop(self) -> None:
        if self.cores:
            self.cores.pin_role_thread()
        if "reward" in self.one_thread:
            one_thread_here()
        while True:
            item = self._get(self.rolled, "reward")
            if item is _DONE or item is None or isinstance(item, _Failed):
                self._put(self.scored, item if item is not None else _DONE, "reward")
                return
            try:
                item = self.reward.finish(item)
            except BaseException as e:  # noqa: BLE001
                self._put(self.scored, _Failed("reward", e), "reward")
                return
            if not self._put(self.scored, item, "reward"):
                return

    def _get(self, q: queue.Queue, role: str) -> Any:
        """The next item, waiting as long as it takes (idle time); None when the stream closes."""
        start = time.perf_counter()
        try:
            while True:
                try:
                    return q.get(timeout=_POLL)
                except queue.Empty:
                    if self._closing.is_set() and role != "rollout":
                        return None
        finally:
            self.idle[role] += time.perf_counter() - start

    def _put(self, q: queue.Queue, item: Any, role: str) -> bool:
        """Put, waiting for room (idle time); False when the stream closed meanwhile."""
        start = time.perf_counter()
        try:
            while not self._closing.is_set():
                try:
                    q.put(item, timeout=_POLL)
                    return True
                except queue.Full:
                    pass
            return False
        finally:
            self.idle[role] += time.perf_counter() - start


class InlineStream:
    """Stream's calls with no threads: a ticket is rolled out and scored when it is submitted,
    in the caller's thread (cluster.backend: inline). No overlap, the same items in the same
    order: the reference the threaded stream is tested against."""

    def __init__(self, rollout: Any, reward: Any, depth: int = 1) -> None:
        self.rollout, self.reward = rollout, reward
        self.ready: list[RolloutBatch | EvalBatch] = []
        self.idle = {"rollout": 0.0, "reward": 0.0, "trainer": 0.0}

    def submit(self, ticket: Ticket) -> None:
        self.ready += [self.reward.finish(item) for item in self.rollout.run(ticket)]

    def next(self) -> RolloutBatch | EvalBatch:
        if not self.ready:
            raise RuntimeError("the pipeline stopped before the step arrived")
        return self.ready.pop(0)

    def depths(self) -> dict[str, int]:
        return {"tickets": 0, "rolled": 0, "scored": len(self.ready)}

    def close(self) -> None:
        self.ready.clear()
