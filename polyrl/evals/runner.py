"""One task on one model: run it under its limits, grade it with its verifier, keep the evidence.

    run = run_task(suite_task, adapter, limits, verifiers)

- A task with tools (a shop or ops `world`, an swe repository: polyrl/domains/task_tools.py)
  runs one episode of the agent loop (polyrl/agent/loop.py) with fresh tools, a TokenBudget
  when the limits set one, and the limits' window, max_tokens, steps and tool-result cap.
  Its EpisodeOutcome is graded exactly as training's rollouts are (by the task's verifier on
  the outcome).
- Any other task is one call: the prompt as the only user message (the same chat prompt
  training renders, `tokenizer.chat_prompt`), graded on the completion's text by the
  task's verifier. A prompt that does not fit the window is not sent: the task fails with
  stop reason "context_overflow" and is graded on an empty completion. A prompt that fits
  only with fewer completion tokens gets max_tokens clamped to the room left (`clamped`).

With a recorder, each task leaves per-call records (polyrl/obs) as training's rollouts
do: the agent loop's model, tool, budget and context records, or one model-call record for
a single call, then one episode record with the verdict.

Everything that can go wrong is a value of the TaskRun: a model call that raises (a KV
pool too small for an unlimited window, a dropped connection) is a failed reply with
stop reason "model_error"; a verifier that raises scores 0 with status "verifier_error".
What attribution reads (finish reasons, events, the tool results and how much of them was
shown) is kept on the TaskRun; the full trajectory too, for tasks.jsonl.

Out of scope: several samples per task (one greedy run each; pass@k is `polyrl audit`'s),
and running tasks concurrently.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from polyrl.agent.budget import TokenBudget
from polyrl.agent.loop import AgentConfig, AgentResult, ModelSlot, agent_episode
from polyrl.agent.model import ChatModel, ModelReply, ModelRequest, failed_reply
from polyrl.agent.outcome import EpisodeOutcome
from polyrl.agent.tools import ToolBox
from polyrl.domains.task_tools import TaskTools
from polyrl.evals.limits import EvalLimits
from polyrl.evals.models import ModelAdapter
from polyrl.evals.suite import SuiteTask
from polyrl.obs import records
from polyrl.obs.records import Recorder
from polyrl.rewards.base import Verifier
from polyrl.rewards.registry import get_verifier
from polyrl.types import Score

NO_TOOLS = ToolBox([])


class Verifiers:
    """The verifiers of a run, made once by name and closed at the end."""

    def __init__(self) -> None:
        self._made: dict[str, Verifier] = {}

    def score(self, name: str, task: Any, response: str | EpisodeOutcome) -> Score:
        if name not in self._made:
            self._made[name] = get_verifier(name)
        try:
            return self._made[name].score([task], [response])[0]
        except Exception as err:  # noqa: BLE001 -- a grader failure is this task's result, not the run's end
            return Score(0.0, {"status": "verifier_error", "error": f"{type(err).__name__}: {err}"})

    def close(self) -> None:
        for verifier in self._made.values():
            verifier.close()
        self._made.clear()


@dataclass
class ShownResult:
    """One tool result and how much of it the model was shown."""

    tool: str
    chars: int
    shown_chars: int | None
    """The cap it was shown under; None = whole."""
    error_type: str | None
    structured: bool
    """The full result is JSON (an object or an array)."""

    @property
    def truncated(self) -> bool:
        return self.shown_chars is not None and self.chars > self.shown_chars


@dataclass
class TaskRun:
    suite_task: SuiteTask
    model: str
    limits: EvalLimits
    score: Score
    success: bool
    answer: str | None
    stop_reason: str
    """Agent: loop.STOP_REASONS; single call: the finish reason ("stop", "length", "error")
    or "context_overflow"."""
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    model_calls: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    latency_s: float = 0.0
    budget_limit: int | None = None
    budget_spent: int = 0
    window: int | None = None
    """The context window the calls ran under (None = no limit)."""
    clamped: bool = False
    """A single call's max_tokens was cut to the room the window left."""
    finish_reasons: list[str] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    tool_results: list[ShownResult] = field(default_factory=list)
    trajectory: dict[str, Any] = field(default_factory=dict)

    @property
    def task_id(self) -> str:
        return self.suite_task.task.id

    @property
    def budget_exhausted(self) -> bool:
        return self.stop_reason == "budget" or any(e["event"] == "budget.exhausted" for e in self.events)


def resolve_window(limits: EvalLimits, adapter: ModelAdapter) -> int | None:
    if limits.context_window == "model":
        return adapter.context_window
    if limits.context_window == "unlimited":
        return None
    return int(limits.context_window)


def run_task(suite_task: SuiteTask, adapter: ModelAdapter, limits: EvalLimits, verifiers: Verifiers,
             trace_id: str = "eval", recorder: Recorder | None = None, tools: TaskTools | None = None) -> TaskRun:
    """Run and grade one task on one model; see the module docstring. `tools`: the run's
    TaskTools (swe tasks share its sandbox pool); None makes and closes one for this task."""
    window = resolve_window(limits, adapter)
    model = adapter.chat_model(window)
    start = time.perf_counter()
    if suite_task.is_agent:
        own = tools is None
        tools = TaskTools() if own else tools
        try:
            run = _run_agent(suite_task, model, adapter.spec, limits, verifiers, tools, trace_id, recorder)
        finally:
            if own:
                tools.close()
    else:
        run = _run_single(suite_task, model, adapter.spec, limits, verifiers, trace_id, recorder)
    run.latency_s = time.perf_counter() - start
    run.window = window
    if recorder is not None:
        recorder.record(records.episode(
            trace_id, suite_task.task.id, success=run.success, reward=run.score.value, stop_reason=run.stop_reason,
            steps=run.model_calls, input_tokens=run.input_tokens, output_tokens=run.output_tokens,
            cached_tokens=run.cached_tokens))
    return run


def _complete(model: ChatModel, request: ModelRequest) -> ModelReply:
    """The model's reply; an exception from a backend becomes a failed reply."""
    try:
        return model.complete(request)
    except Exception as err:  # noqa: BLE001 -- e.g. a prompt too long for the engine's KV pool
        return failed_reply(type(err).__name__, model.name)


def _grade(suite_task: SuiteTask, verifiers: Verifiers, response: str | EpisodeOutcome) -> tuple[Score, bool]:
    score = verifiers.score(suite_task.verifier, suite_task.task, response)
    success = score.details.get("success")
    return score, bool(success) if isinstance(success, bool) else score.value >= 1.0 - 1e-9


def _run_single(suite_task: SuiteTask, model: ChatModel, spec: str, limits: EvalLimits,
                verifiers: Verifiers, trace_id: str, recorder: Recorder | None) -> TaskRun:
    messages = [{"role": "user", "content": suite_task.task.prompt + limits.prompt_suffix}]
    prompt_tokens = model.count_tokens(messages, NO_TOOLS)
    max_tokens, clamped = limits.max_tokens, False
    if model.context_window is not None:
        room = model.context_window - prompt_tokens
        if room < 1:
            score, success = _grade(suite_task, verifiers, "")
            return TaskRun(suite_task, spec, limits, score, success, None, "context_overflow",
                           trajectory={"messages": messages, "prompt_tokens": prompt_tokens, "completion": None})
        clamped, max_tokens = room < max_tokens, min(max_tokens, room)
    reply = _complete(model, ModelRequest(messages, NO_TOOLS, max_tokens))
    score, success = _grade(suite_task, verifiers, reply.text)
    usage = reply.usage
    if recorder is not None:
        recorder.record(records.model_call(
            trace_id, suite_task.task.id, 0, provider=model.provider, request_model=model.name,
            response_model=reply.model, input_tokens=usage.input_tokens, cached_tokens=usage.cached_tokens,
            output_tokens=usage.output_tokens, duration_s=reply.duration_s, ttft_s=reply.ttft_s,
            finish_reason=reply.finish_reason, error_type=reply.error))
    return TaskRun(
        suite_task, spec, limits, score, success, score.details.get("extracted"), reply.finish_reason,
        usage.input_tokens, usage.output_tokens, usage.cached_tokens, model_calls=1,
        budget_spent=usage.total, clamped=clamped, finish_reasons=[reply.finish_reason],
        trajectory={"messages": messages, "completion": reply.text, "finish_reason": reply.finish_reason,
                    "max_tokens": max_tokens, "error": reply.error, "duration_s": reply.duration_s,
                    "usage": {"input_tokens": usage.input_tokens, "cached_tokens": usage.cached_tokens,
                              "output_tokens": usage.output_tokens}})


def _run_agent(suite_task: SuiteTask, model: ChatModel, spec: str, limits: EvalLimits, verifiers: Verifiers,
               tools: TaskTools, trace_id: str, recorder: Recorder | None) -> TaskRun:
    task = suite_task.task
    tight = min(80, limits.result_chars) if limits.result_chars is not None else 80
    config = AgentConfig(max_steps=limits.max_steps, max_tokens=limits.agent_max_tokens, timeout_s=limits.timeout_s,
                         result_chars=limits.result_chars, tight_result_chars=tight,
                         conclusion_tokens=limits.conclusion_tokens)
    budget = TokenBudget(limits.budget)
    episode = agent_episode(task.prompt + limits.prompt_suffix, tools.toolbox(task), [ModelSlot(model)],
                            config, budget, recorder, trace_id, task.id)
    try:
        request = next(episode)
        while True:
            request = episode.send(_complete(model, request))
    except StopIteration as done:
        result: AgentResult = done.value
    score, success = _grade(suite_task, verifiers, result.outcome)
    outcome = result.outcome
    return TaskRun(
        suite_task, spec, limits, score, success, result.answer, result.stop_reason,
        outcome.input_tokens, outcome.output_tokens, result.cached_tokens, outcome.steps, outcome.tool_calls,
        outcome.tool_errors, budget_limit=budget.limit, budget_spent=budget.spent,
        finish_reasons=[s.reply.finish_reason for s in result.steps], events=list(result.events),
        tool_results=_shown_results(result, limits, tight), trajectory=result.to_json())


def _shown_results(result: AgentResult, limits: EvalLimits, tight: int) -> list[ShownResult]:
    """Each tool result with the cap it was shown under: the limits' cap, and the tight cap from
    the step the loop first truncated results to fit (truncation is sticky)."""
    tight_from = min((e["step"] for e in result.events if e["event"] == "context.truncate"), default=None)
    out = []
    for step in result.steps:
        for r in step.results:
            cap = limits.result_chars
            if tight_from is not None and step.index + 1 >= tight_from:  # shown in a prompt after the truncation
                cap = tight if cap is None else min(cap, tight)
            out.append(ShownResult(r.call.name or "invalid", len(r.outcome.content), cap, r.outcome.error_type,
                                   _is_json(r.outcome.content)))
    return out


def _is_json(text: str) -> bool:
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return False
    try:
        json.loads(stripped)
    except ValueError:
        return False
    return True
