"""Execution log and `polyrl replay`: records stored by id with shared program text kept
once, replays that reproduce, and replays that do not, with what differs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from polyrl.cli import main as cli_main
from polyrl.rewards.unit_test_pass import UnitTestPass
from polyrl.sandbox.execution_log import ExecutionLog
from polyrl.types import Task

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing: apt-get install -y bubblewrap")

TASK = Task(id="inc", domain="code", prompt="Write f(x) = x + 1.",
            data={"entry_point": "f", "tests": [{"args": [1], "expected": 2}, {"args": [5], "expected": 6}]})
CHECK = Task(id="inc-check", domain="code", prompt='def f(x):\n    """x + 1"""\n',
             data={"entry_point": "f", "test": "def check(candidate):\n    assert candidate(1) == 2\n"
                                               "    assert abs(candidate(0.5) - 1.5) < 1e-9\n"})


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    log = ExecutionLog(tmp_path / "executions.jsonl")
    verifier = UnitTestPass(log=log)
    try:
        scores = verifier.score([TASK, TASK, CHECK], ["def f(x):\n    return x + 1\n", "def f(x):\n    return 2\n",
                                                      "    return x + 1\n"])
    finally:
        verifier.close()
    assert [s.details["execution"] for s in scores] == ["x000000", "x000001", "x000002"]
    return tmp_path


def test_records_are_stored_once_per_execution_with_shared_text_in_blobs(run_dir: Path) -> None:
    lines = [json.loads(line) for line in (run_dir / "executions.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in lines] == ["inc", "inc", "inc-check"]
    assert all(r["request"]["code"] == "" and r["code_blob"] for r in lines)  # the harness, kept once
    assert len(list((run_dir / "blobs").iterdir())) == 1
    again = ExecutionLog(run_dir / "executions.jsonl")
    assert again.get("x000001")["request"]["code"].startswith('"""Runs INSIDE the sandbox')
    assert again.add(again.get("x000000"), task_id="inc") == "x000003"  # numbering goes on after a reopen
    assert again.get("x000003")["task_id"] == "inc"  # stored under its new id, not the record's old one


def test_replay_reproduces_a_recorded_verdict(run_dir: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli_main(["replay", str(run_dir), "x000001", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["reproduced"] and out["differences"] == [] and out["task_id"] == "inc"
    assert [v["passed"] for v in out["verdicts"]] == [True, False]
    assert cli_main(["replay", str(run_dir), "x000002"]) == 0  # a check with a complex assert: re-judged too
    assert "reproduced" in capsys.readouterr().out


def test_replay_says_what_differs(run_dir: Path, capsys: pytest.CaptureFixture) -> None:
    path = run_dir / "executions.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    lines[0]["verdicts"][1]["passed"] = False  # as if a flaky run had failed test 1
    lines[0]["result"]["status"] = "timeout"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert cli_main(["replay", str(run_dir), "x000000"]) == 1
    out = capsys.readouterr().out
    assert "NOT reproduced" in out and "status: recorded 'timeout', now 'ok'" in out
    assert "test 1: recorded fail (passed), now pass (passed)" in out


def test_list_unknown_ids_and_missing_logs(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli_main(["replay", str(run_dir), "--list", "--failed"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["x000001"]
    assert cli_main(["replay", str(run_dir), "x999999"]) == 2
    assert "--list" in capsys.readouterr().err
    assert cli_main(["replay", str(tmp_path / "nothing-here"), "x000000"]) == 2


def test_a_second_writers_log_has_its_own_file_and_ids_and_replays(run_dir: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    from polyrl.sandbox.execution_log import file_of, log_files, shard_log

    first = run_dir / "executions.jsonl"
    path, prefix = shard_log(first, 2)  # reward actor 2 of a pool (cluster.reward_replicas)
    assert (path.name, prefix) == ("executions-2.jsonl", "x2-")
    other = ExecutionLog(path, prefix=prefix)
    record = ExecutionLog(first).get("x000001")
    assert [other.add(record, task_id="inc") for _ in range(2)] == ["x2-000000", "x2-000001"]
    assert ExecutionLog(path, prefix=prefix).add(record, task_id="inc") == "x2-000002"  # goes on after a reopen
    assert log_files(first) == [first, path]
    (run_dir / "executions-10.jsonl").touch()
    (run_dir / "executions-old.jsonl").touch()  # not a writer's log
    assert log_files(first) == [first, path, run_dir / "executions-10.jsonl"]  # writers in number order
    (run_dir / "executions-10.jsonl").unlink()
    assert file_of(first, "x2-000001") == (path, "x2-") and file_of(first, "x000001") == (first, "x")
    assert cli_main(["replay", str(run_dir), "x2-000001", "--json"]) == 0  # found in its writer's file
    assert json.loads(capsys.readouterr().out)["reproduced"]
    assert cli_main(["replay", str(run_dir), "--list", "--json"]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)] == [
        "x000000", "x000001", "x000002", "x2-000000", "x2-000001", "x2-000002"]
