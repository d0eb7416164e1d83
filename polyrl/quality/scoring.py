"""The audit's verifiers, and batched scoring through them with progress on stderr.

Every probe is scored by the task's real verifier (the one training would use), in big
batches per verifier: the sandbox pool runs a batch on all its workers at once. Three
settings of a verifier:

- "strict": its normal settings, for probes that must score full reward;
- "quick": short per-test and total timeouts (unit_test_pass only), for probes that
  must score below full or 0: a mutant that loops forever costs a second, and a timeout
  only makes such a probe fail sooner, never pass;
- "repeat": a fresh instance per call (unit_test_pass: it plans the task's check again,
  in new sandboxes), for the determinism check.

All unit_test_pass instances share one sandbox pool. A verifier that raises on a task
(a task it cannot grade) is a Score of 0 with status "verifier_error", not a crash.

Out of scope: which probes to score (audit.py), verifiers with options from a run file.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from typing import Callable, Sequence

from polyrl.rewards.base import Verifier
from polyrl.rewards.registry import get_verifier
from polyrl.types import Score, Task

Progress = Callable[[str], None]


def stderr_progress(message: str) -> None:
    print(f"audit: {message}", file=sys.stderr, flush=True)


class Scorer:
    def __init__(self, workers: int | None = None, per_test_timeout_s: float = 3.0, quick_timeout_s: float = 1.0,
                 chunk: int = 512, progress: Progress | None = stderr_progress) -> None:
        self.workers = workers
        self.per_test_timeout_s = per_test_timeout_s
        self.quick_timeout_s = quick_timeout_s
        self.chunk = chunk
        self.progress = progress or (lambda message: None)
        self.calls = 0
        """Completions scored so far (every probe, repeat and policy sample)."""
        self._pool = None
        self._verifiers: dict[tuple[str, str], Verifier] = {}

    def verifier(self, name: str, kind: str = "strict") -> Verifier:
        """The shared `kind` instance of verifier `name` ("repeat" gives a new one each call)."""
        if name != "unit_test_pass":
            kind = "strict"
        if kind != "repeat" and (name, kind) in self._verifiers:
            return self._verifiers[(name, kind)]
        if name == "unit_test_pass":
            from polyrl.rewards.unit_test_pass import UnitTestPass
            from polyrl.sandbox.pool import SandboxPool

            if self._pool is None:
                self._pool = SandboxPool(self.workers)
            timeout = self.quick_timeout_s if kind == "quick" else self.per_test_timeout_s
            verifier: Verifier = UnitTestPass(self._pool, per_test_timeout_s=timeout,
                                              total_timeout_s=max(10 * timeout, 5.0))
        elif name == "swe_patch":
            verifier = get_verifier(name, workers=self.workers)
        elif name == "answer_verify":
            verifier = get_verifier(name, workers=max(1, min(self.workers or 2, 4)))
        else:
            verifier = get_verifier(name)
        if kind != "repeat":
            self._verifiers[(name, kind)] = verifier
        return verifier

    def score(self, items: Sequence[tuple[str, Task, str]], kind: str, label: str) -> list[Score]:
        """Scores of (verifier name, task, completion) items, batched per verifier."""
        out: list[Score | None] = [None] * len(items)
        by_name: dict[str, list[int]] = defaultdict(list)
        for i, (name, _, _) in enumerate(items):
            by_name[name].append(i)
        for name, indices in by_name.items():
            verifier = self.verifier(name, kind)
            try:
                start = time.perf_counter()
                for lo in range(0, len(indices), self.chunk):
                    part = indices[lo:lo + self.chunk]
                    scores = _score_safely(verifier, [items[i][1] for i in part], [items[i][2] for i in part])
                    for i, score in zip(part, scores):
                        out[i] = score
                    if len(indices) > self.chunk:
                        self.progress(f"{label}: {min(lo + self.chunk, len(indices))}/{len(indices)} scored by {name} "
                                      f"({time.perf_counter() - start:.0f} s)")
            finally:
                if kind == "repeat" and name == "unit_test_pass":
                    verifier.close()
            self.calls += len(indices)
        return out  # type: ignore[return-value]

    def plans(self, tasks: Sequence[Task]) -> list:
        """unit_test_pass check plans of `tasks` (None where a task has none or it fails)."""
        if not tasks:
            return []
        verifier = self.verifier("unit_test_pass")
        try:
            return verifier.plan(tasks)  # type: ignore[attr-defined]
        except ValueError:
            return [_plan_one(verifier, t) for t in tasks]

    def close(self) -> None:
        for verifier in self._verifiers.values():
            verifier.close()
        self._verifiers.clear()
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def _plan_one(verifier: Verifier, task: Task):
    try:
        return verifier.plan([task])[0]  # type: ignore[attr-defined]
    except ValueError:
        return None


def _score_safely(verifier: Verifier, tasks: list[Task], completions: list[str]) -> list[Score]:
    """verifier.score, falling back to one task at a time when the batch raises."""
    try:
        return verifier.score(tasks, completions)
    except Exception:  # noqa: BLE001 -- find out which task makes it raise
        out = []
        for task, completion in zip(tasks, completions):
            try:
                out.append(verifier.score([task], [completion])[0])
            except Exception as err:  # noqa: BLE001 -- a task the verifier cannot grade is a finding
                out.append(Score(0.0, {"status": "verifier_error", "error": f"{type(err).__name__}: {err}"}))
        return out
