"""success_minus_cost: did the agent get the answer, and what did it spend getting there.

    reward = success - min(max_cost, alpha * steps + beta * tokens)

`success` is 1 when the episode's final answer matches the task's answer after
normalisation (case, surrounding whitespace and punctuation, a leading article;
numbers compare by value, so "36" = "36.0"), else 0. `steps` counts model calls and
`tokens` the prompt + completion tokens of all of them (what a budget charges).

The cost cap `max_cost` (< 1) makes any success worth more than any failure. With
`gate_cost_on_success` (default) a failure scores 0 whatever it spent, so a failing
policy is not pushed to quit early rather than to succeed (a cost charged to failures too
rewards giving up cheaply);
without it a failure scores -cost, and rewards lie in [-max_cost, 1].

What it grades is an `EpisodeOutcome` (polyrl/agent/outcome.py): the answer, the calls
and the tokens, as training's rollouts pass it. From a file (`polyrl score`) a response
is text: an episode record as `AgentResult.to_completion()` writes it,

    {"answer": "36", "steps": 3, "tokens": 412, ...}

read by `EpisodeOutcome.from_json`, or a plain final message, whose answer is the
<answer> block or, without one, the whole text (steps and tokens 0). A record with
unreadable counts scores 0 with status "malformed".

Out of scope: checking the world's final state (agent tasks here are read-only) and
partial credit for the right tool calls (ToolRL-style); costs relative to the task's
optimal step count are left to a later option.
"""

from __future__ import annotations

import math
import re
from typing import Sequence

from polyrl.agent.call_format import parse_answer
from polyrl.agent.outcome import EpisodeOutcome
from polyrl.types import Score, Task

_EDGE = re.compile(r"^[\s\"'`.,;:!?()\[\]]+|[\s\"'`.,;:!?()\[\]]+$")


def normalize_answer(text: str) -> str:
    text = " ".join(text.lower().split())
    text = _EDGE.sub("", text)
    return re.sub(r"^(a|an|the) ", "", text)


def answers_match(gold: str, answer: str | None) -> bool:
    if answer is None:
        return False
    g, a = normalize_answer(gold), normalize_answer(answer)
    try:
        return math.isclose(float(g), float(a), rel_tol=0, abs_tol=1e-9)
    except ValueError:
        return g == a


def read_response(response: str | EpisodeOutcome) -> EpisodeOutcome:
    """The outcome to grade: as given, from an episode record, or from a plain final message.
    A record with unreadable counts is a ValueError."""
    if isinstance(response, EpisodeOutcome):
        return response
    outcome = EpisodeOutcome.from_json(response)
    if outcome is not None:
        return outcome
    answer = parse_answer(response)
    return EpisodeOutcome(answer if answer is not None else response.strip())


class CostRule:
    """reward = success - min(max_cost, alpha * units + beta * tokens), gated or not: the rule
    success_minus_cost applies to model calls, and world_state to tool calls beyond the minimum."""

    def __init__(self, verifier: str, alpha: float, beta: float, max_cost: float, gate_cost_on_success: bool) -> None:
        if alpha < 0 or beta < 0:
            raise ValueError(f"{verifier}: alpha and beta must be >= 0, got alpha={alpha}, beta={beta}")
        if not 0 <= max_cost < 1:
            raise ValueError(f"{verifier}: max_cost must be in [0, 1), got {max_cost}")
        self.alpha, self.beta, self.max_cost = alpha, beta, max_cost
        self.gate_cost_on_success = gate_cost_on_success

    def cost(self, units: int, tokens: int) -> float:
        return min(self.max_cost, self.alpha * units + self.beta * tokens)

    def reward(self, success: bool, cost: float) -> float:
        return (1.0 - cost) if success else (0.0 if self.gate_cost_on_success else -cost)


class SuccessMinusCost:
    name = "success_minus_cost"

    def __init__(self, alpha: float = 0.02, beta: float = 1e-4, max_cost: float = 0.5,
                 gate_cost_on_success: bool = True) -> None:
        """alpha: cost per model call; beta: cost per token (prompt + completion);
        max_cost: cap on the total cost, below 1; gate_cost_on_success: failures score 0."""
        self.rule = CostRule(self.name, alpha, beta, max_cost, gate_cost_on_success)
        self.alpha, self.beta, self.max_cost = alpha, beta, max_cost
        self.gate_cost_on_success = gate_cost_on_success

    def score(self, tasks: Sequence[Task], responses: Sequence[str | EpisodeOutcome]) -> list[Score]:
        if len(tasks) != len(responses):
            raise ValueError(f"{len(tasks)} tasks but {len(responses)} responses")
        return [self._one(t, r) for t, r in zip(tasks, responses)]

    def _one(self, task: Task, response: str | EpisodeOutcome) -> Score:
        if task.answer is None:
            raise ValueError(f"task {task.id!r}: success_minus_cost needs the task's 'answer'")
        try:
            outcome = read_response(response)
        except ValueError as err:
            return Score(0.0, {"status": "malformed", "error": str(err)})
        success = answers_match(task.answer, outcome.answer)
        cost = self.rule.cost(outcome.steps, outcome.tokens)
        value = self.rule.reward(success, cost)
        details = {"status": "success" if success else ("no_answer" if outcome.answer is None else "wrong"),
                   "success": success, "answer": outcome.answer, "expected": task.answer,
                   "steps": outcome.steps, "tokens": outcome.tokens, "cost": round(cost, 6)}
        if outcome.stop_reason is not None:
            details["stop_reason"] = outcome.stop_reason
        return Score(value, details)

    def close(self) -> None:
        pass
