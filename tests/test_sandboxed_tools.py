"""Tools in a tool host (polyrl/agent/tool_host.py): timeouts, output caps, isolation,
per-episode state, no processes left behind, and the same outcomes as in-process tools.

"sandbox" runs the host in bubblewrap (skipped where it is not installed); "process" is a
plain subprocess with the same protocol, timeouts and caps (the sandbox package's
isolation="none"). Both run everywhere bubblewrap does.
"""

from __future__ import annotations

import gc
import os
import shutil
import time
import uuid

import pytest

from polyrl.agent.call_format import format_answer, format_call
from polyrl.agent.loop import AgentConfig, ModelSlot, run_agent
from polyrl.agent.tool_host import SandboxedToolBox, ToolHostSettings, factory_name, isolated
from polyrl.agent.tools import ToolBox, ToolCall
from polyrl.config import load_config_text
from polyrl.domains.agent import AgentDomain
from polyrl.domains.ops import OpsDomain
from polyrl.engine.base import SamplingParams
from polyrl.rewards.world_state import gold_state
from polyrl.rollout.episodes import rollout_episodes
from polyrl.sandbox import session as session_module
from polyrl.sandbox.session import close_zygotes, zygote_processes
from polyrl.sandbox.types import SandboxConfig
from polyrl.train.setup import build_domains
from polyrl.types import Task
from tests import tool_worlds
from tests.agent_fakes import ScriptedModel, call
from tests.helpers import tiny_tokenizer
from tests.test_agent_episodes import DemoEngine

HAS_BWRAP = shutil.which("bwrap") is not None
SANDBOX = SandboxConfig(allow_unsafe=False)
PROCESS = SandboxConfig(isolation="none", allow_unsafe=True)
SPAWN = SandboxConfig(allow_unsafe=False, start="spawn")
NO_BWRAP = pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap (bwrap) is not installed")
MODES = [pytest.param(SANDBOX, id="sandbox", marks=NO_BWRAP), pytest.param(SPAWN, id="sandbox-spawn", marks=NO_BWRAP),
         pytest.param(PROCESS, id="process")]
WORLD = "tests.tool_worlds:misbehaving"
TASK = Task(id="t1", domain="toy", prompt="do things", answer="gold-answer", data={"secret": "s3"})


def settings(sandbox: SandboxConfig, **kw) -> ToolHostSettings:
    return ToolHostSettings(**{"timeout_s": 1.0, "output_bytes": 1024, "memory_MB": 512, "sandbox": sandbox, **kw})


def host(sandbox: SandboxConfig, task: Task = TASK, factory: str = WORLD, **kw) -> SandboxedToolBox:
    return SandboxedToolBox(tool_worlds.misbehaving(task), factory, task, settings(sandbox, **kw))


def run(tools: ToolBox, name: str, **arguments):
    return tools.run(ToolCall(f"call-{name}", name, arguments))


def sleepers() -> list[int]:
    """Pids of every process the `spawn` tool started, anywhere on this host."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if tool_worlds.SLEEPER_SECONDS.encode() in f.read():
                    found.append(int(pid))
        except (OSError, ValueError):
            continue
    return found


def descendants(pid: int = os.getpid()) -> set[int]:
    """Every live process below `pid` (this test process) in the process tree."""
    parents = {}
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
            if fields[0] != b"Z":
                parents[int(name)] = int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def eventually(check, seconds: float = 3.0):
    """`check()`'s value once it is truthy (a killed process takes a moment to go); its last value else."""
    deadline = time.monotonic() + seconds
    while not (value := check()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return value


BEFORE: set[int] = set()
"""Processes below this one when the test started (other test files' workers): not ours to check."""


def hosts() -> set[int]:
    """Live processes below this one that are not a session zygote and were not there before the
    test: tool hosts and what they started."""
    return descendants() - zygote_processes() - BEFORE


def ended() -> bool:
    """No tool host below this process, and no process a tool started, anywhere."""
    return not hosts() and not sleepers()


def gone() -> bool:
    """Nothing below this process that the test started (the session zygotes closed too)."""
    return not (descendants() - BEFORE) and not sleepers()


@pytest.fixture(autouse=True)
def no_leftovers():
    close_zygotes()
    BEFORE.clear()
    BEFORE.update(descendants())
    assert eventually(lambda: not sleepers()), "an earlier test left a tool's process behind"
    yield
    gc.collect()
    assert eventually(ended), "a tool host or a process a tool started outlived its test"
    close_zygotes()
    assert eventually(gone), "a session zygote outlived close_zygotes()"


# ---------------------------------------------------------------- hangs, floods, crashes


@pytest.mark.parametrize("sandbox", MODES)
@pytest.mark.parametrize("tool", ["hang", "spin"])
def test_a_hanging_tool_costs_its_call_a_timeout_and_the_episode_goes_on(sandbox, tool):
    tools = host(sandbox, timeout_s=0.5)
    model = ScriptedModel([call("count"), call(tool), call("count"), "<answer>done</answer>"])
    start = time.monotonic()
    result = run_agent("do things", tools, [ModelSlot(model)], AgentConfig(max_steps=6))
    elapsed = time.monotonic() - start
    tools.close()
    outcomes = [(r.call.name, r.outcome.error_type) for r in result.tool_results]
    assert outcomes == [("count", None), (tool, "timeout"), ("count", "tool_host_stopped")]
    assert "did not finish within 0.5s" in result.tool_results[1].outcome.content
    assert "unavailable for the rest of this episode" in result.tool_results[2].outcome.content
    assert result.stop_reason == "answer" and result.answer == "done"
    assert elapsed < 5, elapsed  # the trainer's process waited one timeout, nothing more
    assert 0.5 <= result.tool_results[1].outcome.latency_s < 3


@pytest.mark.parametrize("sandbox", MODES)
def test_a_huge_result_is_cut_at_the_limit_and_the_host_lives_on(sandbox):
    with host(sandbox) as tools:
        flooded = run(tools, "flood", size=5_000_000)
        assert flooded.error_type == "output_limit"
        assert "(5000000 bytes) passed the 1024-byte limit" in flooded.content
        shown = flooded.content.split("\n", 1)[1]
        assert shown == "H" * 16 + "x" * (1024 - 16)
        assert run(tools, "count").content == "1 of toolbox 1"  # same host, same state
        assert run(tools, "flood", size=1024).content == "H" * 16 + "x" * 1008  # at the limit: whole


@pytest.mark.parametrize("sandbox", MODES)
def test_printing_megabytes_stops_the_host_and_a_little_noise_is_ignored(sandbox):
    with host(sandbox) as tools:
        assert (run(tools, "whisper").content, run(tools, "whisper").error_type) == ("quiet", None)
        start = time.monotonic()
        shouted = run(tools, "shout", size=5_000_000)
        assert shouted.error_type == "output_limit" and "the tool host was stopped" in shouted.content
        assert time.monotonic() - start < 5
        assert run(tools, "count").error_type == "tool_host_stopped"


@pytest.mark.parametrize("sandbox", MODES)
def test_exit_and_memory_errors_are_outcomes_and_the_host_lives_on(sandbox):
    with host(sandbox, memory_MB=256) as tools:
        assert run(tools, "quit").error_type == "SystemExit"
        assert run(tools, "hog", mb=1024).error_type == "MemoryError"
        assert run(tools, "hog", mb=8).content == str(8 << 20)
        assert run(tools, "count").content == "1 of toolbox 1"


@pytest.mark.parametrize("sandbox", MODES)
def test_a_factory_that_fails_costs_the_episode_its_tools(sandbox):
    with host(sandbox, factory="tests.tool_worlds:broken") as tools:
        first = run(tools, "count")
        assert first.error_type == "tool_host_error" and "this world cannot be built" in first.content
        assert run(tools, "count").error_type == "tool_host_stopped"


def test_the_host_sees_the_task_data_but_never_the_answer():
    with host(PROCESS) as tools:
        assert run(tools, "data").content == "s3 answer=None"


# ---------------------------------------------------------------- isolation


@pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap (bwrap) is not installed")
def test_in_bubblewrap_a_tool_cannot_read_or_write_the_hosts_files(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    target = f"/tmp/polyrl-escape-{uuid.uuid4().hex}"
    repo_file = os.path.abspath("pyproject.toml")
    with host(SANDBOX) as tools:
        for path in (str(secret), repo_file, "/etc/passwd", "/root/.bashrc"):
            assert run(tools, "read", path=path).error_type in ("FileNotFoundError", "PermissionError"), path
        assert run(tools, "write", path="/usr/escape").error_type == "OSError"  # read-only system
        assert run(tools, "write", path=target).content == "written"  # its own /tmp, a tmpfs
        assert run(tools, "read", path=target).content == "escaped"
    assert not os.path.exists(target)
    with host(PROCESS) as tools:  # the unisolated host does read them: the test can tell
        assert run(tools, "read", path=str(secret)).content == "host secret"


# ---------------------------------------------------------------- lifetime and state


@pytest.mark.parametrize("sandbox", MODES)
def test_state_persists_within_an_episode_and_never_leaks_into_the_next(sandbox):
    built = len(tool_worlds.BUILT)
    first, second = host(sandbox), host(sandbox)
    with first, second:
        assert [run(first, "count").content for _ in range(3)] == ["1 of toolbox 1", "2 of toolbox 1",
                                                                  "3 of toolbox 1"]
        assert run(second, "count").content == "1 of toolbox 1"  # its own process, module state too
    assert len(tool_worlds.BUILT) == built + 2  # here only to declare them; every call ran in a host


@pytest.mark.parametrize("sandbox", MODES)
def test_no_process_survives_the_episode(sandbox):
    detach = sandbox.isolation == "bwrap"  # a process in a session of its own escapes a plain host's group
    tools = host(sandbox)
    assert descendants() - BEFORE == set()  # nothing starts before the first call
    assert run(tools, "spawn", detach=detach).ok
    assert eventually(sleepers) and hosts()
    tools.close()
    tools.close()
    assert eventually(ended) and bool(zygote_processes()) == (sandbox.start == "fork")  # a warm zygote stays
    assert run(tools, "count").error_type == "tool_host_stopped"

    forgotten = host(sandbox)  # never closed: collected with its SandboxedToolBox
    assert run(forgotten, "spawn", detach=detach).ok
    assert eventually(sleepers)
    del forgotten
    gc.collect()
    assert eventually(ended)


@pytest.mark.parametrize("sandbox", [m for m in MODES if m.id != "sandbox-spawn"])
def test_a_dead_zygote_costs_its_hosts_and_the_next_episode_starts_another(sandbox):
    first = host(sandbox)
    assert run(first, "count").ok
    (zygote,) = session_module._zygotes.values()
    os.kill(zygote.proc.pid, 9)
    zygote.proc.wait()
    if sandbox.isolation == "bwrap":  # the zygote was pid 1 of the sandbox: its hosts go with it
        assert eventually(lambda: run(first, "count").error_type == "tool_host_stopped")
    with host(sandbox) as second:
        assert run(second, "count").content == "1 of toolbox 1"
    first.close()


@pytest.mark.parametrize("sandbox", MODES)
def test_a_rollout_ends_every_host_even_when_the_engine_fails(sandbox, tmp_path):
    tok = tiny_tokenizer(tmp_path)
    tasks = AgentDomain().sample("train", 2, seed=3)
    tools_for = isolated(AgentDomain.toolbox, settings(sandbox))
    made: list[SandboxedToolBox] = []

    def toolbox_for(task):
        made.append(tools_for(task))
        return made[-1]

    engine = DemoEngine(tok, tasks)
    episodes = rollout_episodes(engine, tok, tasks, 2, SamplingParams(), toolbox_for, AgentConfig(max_tokens=96))
    assert all(e.result.answer == e.task.answer for e in episodes)
    assert all(t.stopped and t.session is not None for t in made)  # each host ran, then was ended
    assert eventually(ended)

    class FailingEngine(DemoEngine):
        def generate(self, prompts, n, sampling):
            if self.calls:
                raise RuntimeError("engine lost")
            return super().generate(prompts, n, sampling)

    made.clear()
    with pytest.raises(RuntimeError, match="engine lost"):
        rollout_episodes(FailingEngine(tok, tasks), tok, tasks, 2, SamplingParams(), toolbox_for,
                         AgentConfig(max_tokens=96))
    assert made and all(t.stopped for t in made)
    assert eventually(ended)


# ---------------------------------------------------------------- the agent domain, both ways


def _agent_calls(task: Task) -> list[ToolCall]:
    """The task's gold calls, then calls that fail in each way the world knows."""
    gold = [ToolCall(f"g{k}", c["name"], dict(c["arguments"])) for k, c in enumerate(task.data["gold_calls"])]
    return gold + [ToolCall("b1", "price", {"item": "unicorn"}), ToolCall("b2", "calc", {"expr": "2**8"}),
                   ToolCall("b3", "stock", {}), ToolCall("b4", "teleport", {"to": "moon"}),
                   ToolCall("b5", "note", {"topic": "GIFT"}), ToolCall("b6", "price", {"item": "Pens", "x": 1}),
                   ToolCall("b7", None, {}, error="not JSON")]


@pytest.mark.parametrize("sandbox", MODES)
def test_agent_domain_outcomes_are_identical_in_process_and_in_the_host(sandbox):
    tasks = AgentDomain().sample("train", 8, seed=1) + AgentDomain(levels=(4,)).sample("heldout", 4, seed=1)
    tools_for = isolated(AgentDomain.toolbox, settings(sandbox))
    for task in tasks:
        local, remote = AgentDomain.toolbox(task), tools_for(task)
        with remote:
            assert remote.openai_specs() == local.openai_specs()
            for c in _agent_calls(task):
                a, b = local.run(c), remote.run(c)
                assert (b.content, b.error_type) == (a.content, a.error_type), (task.id, c)

    task = tasks[0]
    script = [m["content"] for m in AgentDomain.demonstration(task) if m["role"] == "assistant"]
    results = []
    for tools in (AgentDomain.toolbox(task), tools_for(task)):
        with tools:
            results.append(run_agent(task.prompt, tools, [ModelSlot(ScriptedModel(script))]))
    local, remote = results
    assert remote.answer == local.answer == task.answer
    assert remote.outcome == local.outcome
    assert [(r.outcome.content, r.outcome.error_type) for r in remote.tool_results] == \
        [(r.outcome.content, r.outcome.error_type) for r in local.tool_results]
    assert remote.transcript.full_messages() == local.transcript.full_messages()


@pytest.mark.parametrize("sandbox", MODES)
def test_a_stateful_worlds_state_comes_back_from_the_host(sandbox):
    task = OpsDomain(levels=(2,)).sample("train", 1, seed=0)[0]
    calls = [format_call(c["name"], c["arguments"]) for c in task.data["reference_calls"]] + [format_answer("done")]
    fresh = OpsDomain.toolbox(task).state()
    tools_for = isolated(OpsDomain.toolbox, settings(sandbox))
    results = []
    for tools in (OpsDomain.toolbox(task), tools_for(task)):
        with tools:
            assert tools.state() == fresh  # before any call (and no host started for it)
            results.append(run_agent(task.prompt, tools, [ModelSlot(ScriptedModel(calls))], AgentConfig(max_steps=200)))
    local, remote = results
    assert remote.world == local.world == gold_state(task) != fresh
    assert remote.outcome == local.outcome

    killed = tools_for(task)  # a host that was stopped took the episode's changes with it
    with killed:
        run(killed, task.data["reference_calls"][0]["name"], **task.data["reference_calls"][0]["arguments"])
        assert killed.state() is not None
        killed.close()
        assert killed.state() is None


# ---------------------------------------------------------------- the run file


def _run_file(tools: str = "", domain: str = "agent") -> str:
    return f"rl_tasks:\n  - domain: {domain}\n    weight: 1\n{tools}"


def test_run_file_chooses_where_tools_run():
    task = AgentDomain().sample("train", 1, seed=0)[0]
    default = build_domains(load_config_text(_run_file()), verifiers=False).specs["agent"].agent
    assert default.toolbox_for is AgentDomain.toolbox  # in-process unless the run file says otherwise

    sandboxed = build_domains(load_config_text(_run_file("    tools: {isolation: sandbox}\n")), verifiers=False)
    tools = sandboxed.specs["agent"].agent.toolbox_for(task)
    assert isinstance(tools, SandboxedToolBox) and tools.session is None  # nothing runs before a call
    assert tools.settings.timeout_s == 10.0 and tools.settings.sandbox.isolation == "bwrap"
    assert tools.settings.sandbox.allow_unsafe  # a plain process where bubblewrap is missing

    text = _run_file("    tools: {isolation: process, timeout_s: 2.5, output_bytes: 4096, memory_MB: 256}\n")
    chosen = build_domains(load_config_text(text), verifiers=False).specs["agent"].agent.toolbox_for(task)
    assert (chosen.settings.timeout_s, chosen.settings.output_bytes, chosen.settings.memory_MB) == (2.5, 4096, 256)
    assert chosen.settings.sandbox.isolation == "none"

    written_out = "    tools: {isolation: none, timeout_s: 10.0, output_bytes: 65536, memory_MB: 512}\n"
    assert build_domains(load_config_text(_run_file(written_out, "math")), verifiers=False)  # a resumed run
    with pytest.raises(ValueError, match="rl_tasks domain 'math': `tools` is set, but this domain has no tools"):
        build_domains(load_config_text(_run_file("    tools: {isolation: sandbox}\n", "math")), verifiers=False)
    with pytest.raises(ValueError, match="rl_tasks domain 'swe': tools.isolation 'sandbox'.*isolation: none"):
        build_domains(load_config_text(_run_file("    tools: {isolation: sandbox}\n", "swe")), verifiers=False)


@pytest.mark.parametrize("tools, message", [
    ("    tools: {isolation: docker}\n", "rl_tasks[0].tools.isolation"),
    ("    tools: {timeout_s: 0}\n", "rl_tasks[0].tools.timeout_s"),
    ("    tools: {output_bytes: 10}\n", "rl_tasks[0].tools.output_bytes"),
    ("    tools: {timeot_s: 1}\n", "did you mean 'timeout_s'"),
])
def test_run_file_tool_settings_are_checked(tools, message):
    with pytest.raises(Exception, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config_text(_run_file(tools))


def test_tools_that_cannot_be_rebuilt_in_a_host_are_refused():
    assert factory_name(AgentDomain.toolbox) == "polyrl.domains.agent:AgentDomain.toolbox"
    assert factory_name(lambda task: ToolBox([])) is None

    class Holder:
        def toolbox(self, task):
            return ToolBox([])

    assert factory_name(Holder().toolbox) is None
    with pytest.raises(ValueError, match="not an importable function"):
        isolated(Holder().toolbox, ToolHostSettings())
