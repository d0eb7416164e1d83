"""The chat-model contract the agent loop talks to, and what one call returns.

Messages are OpenAI-style dicts: {"role": "system"|"user"|"assistant"|"tool",
"content": str}, an assistant message may carry "tool_calls" (OpenAI form) and a tool
message "tool_call_id" and "name". Each backend turns them into what its model reads:

- `engine_model.EngineChatModel`: the polyrl Engine in-process, through the
  tokenizer's chat template, tool calls in the text format of call_format.py; it keeps
  the token ids of the episode so RL can train on what the policy generated.
- `openai_model.OpenAIChatModel`: any OpenAI-compatible HTTP endpoint, tool calls in
  the OpenAI tools format (or the text format, for endpoints without tool support).

A backend never raises for a failed call: transport errors come back as a ModelReply
with `error` set, and the loop stops the episode with a stage conclusion.

Out of scope: streaming to the caller (the OpenAI backend may stream internally to
measure time to first token), vision and audio content parts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from polyrl.agent.tools import ToolBox, ToolCall

Message = dict[str, Any]


@dataclass
class Usage:
    """Token counts of one call, normalised to the OpenTelemetry GenAI meaning."""

    input_tokens: int = 0
    """All prompt tokens, cached ones included (gen_ai.usage.input_tokens)."""
    output_tokens: int = 0
    cached_tokens: int = 0
    """Prompt tokens served from a prefix cache: a subset of input_tokens
    (gen_ai.usage.cache_read.input_tokens)."""

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass
class ModelRequest:
    """One call the loop wants made."""

    messages: list[Message]
    tools: ToolBox
    max_tokens: int
    slot: int = 0
    """Which of the loop's models (0 = primary; higher = lighter fallbacks)."""
    purpose: str = "act"
    """"act" (a normal step) or "conclude" (the stage conclusion after a stop)."""


@dataclass
class ModelReply:
    text: str
    """The assistant's text; for text-format backends it includes the <tool_call> blocks."""
    calls: list[ToolCall]
    """Parsed tool calls, in order; malformed ones carry `error`."""
    message: Message
    """The assistant message to append to the history, in the form this backend reads back."""
    usage: Usage = field(default_factory=Usage)
    finish_reason: str = "stop"
    """"stop", "length" (max_tokens reached), "tool_calls", or "error"."""
    model: str = ""
    """The model that answered (gen_ai.response.model)."""
    duration_s: float = 0.0
    ttft_s: float | None = None
    """Time to first token; None where the backend cannot see it (non-streaming calls)."""
    error: str | None = None
    """Error type of a failed call (e.g. "APIConnectionError"); the reply is then empty."""


def failed_reply(error_type: str, model: str, duration_s: float = 0.0) -> ModelReply:
    return ModelReply("", [], {"role": "assistant", "content": ""}, Usage(), "error", model, duration_s,
                      error=error_type)


class ChatModel(Protocol):
    name: str
    """The requested model name (gen_ai.request.model)."""
    provider: str
    """gen_ai.provider.name: "polyrl" for the native engine, "openai" for HTTP endpoints."""
    tool_format: str
    """"text" (call_format.py) or "openai" (structured tool_calls)."""
    tools_style: str
    """How the default system prompt lists tools: "compact", "json" or "openai"."""
    context_window: int | None
    """Prompt + completion tokens the model can take; None = unknown (no limit applied)."""

    def count_tokens(self, messages: list[Message], tools: ToolBox) -> int:
        """Prompt tokens these messages will take: exact for the engine, an upper-leaning
        estimate for endpoints. The loop sizes compression and reservations with it."""
        ...

    def complete(self, request: ModelRequest) -> ModelReply:
        ...
