"""What an audit says about one task: findings, and the task's status derived from them.

A finding names its check (one of CHECKS), says what is wrong in one sentence a task
author can act on, and carries a severity: "fail" (the task must not be trained on as it
is: its reward is wrong, gameable or uncomputable) or "warn" (worth a look: a surviving
mutant, a task nobody solves). A task's status is "fail" if any finding fails, else
"warn" if any warns, else "pass".

Out of scope: running checks (audit.py and the probe modules do) and printing (report.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Severity = Literal["fail", "warn"]

CHECKS = (
    # hygiene: static, no verifier involved
    "malformed_line", "empty_prompt", "duplicate", "split_overlap", "tests_compile", "empty_tests",
    "contradictory_tests", "unparsable_answer", "leaked_answer",
    # through the real verifiers
    "solvability", "negative_control", "mutant", "exploit", "false_negative", "determinism", "difficulty",
    "verifier",
)
"""Every check name a finding may carry, in report order."""


@dataclass(frozen=True)
class Finding:
    check: str
    message: str
    severity: Severity = "fail"

    def __post_init__(self) -> None:
        assert self.check in CHECKS, f"unknown check {self.check!r}"
        assert self.severity in ("fail", "warn"), self.severity

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "message": self.message, "severity": self.severity}


@dataclass
class TaskAudit:
    """One pack line's audit. `id` is None for a line that did not load as a task."""

    id: str | None
    line: int | None
    """1-based pack line; for a built-in domain, the task's position in the audited sample."""
    domain: str | None = None
    findings: list[Finding] = field(default_factory=list)
    difficulty: dict[str, Any] | None = None
    """With a policy: samples, solved, pass@1, pass@k."""

    def add(self, check: str, message: str, severity: Severity = "fail") -> None:
        self.findings.append(Finding(check, message, severity))

    def has(self, check: str) -> bool:
        return any(f.check == check for f in self.findings)

    @property
    def status(self) -> str:
        severities = {f.severity for f in self.findings}
        return "fail" if "fail" in severities else "warn" if "warn" in severities else "pass"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "line": self.line, "status": self.status,
                               "findings": [f.to_json() for f in self.findings]}
        if self.domain is not None:
            out["domain"] = self.domain
        if self.difficulty is not None:
            out["difficulty"] = self.difficulty
        return out
