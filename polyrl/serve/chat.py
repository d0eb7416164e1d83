"""Chat messages and tools -> the prompt text; the model's reply -> content and tool_calls.

Two ways to lay tools out, chosen by the model's chat template:

- a template that reads `tools` (Qwen2.5, Llama 3.1, Hermes-style) gets the OpenAI tool
  specs and the conversation as they are (assistant `tool_calls` with parsed arguments);
- any other template (the built-in model's ChatML) gets them as text, exactly as polyrl's
  agent loop lays them out for that model (agent/call_format.py): the call format and a
  compact tool list in the system prompt, earlier calls as `<tool_call>{json}</tool_call>`
  in the assistant's text, results as `tool` messages.

Either way the reply's `<tool_call>` blocks become OpenAI `tool_calls` (arguments as a JSON
string) and the text before them the content. `tool_choice` "required" or a named tool is
honoured by starting the reply with the call's opening (`<tool_call>`, or the call up to its
arguments), which the model then completes; "none" leaves the tools out.

Out of scope: constrained decoding of the arguments against the tool's schema, parallel
calls forced by `tool_choice` (one is forced; the model may add more).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from polyrl.agent.call_format import CALL_OPEN, TEXT_INSTRUCTIONS, format_call, parse_calls
from polyrl.models.tokenizer import Tokenizer
from polyrl.serve.errors import bad_request

ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class ChatPrompt:
    text: str
    """The rendered prompt, ending where the assistant's reply starts (and the forced prefix)."""
    prefill: str = ""
    """Text the reply is forced to start with (tool_choice); part of `text`, prepended to the reply."""
    tools: bool = False
    """Were tools offered (so `<tool_call>` blocks in the reply are calls)?"""


def render_chat(tokenizer: Tokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                tool_choice: str | dict[str, Any] | None) -> ChatPrompt:
    specs = _check_tools(tools)
    forced = _forced_call(tool_choice, specs)
    if tool_choice == "none":
        specs = []
    native = "tools" in tokenizer.chat_template_source()
    convo = [_message(m, i, native) for i, m in enumerate(messages)]
    if specs and not native:
        convo = _with_tool_system_prompt(convo, specs)
    try:
        text = tokenizer.apply_chat_template(convo, add_generation_prompt=True,
                                             tools=[{"type": "function", "function": s} for s in specs]
                                             if specs and native else None)
    except Exception as err:  # noqa: BLE001 -- a template raising on this conversation is a bad request
        raise bad_request(f"messages: the model's chat template cannot render them ({err})", "messages") from None
    return ChatPrompt(text + forced, forced, bool(specs))


def parse_reply(text: str, prompt: ChatPrompt) -> tuple[str | None, list[dict[str, Any]]]:
    """The reply's content and its tool calls (OpenAI format); calls only when tools were offered."""
    text = prompt.prefill + text
    if not prompt.tools or CALL_OPEN not in text:
        return text, []
    calls = [c for c in parse_calls(text) if c.error is None and c.name]
    if not calls:
        return text, []
    content = text[:text.index(CALL_OPEN)].strip() or None
    return content, [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                     for c in calls]


def _check_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    specs = []
    for i, tool in enumerate(tools or []):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise bad_request("each tool must be {\"type\": \"function\", \"function\": {...}}", f"tools[{i}]")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request("a tool's function needs a name", f"tools[{i}].function.name")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise bad_request("parameters must be a JSON schema object", f"tools[{i}].function.parameters")
        specs.append({"name": fn["name"], "description": str(fn.get("description") or ""), "parameters": params})
    return specs


def _forced_call(tool_choice: str | dict[str, Any] | None, specs: list[dict[str, Any]]) -> str:
    if tool_choice in (None, "auto", "none"):
        return ""
    if tool_choice == "required":
        if not specs:
            raise bad_request("tool_choice 'required' needs tools", "tool_choice")
        return CALL_OPEN
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        if name not in {s["name"] for s in specs}:
            raise bad_request(f"tool_choice names {name!r}, which is not among the tools", "tool_choice")
        return CALL_OPEN + json.dumps({"name": name, "arguments": {}})[:-3]  # up to `"arguments": `
    raise bad_request(f"tool_choice: got {tool_choice!r}; use none, auto, required or a named function",
                      "tool_choice")


def _message(m: Any, i: int, native: bool) -> dict[str, Any]:
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise bad_request(f"each message needs a role among {', '.join(ROLES)}", f"messages[{i}].role")
    role = "system" if m["role"] == "developer" else m["role"]
    content = _text(m.get("content"), i)
    calls = m.get("tool_calls") or []
    if role == "tool" and not isinstance(m.get("tool_call_id", ""), (str, type(None))):
        raise bad_request("tool_call_id must be a string", f"messages[{i}].tool_call_id")
    if role != "assistant" or not calls:
        return {"role": role, "content": content}
    parsed = []
    for k, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request("a tool call needs function.name", f"messages[{i}].tool_calls[{k}]")
        args = fn.get("arguments") or "{}"
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            raise bad_request("tool call arguments must be a JSON string",
                              f"messages[{i}].tool_calls[{k}].function.arguments") from None
        parsed.append((fn["name"], args if isinstance(args, dict) else {}))
    if native:
        return {"role": "assistant", "content": content,
                "tool_calls": [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in parsed]}
    return {"role": "assistant", "content": content + "".join(format_call(n, a) for n, a in parsed)}


def _text(content: Any, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise bad_request("content must be a string or a list of text parts", f"messages[{i}].content")


def _with_tool_system_prompt(convo: list[dict[str, Any]], specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The agent loop's text layout: call format and compact tool list lead the system prompt."""
    listing = "Tools: " + ", ".join(f"{s['name']}({', '.join(s['parameters'].get('properties', {}))})"
                                    for s in specs)
    head = f"{TEXT_INSTRUCTIONS}\n{listing}"
    if convo and convo[0]["role"] == "system":
        return [{"role": "system", "content": f"{head}\n{convo[0]['content']}"}] + convo[1:]
    return [{"role": "system", "content": head}] + convo
