"""Why a failed task failed: engineering (a limit we set) or capability (the model).

Evidence is read off the failed TaskRun (runner.py), one kind per way a limit can cause a
failure, each with the lift that removes it:

    kind                     evidence                                          lift
    prompt_overflow          the prompt did not fit the window (not sent, or   context_window: unlimited
                             an agent loop that could not fit even compressed)
    context_compressed       the loop summarised old turns to fit the window   context_window: unlimited
                             (or what was left of the budget)                  (budget: None)
    context_truncated        the loop cut tool results to fit, likewise        likewise
    tool_result_truncated    a tool result was shown cut at the result cap     result_chars: None (raw)
    tool_result_unparseable  ... and it was JSON, which the cut left unreadable result_chars: None (raw)
    budget_exhausted         the token budget ran out                          budget: None
    step_limit               the episode hit max_steps                         max_steps x 2
    timeout                  the episode ran out of time                       timeout_s: None
    output_cut               a reply stopped at max_tokens ("length")          max_tokens x 4 (+ window
                                                                               when the window clamped it)
    answer_format            the verifier found no answer in the expected      a format reminder appended
                             form (answer_verify: no_answer, empty,            to the prompt
                             unparsable; unit_test_pass: load_error)
    model_error              the call itself failed (transport, KV pool)       the same run again

Shrinking forced by the budget on an episode that then stopped on the budget is reported
as budget_exhausted alone (one cause, not three). A failure with evidence is re-run once
with every implicated limit lifted together. The label is "engineering" only if that
re-run succeeds (the outcome flips); otherwise it is "capability", and the evidence stays
on record as not confirmed. A failure without
evidence is "capability" without a re-run. Grading never changes: the re-run is graded by
the same verifier; only the limits (or, for answer_format, the prompt) differ.

Out of scope: lifting one limit at a time to find which one mattered (one re-run per
failure keeps the cost of attribution to at most one extra run per failed task), and
attributing a success (nothing to explain).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from polyrl.evals.limits import EvalLimits
from polyrl.evals.runner import TaskRun

ENGINEERING, CAPABILITY = "engineering", "capability"
KINDS = ("prompt_overflow", "context_compressed", "context_truncated", "tool_result_truncated",
         "tool_result_unparseable", "budget_exhausted", "step_limit", "timeout", "output_cut", "answer_format",
         "model_error")
FORMAT_STATUSES = {"answer_verify": ("no_answer", "empty", "unparsable"), "unit_test_pass": ("load_error",)}
FORMAT_HINTS = {
    "answer_verify": "\n\nEnd with the final answer in the form \\boxed{ANSWER}.",
    "unit_test_pass": "\n\nReply with the whole function in one ```python code block.",
}


@dataclass(frozen=True)
class Evidence:
    kind: str
    """One of KINDS."""
    detail: str
    limits: tuple[str, ...] = ()
    """The EvalLimits fields it implicates, which the re-run lifts ("prompt" for the format
    reminder; empty for a failed call, which is re-run as it was)."""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "detail": self.detail, "limits": list(self.limits)}


@dataclass
class Attribution:
    label: str
    """ENGINEERING (evidence, and the re-run with its limits lifted succeeded) or CAPABILITY."""
    evidence: list[Evidence]
    lifted: dict[str, Any] = field(default_factory=dict)
    """The limits the re-run changed, {field: new value}; empty when there was no re-run."""
    rerun: TaskRun | None = None
    """The re-run with those limits lifted; None when there was no evidence to test."""

    @property
    def tested(self) -> bool:
        return self.rerun is not None

    @property
    def flipped(self) -> bool | None:
        """Did lifting the limits turn the failure into a success? None when untested."""
        return None if self.rerun is None else self.rerun.success

    def to_json(self) -> dict[str, Any]:
        rerun = None
        if self.rerun is not None:
            r = self.rerun
            rerun = {"success": r.success, "reward": r.score.value, "status": r.score.details.get("status"),
                     "stop_reason": r.stop_reason, "tokens_in": r.input_tokens, "tokens_out": r.output_tokens,
                     "model_calls": r.model_calls, "latency_s": round(r.latency_s, 6)}
        return {"label": self.label, "evidence": [e.to_json() for e in self.evidence], "tested": self.tested,
                "flipped": self.flipped, "lifted": self.lifted, "rerun": rerun}


def find_evidence(run: TaskRun) -> list[Evidence]:
    """Every engineering cause visible in a failed run, in KINDS order."""
    found: list[Evidence] = []
    budget_stop = run.stop_reason == "budget" and run.budget_limit is not None
    if run.stop_reason == "context_overflow":
        found.append(Evidence("prompt_overflow", f"the prompt needs {run.trajectory.get('prompt_tokens')} tokens; "
                                                 f"the window is {run.window}", ("context_window",)))
    elif run.stop_reason == "budget" and run.budget_limit is None:
        found.append(Evidence("prompt_overflow", "the prompt did not fit the window even fully compressed",
                              ("context_window",)))
    for action in ("compress", "truncate"):
        fits = [e for e in run.events if e["event"] == f"context.{action}"]
        by_window = [e for e in fits if _over_window(run, e)]
        by_budget = [e for e in fits if not _over_window(run, e)]
        kind = "context_compressed" if action == "compress" else "context_truncated"
        what = "old turns summarised" if action == "compress" else "tool results cut to the tight cap"
        if by_window:
            found.append(Evidence(kind, f"{what} to fit the window of {run.window}", ("context_window",)))
        if by_budget and not budget_stop:  # on a budget stop they are part of that story
            found.append(Evidence(kind, f"{what} to fit what was left of the budget", ("budget",)))
    cut = [r for r in run.tool_results if r.truncated]
    if cut:
        worst = max(cut, key=lambda r: r.chars)
        found.append(Evidence("tool_result_truncated", f"{len(cut)} tool result(s) shown cut, e.g. {worst.tool}: "
                                                       f"{worst.chars} chars shown as {worst.shown_chars}",
                              ("result_chars",)))
        broken = [r for r in cut if r.structured]
        if broken:
            found.append(Evidence("tool_result_unparseable", f"{len(broken)} JSON tool result(s) no longer parse "
                                                             f"once cut", ("result_chars",)))
    if budget_stop:
        found.append(Evidence("budget_exhausted", f"spent {run.budget_spent} of {run.budget_limit} tokens",
                              ("budget",)))
    if run.stop_reason == "max_steps":
        found.append(Evidence("step_limit", f"stopped at max_steps={run.limits.max_steps}", ("max_steps",)))
    if run.stop_reason == "timeout":
        found.append(Evidence("timeout", f"stopped at timeout_s={run.limits.timeout_s}", ("timeout_s",)))
    cut_calls = run.finish_reasons.count("length")
    if cut_calls:
        if run.clamped:
            found.append(Evidence("output_cut", f"{cut_calls} reply stopped at max_tokens, which the window "
                                                f"clamped", ("max_tokens", "context_window")))
        else:
            found.append(Evidence("output_cut", f"{cut_calls} reply(ies) stopped at max_tokens", ("max_tokens",)))
    status = run.score.details.get("status")
    if status in FORMAT_STATUSES.get(run.suite_task.verifier, ()) and run.stop_reason == "stop":
        found.append(Evidence("answer_format", f"{run.suite_task.verifier} status {status!r}", ("prompt",)))
    if run.stop_reason in ("model_error", "error"):
        found.append(Evidence("model_error", "a model call failed: "
                                             f"{run.trajectory.get('error') or _last_error(run) or 'unknown'}"))
    return found


def _over_window(run: TaskRun, event: dict[str, Any]) -> bool:
    """Was this shrinking forced by the window (the prompt was over window - max_tokens)?"""
    if run.window is None:
        return False
    max_tokens = run.limits.agent_max_tokens if run.suite_task.is_agent else run.limits.max_tokens
    return event.get("x.context.tokens_before", 0) > run.window - max_tokens


def _last_error(run: TaskRun) -> str | None:
    errors = [s.get("error") for s in run.trajectory.get("steps", []) if s.get("error")]
    return errors[-1] if errors else None


def lift(limits: EvalLimits, evidence: list[Evidence], verifier: str) -> EvalLimits:
    """`limits` with every limit the evidence implicates lifted (see the module docstring)."""
    implicated = {name for e in evidence for name in e.limits}
    update: dict[str, Any] = {}
    if "context_window" in implicated:
        update["context_window"] = "unlimited"
    if "result_chars" in implicated:
        update["result_chars"] = None
    if "budget" in implicated:
        update["budget"] = None
    if "max_steps" in implicated:
        update["max_steps"] = limits.max_steps * 2
    if "timeout_s" in implicated:
        update["timeout_s"] = None
    if "max_tokens" in implicated:
        update.update(max_tokens=limits.max_tokens * 4, agent_max_tokens=limits.agent_max_tokens * 4,
                      conclusion_tokens=limits.conclusion_tokens * 4)
    if "prompt" in implicated and verifier in FORMAT_HINTS:
        update["prompt_suffix"] = limits.prompt_suffix + FORMAT_HINTS[verifier]
    return limits.with_overrides(update) if update else limits


def attribute(run: TaskRun, rerun: Callable[[EvalLimits], TaskRun]) -> Attribution | None:
    """The attribution of a failed run (None for a success); `rerun(limits)` runs the same
    task on the same model under other limits."""
    if run.success:
        return None
    evidence = find_evidence(run)
    if not evidence:
        return Attribution(CAPABILITY, [])
    lifted_limits = lift(run.limits, evidence, run.suite_task.verifier)
    again = rerun(lifted_limits)
    return Attribution(ENGINEERING if again.success else CAPABILITY, evidence, run.limits.changed(lifted_limits),
                       again)
