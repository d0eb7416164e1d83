"""success_minus_cost: did the agent get the answer, and what did it spend getting there.

    reward = success - min(max_cost, alpha * steps + beta * tokens)

`success` is 1 when the episode's final answer matches the task's answer after
normalisation (case, surrounding whitespace and punctuation, a leading article;
numbers compare by value, so "36" = "36.0"), else 0. `steps` counts model calls and
`tokens` the prompt + completion tokens of all of them (what a budget charges).

The cost cap `max_cost` (< 1) makes any success worth more than any failure. With
`gate_cost_on_success` (default) a failure scores 0 whatever it spent, so a failing
policy is not pushed to quit early rather than to succeed (agent_rl.md section 3);
without it a failure scores -cost, and rewards lie in [-max_cost, 1].

A completion is what `AgentResult.to_completion()` writes, a JSON object:

    {"answer": "36", "steps": 3, "tokens": 412, ...}

A plain string is also accepted (e.g. a final message graded with `polyrl score`):
its answer is the <answer> block or, without one, the whole text; steps and tokens
are then 0. An unreadable completion scores 0 with status "malformed".

Out of scope: checking the world's final state (agent tasks here are read-only) and
partial credit for the right tool calls (ToolRL-style); costs relative to the task's
optimal step count are left to a later option.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Sequence

from polyrl.agent.call_format import parse_answer
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


def read_completion(completion: str) -> dict[str, Any] | None:
    """The reward inputs of a completion: {"answer", "steps", "tokens", ...}; None if unreadable."""
    stripped = completion.strip()
    if stripped.startswith("{"):
        try:
            obj = json.loads(stripped)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and "answer" in obj:
            steps, tokens = obj.get("steps", 0), obj.get("tokens", 0)
            if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (steps, tokens)):
                return None
            answer = obj["answer"]
            return {**obj, "answer": None if answer is None else str(answer)}
    answer = parse_answer(completion)
    return {"answer": answer if answer is not None else stripped, "steps": 0, "tokens": 0}


class SuccessMinusCost:
    name = "success_minus_cost"

    def __init__(self, alpha: float = 0.02, beta: float = 1e-4, max_cost: float = 0.5,
                 gate_cost_on_success: bool = True) -> None:
        """alpha: cost per model call; beta: cost per token (prompt + completion);
        max_cost: cap on the total cost, below 1; gate_cost_on_success: failures score 0."""
        if alpha < 0 or beta < 0:
            raise ValueError(f"success_minus_cost: alpha and beta must be >= 0, got alpha={alpha}, beta={beta}")
        if not 0 <= max_cost < 1:
            raise ValueError(f"success_minus_cost: max_cost must be in [0, 1), got {max_cost}")
        self.alpha, self.beta, self.max_cost = alpha, beta, max_cost
        self.gate_cost_on_success = gate_cost_on_success

    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[Score]:
        if len(tasks) != len(completions):
            raise ValueError(f"{len(tasks)} tasks but {len(completions)} completions")
        return [self._one(t, c) for t, c in zip(tasks, completions)]

    def _one(self, task: Task, completion: str) -> Score:
        if task.answer is None:
            raise ValueError(f"task {task.id!r}: success_minus_cost needs the task's 'answer'")
        inputs = read_completion(completion)
        if inputs is None:
            return Score(0.0, {"status": "malformed", "error": "completion is not an episode record or text"})
        success = answers_match(task.answer, inputs["answer"])
        cost = min(self.max_cost, self.alpha * inputs["steps"] + self.beta * inputs["tokens"])
        value = (1.0 - cost) if success else (0.0 if self.gate_cost_on_success else -cost)
        details = {"status": "success" if success else ("no_answer" if inputs["answer"] is None else "wrong"),
                   "success": success, "answer": inputs["answer"], "expected": task.answer,
                   "steps": inputs["steps"], "tokens": inputs["tokens"], "cost": round(cost, 6)}
        if "stop_reason" in inputs:
            details["stop_reason"] = inputs["stop_reason"]
        return Score(value, details)

    def close(self) -> None:
        pass
