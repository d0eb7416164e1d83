"""Tools in a sandbox: one tool host process per episode, with a timeout and an output cap per call.

`SandboxedToolBox` is a ToolBox: the agent loop and rollout use it unchanged. Its tools
are declared here (names, descriptions, schemas: the system prompt needs them before any
call), but its calls run in a tool host, a program (tool_server.py) in a sandbox session
of polyrl.sandbox (session.py: bubblewrap when installed, the sandbox package's rules
otherwise; with the default start="fork" each host is forked into fresh namespaces from a
warm session zygote, a few milliseconds, instead of starting bubblewrap and an
interpreter, about 50 ms). Inside, the episode's ToolBox is rebuilt by an importable
factory ("module:function", called with the task: id, domain, prompt, split, difficulty,
data; never its answer) and every call travels as one JSON line each way.

Lifetime. The host starts on the episode's first call (an episode that calls no tool
starts nothing) and keeps its ToolBox, so a stateful world's state persists between the
episode's calls and never reaches another episode. `state()` asks the host for the world's
state (the episode's outcome carries it); a host that was killed took its state with it, so
the episode then reports none. `close()` ends it; the rollout closes
each episode's tools when the episode ends, and a host still running when its
SandboxedToolBox is garbage-collected or the interpreter exits is ended then.

What a call can cost (`ToolOutcome.error_type`, beyond those of ToolBox.run):

- "timeout"            no answer within `timeout_s`: the host is killed
- "output_limit"       the result passed `output_bytes` (UTF-8): the model reads the first
                       `output_bytes`, the host lives on. A tool that prints more than
                       `output_bytes` in one call (its prints are not its result), or a
                       reply the host cannot trust, kills the host: also "output_limit"
- "tool_host_error"    the host could not start or build the tools (the message says why)
- "tool_host_stopped"  any later call once the host was killed or died

A killed host is not restarted: a new one would rebuild the world from the task and
silently forget what the episode changed, so the model would read answers from a state
it never saw. The episode goes on with every later call failing as "tool_host_stopped"
(the model can still answer), and the trainer only sees outcomes. Memory is capped by
RLIMIT_AS (`memory_MB`): a tool that passes it fails as "MemoryError", the host lives on.

Not covered: tools whose factory is not importable (closures, methods of live objects
holding host resources, such as the swe domain's sandbox pool: they stay in-process),
factories that need packages outside the standard library and the factory's own package
(the host's interpreter runs without site-packages), parallel calls within a host, and
starting hosts ahead of their first call.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from polyrl.agent.tools import Tool, ToolBox, ToolCall, ToolOutcome
from polyrl.sandbox.session import Session
from polyrl.sandbox.types import Limits, SandboxConfig
from polyrl.types import Task

SERVER = "polyrl.agent.tool_server"
_REPLY_SLACK = 64 << 10
"""JSON escaping may grow a reply (\\u escapes): the host accepts 6x output_bytes plus this."""
_STATE_BYTES = 16 << 20
"""Largest state reply the host accepts: a world's state is the trainer's own data, not a tool's output."""


@dataclass(frozen=True)
class ToolHostSettings:
    """Limits of each episode's tool host, and how it is isolated."""

    timeout_s: float = 10.0
    """Wall-clock limit of one call; past it the host is killed ("timeout")."""
    output_bytes: int = 64 << 10
    """Largest result (UTF-8 bytes) of one call; longer ones are cut ("output_limit")."""
    memory_MB: int = 512
    """RLIMIT_AS of the host process."""
    start_timeout_s: float = 30.0
    """Wall-clock limit of starting the host and building the tools."""
    sandbox: SandboxConfig = field(default_factory=lambda: SandboxConfig(allow_unsafe=True))
    """bubblewrap when installed; with allow_unsafe=True a plain process where it is not
    (SandboxConfig(isolation="none", allow_unsafe=True): always a plain process)."""
    processes: int = 1024
    """RLIMIT_NPROC shared by every tool host of this process (they run as one uid)."""

    def __post_init__(self) -> None:
        for name in ("timeout_s", "output_bytes", "memory_MB", "start_timeout_s", "processes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ToolHostSettings.{name} must be positive, got {getattr(self, name)!r}")


def factory_name(fn: Callable[[Task], ToolBox]) -> str | None:
    """"module:qualified.name" of `fn` when importing that gives `fn` back (a function, a
    static or class method); None for closures and methods bound to an instance."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or "<" in qualname:
        return None
    name = f"{module}:{qualname}"
    from polyrl.agent.tool_server import resolve

    try:
        return name if resolve(name) == fn else None
    except (ImportError, AttributeError, ValueError):
        return None


def import_roots(*modules: str) -> list[str]:
    """Host paths of the top-level packages (or single-file modules) of `modules`: what the
    host binds so they import inside."""
    roots = []
    for module in modules:
        __import__(module)
        top = sys.modules[module.partition(".")[0]]
        paths = list(getattr(top, "__path__", []))
        path = paths[0] if paths else getattr(top, "__file__", None)
        if path is None:
            raise ValueError(f"module {module!r} has no file to bind into the tool host")
        if str(Path(path).resolve()) not in roots:
            roots.append(str(Path(path).resolve()))
    return roots


def _answer(line: bytes) -> tuple[str, str | None, int] | None:
    """(content, error_type, total_bytes) of a call's reply; None when it is not one."""
    try:
        answer = json.loads(line)
        content, error_type, total = answer["content"], answer["error_type"], answer["total_bytes"]
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(content, str) or not isinstance(total, int) or not isinstance(error_type, (str, type(None))):
        return None
    return content, error_type, total


def _declared_only(name: str) -> Callable[..., Any]:
    def fn(**_: Any) -> Any:
        raise AssertionError(f"tool {name!r} runs in the tool host, not here")
    return fn


class SandboxedToolBox(ToolBox):
    """The tools of one episode, run in a tool host; see the module docstring."""

    def __init__(self, declared: ToolBox | Sequence[Tool], factory: str, task: Task,
                 settings: ToolHostSettings = ToolHostSettings()):
        """`declared`: the tools as the model sees them (their functions are never called
        here); `factory(task)` builds the same tools inside the host."""
        super().__init__([Tool(t.name, t.description, t.parameters, _declared_only(t.name)) for t in declared])
        self._fresh_state = declared.state if isinstance(declared, ToolBox) else (lambda: None)
        self.factory, self.settings = factory, settings
        self.task = {"id": task.id, "domain": task.domain, "prompt": task.prompt, "split": task.split,
                     "difficulty": task.difficulty, "data": task.data}
        self.session: Session | None = None
        self.stopped: str | None = None
        """Why the host is gone (None while it may still run)."""

    def run(self, call: ToolCall) -> ToolOutcome:
        """The call's outcome, from the host; never raises."""
        start = time.perf_counter()
        try:
            outcome = self._run(call)
        except Exception as err:  # noqa: BLE001 -- a host-side bug is the episode's, not the trainer's
            self._stop(f"tool host failure: {type(err).__name__}: {err}")
            outcome = ToolOutcome(f"Error: {self.stopped}", "tool_host_error")
        outcome.latency_s = time.perf_counter() - start
        return outcome

    def state(self) -> dict[str, Any] | None:
        """The world's state now, as JSON: the host's once it started; before the first call,
        the declared tools' (a world no call has changed yet); None once the host is gone
        (what the episode changed went with it) or when the host cannot say."""
        if self.session is None:  # no call started a host: the world is as the task built it
            return self._fresh_state()
        if self.stopped is not None:
            return None
        reply = self.session.exchange(b'{"state": true}', self.settings.timeout_s, _STATE_BYTES)
        if reply.status != "ok":
            self._stop(f"the tool host did not report its state: {reply.message or reply.status}")
            return None
        try:
            answer = json.loads(reply.line)
        except ValueError:
            return None
        return answer.get("state") if isinstance(answer, dict) else None

    def close(self) -> None:
        """End the host (idempotent); later calls fail as "tool_host_stopped"."""
        self._stop("the episode's tools were closed")

    # ------------------------------------------------------------------ internals

    def _run(self, call: ToolCall) -> ToolOutcome:
        if self.stopped is not None:
            return ToolOutcome(f"Error: tools are unavailable for the rest of this episode ({self.stopped})",
                               "tool_host_stopped")
        if self.session is None:
            failure = self._start()
            if failure is not None:
                self._stop(failure)
                return ToolOutcome(f"Error: the tool host could not start: {failure}", "tool_host_error")
        assert self.session is not None
        s = self.settings
        request = {"id": call.id, "name": call.name, "arguments": call.arguments, "error": call.error}
        reply = self.session.exchange(json.dumps(request).encode(), s.timeout_s,
                                      6 * s.output_bytes + _REPLY_SLACK)
        if reply.status == "timeout":
            self._stop(f"{call.name} did not finish within {s.timeout_s:g}s")
            return ToolOutcome(f"Error: {call.name} did not finish within {s.timeout_s:g}s; the tool host "
                               "was stopped", "timeout")
        if reply.status == "output_limit":
            self._stop(f"{call.name} flooded its output")
            return ToolOutcome(f"Error: {call.name} wrote more than the {s.output_bytes}-byte output limit; "
                               "the tool host was stopped", "output_limit")
        if reply.status == "died":
            self._stop(f"the tool host died: {reply.message}")
            return ToolOutcome(f"Error: {self.stopped}", "tool_host_stopped")
        if reply.stderr_bytes > s.output_bytes:
            self._stop(f"{call.name} printed more than {s.output_bytes} bytes")
            return ToolOutcome(f"Error: {call.name} printed more than the {s.output_bytes}-byte output limit; "
                               "the tool host was stopped", "output_limit")
        answer = _answer(reply.line)
        if answer is None:  # a tool wrote into the protocol, or patched what writes it
            self._stop(f"{call.name} broke the tool host's reply")
            return ToolOutcome(f"Error: {self.stopped}; the tool host was stopped", "tool_host_error")
        content, error_type, total = answer
        if total > s.output_bytes:
            return ToolOutcome(f"Error: the output of {call.name} ({total} bytes) passed the {s.output_bytes}-byte "
                               f"limit; its first {s.output_bytes} bytes:\n{content}", "output_limit")
        return ToolOutcome(content, error_type)

    def _start(self) -> str | None:
        s = self.settings
        module = self.factory.partition(":")[0]
        try:
            packages = import_roots(SERVER, module)
        except (ImportError, ValueError) as err:
            return f"cannot import {self.factory}: {err}"
        self.session = Session(f"{SERVER}:main", s.sandbox, packages, [module], s.memory_MB,
                               Limits(processes=s.processes), stderr_flood=s.output_bytes)
        failure = self.session.start()
        if failure is not None:
            return failure
        init = {"factory": self.factory, "task": self.task, "output_bytes": s.output_bytes}
        try:
            line = json.dumps(init).encode()
        except (TypeError, ValueError) as err:
            return f"the task's data is not JSON: {err}"
        reply = self.session.exchange(line, s.start_timeout_s, 1 << 20)
        if reply.status != "ok":
            return reply.message
        answer = json.loads(reply.line)
        if "error" in answer:
            return str(answer["error"])
        if sorted(answer["tools"]) != sorted(self.tools):
            return f"the host built tools {answer['tools']}, not the declared {list(self.tools)}"
        return None

    def _stop(self, why: str) -> None:
        self.stopped = self.stopped or why
        if self.session is not None:
            self.session.close()


def isolated(toolbox_for: Callable[[Task], ToolBox], settings: ToolHostSettings) -> Callable[[Task], ToolBox]:
    """`toolbox_for` with each episode's calls run in a tool host of its own. ValueError
    when `toolbox_for` cannot be imported inside the host (see `factory_name`)."""
    factory = factory_name(toolbox_for)
    if factory is None:
        raise ValueError(f"{toolbox_for!r} is not an importable function (module:function), so its tools "
                         "cannot be rebuilt in a tool host")

    def episode_tools(task: Task) -> ToolBox:
        return SandboxedToolBox(toolbox_for(task), factory, task, settings)

    return episode_tools
