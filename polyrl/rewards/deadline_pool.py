"""Run a function over items in worker processes, with a hard per-item deadline.

Why: some checks (symbolic math, parsers) can hang on adversarial input, and in-process
timeouts (signal.alarm) only work in the main thread and cannot interrupt C code. Here
the parent owns the clock: it waits at most `timeout_s` for each item's result and, on
expiry, kills the worker (SIGKILL), starts a fresh one and carries on with the rest.

Shape: one duplex `Connection` (over a socket pair) per worker. `map` splits the items into one contiguous chunk per
worker and sends each chunk in one message (so a batch costs one round trip per worker);
the worker answers item by item, and the clock for an item starts when the previous
answer of that worker arrived (or the chunk was sent). The clock is generous, never
unfair: a parent that is busy elsewhere only gives items more time.

Workers are fresh interpreters (`sys.executable`, like multiprocessing's 'spawn') but
started with subprocess rather than multiprocessing, so the caller's main script is
never re-imported in them: scripts need no `if __name__ == "__main__"` guard, and a
worker inherits no threads or locks. `fn`, `initializer` and the items are pickled, so
the functions must live at the top level of an importable module (not `__main__`).

Out of scope: isolation. Workers run as the same user with no resource limits; code
execution goes through `polyrl.sandbox`.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Literal, Sequence

OutcomeStatus = Literal["ok", "error", "timeout", "crashed"]


@dataclass
class Outcome:
    """What happened to one item: "ok" (value holds fn's result), "error" (fn raised;
    error holds the exception), "timeout" (past the deadline; the worker was killed) or
    "crashed" (the worker died, e.g. out of memory)."""

    status: OutcomeStatus
    value: Any = None
    error: str = ""


# Runs in the fresh interpreter: take the parent's sys.path first, so that `fn`'s
# module (and polyrl itself) import exactly as they do in the parent.
_BOOTSTRAP = (
    "import sys\n"
    "from multiprocessing.connection import Connection\n"
    "conn = Connection(int(sys.argv[1]))\n"
    "sys.path[:] = conn.recv()\n"
    "from polyrl.rewards.deadline_pool import _worker_main\n"
    "_worker_main(conn)\n"
)


def _worker_main(conn: Connection) -> None:
    # Ctrl-C reaches the whole process group; the parent decides what happens to us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fn, initializer = conn.recv()
    if initializer is not None:
        initializer()
    conn.send("ready")
    while True:
        try:
            batch = conn.recv()
        except EOFError:  # the parent closed us or exited
            return
        for index, item in batch:
            try:
                conn.send((index, "ok", fn(item), ""))
            except Exception as exc:  # noqa: BLE001 -- any failure of fn is a value
                conn.send((index, "error", None, f"{type(exc).__name__}: {exc}"))


@dataclass
class _Worker:
    process: subprocess.Popen
    conn: Connection


def _stop(worker: _Worker) -> None:
    worker.process.kill()
    worker.process.wait()
    worker.conn.close()


def _stop_all(workers: list[_Worker]) -> None:
    while workers:
        _stop(workers.pop())


class DeadlinePool:
    """`map(items) -> [Outcome]`, each item given at most `timeout_s` seconds.

    Workers start lazily on the first `map` and are reused; `close()` (or garbage
    collection, or interpreter exit) kills them. `initializer` runs once in each new
    worker before it reports ready (heavy imports belong there, so they do not eat into
    the first item's deadline); a worker gets `start_timeout_s` to become ready, and one
    that does not is an infrastructure failure: `map` raises RuntimeError.
    """

    def __init__(
        self,
        fn: Callable[[Any], Any],
        workers: int = 1,
        timeout_s: float = 5.0,
        initializer: Callable[[], None] | None = None,
        start_timeout_s: float = 60.0,
    ) -> None:
        assert workers >= 1 and timeout_s > 0
        for f in (fn, initializer):
            assert getattr(f, "__module__", None) != "__main__", (
                f"{f!r} is defined in __main__; pool workers can only import functions "
                "from importable modules"
            )
        self.fn = fn
        self.num_workers = workers
        self.timeout_s = timeout_s
        self.initializer = initializer
        self.start_timeout_s = start_timeout_s
        self._workers: list[_Worker] = []
        self._closed = False
        self._finalizer = weakref.finalize(self, _stop_all, self._workers)

    def map(self, items: Sequence[Any]) -> list[Outcome]:
        if self._closed:
            raise RuntimeError("DeadlinePool.map after close()")
        if not items:
            return []
        try:
            return self._map(items)
        except BaseException:
            # Interrupted half way (Ctrl-C, a worker that cannot start): pipes may hold
            # stale answers, so the next call starts from fresh workers.
            _stop_all(self._workers)
            raise

    def close(self) -> None:
        self._closed = True
        self._finalizer()

    def __enter__(self) -> DeadlinePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------

    def _map(self, items: Sequence[Any]) -> list[Outcome]:
        while len(self._workers) < self.num_workers:
            self._workers.append(self._start_worker())

        outcomes: list[Outcome | None] = [None] * len(items)
        per_worker = -(-len(items) // len(self._workers))
        # worker slot -> indices still owed by that worker, in the order it runs them
        pending: dict[int, list[int]] = {}
        started: dict[int, float] = {}
        for slot in range(len(self._workers)):
            chunk = list(range(slot * per_worker, min(len(items), (slot + 1) * per_worker)))
            if chunk:
                pending[slot] = chunk
                self._send(slot, chunk, items)
                started[slot] = time.monotonic()

        while pending:
            by_conn = {self._workers[slot].conn: slot for slot in pending}
            deadline = min(started[slot] for slot in pending) + self.timeout_s
            ready = wait(list(by_conn), timeout=max(0.0, deadline - time.monotonic()))
            for conn in ready:
                slot = by_conn[conn]
                try:
                    index, status, value, error = conn.recv()
                except (EOFError, OSError):
                    self._replace(slot, pending, items, outcomes, Outcome("crashed", error="worker died"))
                else:
                    assert index == pending[slot][0], "worker answered out of order"
                    outcomes[pending[slot].pop(0)] = Outcome(status, value, error)
                    if not pending[slot]:
                        del pending[slot]
                started[slot] = time.monotonic()
            now = time.monotonic()
            for slot in list(pending):
                if now - started[slot] >= self.timeout_s and not self._workers[slot].conn.poll(0):
                    self._replace(
                        slot, pending, items, outcomes,
                        Outcome("timeout", error=f"no result within {self.timeout_s:g}s"),
                    )
                    started[slot] = time.monotonic()

        assert all(o is not None for o in outcomes)
        return outcomes  # type: ignore[return-value]

    def _start_worker(self) -> _Worker:
        parent_sock, child_sock = socket.socketpair()
        with child_sock:
            process = subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP, str(child_sock.fileno())],
                pass_fds=(child_sock.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=2,  # keep the parent's stdout clean (`polyrl score --json`)
            )
        worker = _Worker(process, Connection(parent_sock.detach()))
        try:
            worker.conn.send(sys.path)
            worker.conn.send((self.fn, self.initializer))
            if not worker.conn.poll(self.start_timeout_s) or worker.conn.recv() != "ready":
                raise RuntimeError(f"not ready within {self.start_timeout_s:g}s")
        except (EOFError, OSError, RuntimeError) as exc:
            _stop(worker)
            raise RuntimeError(f"pool worker failed to start: {exc or type(exc).__name__}") from exc
        return worker

    def _send(self, slot: int, indices: list[int], items: Sequence[Any]) -> None:
        self._workers[slot].conn.send([(i, items[i]) for i in indices])

    def _replace(
        self,
        slot: int,
        pending: dict[int, list[int]],
        items: Sequence[Any],
        outcomes: list[Outcome | None],
        lost: Outcome,
    ) -> None:
        """The worker in `slot` is stuck or dead: record `lost` for the item it was on,
        start a fresh worker and hand it the rest of the chunk."""
        _stop(self._workers[slot])
        self._workers[slot] = self._start_worker()
        outcomes[pending[slot].pop(0)] = lost
        if pending[slot]:
            self._send(slot, pending[slot], items)
        else:
            del pending[slot]
