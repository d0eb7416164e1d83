"""Cores split between the trainer and the roles beside it, so that overlapped phases stop
taking turns on the same core.

    split = CoreSplit.halves(os.sched_getaffinity(0))   # trainer: the first half, roles: the rest
    undo = split.apply()     # this process's threads -> trainer cores; its child processes -> role cores
    split.pin_role_thread()  # called by a role's own thread (stream.py) when it starts
    undo()                   # this process's threads and torch's thread count as they were

With `trainer.max_staleness` > 0 the rollout of the next step runs while the trainer updates.
On a machine with few cores every phase then shares every core: the engine workers, the
sandboxes and the trainer's torch threads are scheduled onto the same cores in turn, and each
phase slows (BENCHMARKS.md, the pipeline: the update 0.38 s -> 0.98 s a step on 2 cores).
Splitting the cores gives each side cores of its own: the trainer's threads on one part, the
engine worker processes, the sandboxes and the role threads on the other. On the 2-core
CPU that made K = 1 run at 0.78x of the synchronous loop instead of 0.74x: each phase then
has one core where it had two (BENCHMARKS.md, the pipeline). It is for runs with K > 0 on a
CPU with cores to spare, not a way to beat K = 0 on two.

Affinity is set per thread on Linux (`sched_setaffinity` on a thread id); a thread or a
process started later inherits the affinity of the thread that starts it. So `apply` sets
every thread of this process, and every thread of every process below it (engine workers,
sandbox zygotes), and the role threads set their own when they start. The trainer's torch
threads are limited to its cores' number.

Out of scope: other operating systems (`available()` is False there, and nothing is pinned),
the Ray backend (its actors are processes of their own, placed by Ray's resources).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from polyrl.sandbox.process import children_of


def available() -> bool:
    return hasattr(os, "sched_setaffinity") and Path("/proc/self/task").is_dir()


@dataclass(frozen=True)
class CoreSplit:
    trainer: frozenset[int]
    roles: frozenset[int]

    @classmethod
    def halves(cls, cores: set[int] | frozenset[int]) -> CoreSplit | None:
        """The trainer on the first half of `cores` (rounded up), the roles on the rest; None
        when there is only one core to split."""
        ordered = sorted(cores)
        if len(ordered) < 2:
            return None
        cut = (len(ordered) + 1) // 2
        return cls(frozenset(ordered[:cut]), frozenset(ordered[cut:]))

    def apply(self) -> Callable[[], None]:
        """This process's threads onto the trainer's cores (torch's threads limited to them), and
        every process below this one onto the roles' cores; returns what puts this process's
        threads back on the cores they had and torch's thread count as it was."""
        import torch

        cores, threads = frozenset(os.sched_getaffinity(0)), torch.get_num_threads()
        torch.set_num_threads(len(self.trainer))
        _pin_threads(os.getpid(), self.trainer)
        for pid in _descendants(os.getpid()):
            _pin_threads(pid, self.roles)

        def undo() -> None:
            _pin_threads(os.getpid(), cores)
            torch.set_num_threads(threads)

        return undo

    def pin_role_thread(self) -> None:
        """The calling thread (and what it starts from now on) onto the roles' cores."""
        os.sched_setaffinity(0, self.roles)


def _pin_threads(pid: int, cores: frozenset[int]) -> None:
    """Every thread of process `pid` onto `cores`; a thread or process gone meanwhile is skipped."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:
            pass


def _descendants(root: int) -> list[int]:
    """The pids of every process below `root`."""
    out, todo = [], [root]
    while todo:
        for child in children_of(todo.pop()):
            out.append(child)
            todo.append(child)
    return out
