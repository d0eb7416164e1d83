"""`polyrl score`: rewards with reasons, per-line errors, exit codes, the console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from polyrl import cli
from polyrl.rewards import registry

PACK = [
    {"id": "add", "domain": "math", "prompt": "What is 47 + 38?", "answer": "85"},
    {"id": "half", "domain": "math", "prompt": "Half of 1?", "answer": "0.5"},
    {"id": "odd", "domain": "math", "prompt": "What is 1 + 1?", "answer": "2", "verifier": "no_such_verifier"},
    {"id": "broken", "domain": "math", "prompt": "What is 2 + 2?"},
]
GOOD_COMPLETIONS = [
    {"id": "add", "completion": "47 + 38 = 85.\n\\boxed{85}"},  # right
    {"id": "add", "completion": "\\boxed{84}"},  # wrong
    {"id": "add", "completion": "\\boxed{85} or \\boxed{86}"},  # hedged
    {"id": "add", "completion": "\\boxed{}"},  # empty
    {"id": "add", "completion": "\\boxed{85}" + "9" * 5000},  # huge
    {"id": "half", "completion": "The answer is \\frac{1}{2}."},  # right, symbolically
]
EXPECTED = [(1.0, "correct"), (0.0, "wrong"), (0.0, "hedged"), (0.0, "empty"), (0.0, "overlong"), (1.0, "correct")]


def _jsonl(path: Path, lines: list) -> str:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return str(path)


def _run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["score", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_rewards_and_reasons(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pack = _jsonl(tmp_path / "pack.jsonl", PACK[:2])
    completions = _jsonl(tmp_path / "c.jsonl", GOOD_COMPLETIONS)
    code, out, _ = _run(capsys, pack, "--completions", completions, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["errors"] == []
    assert [(r["reward"], r["details"]["status"]) for r in doc["results"]] == EXPECTED
    assert [r["line"] for r in doc["results"]] == [1, 2, 3, 4, 5, 6]
    assert doc["results"][1]["details"]["extracted"] == "84" and doc["results"][1]["details"]["gold"] == "85"
    assert doc["summary"] == {
        "scored": 6,
        "errors": 0,
        "mean_reward": pytest.approx(2 / 6),
        "by_status": {"correct": 2, "wrong": 1, "hedged": 1, "empty": 1, "overlong": 1},
    }


def test_bad_lines_are_reported_and_the_rest_is_scored(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(registry._VERIFIERS, "half_written", "polyrl.rewards.not_written_yet:Nothing")
    pack = _jsonl(
        tmp_path / "pack.jsonl",
        [*PACK, "{oops", {"id": "wip", "domain": "math", "prompt": "p", "answer": "1", "verifier": "half_written"}],
    )
    completions = _jsonl(
        tmp_path / "c.jsonl",
        [
            {"id": "add", "completion": "\\boxed{85}"},
            "not json at all",
            {"id": "missing", "completion": "\\boxed{1}"},
            {"id": "odd", "completion": "\\boxed{2}"},
            {"id": "broken", "completion": "\\boxed{4}"},
            {"id": "half", "completion": 5},
            {"id": "wip", "completion": "\\boxed{1}"},
            "",
            {"id": "half", "completion": "\\boxed{1/2}"},
        ],
    )
    code, out, _ = _run(capsys, pack, "--completions", completions, "--json")
    doc = json.loads(out)
    assert code == 1
    assert [(r["line"], r["reward"]) for r in doc["results"]] == [(1, 1.0), (9, 1.0)]
    errors = [(e["file"], e["line"], e["id"]) for e in doc["errors"]]
    assert errors == [
        (pack, 4, "broken"),
        (pack, 5, None),
        (completions, 2, None),
        (completions, 3, "missing"),
        (completions, 4, "odd"),
        (completions, 5, "broken"),
        (completions, 6, "half"),
        (completions, 7, "wip"),
    ]
    messages = [e["message"] for e in doc["errors"]]
    assert "'answer' is missing" in messages[0] and "not valid JSON" in messages[1]
    assert "not valid JSON" in messages[2] and "unknown id 'missing'" in messages[3]
    assert "unknown verifier 'no_such_verifier'" in messages[4]
    assert "did not load (pack line 4)" in messages[5]
    assert "'completion' must be a string" in messages[6]
    assert "verifier 'half_written' failed to load: ModuleNotFoundError" in messages[7]
    assert doc["summary"]["scored"] == 2 and doc["summary"]["errors"] == 8


def test_table_output_and_errors_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pack = _jsonl(tmp_path / "pack.jsonl", PACK[:2])
    completions = _jsonl(tmp_path / "c.jsonl", [GOOD_COMPLETIONS[0], {"id": "nope", "completion": ""}])
    code, out, err = _run(capsys, pack, "--completions", completions)
    assert code == 1
    assert "add" in out and "correct" in out and "scored 1, errors 1, mean reward 1.000" in out
    assert f"{completions}:2: nope: unknown id 'nope'" in err


def test_unreadable_files_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pack = _jsonl(tmp_path / "pack.jsonl", PACK[:1])
    code, out, err = _run(capsys, str(tmp_path / "absent.jsonl"), "--completions", pack)
    assert (code, out) == (2, "") and "absent.jsonl" in err and "No such file" in err
    code, _, err = _run(capsys, pack, "--completions", str(tmp_path / "gone.jsonl"), "--json")
    assert code == 2 and "gone.jsonl" in err


def test_installed_console_script(tmp_path: Path) -> None:
    pack = _jsonl(tmp_path / "pack.jsonl", PACK[:2])
    completions = _jsonl(tmp_path / "c.jsonl", GOOD_COMPLETIONS)
    script = Path(sys.executable).parent / "polyrl"
    proc = subprocess.run(
        [str(script), "score", pack, "--completions", completions, "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [(r["reward"], r["details"]["status"]) for r in doc["results"]] == EXPECTED
