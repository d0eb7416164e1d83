"""The agent domain: demonstrations solve their tasks, splits are disjoint, the reward's options."""

import json

import pytest

from polyrl.agent.loop import ModelSlot, run_agent
from polyrl.domains.agent import LEVELS, AgentDomain
from polyrl.domains.agent_world import World, calc
from polyrl.domains.registry import get_domain
from polyrl.rewards.registry import get_verifier
from polyrl.rewards.success_minus_cost import SuccessMinusCost, answers_match
from polyrl.types import Task
from tests.agent_fakes import ScriptedModel


def _replay(task: Task):
    """Run the agent loop with a model that says exactly what the demonstration's assistant says."""
    demo = AgentDomain.demonstration(task)
    model = ScriptedModel([m["content"] for m in demo if m["role"] == "assistant"])
    return demo, run_agent(task.prompt, AgentDomain.toolbox(task), [ModelSlot(model)])


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_demonstrations_solve_their_tasks(split):
    tasks = AgentDomain().sample(split, 60, seed=3)
    verifier = SuccessMinusCost(alpha=0.02, beta=1e-4)
    for task in tasks:
        demo, result = _replay(task)
        assert result.transcript.full_messages() == demo  # the demo's tool results are the world's real ones
        assert len(result.steps) == task.data["optimal_steps"]
        [score] = verifier.score([task], [result.to_completion()])
        expected = 1.0 - 0.02 * len(result.steps) - 1e-4 * result.tokens
        assert score.details["success"] and score.value == pytest.approx(expected)


def test_levels_are_graded_and_kinds_covered():
    tasks = AgentDomain().sample("train", 400, seed=0)
    by_level = {level: [t for t in tasks if t.difficulty == level] for level in LEVELS}
    steps = {level: max(t.data["optimal_steps"] for t in ts) for level, ts in by_level.items()}
    assert steps[1] < steps[2] < steps[3] <= steps[4] and all(by_level.values())
    kinds = {t.data["kind"] for t in tasks}
    assert {"price", "stock", "cost", "compare", "cost2", "worth", "note_cost", "note_stock", "absent"} == kinds
    absent = next(t for t in tasks if t.data["kind"] == "absent")
    assert absent.answer == "none" and "Error: no item" in AgentDomain.demonstration(absent)[3]["content"]


def test_splits_do_not_overlap_and_are_stable():
    domain = AgentDomain()
    train = domain.sample("train", 500, seed=0)
    heldout = domain.sample("heldout", 200, seed=0)
    assert not {t.prompt for t in train} & {t.prompt for t in heldout}
    assert len({t.id for t in train}) == 500 and len({t.id for t in heldout}) == 200
    assert [t.id for t in domain.sample("heldout", 200, seed=0)] == [t.id for t in heldout]
    assert {t.difficulty for t in heldout} == set(LEVELS)


def test_registered_with_its_verifier():
    domain = get_domain("agent", levels=(1, 2))
    assert domain.default_verifier == "success_minus_cost"
    assert {t.difficulty for t in domain.sample("train", 30, seed=1)} <= {1, 2}
    verifier = get_verifier("success_minus_cost", alpha=0.1, beta=0.0)
    assert verifier.alpha == 0.1
    with pytest.raises(ValueError, match="levels"):
        AgentDomain(levels=(5,))


def test_reward_options_and_inputs():
    task = Task("t", "agent", "q", answer="36")
    v = SuccessMinusCost(alpha=0.1, beta=0.01, max_cost=0.5)

    def record(answer, steps, tokens):
        return json.dumps({"answer": answer, "steps": steps, "tokens": tokens})

    ok, wrong, costly, none, text, bad = v.score([task] * 6, [
        record("36", 2, 10), record("35", 2, 10), record("36", 10, 1000), record(None, 1, 1),
        "I think <answer> 36. </answer>", '{"answer": "36", "steps": -1}'])
    assert ok.value == pytest.approx(1 - 0.2 - 0.1) and ok.details["status"] == "success"
    assert wrong.value == 0.0 and wrong.details["status"] == "wrong"
    assert costly.value == pytest.approx(0.5)  # capped: any success beats any failure
    assert none.value == 0.0 and none.details["status"] == "no_answer"
    assert text.value == 1.0
    assert bad.value == 0.0 and bad.details["status"] == "malformed"
    ungated = SuccessMinusCost(alpha=0.1, beta=0.0, gate_cost_on_success=False)
    assert ungated.score([task], [record("1", 3, 0)])[0].value == pytest.approx(-0.3)
    with pytest.raises(ValueError, match="max_cost"):
        SuccessMinusCost(max_cost=1.0)


@pytest.mark.parametrize("gold, answer, match", [
    ("36", "36", True), ("36", " 36.0 ", True), ("key", "The key.", True), ("key", "KEY", True),
    ("none", "None", True), ("36", "63", False), ("key", "keys", False), ("36", None, False),
])
def test_answer_normalisation(gold, answer, match):
    assert answers_match(gold, answer) is match


def test_world_tools_forgive_case_and_plurals_and_fail_as_values():
    world = World({"pen": {"price": 12, "stock": 3}}, {"gift": "The gift is a pen."})
    tools = world.toolbox()
    from polyrl.agent.tools import ToolCall

    assert tools.run(ToolCall("a", "price", {"item": "Pens"})).content == "12"
    missing = tools.run(ToolCall("b", "stock", {"item": "kite"}))
    assert missing.error_type == "KeyError" and missing.content == "Error: no item kite"
    assert tools.run(ToolCall("c", "calc", {"expr": "2*(3+4)-1"})).content == "13"
    for expr in ("2**100", "__import__('os')", "1/2", "x+1", "9" * 70):
        assert tools.run(ToolCall("d", "calc", {"expr": expr})).error_type == "ValueError"
    with pytest.raises(ValueError):
        calc("open('f')")
