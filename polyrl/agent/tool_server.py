"""Runs INSIDE the tool host (`python -m polyrl.agent.tool_server`): one episode's tools.

tool_host.py starts this program in a sandbox (polyrl.sandbox.session) on the episode's
first tool call. It reads JSON lines on stdin and answers each with one JSON line:

    {"factory": "pkg.mod:Class.fn", "task": {...}, "output_bytes": N}
        -> {"tools": [names]}        the episode's ToolBox, built by the factory from the task
        -> {"error": "..."}          the factory could not be imported or failed
    {"state": true}
        -> {"state": {...} | null}   ToolBox.state(): the world as it is now
        -> {"error": "..."}          the state function failed, or its state is not JSON
    {"id", "name", "arguments", "error"}   one ToolCall
        -> {"content", "error_type", "total_bytes"}   ToolBox.run's outcome, its content cut
                                                      to output_bytes (UTF-8) when longer

The ToolBox lives as long as this process, so the world's state persists between the
episode's calls. The protocol owns the real stdin and stdout: a tool's reads see an empty
stdin, and what it prints goes to stderr (the host caps it). A tool that raises even
BaseException (SystemExit, KeyboardInterrupt) is an outcome, as an Exception is in ToolBox.run.

Standard library and polyrl.agent.tools only, besides the factory's own module.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any


def resolve(factory: str) -> Any:
    """The object `factory` names: "module:qualified.name"."""
    module, _, qualname = factory.partition(":")
    if not module or not qualname:
        raise ValueError(f"tool factory {factory!r} must be 'module:function'")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def cut(text: str, limit: int) -> tuple[str, int]:
    """(text cut to at most `limit` UTF-8 bytes, its full size in bytes)."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text, len(data)
    return data[:limit].decode("utf-8", "ignore"), len(data)


def serve(requests, reply) -> None:
    from polyrl.agent.tools import ToolBox, ToolCall, ToolOutcome
    from polyrl.types import Task

    tools: ToolBox | None = None
    limit = 0
    for line in requests:
        try:
            message = json.loads(line)
        except ValueError as err:
            reply({"error": f"unreadable request: {err}"})
            continue
        if tools is None:
            try:
                built = resolve(message["factory"])(Task(**message["task"]))
                if not isinstance(built, ToolBox):
                    raise TypeError(f"{message['factory']} returned {type(built).__name__}, not a ToolBox")
            except BaseException as err:  # noqa: BLE001 -- reported to the host, which stops us
                reply({"error": f"could not build the tools: {type(err).__name__}: {err}"})
                return
            tools, limit = built, int(message["output_bytes"])
            reply({"tools": list(tools.tools)})
            continue
        if message.get("state"):
            reply(_state_of(tools))
            continue
        call = ToolCall(str(message.get("id", "")), message.get("name"), message.get("arguments") or {},
                        error=message.get("error"))
        try:
            outcome = tools.run(call)
        except BaseException as err:  # noqa: BLE001 -- SystemExit and friends end the call, not the host
            outcome = ToolOutcome(f"Error: {type(err).__name__}: {err}", type(err).__name__)
        content, size = cut(outcome.content, limit)
        reply({"content": content, "error_type": outcome.error_type, "total_bytes": size})


def _state_of(tools: Any) -> dict:
    """The reply to a state request: {"state": ToolBox.state()}, or {"error": why} when the
    world's state function fails or its state is not JSON."""
    try:
        state = tools.state()
        json.dumps(state)
    except BaseException as err:  # noqa: BLE001 -- reported to the host, which reports no state
        return {"error": f"the world's state is unavailable: {type(err).__name__}: {err}"}
    return {"state": state}


def main() -> None:
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.dup(1)
    empty, closed = os.pipe()  # a tool reading stdin reads nothing
    os.close(closed)
    os.dup2(empty, 0)
    os.close(empty)
    os.dup2(2, 1)  # a tool's prints go to stderr, never into the protocol

    def reply(message: dict) -> None:
        data = memoryview(json.dumps(message).encode() + b"\n")
        while data:
            data = data[os.write(replies, data):]

    serve(iter(requests.readline, b""), reply)


if __name__ == "__main__":
    main()
