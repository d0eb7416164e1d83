"""The audit of agent tasks (success_minus_cost): the built-in domain passes with every probe
scoring as it must; a task whose world, gold calls and answer disagree fails solvability; a
lenient answer match is caught by the hedging exploits; the same question over another world is
not a duplicate, over the same world with another answer it is."""

from __future__ import annotations

from dataclasses import replace

import pytest

from polyrl.domains.agent import AgentDomain
from polyrl.quality.agent_probes import reference_answer
from polyrl.quality.audit import audit_domain, audit_tasks
from polyrl.rewards import success_minus_cost

QUIET = {"progress": None}


@pytest.fixture(scope="module")
def tasks():
    return [replace(t, verifier="success_minus_cost") for t in AgentDomain().sample("train", 48, seed=0)]


def _audit(tasks):
    return audit_tasks(list(enumerate(tasks, start=1)), [], "test", **QUIET)


def test_the_built_in_agent_domain_passes_every_probe():
    result = audit_domain("agent", 48, seed=3, **QUIET)
    assert [(a.id, a.findings) for a in result.tasks if a.status != "pass"] == []
    assert set(result.tally) == {"cost", "exploit", "false_negative", "negative_control"}
    assert all(held == total for held, total in result.tally.values()), result.tally


def test_the_gold_calls_give_the_stated_answer_for_every_kind(tasks):
    assert {t.data["kind"] for t in tasks} == {"price", "stock", "cost", "compare", "cost2", "worth", "absent",
                                               "note_cost", "note_stock"}
    assert [reference_answer(t) for t in tasks] == [t.answer for t in tasks]


def test_a_task_whose_answer_disagrees_with_its_world_fails_solvability(tasks):
    wrong = replace(tasks[0], answer=str(tasks[0].answer) + "7", id="wrong")
    broken = replace(tasks[1], data={**tasks[1].data, "world": {"items": "none"}}, id="broken")
    by_id = {a.id: a for a in _audit([wrong, broken, tasks[2]]).tasks}
    assert by_id["wrong"].status == "fail" and by_id["wrong"].has("solvability")
    assert by_id["broken"].status == "fail" and "cannot run" in str(by_id["broken"].findings)
    assert by_id[tasks[2].id].status == "pass"


def test_a_lenient_answer_match_is_caught_as_an_exploit(tasks, monkeypatch):
    monkeypatch.setattr(success_minus_cost, "answers_match",
                        lambda gold, answer: answer is not None and gold.lower() in answer.lower())
    result = _audit(tasks[:12])
    exploited = [a for a in result.tasks if a.has("exploit")]
    assert len(exploited) == 12 and result.tally["exploit"][0] == 0


def test_the_same_question_over_another_world_is_another_task(tasks):
    a, b = tasks[0], next(t for t in tasks[1:] if t.answer != tasks[0].answer)
    twin = replace(b, prompt=a.prompt, id="twin")  # same question, another world, another answer
    clash = replace(a, answer=b.answer, id="clash")  # same question, same world, another answer
    by_id = {x.id: x for x in _audit([a, twin, clash]).tasks}
    assert not by_id["twin"].has("duplicate")
    assert by_id["clash"].has("duplicate") and by_id["clash"].status == "fail"
