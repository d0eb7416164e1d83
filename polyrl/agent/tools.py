"""Tools: a name, a JSON schema of its arguments and a Python function; running one call.

`ToolBox.run(call)` never raises. Everything that can go wrong with a call becomes a
`ToolOutcome` whose `content` is an error text the model reads on its next turn and
whose `error_type` says what kind of failure it was (recorded as OpenTelemetry
`error.type`):

- "malformed_call"     the model's call could not be parsed (see call_format.py)
- "unknown_tool"       no tool of that name
- "invalid_arguments"  the arguments do not fit the tool's schema
- the exception class  the tool function raised (e.g. "KeyError")

Argument checking covers the schema subset tools here use: an object with
`properties` of type string, integer, number, boolean or array, `enum`, `required`
and `additionalProperties: false`. Values are coerced where a model's intent is
unambiguous: "3" and 3.0 for an integer, 3 for a number, "true" for a boolean.

A ToolBox runs its tools in this process: no timeout, no output cap, so it is for
trusted code. `polyrl.agent.tool_host.SandboxedToolBox` is the same interface with every
call run in a sandboxed tool host per episode (bubblewrap where installed), with a
wall-clock timeout, an output cap and a memory limit per call; run files choose it per
domain (`rl_tasks[].tools.isolation`). Callers `close()` an episode's tools when the
episode ends (a no-op here).

Out of scope: nested object schemas ($ref, oneOf, anyOf), async tools, and per-call
timeouts in-process (a tool that hangs here hangs its episode: use the tool host).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_TYPES = ("string", "integer", "number", "boolean", "array")


@dataclass(frozen=True)
class Tool:
    """One callable tool, declared the way OpenAI function calling declares it."""

    name: str
    description: str
    parameters: dict[str, Any]
    """JSON schema of the arguments object: {"type": "object", "properties": {...}, "required": [...]}."""
    fn: Callable[..., Any] = field(compare=False)
    """Called with the checked arguments as keywords; its return value is shown via str()."""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"tool name {self.name!r} must be an identifier (letters, digits, _)")
        if self.parameters.get("type") != "object" or not isinstance(self.parameters.get("properties", {}), dict):
            raise ValueError(f"tool {self.name!r}: parameters must be an object schema with a 'properties' dict")
        for key, prop in self.parameters.get("properties", {}).items():
            if prop.get("type") not in _TYPES:
                raise ValueError(f"tool {self.name!r}: property {key!r} has type {prop.get('type')!r}; "
                                 f"supported: {', '.join(_TYPES)}")
        unknown = set(self.parameters.get("required", [])) - set(self.parameters.get("properties", {}))
        if unknown:
            raise ValueError(f"tool {self.name!r}: required {sorted(unknown)} not among its properties")

    def openai_spec(self) -> dict[str, Any]:
        """The tool in the OpenAI `tools=[...]` format."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    def signature(self) -> str:
        """`price(item)`: the compact form a small model's system prompt lists."""
        return f"{self.name}({', '.join(self.parameters.get('properties', {}))})"


@dataclass
class ToolCall:
    """One call the model asked for, as parsed from its reply."""

    id: str
    """Unique within the episode; tool results answer it (OpenAI `tool_call_id`)."""
    name: str | None
    arguments: dict[str, Any]
    raw: str = ""
    """The text the call was parsed from (for logs)."""
    error: str | None = None
    """Why the call could not be parsed; set means the call is malformed and will not run."""

    def brief(self) -> str:
        """`price(item=pen)`: one line for summaries and live views."""
        if self.error is not None:
            return "malformed call"
        return f"{self.name}({', '.join(f'{k}={v}' for k, v in self.arguments.items())})"


@dataclass
class ToolOutcome:
    content: str
    """What the model reads: the tool's result, or an error text starting with "Error:"."""
    error_type: str | None = None
    latency_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error_type is None


def check_arguments(schema: dict[str, Any], arguments: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """(coerced arguments, None), or (arguments, what is wrong) when they do not fit `schema`."""
    props: dict[str, Any] = schema.get("properties", {})
    missing = [k for k in schema.get("required", []) if k not in arguments]
    if missing:
        return arguments, f"missing argument {missing[0]!r}"
    if schema.get("additionalProperties", True) is False:
        extra = [k for k in arguments if k not in props]
        if extra:
            return arguments, f"unexpected argument {extra[0]!r}; expected {', '.join(props) or 'none'}"
    out: dict[str, Any] = {}
    for key, value in arguments.items():
        if key not in props:
            out[key] = value
            continue
        ok, coerced = _coerce(props[key], value)
        if not ok:
            return arguments, f"argument {key!r} must be {props[key]['type']}, got {value!r}"
        if "enum" in props[key] and coerced not in props[key]["enum"]:
            return arguments, f"argument {key!r} must be one of {props[key]['enum']}, got {coerced!r}"
        out[key] = coerced
    return out, None


def _coerce(prop: dict[str, Any], value: Any) -> tuple[bool, Any]:
    kind = prop["type"]
    if kind == "string":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return True, str(value)
        return isinstance(value, str), value
    if kind == "boolean":
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return True, value.lower() == "true"
        return isinstance(value, bool), value
    if kind == "array":
        return isinstance(value, list), value
    if isinstance(value, bool):
        return False, value
    if isinstance(value, str):
        try:
            value = float(value.strip()) if kind == "number" or "." in value else int(value.strip())
        except ValueError:
            return False, value
    if kind == "integer":
        if isinstance(value, float) and value.is_integer():
            return True, int(value)
        return isinstance(value, int), value
    return isinstance(value, (int, float)), value


class ToolBox:
    """The tools of one episode. Stateful worlds give each episode a fresh ToolBox, and
    may give it a `state` function: what the world looks like now, as JSON (the agent loop
    puts it in the episode's outcome; a ToolBox that runs its tools elsewhere forwards it)."""

    def __init__(self, tools: Sequence[Tool], state: Callable[[], dict[str, Any]] | None = None):
        self._state = state
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            self.tools[tool.name] = tool

    def __iter__(self):
        return iter(self.tools.values())

    def state(self) -> dict[str, Any] | None:
        """The world's state now, as JSON; None for tools that keep none."""
        return None if self._state is None else self._state()

    def openai_specs(self) -> list[dict[str, Any]]:
        return [t.openai_spec() for t in self.tools.values()]

    def run(self, call: ToolCall) -> ToolOutcome:
        """The call's outcome; never raises (see the module docstring)."""
        start = time.perf_counter()
        if call.error is not None:
            outcome = ToolOutcome(f"Error: malformed tool call ({call.error})", "malformed_call")
        elif call.name not in self.tools:
            outcome = ToolOutcome(f"Error: unknown tool {call.name!r}; tools: {', '.join(self.tools)}",
                                  "unknown_tool")
        else:
            tool = self.tools[call.name]
            arguments, problem = check_arguments(tool.parameters, call.arguments)
            if problem is not None:
                outcome = ToolOutcome(f"Error: {call.name}: {problem}", "invalid_arguments")
            else:
                try:
                    outcome = ToolOutcome(str(tool.fn(**arguments)))
                except Exception as exc:  # noqa: BLE001 -- a failing tool is an observation
                    message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
                    outcome = ToolOutcome(f"Error: {message}", type(exc).__name__)
        outcome.latency_s = time.perf_counter() - start
        return outcome

    def close(self) -> None:
        """Release what the tools hold; nothing for in-process tools (SandboxedToolBox ends its host)."""

    def __enter__(self) -> "ToolBox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
