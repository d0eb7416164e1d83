"""Deterministic stand-ins for the agent tests: a scripted chat model, a toy tool world."""

from __future__ import annotations

import threading

from polyrl.agent.call_format import format_call, parse_calls
from polyrl.agent.model import ModelReply, ModelRequest, Usage
from polyrl.agent.tools import Tool, ToolBox


def count_chars(messages) -> int:
    """Test token count: one token per 4 characters of content, plus 2 per message."""
    return sum(len(str(m.get("content") or "")) // 4 + 2 for m in messages)


class ScriptedModel:
    """Replies with the given texts in order (text tool-call format); the last one repeats.
    Usage: prompt = count_chars(messages), completion = len(text) // 4 + 1, capped at max_tokens."""

    provider = "test"
    tool_format = "text"
    tools_style = "compact"

    def __init__(self, texts, name="scripted", context_window=None):
        self.texts = list(texts)
        self.name = name
        self.context_window = context_window
        self.requests: list[ModelRequest] = []
        self._lock = threading.Lock()

    def count_tokens(self, messages, tools) -> int:
        return count_chars(messages)

    def complete(self, request: ModelRequest) -> ModelReply:
        with self._lock:
            self.requests.append(request)
            text = self.texts[min(len(self.requests) - 1, len(self.texts) - 1)]
            index = len(self.requests) - 1
        out = min(request.max_tokens, len(text) // 4 + 1)
        usage = Usage(count_chars(request.messages), out)
        return ModelReply(text, parse_calls(text, f"call_{index}"), {"role": "assistant", "content": text}, usage,
                          "stop", self.name, 0.001)


def toy_tools(calls: list | None = None) -> ToolBox:
    """add(a, b), echo(text), boom() which raises, big() which returns 2,000 characters."""

    def add(a: int, b: int) -> int:
        if calls is not None:
            calls.append(("add", a, b))
        return a + b

    def boom() -> str:
        raise RuntimeError("the tool broke")

    ints = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"], "additionalProperties": False}
    text = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    none = {"type": "object", "properties": {}}
    return ToolBox([Tool("add", "Add two integers.", ints, add),
                    Tool("echo", "Echo text.", text, lambda text: text),
                    Tool("boom", "Always fails.", none, boom),
                    Tool("big", "A long result.", none, lambda: "H" * 50 + "x" * 1900 + "T" * 50)])


def call(name: str, **arguments) -> str:
    return format_call(name, arguments)
