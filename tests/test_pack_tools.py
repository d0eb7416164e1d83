"""Packs whose tasks bring tools run with them everywhere: `polyrl pack D` then `polyrl eval`:
every generated built-in domain's pack loads as a suite,
an ops task runs with the ops world's tools and is graded on the world's final state, an swe
task runs with its repository's tools (tests in the sandbox); `polyrl agent` refuses a pack
without tool worlds with a message, not a crash; a run file's agent pack trains as agent
episodes (it used to roll out single-turn, without its tools), and a line without a world
stops the run at load.

The model is a replayer (no weights): it makes the calls it is given in order, then answers,
so success depends only on which tools the episode ran with and what the verifier reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from polyrl.agent.call_format import format_answer, format_call, parse_calls
from polyrl.agent.model import ModelReply, ModelRequest, Usage
from polyrl.cli import main
from polyrl.evals.limits import EvalLimits
from polyrl.evals.runner import Verifiers, run_task
from polyrl.evals.suite import load_suite
from tests.agent_fakes import count_chars
from tests.helpers import builtin_tiny_as_small

WITH_TOOLS = {"agent", "ops", "swe"}


@pytest.fixture(scope="module")
def small_builtin(tmp_path_factory):
    """builtin:tiny as the small test recipe's model: longctx packs measure their documents in
    the model's tokens, and the full model takes minutes to build on a machine with an empty cache."""
    with builtin_tiny_as_small(tmp_path_factory.mktemp("cache")):
        yield


@pytest.mark.parametrize("domain", ["math", "code", "agent", "alignment", "longctx", "swe", "ops"])
def test_a_generated_pack_loads_as_a_suite(tmp_path, domain, small_builtin):
    path = tmp_path / f"{domain}.jsonl"
    assert main(["pack", domain, "-n", "3", "-o", str(path)]) == 0
    suite = load_suite(path)
    assert len(suite.tasks) == 3
    assert {t.is_agent for t in suite.tasks} == {domain in WITH_TOOLS}
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    if domain in ("agent", "alignment"):  # the pack reader has no default verifier for these
        assert {x["verifier"] for x in lines} == {"success_minus_cost" if domain == "agent" else "preference_model"}


class Replayer:
    """Makes `calls` one per turn, then answers `answer`."""

    provider, tool_format, tools_style = "test", "text", "compact"
    name, context_window = "replayer", None

    def __init__(self, calls: list[dict], answer: str = "done"):
        self.calls, self.answer, self.made, self.shown = calls, answer, 0, []

    def count_tokens(self, messages, tools) -> int:
        return count_chars(messages)

    def complete(self, request: ModelRequest) -> ModelReply:
        self.shown = [m["content"] for m in request.messages if m["role"] == "tool"]
        if self.made < len(self.calls):
            text = format_call(self.calls[self.made]["name"], self.calls[self.made]["arguments"])
        else:
            text = format_answer(self.answer)
        self.made += 1
        return ModelReply(text, parse_calls(text, f"call_{self.made}"), {"role": "assistant", "content": text},
                          Usage(count_chars(request.messages), len(text) // 4 + 1), "stop", self.name, 0.001)


@dataclass
class ReplayerAdapter:
    calls: list[dict]
    answer: str = "done"
    spec: str = "replayer"
    kind: str = "test"
    context_window: int | None = None

    def chat_model(self, context_window):
        self.model = Replayer(self.calls, self.answer)
        return self.model

    def close(self) -> None:
        pass


def test_an_ops_task_runs_with_the_ops_tools_and_is_graded_on_the_world(tmp_path):
    path = tmp_path / "ops.jsonl"
    assert main(["pack", "ops", "-n", "1", "-o", str(path)]) == 0
    suite_task = load_suite(path).tasks[0]
    assert suite_task.verifier == "world_state"
    reference = suite_task.task.data["reference_calls"]
    limits = EvalLimits(max_steps=len(reference) + 2, result_chars=None)
    verifiers = Verifiers()
    try:
        done = run_task(suite_task, ReplayerAdapter(reference), limits, verifiers)
        idle = run_task(suite_task, ReplayerAdapter([]), limits, verifiers)
    finally:
        verifiers.close()
    assert done.tool_calls == len(reference)
    assert done.success and done.score.details["success"] is True
    assert not idle.success  # "done" without the calls leaves the world as it was


def test_polyrl_agent_refuses_a_pack_without_worlds_naming_a_task(tmp_path, capsys):
    path = tmp_path / "math.jsonl"
    assert main(["pack", "math", "-n", "2", "-o", str(path)]) == 0
    first = json.loads(path.read_text().splitlines()[0])["id"]
    assert main(["agent", str(path), "--model", "builtin:tiny"]) == 2
    err = capsys.readouterr().err
    assert f"task {first!r} has no 'world' (2 such tasks)" in err and "internal error" not in err


def test_an_swe_task_runs_with_its_repository_tools_in_the_sandbox(tmp_path):
    path = tmp_path / "swe.jsonl"
    assert main(["pack", "swe", "-n", "1", "-o", str(path)]) == 0
    suite_task = load_suite(path).tasks[0]
    patch = suite_task.task.data["reference_patch"]
    calls = [{"name": "run_tests", "arguments": {}}, {"name": "apply_patch", "arguments": {"patch": patch}},
             {"name": "run_tests", "arguments": {}}, {"name": "diff", "arguments": {}}]
    limits = EvalLimits(max_steps=len(calls) + 2, result_chars=None)
    verifiers = Verifiers()
    try:
        fixer = ReplayerAdapter(calls, patch)
        fixed = run_task(suite_task, fixer, limits, verifiers)
        idle = run_task(suite_task, ReplayerAdapter([], ""), limits, verifiers)
    finally:
        verifiers.close()
    before, _, after, diff = fixer.model.shown
    assert "FAILED tests/" in before and after.endswith(" 0 failed") and diff.strip()  # the tests ran, in and out
    assert fixed.tool_calls == len(calls) and fixed.success
    assert not idle.success


def _agent_pack(tmp_path, drop_world_of: int | None = None, break_world_of: int | None = None):
    path = tmp_path / "shop.jsonl"
    assert main(["pack", "agent", "--split", "train", "-n", "6", "-o", str(path)]) == 0
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for k, line in enumerate(lines):
        line["split"] = "train" if k % 2 else "heldout"
        if k == drop_world_of:
            del line["world"]
        if k == break_world_of:
            line["world"] = {"notes": {}}
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path, lines


def test_a_run_files_agent_pack_rolls_out_with_the_tools_of_its_worlds(tmp_path):
    from polyrl.agent.tools import ToolCall
    from polyrl.config import load_config_text
    from polyrl.train.setup import build_domains

    path, lines = _agent_pack(tmp_path)
    spec = build_domains(load_config_text(f"rl_tasks:\n  - {{domain: shop, pack: {path}, weight: 1}}\n"),
                         verifiers=False).specs["shop"]
    assert spec.verifier == "success_minus_cost" and spec.agent is not None
    task = spec.source.sample("train", 1, 0)[0]
    item = sorted(task.data["world"]["items"])[0]
    price = spec.agent.toolbox_for(task).run(ToolCall("c", "price", {"item": item}))
    assert price.content == str(task.data["world"]["items"][item]["price"])


def test_an_agent_pack_line_without_a_world_stops_the_run_at_load(tmp_path):
    from polyrl.config import load_config_text
    from polyrl.train.setup import build_domains

    path, lines = _agent_pack(tmp_path, drop_world_of=3)
    with pytest.raises(ValueError, match=f"task {lines[3]['id']!r} has no 'world'"):
        build_domains(load_config_text(f"rl_tasks:\n  - {{domain: shop, pack: {path}, weight: 1}}\n"),
                      verifiers=False)


def test_an_agent_pack_line_with_a_malformed_world_stops_the_run_at_load(tmp_path):
    from polyrl.config import load_config_text
    from polyrl.train.setup import build_domains

    path, lines = _agent_pack(tmp_path, break_world_of=2)
    with pytest.raises(ValueError, match=f"task {lines[2]['id']!r} has a 'world' its tools cannot read"):
        build_domains(load_config_text(f"rl_tasks:\n  - {{domain: shop, pack: {path}, weight: 1}}\n"),
                      verifiers=False)
