"""Per-call observability records, named after the OpenTelemetry GenAI conventions.

One record per model call ("chat {model}"), per tool call ("execute_tool {tool}"),
per budget or context event, and per scored episode. A record is span-shaped: an
episode is a trace (`trace_id`, also gen_ai.conversation.id), a record has a start
time, a duration and attributes. Attribute keys are the OTel GenAI names where one
exists, `x.*` extensions otherwise:

    gen_ai.operation.name                  "chat" | "execute_tool"
    gen_ai.provider.name                   "polyrl" | "openai"
    gen_ai.request.model / .response.model
    gen_ai.usage.input_tokens              prompt tokens, cached ones INCLUDED
    gen_ai.usage.cache_read.input_tokens   the cached subset of them
    gen_ai.usage.output_tokens
    gen_ai.client.operation.duration       seconds
    gen_ai.client.operation.time_to_first_chunk   seconds (streaming calls only)
    gen_ai.response.finish_reasons         ["stop"] | ["length"] | ...
    gen_ai.tool.name, gen_ai.tool.call.id  tool calls; tool latency = duration
    error.type                             failed calls and tools only
    x.step, x.task_id                      where in the episode
    x.phase, x.domain                      "train" | "eval", and the task's domain (rollouts
                                           of a training run; `Stamp` adds them)
    x.call.batch_size, x.call.batch_duration   a call answered inside one batched engine call:
                                           its duration is its share of the batch's
    x.budget.*                             spent, limit, milestone, action
    x.context.*                            tokens before/after a compression or truncation
    x.episode.*                            success, reward, stop reason, tokens, steps

Input tokens include cached tokens because mixing the two conventions is the most
reported accounting bug in LiteLLM and Langfuse; uncached = input - cache_read.

Out of scope: message contents in records (they stay in the trajectory log; tool
records carry the call's arguments and a clipped result preview only), and
metrics aggregation (polyrl.obs.report computes figures from stored records).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

INPUT_TOKENS = "gen_ai.usage.input_tokens"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
DURATION = "gen_ai.client.operation.duration"
TTFT = "gen_ai.client.operation.time_to_first_chunk"
FINISH_REASONS = "gen_ai.response.finish_reasons"
TOOL_NAME = "gen_ai.tool.name"
ERROR_TYPE = "error.type"
PHASE = "x.phase"
DOMAIN = "x.domain"


@dataclass
class ObsRecord:
    kind: str
    """"model", "tool", "event" or "episode"."""
    name: str
    """Span name: "chat tiny", "execute_tool price", "budget.alert", "episode"."""
    trace_id: str
    """The episode this record belongs to."""
    attributes: dict[str, Any] = field(default_factory=dict)
    task_id: str | None = None
    step: int | None = None
    start_time: float = field(default_factory=time.time)
    """Unix seconds."""
    duration_s: float | None = None


class Recorder(Protocol):
    def record(self, rec: ObsRecord) -> None:
        ...


class ListRecorder:
    """Keeps records in memory (tests, and fanning out to several sinks)."""

    def __init__(self) -> None:
        self.records: list[ObsRecord] = []

    def record(self, rec: ObsRecord) -> None:
        self.records.append(rec)


class Tee:
    """Sends every record to each of several recorders (e.g. SQLite and a live view)."""

    def __init__(self, *recorders: Recorder | None):
        self.recorders = [r for r in recorders if r is not None]

    def record(self, rec: ObsRecord) -> None:
        for r in self.recorders:
            r.record(rec)


class Stamp:
    """Adds fixed attributes (phase, domain) to every record before passing it on; an
    attribute the record already has is kept."""

    def __init__(self, recorder: Recorder, **attributes: Any):
        self.recorder, self.attributes = recorder, attributes

    def record(self, rec: ObsRecord) -> None:
        rec.attributes = {**self.attributes, **rec.attributes}
        self.recorder.record(rec)


def stamped(records: list[ObsRecord], **attributes: Any) -> list[ObsRecord]:
    """`records`, each with `attributes` added where it has none of that name (in place)."""
    stamp = Stamp(ListRecorder(), **attributes)
    for rec in records:
        stamp.record(rec)
    return records


def model_call(trace_id: str, task_id: str | None, step: int, *, provider: str, request_model: str,
               response_model: str, input_tokens: int, cached_tokens: int, output_tokens: int,
               duration_s: float, ttft_s: float | None, finish_reason: str, error_type: str | None,
               purpose: str = "act", extra: dict[str, Any] | None = None) -> ObsRecord:
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": request_model,
        "gen_ai.response.model": response_model or request_model,
        "gen_ai.conversation.id": trace_id,
        INPUT_TOKENS: input_tokens,
        CACHE_READ_TOKENS: cached_tokens,
        OUTPUT_TOKENS: output_tokens,
        DURATION: duration_s,
        FINISH_REASONS: [finish_reason],
        "x.step": step,
        "x.task_id": task_id,
        "x.call.purpose": purpose,
    }
    if ttft_s is not None:
        attrs[TTFT] = ttft_s
    if error_type is not None:
        attrs[ERROR_TYPE] = error_type
    attrs.update(extra or {})
    start = time.time() - duration_s
    return ObsRecord("model", f"chat {request_model}", trace_id, attrs, task_id, step, start, duration_s)


def tool_call(trace_id: str, task_id: str | None, step: int, *, tool: str, call_id: str, latency_s: float,
              error_type: str | None, result_chars: int, shown_chars: int | None = None,
              arguments: dict[str, Any] | None = None, result_preview: str | None = None) -> ObsRecord:
    """`arguments` and `result_preview` (a clipped result) fill the opt-in OTel attributes
    gen_ai.tool.call.arguments / .result that live views print."""
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        TOOL_NAME: tool,
        "gen_ai.tool.call.id": call_id,
        "gen_ai.conversation.id": trace_id,
        DURATION: latency_s,
        "x.step": step,
        "x.task_id": task_id,
        "x.tool.result_chars": result_chars,
    }
    if shown_chars is not None and shown_chars < result_chars:
        attrs["x.tool.truncated"] = True
    if arguments is not None:
        attrs["gen_ai.tool.call.arguments"] = arguments
    if result_preview is not None:
        attrs["gen_ai.tool.call.result"] = result_preview
    if error_type is not None:
        attrs[ERROR_TYPE] = error_type
    start = time.time() - latency_s
    return ObsRecord("tool", f"execute_tool {tool}", trace_id, attrs, task_id, step, start, latency_s)


def event(trace_id: str, task_id: str | None, step: int | None, name: str, **attrs: Any) -> ObsRecord:
    """A budget or context event: "budget.alert", "budget.exhausted", "context.compress",
    "context.truncate", "model.downgrade", "episode.conclude", "episode.stop"."""
    return ObsRecord("event", name, trace_id, {"x.step": step, "x.task_id": task_id, **attrs}, task_id, step)


def episode(trace_id: str, task_id: str | None, *, success: bool, reward: float, stop_reason: str,
            steps: int, input_tokens: int, output_tokens: int, cached_tokens: int) -> ObsRecord:
    """The verdict on one episode, written by whoever scored it (polyrl agent, the trainer)."""
    attrs = {"x.episode.success": bool(success), "x.episode.reward": reward, "x.episode.stop_reason": stop_reason,
             "x.episode.steps": steps, INPUT_TOKENS: input_tokens, OUTPUT_TOKENS: output_tokens,
             CACHE_READ_TOKENS: cached_tokens, "x.task_id": task_id}
    return ObsRecord("episode", "episode", trace_id, attrs, task_id, None)
