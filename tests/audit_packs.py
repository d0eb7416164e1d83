"""Task packs for the audit tests: one line per defect the audit must catch, plus clean ones.

`BROKEN` maps each task id to the check that must flag it (and its severity); `write_pack`
writes the lines, with one malformed line after the first task (line 2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DOUBLE_PROMPT = "Write a Python function f(x) that returns x doubled."
DOUBLE_TESTS = [{"args": [2], "expected": 4}, {"args": [3], "expected": 6}, {"args": [-1], "expected": -2},
                {"args": [10], "expected": 20}]
DOUBLE_REF = "def f(x):\n    return x * 2\n"


def _code(task_id: str, **fields: Any) -> dict[str, Any]:
    line = {"id": task_id, "domain": "code", "prompt": DOUBLE_PROMPT, "entry_point": "f", "split": "train"}
    line.update(fields)
    if "test" not in line and "tests" not in line:
        line["tests"] = DOUBLE_TESTS
    return line


def _math(task_id: str, prompt: str, answer: str) -> dict[str, Any]:
    return {"id": task_id, "domain": "math", "prompt": prompt, "answer": answer, "split": "train"}


_FLAKY_CHECK = "import os\n\ndef check(candidate):\n" + "".join(
    f"    assert candidate({k}) == {k} + os.urandom(1)[0] % 2\n" for k in range(24))

LINES: list[dict[str, Any]] = [
    _code("clean_code", reference=DOUBLE_REF),
    _code("unsolvable", prompt="Write f(x) returning x doubled.", reference=DOUBLE_REF,
          test="def check(candidate):\n    assert candidate(2) > 3\n    assert candidate(2) < 1\n"),
    _code("contradictory_tests", prompt="Write f(x) that returns x plus one.", reference="def f(x):\n    return x + 1\n",
          tests=[{"args": [1], "expected": 2}, {"args": [1], "expected": 3}, {"args": [5], "expected": 6}]),
    _code("wrong_reference", prompt="Write f(x), twice x.", reference="def f(x):\n    return x + 2\n"),
    _code("empty_tests", prompt="Write f(x), x times two.", reference=DOUBLE_REF,
          test="def check(candidate):\n    pass\n"),
    _code("constant_passes", prompt="Write f(s) that counts the vowels of s.",
          reference="def f(s):\n    return sum(c in 'aeiou' for c in s)\n",
          tests=[{"args": ["xyz"], "expected": 0}, {"args": ["rhythm"], "expected": 0},
                 {"args": ["psst"], "expected": 0}]),
    _code("reference_hangs", prompt="Write f(x) = 2x.", reference="def f(x):\n    while True:\n        pass\n"),
    _code("check_does_not_compile", prompt="Write f(x) = x * 2.", reference=DOUBLE_REF,
          test="def check(candidate):\n    assert candidate(2) == \n"),
    _code("flaky_check", prompt="Write f(x) that returns x.", reference="def f(x):\n    return x\n",
          test=_FLAKY_CHECK),
    _code("leaked_code", prompt="def f(x):\n    \"\"\"Return x doubled.\"\"\"\n    return x * 2\n", reference=DOUBLE_REF),
    _math("clean_math", "What is 3 + 4?", "7"),
    _math("leaked_answer", "What is 6 * 7? The answer is 42.", "42"),
    _math("unparsable_answer", "What is one half?", "\\frac{1}{"),
    _math("duplicate_a", "What is 2 + 2?", "4"),
    _math("duplicate_b", "What is  2 + 2?", "4"),
    _math("empty_prompt", "", "3"),
]

BROKEN: dict[str, tuple[str, str]] = {
    "unsolvable": ("solvability", "fail"),
    "contradictory_tests": ("contradictory_tests", "fail"),
    "wrong_reference": ("solvability", "fail"),
    "empty_tests": ("empty_tests", "fail"),
    "constant_passes": ("negative_control", "fail"),
    "reference_hangs": ("solvability", "fail"),
    "check_does_not_compile": ("tests_compile", "fail"),
    "flaky_check": ("determinism", "fail"),
    "leaked_code": ("leaked_answer", "fail"),
    "leaked_answer": ("leaked_answer", "fail"),
    "unparsable_answer": ("unparsable_answer", "fail"),
    "duplicate_b": ("duplicate", "warn"),
    "empty_prompt": ("empty_prompt", "fail"),
}
CLEAN = ("clean_code", "clean_math", "duplicate_a")
MALFORMED_LINE = 2


def write_pack(path: Path) -> Path:
    rows = [json.dumps(LINES[0]), "{this is not json", *(json.dumps(line) for line in LINES[1:])]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path
