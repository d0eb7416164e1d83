"""The verifier contract: `(tasks, responses) -> scores`, batched.

A response is what a sample comes to: the completion's text for a single-turn sample,
an `EpisodeOutcome` (the answer and its costs) for an agent episode. Verifiers of text
(answer_verify, unit_test_pass, preference_model, rule_check) take text; the agent
domains' verifier (success_minus_cost) takes either.

A verifier never raises on a bad response: unparsable answers, timeouts and sandbox
failures come back as a Score of 0 with details saying why. It may raise only for
programmer or user errors (a task without the fields the verifier needs).
"""

from __future__ import annotations

from typing import Protocol, Sequence, Union

from polyrl.agent.outcome import EpisodeOutcome
from polyrl.types import Score, Task

Response = Union[str, EpisodeOutcome]


class Verifier(Protocol):
    name: str

    def score(self, tasks: Sequence[Task], responses: Sequence[Response]) -> list[Score]:
        """One Score per (task, response) pair, in order."""
        ...

    def close(self) -> None:
        """Release worker processes or sandboxes; scoring after close is an error."""
        ...
