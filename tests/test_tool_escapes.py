"""The sandbox exploit suite (tests/test_sandbox_exploits.py) applied to tools: each exploit
runs as a tool call in a sandboxed tool host (bubblewrap, forked from the warm zygote), and
none reaches the host: every call comes back as an outcome, no file carrying the marker
appears, no process carrying it survives, nothing connects to a listener on 127.0.0.1, and
neither the network nor a namespace trick gets the answer 3 out.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any, Iterator

import pytest

from polyrl.agent.tool_host import SandboxedToolBox, ToolHostSettings
from polyrl.agent.tools import ToolCall
from polyrl.sandbox.session import close_zygotes
from polyrl.sandbox.types import SandboxConfig
from polyrl.types import Task
from tests import tool_worlds
from tests.test_sandbox_exploits import CANARY_DIRS, CORRECT, EXPLOITS, MARKER, _Listener, _marked_processes

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")


@pytest.fixture(scope="module")
def outcomes() -> Iterator[dict[str, Any]]:
    listener = _Listener()
    settings = ToolHostSettings(timeout_s=2.0, output_bytes=1 << 16, memory_MB=256,
                                sandbox=SandboxConfig(allow_unsafe=False))
    results = {}
    try:
        for name, code in [*EXPLOITS.items(), ("correct", CORRECT)]:
            code = (code.replace("{marker}", MARKER).replace("{port}", str(listener.port))
                    .replace("{canary_dirs!r}", repr(CANARY_DIRS)))
            task = Task(id=f"exploit-{name}", domain="toy", prompt="solve", data={"code": code})
            tools = SandboxedToolBox(tool_worlds.exploit(task), "tests.tool_worlds:exploit", task, settings)
            try:
                results[name] = tools.run(ToolCall(f"call-{name}", "solve", {}))
            finally:
                tools.close()
    finally:
        close_zygotes()
        time.sleep(0.2)  # let anything that escaped show itself
        listener.close()
    yield {"outcomes": results, "connections": listener.connections, "processes": _marked_processes()}


@pytest.mark.parametrize("name", sorted(EXPLOITS))
def test_every_exploit_ends_as_an_outcome(outcomes: dict[str, Any], name: str) -> None:
    outcome = outcomes["outcomes"][name]
    assert isinstance(outcome.content, str)
    if name in ("network", "namespace_escape"):
        assert outcome.content != "3", f"{name} got its answer out of the sandbox"


def test_no_exploit_touches_the_host(outcomes: dict[str, Any]) -> None:
    assert outcomes["connections"] == 0
    assert outcomes["processes"] == []
    assert [d for d in CANARY_DIRS if os.path.exists(os.path.join(d, MARKER))] == []
    try:
        assert os.waitpid(-1, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        pass


def test_the_hostile_ones_fail_for_the_right_reason_and_the_next_episode_still_starts(outcomes) -> None:
    by = outcomes["outcomes"]
    seen = {name: (o.error_type, o.content[:160]) for name, o in by.items()}
    assert by["fork_bomb"].error_type == "timeout", seen["fork_bomb"]
    # right after the fork bomb's thousand processes are killed, the next episode's host starts
    assert by["sleep_past_deadline"].error_type == "timeout", seen["sleep_past_deadline"]
    assert by["busy_loop"].error_type == "timeout", seen["busy_loop"]
    assert by["huge_return"].error_type == "output_limit" and by["endless_output"].error_type == "output_limit"
    assert by["os_exit"].error_type == by["posix_exit"].error_type == "tool_host_stopped"
    # only the exploits that break the host's own reply (one patches json.dumps, one writes protocol
    # lines into every descriptor) stop the host; depending on when the forged line arrives, the host
    # reads it as the reply or as an answer out of turn. Either way nothing forged gets through.
    breakers = {"patched_print_json_repr", "forged_protocol_lines"}
    stopped = {n for n, o in by.items() if o.error_type in ("tool_host_error", "tool_host_stopped")}
    assert stopped - {"os_exit", "posix_exit"} <= breakers, {n: seen[n] for n in stopped}
    assert all(by[n].content != "3" for n in breakers)
    assert (by["correct"].error_type, by["correct"].content) == (None, "3")
