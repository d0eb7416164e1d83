"""Stopping a training run on purpose: Ctrl-C (or SIGTERM) ends it at the next step boundary,
so it keeps every whole step; a second Ctrl-C stops it at once (KeyboardInterrupt), which
loses at most the step in flight, as a kill does.

    with StopAtStepBoundary(log) as stop:
        for step in range(start, steps):
            if stop.requested:
                log(stop.message(run_dir)); break
            ... the step, its lines, rd.save_state(...)

A full disk is the other clean stop: RunDir raises DiskFull (train/run_dir.py) before the
state names the step done, so `--resume` repeats that step once space is freed.

Out of scope: signals in threads other than the main one (there the handlers are not
installed and Ctrl-C is a plain KeyboardInterrupt), and stopping worker processes (their
owners close them on the way out).
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any, Callable


class StopAtStepBoundary:
    """A context manager: while inside, the first SIGINT/SIGTERM sets `requested`; the second
    SIGINT raises KeyboardInterrupt. The previous handlers come back on exit."""

    def __init__(self, log: Callable[[str], None] = print, signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)):
        self.log = log
        self.signals = signals
        self.requested = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        self.log("stopping after this step (Ctrl-C again to stop now, losing the step in flight)")

    def message(self, run_dir: str | Path) -> str:
        return f"stopped on request; continue with `polyrl train --resume {run_dir}`"

    def __enter__(self) -> "StopAtStepBoundary":
        if threading.current_thread() is threading.main_thread():
            for s in self.signals:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()
