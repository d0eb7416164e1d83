"""Backends that run many requests: the protocol, and the local bubblewrap worker pool.

`SandboxBackend` is what graders depend on: `run`, `run_many`, `close`. `SandboxPool`
implements it on this host with N worker threads, each driving one sandbox at a time;
worker k runs as uid uid_base + k so its RLIMIT_NPROC budget is its own. With
start="fork" (the default) worker k keeps a zygote (zygote.py) that forks each request
into namespaces and a tmpfs of its own; with start="spawn" each request gets a new
bubblewrap (runner.py). Either way nothing of one request is reused by the next.
Threads are enough: the work happens in the child processes, and the GIL is released
while a thread waits on their pipes. Concurrency about equal to the core count keeps the
CPUs busy without thrashing.

Other backends fit the same protocol: http.py posts SandboxFusion `/run_code` requests;
a Ray-actor pool (one SandboxPool per node behind an actor) is left for later.

Not covered: priorities, cancellation of queued requests, per-tenant quotas.
"""

from __future__ import annotations

import os
import queue
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, Sequence

from polyrl.sandbox.bwrap import SandboxUnavailable, find_bwrap, probe, require_bwrap
from polyrl.sandbox.runner import MAX_SLOTS, run, slot_uid
from polyrl.sandbox.types import RunRequest, RunResult, SandboxConfig
from polyrl.sandbox.zygote import Zygote


class SandboxBackend(Protocol):
    def run(self, request: RunRequest) -> RunResult:
        """One request; a misbehaving program is a RunResult status, never an exception."""
        ...

    def run_many(self, requests: Sequence[RunRequest]) -> list[RunResult]:
        """Results in request order."""
        ...

    def close(self) -> None:
        ...


class SandboxPool:
    """`workers` concurrent sandboxes on this host (default: the number of usable cores)."""

    def __init__(self, workers: int | None = None, config: SandboxConfig | None = None):
        self.config = config or SandboxConfig()
        self.workers = workers or len(os.sched_getaffinity(0))
        if not 1 <= self.workers <= MAX_SLOTS:
            raise ValueError(f"SandboxPool(workers={self.workers}): must be between 1 and {MAX_SLOTS}")
        self._executor: ThreadPoolExecutor | None = None
        self._zygotes: list[Zygote] | None = None
        isolated = self.config.isolation == "bwrap"
        if isolated and not self.config.allow_unsafe:
            probe(require_bwrap(self.config), self.config)
        if isolated and self.config.start == "fork" and find_bwrap(self.config):
            self._start_zygotes(require_bwrap(self.config))
        self._slots: queue.SimpleQueue[int] = queue.SimpleQueue()
        for slot in range(self.workers):
            self._slots.put(slot)
        self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="sandbox")

    def _start_zygotes(self, bwrap: str) -> None:
        """One zygote per slot (each starts on its first request); the first one is tried now."""
        self._zygotes = [Zygote(bwrap, self.config, slot_uid(self.config, k)) for k in range(self.workers)]
        first = self._zygotes[0].run(RunRequest(code="pass"))
        if first.status != "ok":
            self.close()
            raise SandboxUnavailable(
                f"the sandbox zygote does not work on this host: {first.message or first.stderr[-300:]}; "
                "SandboxConfig(start='spawn') runs one bubblewrap per execution instead")

    def run(self, request: RunRequest) -> RunResult:
        slot = self._slots.get()
        try:
            if self._zygotes is not None:
                return self._zygotes[slot].run(request)
            return run(request, self.config, slot)
        finally:
            self._slots.put(slot)

    def run_many(self, requests: Sequence[RunRequest]) -> list[RunResult]:
        if self._executor is None:
            raise RuntimeError("SandboxPool is closed")
        return list(self._executor.map(self.run, requests))

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        for zygote in self._zygotes or ():
            zygote.close()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
