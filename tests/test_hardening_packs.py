"""Hostile packs and completions files: per-line errors, never a traceback or an exhausted
host; empty files are errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polyrl import cli
from polyrl.domains.pack import MAX_JSON_DEPTH, load_pack
from polyrl.quality import hygiene
from polyrl.quality.findings import TaskAudit
from polyrl.types import Task

MATH = {"id": "m1", "domain": "math", "prompt": "What is 1 + 1?", "answer": "2"}
DEEP = '{"id": "deep", "domain": "math", "prompt": "p", "answer": ' + "[" * 100_000 + "]" * 100_000 + "}"
JUST_TOO_DEEP = ('{"id": "d2", "domain": "math", "prompt": "p", "answer": "1", "metadata": {"x": '
                 + "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH + "}}")
HUGE_INT = '{"id": "huge", "domain": "math", "prompt": "p", "answer": ' + "7" * 10_000 + "}"


def _write(path: Path, lines: list) -> str:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return str(path)


@pytest.mark.parametrize("line,message", [
    (DEEP, "not readable: JSON nested more than 100 levels deep"),
    (JUST_TOO_DEEP, "not readable: JSON nested more than 100 levels deep"),
    (HUGE_INT, "not readable: Exceeds the limit"),
    (b'{"id": "\xff"}', "not valid UTF-8"),
])
def test_hostile_pack_lines_are_per_line_errors(tmp_path, line, message):
    path = tmp_path / "p.jsonl"
    raw = line if isinstance(line, bytes) else line.encode()
    path.write_bytes(json.dumps(MATH).encode() + b"\n" + raw + b"\n" + json.dumps({**MATH, "id": "m3"}).encode() + b"\n")
    loaded = load_pack(path)
    assert [t.id for _, t in loaded.tasks] == ["m1", "m3"] and loaded.lines == 3
    assert len(loaded.errors) == 1 and loaded.errors[0].line == 2 and loaded.errors[0].message.startswith(message)


def test_nesting_within_the_limit_loads(tmp_path):
    depth = MAX_JSON_DEPTH - 3
    line = {**MATH, "metadata": {"x": json.loads("[" * depth + "]" * depth)}}
    assert load_pack(_write(tmp_path / "p.jsonl", [line])).errors == []


def _score(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["score", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_score_refuses_an_empty_pack_or_completions_file(tmp_path, capsys):
    pack = _write(tmp_path / "pack.jsonl", [MATH])
    empty = _write(tmp_path / "empty.jsonl", [])
    completions = _write(tmp_path / "c.jsonl", [{"id": "m1", "completion": "\\boxed{2}"}])
    code, out, err = _score(capsys, empty, "--completions", completions)
    assert (code, out) == (2, "") and err.strip() == f"polyrl score: {empty} is empty: nothing to score"
    code, out, err = _score(capsys, pack, "--completions", empty)
    assert (code, out) == (2, "") and err.strip() == f"polyrl score: {empty} is empty: nothing to score"


def test_score_hostile_completion_lines_are_per_line_errors(tmp_path, capsys):
    pack = _write(tmp_path / "pack.jsonl", [MATH])
    completions = _write(tmp_path / "c.jsonl", [
        {"id": "m1", "completion": "\\boxed{2}"},
        '{"id": "m1", "completion": ' + "[" * 50_000 + "]" * 50_000 + "}",
        '{"id": "m1", "completion": "x", "n": ' + "1" * 9000 + "}",
        {"id": "m1", "completion": "\\boxed{3}"},
    ])
    code, out, err = _score(capsys, pack, "--completions", completions, "--json")
    doc = json.loads(out)
    assert code == 1 and [r["line"] for r in doc["results"]] == [1, 4]
    assert [(e["line"], e["message"].split(":")[0]) for e in doc["errors"]] == [(2, "not readable"), (3, "not readable")]


def test_audit_refuses_an_empty_pack(tmp_path, capsys):
    empty = _write(tmp_path / "empty.jsonl", [])
    code = cli.main(["audit", empty, "--quiet"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "") and err.strip() == f"polyrl audit: {empty} is empty: a pack has one task per line"


PATHOLOGICAL = [
    "def check(candidate):\n    assert candidate(1) == " + "1+" * 1_000_000 + "1\n",  # megabytes of syntax tree
    "def check(candidate):\n    assert candidate(1) == " + "-" * 300_000 + "1\n",
    "def check(candidate):\n    assert candidate(1) == " + "(" * 150 + "1" + ")" * 150 + "\n",
    "def check(candidate):\n    assert candidate(1) == " + "1+" * 90_000 + "1\n",  # under the size limit
    "def check(candidate):\n    assert candidate(1) == " + "-" * 150_000 + "1\n",
]


@pytest.mark.parametrize("test", PATHOLOGICAL, ids=["long-sum", "deep-unary", "deep-parens", "sum-under-limit",
                                                    "unary-under-limit"])
def test_audit_hygiene_survives_pathological_program_text(test):
    task = Task(id="c1", domain="code", prompt="def f(x):\n", answer=None, verifier=None, split="train",
                difficulty=0, data={"entry_point": "f", "test": test}, metadata={})
    audit = TaskAudit("c1", 1, "code")
    hygiene.check_pack([task], [audit], [True])  # must return, not raise nor exhaust memory
    assert audit.status in ("pass", "fail")
    if len(test) > hygiene.MAX_PROGRAM_CHARS:
        assert audit.has("tests_compile") and "the audit parses program text of at most" in audit.findings[0].message
