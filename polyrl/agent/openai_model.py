"""The agent loop's HTTP backend: any OpenAI-compatible /v1/chat/completions endpoint.

Works with OpenAI, vLLM (`vllm serve --enable-auto-tool-choice --tool-call-parser
hermes`), SGLang, llama.cpp's server and LiteLLM's proxy, through the `openai` client
(an optional dependency: `pip install 'polyrl[openai]'`; imported when the backend is
built).

- `tool_format="openai"` (default): tools go as `tools=[{"type": "function", ...}]`,
  calls come back as structured `tool_calls` whose `arguments` is a JSON string, and
  results go back as `role: "tool"` messages with their `tool_call_id`.
- `tool_format="text"`: for endpoints without tool support; the system prompt lists
  the tools as JSON and calls are parsed from the text (call_format.py); tool results
  go back as user messages in <tool_response> tags.

`service_tier` names the endpoint's speed tier for every call (a `polyrl serve` fast tier:
`service_tier="fast"`), so a fallback slot can be the same model at the faster speed.

Usage is read from the response: `prompt_tokens` (which OpenAI counts *including*
cached tokens, the OTel convention too), `prompt_tokens_details.cached_tokens`,
`completion_tokens`. With `stream=True` the call streams internally so the time to
first token can be measured (`stream_options.include_usage` gives the usage).

A failed call (connection refused, HTTP error, timeout) is a ModelReply with `error`
set to the exception's class name, never an exception.

Out of scope: the Responses API, retries with backoff (set `max_retries` on the
client), and exact token counts before a call (`count_tokens` estimates from
characters, erring high, so budget reservations hold in practice; the budget counts
any overrun).
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

from polyrl.agent.call_format import call_from_json, parse_calls
from polyrl.agent.model import Message, ModelReply, ModelRequest, Usage, failed_reply
from polyrl.agent.tools import ToolBox, ToolCall

_MISSING = ("the OpenAI-compatible backend needs the `openai` package: "
            "pip install 'polyrl[openai]'  (or: pip install openai)")


def _import_openai() -> Any:
    try:
        import openai
    except ImportError as exc:
        raise ImportError(_MISSING) from exc
    return openai


class OpenAIChatModel:
    """ChatModel over an OpenAI-compatible endpoint; see the module docstring."""

    provider = "openai"

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None, *,
                 tool_format: str = "openai", stream: bool = False, temperature: float = 0.0,
                 context_window: int | None = None, timeout_s: float = 60.0, max_retries: int = 0,
                 chars_per_token: float = 3.0, client: Any = None, service_tier: str | None = None):
        if tool_format not in ("openai", "text"):
            raise ValueError(f"tool_format must be 'openai' or 'text', got {tool_format!r}")
        if chars_per_token <= 0:
            raise ValueError(f"chars_per_token must be > 0, got {chars_per_token}")
        self.name = f"{model}@{service_tier}" if service_tier else model
        self.api_model = model
        self.service_tier = service_tier
        """Sent as the request's `service_tier` (e.g. "fast": a `polyrl serve` fast tier)."""
        self.tool_format = tool_format
        self.tools_style = "openai" if tool_format == "openai" else "json"
        self.stream = stream
        self.temperature = temperature
        self.context_window = context_window
        self.chars_per_token = chars_per_token
        if client is None:
            openai = _import_openai()
            key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"  # local servers accept any key
            client = openai.OpenAI(base_url=base_url, api_key=key, timeout=timeout_s, max_retries=max_retries)
        self.client = client

    def count_tokens(self, messages: list[Message], tools: ToolBox) -> int:
        chars = sum(len(str(m.get("content") or "")) + len(json.dumps(m.get("tool_calls", ""))) + 8 for m in messages)
        if self.tool_format == "openai":
            chars += len(json.dumps(tools.openai_specs()))
        return math.ceil(chars / self.chars_per_token)

    def api_messages(self, messages: list[Message]) -> list[dict[str, Any]]:
        """The history as this endpoint takes it. A tool result whose call the endpoint
        never saw (text format, or a history from a text-format model) goes as a user
        message, so no request carries an unanswered or unknown tool_call_id."""
        out: list[dict[str, Any]] = []
        declared: set[str] = set()
        for m in messages:
            role, content = m["role"], m.get("content")
            if role == "assistant":
                msg: dict[str, Any] = {"role": "assistant", "content": content or ""}
                if self.tool_format == "openai" and m.get("tool_calls"):
                    msg["tool_calls"] = m["tool_calls"]
                    declared.update(tc["id"] for tc in m["tool_calls"])
                out.append(msg)
            elif role == "tool":
                if m.get("tool_call_id") in declared:
                    out.append({"role": "tool", "tool_call_id": m["tool_call_id"], "content": str(content)})
                else:
                    out.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
            else:
                out.append({"role": role, "content": str(content or "")})
        return out

    def complete(self, request: ModelRequest) -> ModelReply:
        kwargs: dict[str, Any] = {"model": self.api_model, "messages": self.api_messages(request.messages),
                                  "max_tokens": request.max_tokens, "temperature": self.temperature}
        if self.service_tier:
            kwargs["service_tier"] = self.service_tier
        if self.tool_format == "openai" and request.tools.tools:
            kwargs["tools"] = request.tools.openai_specs()
            if request.purpose == "conclude":
                kwargs["tool_choice"] = "none"  # the stage conclusion answers from what it has
        start = time.perf_counter()
        try:
            text, raw_calls, finish, usage, model, ttft = (self._streamed(kwargs, start) if self.stream
                                                           else self._whole(kwargs))
        except Exception as exc:  # noqa: BLE001 -- openai.APIError, httpx transport errors, bad payloads
            return failed_reply(type(exc).__name__, self.name, time.perf_counter() - start)
        duration = time.perf_counter() - start

        if self.tool_format == "text":
            calls, message = parse_calls(text), {"role": "assistant", "content": text}
        else:
            calls = [call_from_json(c["id"] or f"call_{k}", c["name"], c["arguments"], c["arguments"])
                     for k, c in enumerate(raw_calls)]
            message = {"role": "assistant", "content": text, "tool_calls": [_api_call(c) for c in calls]}
            if not calls:
                del message["tool_calls"]
        if usage is None:  # some servers omit usage: estimate rather than charge nothing
            usage = Usage(self.count_tokens(request.messages, request.tools),
                          math.ceil(len(text) / self.chars_per_token) + len(calls))
        served = self.name if self.service_tier else (model or self.name)  # the tier shows in the records
        return ModelReply(text, calls, message, usage, finish or "stop", served, duration, ttft)

    def _whole(self, kwargs: dict[str, Any]) -> tuple:
        resp = self.client.chat.completions.create(**kwargs)
        choice = resp.choices[0]
        raw_calls = [{"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments}
                     for tc in (choice.message.tool_calls or [])]
        return choice.message.content or "", raw_calls, choice.finish_reason, _usage(resp.usage), resp.model, None

    def _streamed(self, kwargs: dict[str, Any], start: float) -> tuple:
        stream = self.client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
        parts: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        finish, usage, model, ttft = None, None, None, None
        for chunk in stream:
            model = chunk.model or model
            if chunk.usage is not None:
                usage = _usage(chunk.usage)
            for choice in chunk.choices:
                delta = choice.delta
                if ttft is None and (delta.content or delta.tool_calls):
                    ttft = time.perf_counter() - start
                if delta.content:
                    parts.append(delta.content)
                for tc in delta.tool_calls or []:
                    acc = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                    acc["id"] = tc.id or acc["id"]
                    if tc.function is not None:
                        acc["name"] += tc.function.name or ""
                        acc["arguments"] += tc.function.arguments or ""
                finish = choice.finish_reason or finish
        return "".join(parts), [calls[i] for i in sorted(calls)], finish, usage, model, ttft


def _usage(u: Any) -> Usage | None:
    if u is None:
        return None
    details = getattr(u, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) if details is not None else None
    return Usage(int(u.prompt_tokens or 0), int(u.completion_tokens or 0), int(cached or 0))


def _api_call(call: ToolCall) -> dict[str, Any]:
    arguments = call.raw if call.error is not None else json.dumps(call.arguments)
    return {"id": call.id, "type": "function", "function": {"name": call.name or "", "arguments": arguments}}
