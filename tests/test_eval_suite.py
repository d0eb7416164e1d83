"""The example suite (`polyrl suite example`): size, tags, families, and validity as a pack that
`polyrl eval`, `polyrl audit` and the verifiers read; and suite loading's errors."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from polyrl.agent.tools import ToolCall
from polyrl.cli import main
from polyrl.domains.agent import AgentDomain
from polyrl.evals.example_suite import example_suite
from polyrl.evals.suite import SuiteError, load_suite
from polyrl.rewards.unit_test_pass import UnitTestPass


@pytest.fixture(scope="module")
def suite_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("suite") / "suite.jsonl"
    assert main(["suite", "example", "-o", str(path)]) == 0
    return path


def test_example_suite_size_tags_and_families(suite_file):
    lines = [json.loads(x) for x in suite_file.read_text().splitlines()]
    assert len(lines) >= 100
    assert len({x["id"] for x in lines}) == len(lines)
    assert len({x["prompt"] for x in lines}) == len(lines)  # a prompt graded two ways fails an audit
    tags = Counter(x["metadata"]["tag"] for x in lines)
    assert set(tags) == {"typical", "edge", "failure_mode"} and min(tags.values()) >= 20
    families = Counter((x["metadata"]["family"], x["metadata"]["tag"]) for x in lines)
    for family in ("customer_service", "code_fix", "word_problem", "long_document"):
        for tag in ("typical", "edge", "failure_mode"):
            assert families[(family, tag)] >= 2, (family, tag)
    cases = Counter(x["metadata"].get("case") for x in lines if x["domain"] == "agent")
    assert {"unknown_item", "tool_error", "ambiguous_request", "long_tool_result"} <= set(cases)
    longest = max(len(x["prompt"]) for x in lines if x["metadata"]["family"] == "long_document")
    assert longest > 2000  # longer than the built-in model's 512-token window


def test_example_suite_is_a_pure_function_of_its_seed():
    assert example_suite(0) == example_suite(0)
    assert example_suite(0) != example_suite(1)


def test_example_suite_loads_as_a_suite_and_its_answers_are_right(suite_file):
    suite = load_suite(suite_file)
    assert len(suite.tasks) >= 100
    assert {t.verifier for t in suite.tasks} == {"success_minus_cost", "unit_test_pass", "answer_verify"}
    agent = [t for t in suite.tasks if t.is_agent]
    assert len(agent) == 40
    for t in agent:  # the planted edge cases and failure modes are what they claim, in the task's own world
        tools, case = AgentDomain.toolbox(t.task), t.task.metadata["case"]
        if case in ("unknown_item", "tool_error", "ambiguous_request"):
            assert t.task.answer == "none"
        if case == "unknown_item":
            item = t.task.prompt.split("price of a ")[1].rstrip("?")
            assert tools.run(ToolCall("c", "price", {"item": item})).error_type == "KeyError"
        if case == "tool_error":
            topic = next(w for w in ("gift", "sale", "prize") if w in t.task.prompt)
            note = tools.run(ToolCall("c", "note", {"topic": topic})).content
            item = note.split(" is a ")[1].rstrip(".")
            assert tools.run(ToolCall("c", "price", {"item": item})).error_type == "KeyError"
        if case == "long_tool_result":
            note = tools.run(ToolCall("c", "note", {"topic": "policy"})).content
            assert len(note) > 400 and f"is {t.task.answer} days" in note  # past the default result cap
    for t in suite.tasks:
        if t.task.metadata["family"] == "long_document" and "in order" in t.task.prompt:
            number = t.task.prompt.split("in order ")[1].split("?")[0]
            line = next(x for x in t.task.prompt.splitlines() if x.startswith(f"Order {number}:"))
            assert f" {t.task.answer} " in line
    code = [t.task for t in suite.tasks if t.verifier == "unit_test_pass"]
    verifier = UnitTestPass()
    try:
        scores = verifier.score(code, [t.data["reference"] for t in code])
    finally:
        verifier.close()
    assert [s.value for s in scores] == [1.0] * len(code)  # every reference fix passes its tests


def test_example_suite_passes_an_audit(suite_file, capsys):
    assert main(["audit", str(suite_file), "--quiet", "--mutants", "1", "--repeats", "0"]) == 0
    assert "0 fail" in capsys.readouterr().out


def test_example_suite_agent_tasks_are_shown_solvable_by_their_gold_calls(suite_file):
    from polyrl.quality.audit import audit_pack

    result = audit_pack(str(suite_file), progress=None)
    lines = {x["id"]: x for x in map(json.loads, suite_file.read_text().splitlines())}
    agent = [a for a in result.tasks if lines[a.id]["domain"] == "agent"]
    unverified = {a.id for a in agent if a.has("solvability")}
    assert len(agent) == 40 and unverified == {i for i in unverified if lines[i]["metadata"]["case"] == "long_tool_result"}
    assert len(unverified) <= 3 and all(a.status != "fail" for a in agent)
    assert result.tally["cost"] == [len(agent) - len(unverified)] * 2


@pytest.mark.parametrize("line, message", [
    ('{"id": "a", "domain": "math", "prompt": "1+1?"}', "field 'answer' is missing"),
    ('{"id": "a", "domain": "math", "prompt": "1+1?", "answer": "2", "metadata": {"tag": "hard"}}',
     "metadata.tag must be one of typical, edge, failure_mode"),
    ('{"id": "a", "domain": "math", "prompt": "1+1?", "answer": "2", "metadata": {"limits": {"budget": 0}}}',
     "metadata.limits.budget"),
    ('{"id": "a", "domain": "math", "prompt": "1+1?", "answer": "2", "metadata": {"limits": {"bogus": 1}}}',
     "metadata.limits.bogus"),
    ('{"id": "a", "domain": "agent", "prompt": "hi", "answer": "1", "verifier": "success_minus_cost", '
     '"world": {"notes": {}}}', "it has a 'world' its tools cannot read"),
    ('{"id": "a", "domain": "math", "prompt": "1+1?", "answer": "2", "verifier": "nope"}', "unknown verifier"),
    ("not json", "not valid JSON"),
])
def test_bad_suite_lines_are_errors_naming_the_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "ok", "domain": "math", "prompt": "2+2?", "answer": "4"}\n' + line + "\n")
    with pytest.raises(SuiteError, match=message) as err:
        load_suite(path)
    assert f"{path}:2:" in str(err.value)


def test_empty_and_missing_suites(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(SuiteError, match="is empty"):
        load_suite(tmp_path / "empty.jsonl")
    with pytest.raises(SuiteError, match="cannot read suite"):
        load_suite(tmp_path / "missing.jsonl")
    with pytest.raises(SuiteError, match="is a directory"):
        load_suite(tmp_path)
