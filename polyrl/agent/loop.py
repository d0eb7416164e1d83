"""The agent loop: render the history, call the model, charge the budget, run the tools.

    while not stopped:
        stop on max steps or timeout
        fit the prompt (compress -> truncate -> lighter model -> compress all), reserve, else stop: budget
        reply = model(prompt)                  # a `yield`: see below
        charge the budget (milestone alerts)
        stop on an answer (<answer>, which wins over calls in the same reply, or a reply without calls)
        run each tool call, append the turn
    no answer? a stage conclusion: one last short call for the best answer, else a
    summary of what was found so far. Never nothing.

`agent_episode` is a generator: it yields each ModelRequest and receives the
ModelReply, so one loop serves two drivers. `run_agent` answers each request with the
request's model (production, `polyrl agent`); `polyrl.rollout.episodes` drives many
episodes in lock-step and answers their requests with one batched Engine call (RL).

Every model call, tool call, budget alert, compression, truncation, downgrade and stop
goes to the recorder (polyrl.obs) as it happens.

Out of scope: parallel tool execution within a turn, human-in-the-loop turns, and
retries of failed model calls (a failed call ends the episode; retry policies belong
to the backend).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Sequence

from polyrl.agent.budget import Reservation, TokenBudget
from polyrl.agent.call_format import parse_answer, system_prompt
from polyrl.agent.context import FitEvent, ToolResult, Transcript, Turn, clip
from polyrl.agent.model import ChatModel, Message, ModelReply, ModelRequest
from polyrl.agent.outcome import EpisodeOutcome
from polyrl.agent.tools import ToolBox, ToolCall, ToolOutcome
from polyrl.obs import records
from polyrl.obs.records import Recorder

STOP_REASONS = ("answer", "max_steps", "timeout", "budget", "model_error")
CONCLUDE_PROMPT = "Stop now: no more tool calls. Give your best answer as <answer>X</answer>."


@dataclass(frozen=True)
class AgentConfig:
    max_steps: int = 8
    """Model calls before the episode stops with "max_steps" (the conclusion call comes on top)."""
    max_tokens: int = 64
    """Completion tokens per model call."""
    timeout_s: float | None = None
    """Wall-clock limit of the episode; checked before each model call."""
    result_chars: int | None = 400
    """Cap on each tool result shown to the model, head and tail kept; None = no cap."""
    tight_result_chars: int = 80
    """The cap once the prompt is over its limit and compression was not enough."""
    keep_recent_turns: int = 1
    """Turns compression keeps whole before it truncates tool results."""
    conclude: bool = True
    """After a stop on budget or max steps, make one short call asking for the best answer."""
    conclusion_tokens: int = 32
    """max_tokens of that call."""
    system_prompt: str | None = None
    """None = the default of call_format.system_prompt for the primary model's tools style."""

    def __post_init__(self) -> None:
        for name in ("max_steps", "max_tokens", "tight_result_chars", "conclusion_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"AgentConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.result_chars is not None and self.result_chars < self.tight_result_chars:
            raise ValueError(f"AgentConfig.result_chars ({self.result_chars}) must be >= tight_result_chars "
                             f"({self.tight_result_chars}) or None")
        if self.keep_recent_turns < 0:
            raise ValueError(f"AgentConfig.keep_recent_turns must be >= 0, got {self.keep_recent_turns}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"AgentConfig.timeout_s must be > 0 or None, got {self.timeout_s}")


@dataclass
class ModelSlot:
    """A model the loop may call; slot 0 is the primary, later slots lighter fallbacks."""

    model: ChatModel
    cost_weight: float = 1.0
    """Budget tokens charged per token of this model: a lighter model at 0.25 stretches
    what is left of the budget four times."""

    def __post_init__(self) -> None:
        if self.cost_weight <= 0:
            raise ValueError(f"ModelSlot.cost_weight must be > 0, got {self.cost_weight}")


@dataclass
class Step:
    index: int
    purpose: str
    """"act" or "conclude"."""
    slot: int
    model: str
    reply: ModelReply
    charged: int
    """Budget tokens charged for the call (cost-weighted)."""
    results: list[ToolResult] = field(default_factory=list)


@dataclass
class AgentResult:
    task: str
    answer: str | None
    """The final answer (from <answer>, or the whole final text); None if there is none."""
    stop_reason: str
    """One of STOP_REASONS."""
    steps: list[Step]
    transcript: Transcript
    conclusion: str | None = None
    """The stage conclusion when the episode stopped without an answer."""
    events: list[dict[str, Any]] = field(default_factory=list)
    trace_id: str = "episode"
    task_id: str | None = None
    world: dict[str, Any] | None = None
    """The tools' world state at the end (ToolBox.state()); None for stateless tools."""

    @property
    def input_tokens(self) -> int:
        return sum(s.reply.usage.input_tokens for s in self.steps)

    @property
    def output_tokens(self) -> int:
        return sum(s.reply.usage.output_tokens for s in self.steps)

    @property
    def cached_tokens(self) -> int:
        return sum(s.reply.usage.cached_tokens for s in self.steps)

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def tool_results(self) -> list[ToolResult]:
        return [r for s in self.steps for r in s.results]

    @property
    def outcome(self) -> EpisodeOutcome:
        """What a verifier grades: the answer and the episode's costs."""
        return EpisodeOutcome(self.answer, len(self.steps), self.tokens, self.input_tokens, self.output_tokens,
                              len(self.tool_results), sum(not r.outcome.ok for r in self.tool_results),
                              self.stop_reason,
                              tuple({"name": r.call.name, "arguments": r.call.arguments} for r in self.tool_results
                                    if r.call.error is None and r.call.name is not None),
                              self.world)

    def to_completion(self) -> str:
        """The outcome as a JSON episode record, for files (`polyrl score` reads it back)."""
        return json.dumps(self.outcome.to_json())

    def to_json(self) -> dict[str, Any]:
        """The trajectory log entry: every call, every full tool result, every event."""
        return {
            "trace_id": self.trace_id, "task_id": self.task_id, "answer": self.answer,
            "stop_reason": self.stop_reason, "conclusion": self.conclusion,
            **{k: v for k, v in self.outcome.to_json().items() if k != "actions"},  # the steps list every call
            "steps": [{
                "index": s.index, "purpose": s.purpose, "model": s.model, "text": s.reply.text,
                "finish_reason": s.reply.finish_reason, "error": s.reply.error, "charged": s.charged,
                "usage": {"input_tokens": s.reply.usage.input_tokens, "cached_tokens": s.reply.usage.cached_tokens,
                          "output_tokens": s.reply.usage.output_tokens},
                "duration_s": s.reply.duration_s, "ttft_s": s.reply.ttft_s,
                "calls": [{"id": r.call.id, "name": r.call.name, "arguments": r.call.arguments,
                           "parse_error": r.call.error, "result": r.outcome.content,
                           "error_type": r.outcome.error_type, "latency_s": r.outcome.latency_s}
                          for r in s.results],
            } for s in self.steps],
            "events": self.events,
            "messages": self.transcript.full_messages(),
        }


Episode = Generator[ModelRequest, ModelReply, AgentResult]


def agent_episode(task: str, tools: ToolBox, models: Sequence[ModelSlot], config: AgentConfig = AgentConfig(),
                  budget: TokenBudget | None = None, recorder: Recorder | None = None,
                  trace_id: str = "episode", task_id: str | None = None,
                  clock: Callable[[], float] = time.monotonic) -> Episode:
    """One episode on `task` (the user's request) with `tools`; see the module docstring."""
    if not models:
        raise ValueError("agent_episode needs at least one model")
    budget = budget if budget is not None else TokenBudget(None)
    emit = _Emitter(recorder, trace_id, task_id)
    transcript = Transcript(config.system_prompt or system_prompt(tools, models[0].model.tools_style), task,
                            config.result_chars, config.tight_result_chars, config.keep_recent_turns)
    steps: list[Step] = []
    slot, answer, start = 0, None, clock()

    while True:
        if len(steps) >= config.max_steps:
            stop = "max_steps"
            break
        if config.timeout_s is not None and clock() - start >= config.timeout_s:
            stop = "timeout"
            break
        plan = _plan_call(transcript, tools, models, slot, budget, config.max_tokens, emit, len(steps))
        if plan is None:
            stop = "budget"
            break
        request, reservation = plan
        slot = request.slot
        reply = yield request
        step = _settle(request, reply, models, budget, reservation, emit, len(steps))
        steps.append(step)
        if reply.error is not None:
            stop = "model_error"
            break
        answer = parse_answer(reply.text)
        if answer is not None or not reply.calls:
            answer = answer if answer is not None else reply.text.strip()
            transcript.add(Turn(step.index, reply.message))  # the final turn, for the log
            stop = "answer"
            break
        turn = Turn(step.index, reply.message)
        for call in reply.calls:
            outcome = tools.run(call)
            turn.results.append(ToolResult(call, outcome))
            emit.tool(step.index, call, outcome, config.result_chars)
        step.results = turn.results
        transcript.add(turn)

    conclusion = None
    if stop != "answer":
        conclusion, answer = yield from _conclude(stop, transcript, tools, models, slot, budget, config, emit, steps)
    emit.event(len(steps), "episode.stop", **{"x.episode.stop_reason": stop, "x.budget.spent": budget.spent,
                                               "x.budget.limit": budget.limit})
    return AgentResult(task, answer, stop, steps, transcript, conclusion, emit.events, trace_id, task_id,
                       tools.state())


def run_agent(task: str, tools: ToolBox, models: Sequence[ModelSlot], config: AgentConfig = AgentConfig(),
              budget: TokenBudget | None = None, recorder: Recorder | None = None,
              trace_id: str = "episode", task_id: str | None = None,
              clock: Callable[[], float] = time.monotonic) -> AgentResult:
    """Run one episode to its end, each request answered by its slot's model."""
    episode = agent_episode(task, tools, models, config, budget, recorder, trace_id, task_id, clock)
    try:
        request = next(episode)
        while True:
            request = episode.send(models[request.slot].model.complete(request))
    except StopIteration as done:
        return done.value


def _prompt_limit(slot: ModelSlot, budget: TokenBudget, max_tokens: int) -> float:
    """The most prompt tokens a call of `slot` may take: the context window and the budget."""
    limit = math.inf
    if slot.model.context_window is not None:
        limit = slot.model.context_window - max_tokens
    available = budget.available
    if available is not None:
        limit = min(limit, math.floor(available / slot.cost_weight) - max_tokens)
    return limit


def _plan_call(transcript: Transcript, tools: ToolBox, models: Sequence[ModelSlot], slot: int,
               budget: TokenBudget, max_tokens: int, emit: "_Emitter", step: int,
               extra: list[Message] | None = None, purpose: str = "act") -> tuple[ModelRequest, Reservation] | None:
    """A request that fits, and its reservation. Over the limit, in order: compress old
    turns and truncate tool results (for the current model, then each lighter one),
    then compress everything; None when nothing fits (the budget is exhausted)."""
    for last_resort in (False, True):
        for s in range(slot, len(models)):
            model = models[s]
            limit = _prompt_limit(model, budget, max_tokens)
            if limit <= 0:
                continue
            messages, tokens, fitted = transcript.fit(lambda m: model.model.count_tokens(m, tools), limit, extra,
                                                      last_resort)
            for e in fitted:
                emit.fit(step, e)
            if tokens > limit:
                continue
            reservation = budget.reserve(math.ceil(model.cost_weight * (tokens + max_tokens)))
            if reservation is None:  # a concurrent call took the room meanwhile
                continue
            if s != slot:
                emit.event(step, "model.downgrade", **{"x.model.from": models[slot].model.name,
                                                        "x.model.to": model.model.name,
                                                        "x.budget.action": "downgrade"})
            return ModelRequest(messages, tools, max_tokens, s, purpose), reservation
    emit.event(step, "budget.exhausted", **{"x.budget.spent": budget.spent, "x.budget.limit": budget.limit,
                                             "x.budget.available": budget.available, "x.call.purpose": purpose})
    return None


def _settle(request: ModelRequest, reply: ModelReply, models: Sequence[ModelSlot], budget: TokenBudget,
            reservation: Reservation, emit: "_Emitter", index: int) -> Step:
    """Charge the call to the budget and record it."""
    slot = models[request.slot]
    charged = math.ceil(slot.cost_weight * reply.usage.total)
    for alert in budget.commit(reservation, charged):
        emit.event(index, "budget.alert", **{"x.budget.milestone": alert.milestone, "x.budget.spent": alert.spent,
                                              "x.budget.limit": alert.limit, "x.budget.action": "alert"})
    emit.model(index, slot.model, reply, request.purpose, budget)
    return Step(index, request.purpose, request.slot, slot.model.name, reply, charged)


def _conclude(stop: str, transcript: Transcript, tools: ToolBox, models: Sequence[ModelSlot], slot: int,
              budget: TokenBudget, config: AgentConfig, emit: "_Emitter",
              steps: list[Step]) -> Generator[ModelRequest, ModelReply, tuple[str, str | None]]:
    """(conclusion text, answer or None): the model's best answer if one more short call
    fits, else a summary of what was found so far."""
    if config.conclude and stop in ("budget", "max_steps"):
        nudge: list[Message] = [{"role": "user", "content": CONCLUDE_PROMPT}]
        plan = _plan_call(transcript, tools, models, slot, budget, config.conclusion_tokens, emit, len(steps),
                          nudge, "conclude")
        if plan is not None:
            request, reservation = plan
            reply = yield request
            steps.append(_settle(request, reply, models, budget, reservation, emit, len(steps)))
            answer = parse_answer(reply.text)
            if answer is None and not reply.calls and reply.error is None:
                answer = reply.text.strip() or None
            if answer:
                emit.event(len(steps), "episode.conclude", **{"x.conclusion.source": "model",
                                                               "x.budget.action": "conclude"})
                return reply.text, answer
    found = transcript.found_so_far()
    text = (f"Stopped ({stop}) after {len(steps)} model calls without a final answer. "
            + (f"Found so far: {'; '.join(found)}." if found else "Nothing was found yet."))
    emit.event(len(steps), "episode.conclude", **{"x.conclusion.source": "summary", "x.budget.action": "conclude"})
    return text, None


class _Emitter:
    """Builds obs records for one episode and keeps its events for the trajectory log."""

    def __init__(self, recorder: Recorder | None, trace_id: str, task_id: str | None):
        self.recorder, self.trace_id, self.task_id = recorder, trace_id, task_id
        self.events: list[dict[str, Any]] = []

    def _send(self, rec: records.ObsRecord) -> None:
        if self.recorder is not None:
            self.recorder.record(rec)

    def event(self, step: int, name: str, **attrs: Any) -> None:
        self.events.append({"event": name, "step": step, **attrs})
        self._send(records.event(self.trace_id, self.task_id, step, name, **attrs))

    def fit(self, step: int, e: FitEvent) -> None:
        self.event(step, f"context.{e.action}", **{"x.context.tokens_before": e.tokens_before,
                                                   "x.context.tokens_after": e.tokens_after,
                                                   "x.budget.action": e.action,
                                                   **{f"x.context.{k}": v for k, v in e.detail.items()}})

    def model(self, step: int, model: ChatModel, reply: ModelReply, purpose: str, budget: TokenBudget) -> None:
        self._send(records.model_call(
            self.trace_id, self.task_id, step, provider=model.provider, request_model=model.name,
            response_model=reply.model, input_tokens=reply.usage.input_tokens,
            cached_tokens=reply.usage.cached_tokens, output_tokens=reply.usage.output_tokens,
            duration_s=reply.duration_s, ttft_s=reply.ttft_s, finish_reason=reply.finish_reason,
            error_type=reply.error, purpose=purpose,
            extra={"x.budget.spent": budget.spent, "x.budget.limit": budget.limit,
                   "x.tool_calls": len(reply.calls)}))

    def tool(self, step: int, call: ToolCall, outcome: ToolOutcome, shown: int | None) -> None:
        self._send(records.tool_call(self.trace_id, self.task_id, step, tool=call.name or "invalid",
                                     call_id=call.id, latency_s=outcome.latency_s, error_type=outcome.error_type,
                                     result_chars=len(outcome.content), shown_chars=shown,
                                     arguments=call.arguments, result_preview=clip(outcome.content, 200)))
