"""The `exact_match` verifier: 1 when the completion's \\boxed{...} answer is the task's answer.

Whitespace around the boxed text is ignored; case and inner spaces are not. A completion
that boxes two different answers scores 0 (hedging over candidates must not pay). A
completion without a box, or a task without an answer, scores 0 with the reason in its
details: a bad response is data, never an exception. `reference(task)` gives the
completion that must score full reward, which `polyrl audit` uses for its solvability,
negative-control, exploit and determinism checks.
"""

from __future__ import annotations

import re
from typing import Sequence

from polyrl.types import Score, Task

_BOX = re.compile(r"\\boxed\{([^{}]*)\}")


class ExactMatch:
    name = "exact_match"

    def __init__(self, strip: bool = True) -> None:
        """`strip`: ignore whitespace around the boxed answer."""
        self.strip = strip
        self._closed = False

    def score(self, tasks: Sequence[Task], responses: Sequence[object]) -> list[Score]:
        assert not self._closed, "exact_match: score after close"
        return [self._one(task, response) for task, response in zip(tasks, responses)]

    def _one(self, task: Task, response: object) -> Score:
        if task.answer is None:
            return Score(0.0, {"status": "task_error", "error": f"task {task.id!r} has no answer"})
        text = response if isinstance(response, str) else getattr(response, "answer", "") or ""
        boxes = _BOX.findall(text)
        if not boxes:
            return Score(0.0, {"status": "no_answer", "extracted": None})
        answers = {box.strip() if self.strip else box for box in boxes}
        if len(answers) > 1:
            return Score(0.0, {"status": "several_answers", "extracted": sorted(answers)})
        got = answers.pop()
        ok = got == task.answer
        return Score(float(ok), {"status": "correct" if ok else "wrong", "extracted": got})

    @staticmethod
    def reference(task: Task) -> str | None:
        return None if task.answer is None else f"\\boxed{{{task.answer}}}"

    def close(self) -> None:
        self._closed = True
