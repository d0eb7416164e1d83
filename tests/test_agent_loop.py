"""The agent loop with scripted models: stops, bad calls as observations, degradation order."""

import json

import pytest

from polyrl.agent.budget import TokenBudget
from polyrl.agent.loop import AgentConfig, ModelSlot, agent_episode, run_agent
from polyrl.agent.model import failed_reply
from polyrl.obs.records import ListRecorder
from tests.agent_fakes import ScriptedModel, call, toy_tools


def _tool_messages(model: ScriptedModel, request: int) -> list[str]:
    return [m["content"] for m in model.requests[request].messages if m["role"] == "tool"]


def test_answer_ends_the_episode():
    model = ScriptedModel([call("add", a=2, b=3), "The sum is <answer>5</answer>."])
    rec = ListRecorder()
    result = run_agent("add 2 and 3", toy_tools(), [ModelSlot(model)], recorder=rec, trace_id="ep", task_id="t1")
    assert (result.answer, result.stop_reason, len(result.steps)) == ("5", "answer", 2)
    assert _tool_messages(model, 1) == ["5"]
    assert result.tokens == sum(s.reply.usage.total for s in result.steps) > 0
    kinds = [r.kind for r in rec.records]
    assert kinds == ["model", "tool", "model", "event"] and rec.records[-1].name == "episode.stop"
    assert all(r.trace_id == "ep" and r.task_id == "t1" for r in rec.records)
    assert json.loads(result.to_completion())["answer"] == "5"


def test_reply_without_calls_is_the_final_answer():
    result = run_agent("hi", toy_tools(), [ModelSlot(ScriptedModel(["  just text  "]))])
    assert (result.answer, result.stop_reason) == ("just text", "answer")


@pytest.mark.parametrize("bad, error_type", [
    ("<tool_call>{not json at all</tool_call>", "malformed_call"),
    (call("nope", x=1), "unknown_tool"),
    (call("add", a="seven", b=1), "invalid_arguments"),
    (call("add", a=1), "invalid_arguments"),
    (call("boom"), "RuntimeError"),
])
def test_bad_calls_and_tool_exceptions_become_observations(bad, error_type):
    model = ScriptedModel([bad, call("add", a=1, b=1), "<answer>2</answer>"])
    rec = ListRecorder()
    result = run_agent("task", toy_tools(), [ModelSlot(model)], recorder=rec)
    assert result.stop_reason == "answer" and result.answer == "2"  # the episode went on
    [observation] = _tool_messages(model, 1)
    assert observation.startswith("Error:")
    tools = [r for r in rec.records if r.kind == "tool"]
    assert tools[0].attributes["error.type"] == error_type and "error.type" not in tools[1].attributes
    assert json.loads(result.to_completion())["tool_errors"] == 1


def test_max_steps_then_a_stage_conclusion_from_the_model():
    model = ScriptedModel([call("add", a=1, b=1)] * 3 + ["<answer>2</answer>"])
    result = run_agent("task", toy_tools(), [ModelSlot(model)], AgentConfig(max_steps=3))
    assert result.stop_reason == "max_steps" and result.answer == "2"
    assert [s.purpose for s in result.steps] == ["act"] * 3 + ["conclude"]
    assert "no more tool calls" in model.requests[-1].messages[-1]["content"]
    assert model.requests[-1].max_tokens == AgentConfig().conclusion_tokens


def test_exhausted_budget_returns_a_stage_conclusion():
    model = ScriptedModel([call("add", a=20, b=22)] + [call("echo", text="more " * 10)] * 50)
    budget = TokenBudget(400)
    rec = ListRecorder()
    result = run_agent("find the sum", toy_tools(), [ModelSlot(model)],
                       AgentConfig(max_steps=50, max_tokens=32, conclude=False), budget, rec)
    assert result.stop_reason == "budget" and result.answer is None
    assert result.conclusion.startswith("Stopped (budget) after")
    assert "add(a=20, b=22) -> 42" in result.conclusion  # what was found so far
    assert budget.spent <= 400
    names = [r.name for r in rec.records if r.kind == "event"]
    assert "budget.exhausted" in names and "episode.conclude" in names
    assert names.count("budget.alert") == len({r.attributes["x.budget.milestone"] for r in rec.records
                                               if r.name == "budget.alert"})


def test_over_budget_compresses_then_truncates_then_downgrades_then_concludes():
    heavy = ScriptedModel([call("big")] + [call("add", a=1, b=2)] * 40, name="heavy")
    light = ScriptedModel([call("add", a=3, b=4)] * 40, name="light")
    rec = ListRecorder()
    config = AgentConfig(max_steps=40, max_tokens=16, result_chars=2000, tight_result_chars=40)
    result = run_agent("task", toy_tools(), [ModelSlot(heavy), ModelSlot(light, cost_weight=0.25)],
                       config, TokenBudget(4000), rec)
    order = [r.name for r in rec.records if r.kind == "event"]
    first = {name: order.index(name) for name in ("context.compress", "context.truncate", "model.downgrade",
                                                 "episode.conclude")}
    assert first["context.compress"] < first["context.truncate"] < first["model.downgrade"] < first["episode.conclude"]
    assert {s.model for s in result.steps} == {"heavy", "light"}
    assert result.stop_reason == "budget" and result.conclusion
    big = [m for m in heavy.requests[-1].messages if m["role"] == "tool" and "[truncated" in m["content"]]
    assert big or "Earlier steps:" in heavy.requests[-1].messages[1]["content"]
    # the trajectory keeps the full 2,000-character result
    assert any(len(r["result"]) == 2000 for s in result.to_json()["steps"] for r in s["calls"])


def test_context_window_is_respected():
    model = ScriptedModel([call("echo", text="word " * 40)] * 12 + ["<answer>x</answer>"], context_window=120)
    result = run_agent("task", toy_tools(), [ModelSlot(model)], AgentConfig(max_steps=12, max_tokens=16))
    assert all(model.count_tokens(r.messages, None) + r.max_tokens <= 120 for r in model.requests)
    assert any(e["event"] == "context.compress" for e in result.events)


def test_timeout_with_a_fake_clock():
    now = [0.0]

    def clock():
        now[0] += 1.0
        return now[0]

    model = ScriptedModel([call("add", a=1, b=1)])
    result = run_agent("task", toy_tools(), [ModelSlot(model)], AgentConfig(max_steps=100, timeout_s=3.5),
                       clock=clock)
    assert result.stop_reason == "timeout" and result.answer is None and len(result.steps) == 3
    assert "add(a=1, b=1) -> 2" in result.conclusion


def test_model_error_stops_with_a_conclusion():
    episode = agent_episode("task", toy_tools(), [ModelSlot(ScriptedModel(["unused"]))])
    next(episode)
    with pytest.raises(StopIteration) as done:
        episode.send(failed_reply("APIConnectionError", "m"))
    result = done.value.value
    assert result.stop_reason == "model_error" and result.steps[0].reply.error == "APIConnectionError"
    assert result.conclusion.startswith("Stopped (model_error)")


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="max_steps"):
        AgentConfig(max_steps=0)
    with pytest.raises(ValueError, match="result_chars"):
        AgentConfig(result_chars=10, tight_result_chars=80)
    with pytest.raises(ValueError, match="cost_weight"):
        ModelSlot(ScriptedModel([""]), cost_weight=0)
