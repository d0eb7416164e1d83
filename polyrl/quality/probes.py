"""A probe: one completion the audit scores with the task's real verifier, and what its
reward must be for the task to be sound.

Expectations:
- "full": must score full reward (the reference, equivalent rewrites of it);
- "below": must score less than full reward (negative controls, mutants): otherwise
  the tests cannot tell this wrong answer from a right one;
- "zero": must score 0 (exploits: any reward at all means the reward can be gamed);
- "partial": must score above 0 and below full (a right but costly answer: a cost the
  verifier charges must lower the reward without zeroing it).

Probes that must fail run on a verifier with short per-test timeouts (a mutant that
loops forever costs little; timing out only makes it fail sooner, never pass); probes
that must pass run with the verifier's normal timeouts.

Out of scope: which probes a task gets (code_probes.py, math_probes.py) and the
orchestration (audit.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from polyrl.quality.findings import Finding
from polyrl.types import Score

Expect = Literal["full", "below", "zero", "partial"]


@dataclass(frozen=True)
class Probe:
    check: str
    """The finding's check when the expectation does not hold."""
    name: str
    """What the completion is, in a few words: "constant return None", "sys.exit(0)"."""
    completion: str
    expect: Expect

    @property
    def must_pass(self) -> bool:
        return self.expect == "full"


def holds(probe: Probe, value: float) -> bool:
    if probe.expect == "full":
        return value >= 1.0
    if probe.expect == "below":
        return value < 1.0
    if probe.expect == "partial":
        return 0.0 < value < 1.0
    return value == 0.0


def why(score: Score) -> str:
    """A short reason for a score, from its details: status and the first failing test."""
    details = score.details
    parts = [str(details.get("status", "?"))]
    if details.get("error"):
        parts.append(str(details["error"])[:160])
    failing = [t for t in details.get("tests", []) if not t.get("passed")]
    if failing:
        first = failing[0]
        parts.append(f"{first['name']} {first['status']}" + (f": {first['detail'][:120]}" if first.get("detail") else ""))
    if "passed" in details and "total" in details:
        parts.append(f"{details['passed']}/{details['total']} tests")
    if details.get("extracted") is not None:
        parts.append(f"extracted {str(details['extracted'])[:60]!r}")
    return ", ".join(parts)


def findings_for(probes: list[Probe], scores: list[Score]) -> list[Finding]:
    """One finding per check whose expectations do not all hold, naming the probes that broke them."""
    broken: dict[str, list[str]] = {}
    total: dict[str, int] = {}
    for probe, score in zip(probes, scores):
        total[probe.check] = total.get(probe.check, 0) + 1
        if not holds(probe, score.value):
            verb = {"full": "scores only", "below": "scores full reward", "zero": "scores",
                    "partial": "scores"}[probe.expect]
            shown = f"{score.value:g}" if probe.expect != "below" else ""
            broken.setdefault(probe.check, []).append(f"{probe.name} {verb} {shown}".rstrip()
                                                     + (f" ({why(score)})" if probe.expect == "full" else ""))
    out = []
    for check, items in broken.items():
        if check == "mutant":
            message = (f"{len(items)} of {total[check]} mutants of the reference score full reward "
                       f"(the tests may not pin these down): " + "; ".join(items))
            out.append(Finding(check, message, "warn"))
        else:
            out.append(Finding(check, _lead(check) + "; ".join(items)))
    return out


def _lead(check: str) -> str:
    return {
        "negative_control": "a wrong answer gets full reward, the tests are too weak: ",
        "exploit": "the reward can be gamed: ",
        "false_negative": "an equivalent answer is rejected: ",
        "leaked_answer": "the prompt gives the answer away: ",
        "cost": "a costlier right answer is not charged, or is zeroed: ",
    }.get(check, "")
