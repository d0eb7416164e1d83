"""The verifier contract: `(tasks, completions) -> scores`, batched.

A verifier never raises on a bad completion: unparsable answers, timeouts and sandbox
failures come back as a Score of 0 with details saying why. It may raise only for
programmer or user errors (a task without the fields the verifier needs).
"""

from __future__ import annotations

from typing import Protocol, Sequence

from polyrl.types import Score, Task


class Verifier(Protocol):
    name: str

    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[Score]:
        """One Score per (task, completion) pair, in order."""
        ...

    def close(self) -> None:
        """Release worker processes or sandboxes; scoring after close is an error."""
        ...
