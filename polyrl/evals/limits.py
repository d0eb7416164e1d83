"""The limits a task runs under, and how a suite line can tighten or loosen them.

One `EvalLimits` per run (from the command line), overridden field by field by a task's
`metadata.limits` (a business knows that its refund task runs with a 600-token budget in
production). Attribution (attribution.py) lifts one limit at a time: a copy with a larger
window, budget or max_tokens, raw tool results, or a format reminder in the prompt.

Out of scope: limits on money (the price card prices a run after the fact) and on
concurrent calls (tasks run one after another).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

Window = int | Literal["model", "unlimited"]


class EvalLimits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int = Field(256, ge=1)
    """Completion tokens of a single-turn task's one call (math, code, ...)."""
    agent_max_tokens: int = Field(64, ge=1)
    """Completion tokens of each model call of an agent episode."""
    conclusion_tokens: int = Field(32, ge=1)
    """max_tokens of the stage-conclusion call after an agent stops on budget or steps."""
    max_steps: int = Field(8, ge=1)
    """Model calls an agent episode may make before it must answer."""
    budget: int | None = Field(None, ge=1)
    """Token budget of an agent episode (prompt + completion of every call); None = none."""
    result_chars: int | None = Field(400, ge=1)
    """Cap on each tool result the model is shown (head and tail kept); None = raw results."""
    context_window: Window = "model"
    """Prompt + completion tokens a call may take: "model" = the model's own window (unknown
    for endpoints), an integer = that many (a production limit), "unlimited" = no check."""
    timeout_s: float | None = Field(None, gt=0)
    """Wall-clock limit of one agent episode; None = none."""
    prompt_suffix: str = ""
    """Text appended to the task's prompt (attribution's format reminder; empty normally)."""

    def with_overrides(self, overrides: dict[str, Any]) -> "EvalLimits":
        """These limits with `overrides` applied (ValueError naming the field when invalid)."""
        if not overrides:
            return self
        try:
            return EvalLimits.model_validate({**self.model_dump(), **overrides})
        except ValidationError as err:
            first = err.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "limits"
            raise ValueError(f"limits.{field}: {first['msg']}") from None

    def changed(self, other: "EvalLimits") -> dict[str, Any]:
        """{field: value in `other`} for every field where `other` differs from these limits."""
        mine, theirs = self.model_dump(), other.model_dump()
        return {k: theirs[k] for k in theirs if theirs[k] != mine[k]}
