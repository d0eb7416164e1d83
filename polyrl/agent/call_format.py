"""The text tool-call format of local models, and its parser.

The Hermes/Qwen convention, kept small enough for the built-in tiny model. An
assistant turn is text with zero or more calls, each one JSON object in tags:

    <tool_call>{"name":"price","arguments":{"item":"pen"}}</tool_call>

Tool results come back as messages of role "tool" (ChatML renders them as
`<|im_start|>tool ... <|im_end|>`; Qwen templates wrap them in <tool_response>).
A turn that ends the episode carries the answer in tags:

    <answer>36</answer>

A turn with neither is taken as the final answer, whole (what an OpenAI-style agent
does when it replies without calling a tool).

The parser is forgiving where a model's intent is clear and strict where it is not:
an unclosed final `<tool_call>` is read to the
end of the text; the body is tried as JSON, then as a Python literal (single quotes),
then from each "{" with a raw JSON decode; "parameters" is accepted for "arguments",
and arguments given as a JSON string are decoded. Whatever is left unreadable becomes
a ToolCall with `error` set, which the ToolBox turns into an error observation.

Out of scope: parallel-call ordering semantics (calls run in the order written), and
the Llama 3.1 `<|python_tag|>` and NexusRaven `Call:` formats.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any, Iterable

from polyrl.agent.tools import Tool, ToolCall

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)\Z", re.S)
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|\Z)", re.S)


def format_call(name: str, arguments: dict[str, Any]) -> str:
    """One call in the text format, compact JSON (what demonstrations teach)."""
    body = json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"), ensure_ascii=False)
    return f"{CALL_OPEN}{body}{CALL_CLOSE}"


def format_answer(answer: str) -> str:
    return f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"


def parse_calls(text: str, id_prefix: str = "call") -> list[ToolCall]:
    """Every `<tool_call>` block of `text`, in order; malformed ones carry `error`."""
    calls = []
    for k, match in enumerate(_CALL.finditer(text)):
        body = match.group(1) if match.group(1) is not None else match.group(2)
        calls.append(_parse_body(body.strip(), f"{id_prefix}_{k}", match.group(0)))
    return calls


def parse_answer(text: str) -> str | None:
    """The content of the first `<answer>` block (closed or not), stripped; None if none."""
    match = _ANSWER.search(text)
    return match.group(1).strip() if match else None


def call_from_json(call_id: str, name: str | None, arguments: Any, raw: str = "") -> ToolCall:
    """A ToolCall from a name and arguments as an API gives them (a JSON string or an object)."""
    if not isinstance(name, str) or not name:
        return ToolCall(call_id, None, {}, raw, error="no tool name")
    if isinstance(arguments, str):
        decoded = _decode(arguments) if arguments.strip() else {}
        if decoded is None:
            return ToolCall(call_id, name, {}, raw, error="arguments are not valid JSON")
        arguments = decoded
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return ToolCall(call_id, name, {}, raw, error="arguments must be a JSON object")
    return ToolCall(call_id, name, arguments, raw)


def _parse_body(body: str, call_id: str, raw: str) -> ToolCall:
    obj = _decode(body)
    if obj is None:
        return ToolCall(call_id, None, {}, raw, error="not a JSON object")
    if not isinstance(obj, dict):
        return ToolCall(call_id, None, {}, raw, error="not a JSON object")
    arguments = obj.get("arguments", obj.get("parameters", {}))
    return call_from_json(call_id, obj.get("name"), arguments, raw)


def _decode(body: str) -> Any:
    """A JSON value from `body`: strict JSON, a Python literal, or the first decodable object."""
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        pass
    try:
        value = ast.literal_eval(body)
        if isinstance(value, (dict, list, str, int, float)):
            return value
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        pass
    decoder = json.JSONDecoder()
    for start in (i for i, ch in enumerate(body) if ch == "{"):
        try:
            value, _ = decoder.raw_decode(body, start)
            return value
        except json.JSONDecodeError:
            continue
    return None


def tools_prompt(tools: Iterable[Tool], style: str) -> str:
    """How the system prompt lists the tools: "compact" signatures for small models,
    "json" schemas in <tools> tags for Hermes/Qwen-style models, nothing for "openai"
    (the API carries the schemas)."""
    tools = list(tools)
    if style == "compact":
        return "Tools: " + ", ".join(t.signature() for t in tools)
    if style == "json":
        specs = "\n".join(json.dumps(t.openai_spec(), separators=(",", ":")) for t in tools)
        return f"<tools>\n{specs}\n</tools>"
    if style == "openai":
        return ""
    raise ValueError(f"tools style must be compact, json or openai, got {style!r}")


TEXT_INSTRUCTIONS = "Call tools as <tool_call>{json}</tool_call>. End with <answer>X</answer>."
OPENAI_INSTRUCTIONS = "Use the tools to find what you need. End with <answer>X</answer>."


def system_prompt(tools: Iterable[Tool], style: str) -> str:
    """The default system prompt: the call format (text styles) and the tool list."""
    listing = tools_prompt(tools, style)
    head = OPENAI_INSTRUCTIONS if style == "openai" else TEXT_INSTRUCTIONS
    return f"{head}\n{listing}" if listing else head
