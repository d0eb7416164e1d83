"""`polyrl pack D` then `polyrl eval`: every generated built-in domain's pack loads as a suite,
and an ops task runs with the ops world's tools and is graded on the world's final state;
`polyrl agent` refuses a pack without tool worlds with a message, not a crash.

The ops model is a replayer (no weights): it makes the task's reference calls in order, or
answers at once, so success depends only on which tools the episode ran with and what the
verifier reads from them.
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

WITH_TOOLS = {"agent", "ops"}


@pytest.mark.parametrize("domain", ["math", "code", "agent", "alignment", "longctx", "swe", "ops"])
def test_a_generated_pack_loads_as_a_suite(tmp_path, domain):
    path = tmp_path / f"{domain}.jsonl"
    assert main(["pack", domain, "-n", "3", "-o", str(path)]) == 0
    suite = load_suite(path)
    assert len(suite.tasks) == 3
    assert {t.is_agent for t in suite.tasks} == {domain in WITH_TOOLS}
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    if domain in ("agent", "alignment"):  # the pack reader has no default verifier for these
        assert {x["verifier"] for x in lines} == {"success_minus_cost" if domain == "agent" else "preference_model"}


class Replayer:
    """Makes `calls` one per turn, then answers "done"."""

    provider, tool_format, tools_style = "test", "text", "compact"
    name, context_window = "replayer", None

    def __init__(self, calls: list[dict]):
        self.calls, self.made = calls, 0

    def count_tokens(self, messages, tools) -> int:
        return count_chars(messages)

    def complete(self, request: ModelRequest) -> ModelReply:
        if self.made < len(self.calls):
            text = format_call(self.calls[self.made]["name"], self.calls[self.made]["arguments"])
        else:
            text = format_answer("done")
        self.made += 1
        return ModelReply(text, parse_calls(text, f"call_{self.made}"), {"role": "assistant", "content": text},
                          Usage(count_chars(request.messages), len(text) // 4 + 1), "stop", self.name, 0.001)


@dataclass
class ReplayerAdapter:
    calls: list[dict]
    spec: str = "replayer"
    kind: str = "test"
    context_window: int | None = None

    def chat_model(self, context_window):
        return Replayer(self.calls)

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
