"""JSONL task packs: per-line errors, task fields, PackDomain splits and sampling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polyrl.domains.pack import PackDomain, hash_split, load_pack, verifier_for
from polyrl.types import Task

GOOD_MATH = {"id": "m1", "domain": "math", "prompt": "What is 2 + 2?", "answer": "4"}
GOOD_CODE = {
    "id": "c1",
    "domain": "code",
    "prompt": "def inc(x):",
    "entry_point": "inc",
    "tests": [{"args": [1], "expected": 2}],
    "reference": "def inc(x):\n    return x + 1\n",
}
GOOD_HUMANEVAL = {
    "id": "HumanEval/0",
    "domain": "code",
    "prompt": "def f():",
    "entry_point": "f",
    "test": "def check(candidate):\n    assert candidate() == 1\n",
}
BAD = {"id": "x", "domain": "math", "prompt": "p", "answer": "1"}
GOOD_CUSTOM = {"id": "g1", "domain": "chess", "prompt": "e4?", "verifier": "chess_move", "board": "start"}


def _write(tmp_path: Path, lines: list) -> Path:
    path = tmp_path / "pack.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def test_good_lines_load_with_their_fields(tmp_path: Path) -> None:
    extra = {**GOOD_MATH, "id": "m2", "answer": 12, "split": "heldout", "difficulty": 3, "metadata": {"src": "x"}}
    load = load_pack(_write(tmp_path, [GOOD_MATH, "", GOOD_CODE, GOOD_HUMANEVAL, GOOD_CUSTOM, extra]))
    assert load.errors == []
    assert [line for line, _ in load.tasks] == [1, 3, 4, 5, 6]
    math, code, humaneval, custom, m2 = (task for _, task in load.tasks)
    assert (math.answer, math.verifier, math.data, math.split) == ("4", None, {}, hash_split(math.prompt))
    assert code.data == {k: GOOD_CODE[k] for k in ("entry_point", "tests", "reference")}
    assert humaneval.data["test"].startswith("def check")
    assert (custom.verifier, custom.data) == ("chess_move", {"board": "start"})
    assert (m2.answer, m2.split, m2.difficulty, m2.metadata) == ("12", "heldout", 3, {"src": "x"})
    assert [verifier_for(t) for t in (math, code, custom)] == ["answer_verify", "unit_test_pass", "chess_move"]


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ({"domain": "math", "prompt": "p", "answer": "1"}, "'id' is missing"),
        ({"id": 7, "domain": "math", "prompt": "p", "answer": "1"}, "'id' must be a string, got int"),
        ({"id": "x", "domain": "math", "answer": "1"}, "'prompt' is missing"),
        ({"id": "x", "domain": "math", "prompt": "p"}, "'answer' is missing"),
        ({**BAD, "answer": [1]}, "'answer' must be a string or a number, got list"),
        ({**BAD, "split": "test"}, "'split' must be one of"),
        ({**BAD, "difficulty": "hard"}, "'difficulty' must be an integer"),
        ({**BAD, "metadata": []}, "'metadata' must be an object"),
        ({**GOOD_CODE, "id": "c2", "entry_point": None}, "'entry_point' is missing"),
        ({**GOOD_CODE, "id": "c2", "tests": []}, "'tests' is empty"),
        ({**GOOD_CODE, "id": "c2", "tests": [{"args": 1, "expected": 2}]}, "'tests[0].args' must be a list"),
        ({**GOOD_CODE, "id": "c2", "tests": [{"args": [1]}]}, "'tests[0]' must be an object with 'args' and"),
        ({**GOOD_CODE, "id": "c2", "test": "def check(c): pass"}, "exactly one of 'tests'"),
        ({"id": "x", "domain": "chess", "prompt": "p"}, "'verifier' is missing"),
    ],
)
def test_a_malformed_line_is_an_error_and_the_others_load(tmp_path: Path, line, message: str) -> None:
    load = load_pack(_write(tmp_path, [GOOD_MATH, line, GOOD_CODE]))
    assert [task.id for _, task in load.tasks] == ["m1", "c1"]
    [error] = load.errors
    assert error.line == 2 and message in error.message, error
    if isinstance(line, dict) and isinstance(line.get("id"), str):
        assert error.id == line["id"]


def test_duplicate_ids_name_the_first_line(tmp_path: Path) -> None:
    load = load_pack(_write(tmp_path, [GOOD_MATH, GOOD_CODE, {**GOOD_MATH, "prompt": "other"}]))
    assert [line for line, _ in load.tasks] == [1, 2]
    [error] = load.errors
    assert (error.line, error.id) == (3, "m1") and "duplicate id 'm1' (first on line 1)" in error.message


def test_invalid_utf8_is_a_line_error(tmp_path: Path) -> None:
    path = tmp_path / "pack.jsonl"
    path.write_bytes(json.dumps(GOOD_MATH).encode() + b"\n\xff\xfe\n")
    load = load_pack(path)
    assert len(load.tasks) == 1 and [e.line for e in load.errors] == [2]


def test_missing_file_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        load_pack(tmp_path / "absent.jsonl")


def _tasks(n: int) -> list[Task]:
    prompts = [f"What is {i} + 1?" for i in range(n)]
    return [Task(id=f"t{i}", domain="math", prompt=p, answer="1", split=hash_split(p)) for i, p in enumerate(prompts)]


def test_pack_domain_keeps_splits_apart_and_is_deterministic() -> None:
    tasks = _tasks(200)
    domain = PackDomain("mypack", tasks, "answer_verify")
    heldout = {t.id for t in tasks if t.split == "heldout"}
    assert 20 < len(heldout) < 70  # about 1 in 5
    assert {t.id for t in domain.sample("heldout", len(heldout), seed=0)} == heldout
    train = domain.sample("train", 50, seed=1)
    assert not {t.id for t in train} & heldout and len({t.id for t in train}) == 50
    assert train == domain.sample("train", 50, seed=1) and train != domain.sample("train", 50, seed=2)


def test_pack_domain_repeats_evenly_when_n_exceeds_the_split() -> None:
    tasks = [Task(id=f"t{i}", domain="math", prompt=str(i), answer="1", split="heldout") for i in range(3)]
    drawn = PackDomain("p", tasks, "answer_verify").sample("heldout", 7, seed=0)
    counts = sorted([t.id for t in drawn].count(t.id) for t in tasks)
    assert counts == [2, 2, 3]


def test_pack_domain_errors() -> None:
    domain = PackDomain("p", [Task(id="a", domain="math", prompt="p", split="train")], "answer_verify")
    with pytest.raises(ValueError, match="no 'heldout' tasks"):
        domain.sample("heldout", 1, seed=0)
    with pytest.raises(ValueError, match="split must be one of"):
        domain.sample("valid", 1, seed=0)
    assert domain.sample("heldout", 0, seed=0) == []
