"""JSONL task packs: load them line by line, and serve their tasks as a Domain.

Line shapes (one JSON object per line; blank lines are skipped):

- math: `{"id", "domain": "math", "prompt", "answer"}` (answer: string or number)
- code: `{"id", "domain": "code", "prompt", "entry_point", "tests": [{"args": [...],
  "expected": ...}, ...]}`, or HumanEval style with `"test"` (the source of a
  `check(candidate)` function) instead of `"tests"`; optional `"reference"`.
- any other domain: must name its `"verifier"`.
- every line may carry `"verifier"`, `"metadata"` (object), `"split"` ("train" or
  "heldout"; default: a stable hash of the prompt, `hash_split`) and `"difficulty"`
  (integer >= 0). Any other field goes into `Task.data` for the domain's verifier.

A malformed line (bad JSON, a missing or wrongly typed field, a duplicate id, a domain
without a verifier, JSON nested deeper than MAX_JSON_DEPTH or a number too long to read)
becomes a `PackError` naming the line and the field; every other line still loads.
`read_json_line` is that reading for any JSONL file a command is given (completions too).

Out of scope: checking that a task is solvable or its tests sound (`polyrl audit`),
and fetching packs from anywhere but a local path.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from polyrl.types import Task

SPLITS = ("train", "heldout")
HELDOUT_ONE_IN = 5
DEFAULT_VERIFIERS = {"math": "answer_verify", "code": "unit_test_pass", "longctx": "answer_verify", "swe": "swe_patch",
                     "ops": "world_state"}
"""Verifier of each domain with a known line shape; other domains name theirs per line."""

_COMMON_FIELDS = {"id", "domain", "prompt", "answer", "verifier", "metadata", "split", "difficulty"}

MAX_JSON_DEPTH = 100
"""Nesting of a line's arrays and objects; deeper lines are errors (a task has a few levels, and
every reader after this one, JSON writers included, recurses once per level)."""


def read_json_line(raw: bytes) -> Any:
    """One JSONL line as a Python value; ValueError with a message naming what is wrong
    (not UTF-8, not JSON, nested too deep, a number too long to read)."""
    try:
        obj = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"not valid UTF-8: {exc}") from None
    except RecursionError:
        raise ValueError(f"not readable: JSON nested more than {MAX_JSON_DEPTH} levels deep") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    except ValueError as exc:  # an integer of thousands of digits: Python refuses to convert it
        raise ValueError(f"not readable: {exc}") from None
    if _depth_exceeds(obj, MAX_JSON_DEPTH):
        raise ValueError(f"not readable: JSON nested more than {MAX_JSON_DEPTH} levels deep")
    return obj


def _depth_exceeds(obj: Any, limit: int) -> bool:
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (list, dict)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return False


def check_split(split: str) -> None:
    """A ValueError unless `split` is one of SPLITS (what every domain's `sample` takes)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def hash_split(text: str) -> str:
    """"heldout" for 1 in HELDOUT_ONE_IN texts, "train" otherwise, by sha256: stable
    across runs, machines and Python versions, so a prompt never changes sides."""
    return "heldout" if int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % HELDOUT_ONE_IN == 0 else "train"


def verifier_for(task: Task) -> str:
    """The verifier that grades `task`: its own, else its domain's default."""
    if task.verifier:
        return task.verifier
    if task.domain not in DEFAULT_VERIFIERS:
        raise ValueError(f"task {task.id!r}: domain {task.domain!r} has no default verifier and the task names none")
    return DEFAULT_VERIFIERS[task.domain]


@dataclass
class PackError:
    line: int
    """1-based line number in the pack file."""
    message: str
    id: str | None = None
    """The line's id, when it could be read."""


@dataclass
class PackLoad:
    tasks: list[tuple[int, Task]]
    """(1-based line number, task) for every line that loaded."""
    errors: list[PackError]
    lines: int = 0
    """Non-blank lines read; 0 means an empty pack, which callers refuse."""


class _BadLine(ValueError):
    pass


class EmptyPack(ValueError):
    """A pack file with no lines at all: an error wherever a pack is used."""

    def __init__(self, path: str | Path):
        super().__init__(f"{path} is empty: a pack has one task per line")


_TYPE_NAMES = {str: "a string", list: "a list", dict: "an object", int: "an integer", float: "a number"}


def _get(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], *, required: bool = True) -> Any:
    """obj[key] checked against `kind` (bool never counts as a number)."""
    if key not in obj or obj[key] is None:
        if required:
            raise _BadLine(f"field {key!r} is missing")
        return None
    value = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) or not isinstance(value, kinds):
        expected = " or ".join(_TYPE_NAMES[k] for k in kinds if not (k is int and float in kinds))
        raise _BadLine(f"field {key!r} must be {expected}, got {type(value).__name__}")
    return value


def _code_fields(obj: dict[str, Any]) -> None:
    _get(obj, "entry_point", str)
    _get(obj, "reference", str, required=False)
    has_tests, has_test = obj.get("tests") is not None, obj.get("test") is not None
    if has_tests == has_test:
        raise _BadLine("a code task needs exactly one of 'tests' (a list of cases) or 'test' (check() source)")
    if has_test:
        _get(obj, "test", str)
        return
    cases = _get(obj, "tests", list)
    if not cases:
        raise _BadLine("field 'tests' is empty")
    for i, case in enumerate(cases):
        if not isinstance(case, dict) or "expected" not in case:
            raise _BadLine(f"field 'tests[{i}]' must be an object with 'args' and 'expected'")
        if not isinstance(case.get("args"), list):
            raise _BadLine(f"field 'tests[{i}].args' must be a list")


def _task_from_line(obj: Any) -> Task:
    if not isinstance(obj, dict):
        raise _BadLine(f"a line must be a JSON object, got {type(obj).__name__}")
    task_id = _get(obj, "id", str)
    domain = _get(obj, "domain", str)
    prompt = _get(obj, "prompt", str)
    if not task_id or not domain:
        raise _BadLine(f"field {'id' if not task_id else 'domain'!r} is empty")
    answer = _get(obj, "answer", (str, int, float), required=domain == "math")
    verifier = _get(obj, "verifier", str, required=domain not in DEFAULT_VERIFIERS)
    if domain == "code":
        _code_fields(obj)
    split = _get(obj, "split", str, required=False)
    if split is not None and split not in SPLITS:
        raise _BadLine(f"field 'split' must be one of {SPLITS}, got {split!r}")
    difficulty = _get(obj, "difficulty", int, required=False)
    if difficulty is not None and difficulty < 0:
        raise _BadLine(f"field 'difficulty' must be >= 0, got {difficulty}")
    return Task(
        id=task_id,
        domain=domain,
        prompt=prompt,
        answer=None if answer is None else str(answer),
        verifier=verifier,
        split=split or hash_split(prompt),
        difficulty=difficulty or 0,
        data={k: v for k, v in obj.items() if k not in _COMMON_FIELDS},
        metadata=_get(obj, "metadata", dict, required=False) or {},
    )


def load_pack(path: str | Path) -> PackLoad:
    """Every line of the pack at `path` as a Task or a PackError. Raises OSError only
    when the file itself cannot be read."""
    tasks: list[tuple[int, Task]] = []
    errors: list[PackError] = []
    first_line_of: dict[str, int] = {}
    lines = 0
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            lines += 1
            try:
                obj = read_json_line(raw)
            except ValueError as exc:
                errors.append(PackError(number, str(exc)))
                continue
            raw_id = obj.get("id") if isinstance(obj, dict) and isinstance(obj.get("id"), str) else None
            if raw_id is not None and raw_id in first_line_of:
                message = f"duplicate id {raw_id!r} (first on line {first_line_of[raw_id]})"
                errors.append(PackError(number, message, raw_id))
                continue
            if raw_id is not None:
                first_line_of[raw_id] = number
            try:
                tasks.append((number, _task_from_line(obj)))
            except _BadLine as exc:
                errors.append(PackError(number, str(exc), raw_id))
    return PackLoad(tasks, errors, lines)


def verifier_misfit(task: Task, verifier: str) -> str | None:
    """Why `verifier` cannot grade `task`, in words, or None when it can (or is not one whose
    needs are known here). What each built-in verifier reads of a task is its module's docstring."""
    if verifier == "unit_test_pass" and not ("entry_point" in task.data and ("tests" in task.data or
                                                                              "test" in task.data)):
        return "unit_test_pass grades code tasks (entry_point with tests or test); this task has none"
    if verifier in ("answer_verify", "success_minus_cost") and task.answer is None:
        return f"{verifier} compares against the task's answer; this task has none"
    if verifier == "swe_patch" and not all(k in task.data for k in ("package", "files", "visible_tests",
                                                                     "hidden_tests")):
        return "swe_patch grades swe tasks (package, files, visible_tests, hidden_tests); this task has none"
    if verifier == "world_state" and not all(k in task.data for k in ("world", "gold_changes", "min_calls")):
        return "world_state grades ops tasks (world, gold_changes, min_calls); this task has none"
    if verifier == "rule_check" and not ("intent" in task.data and "entities" in task.data):
        return "rule_check grades alignment tasks (intent and entities); this task has neither"
    return None


class PackDomain:
    """A Domain over the tasks of one pack domain.

    Each task's split was fixed at load time (its line's "split", else `hash_split`).
    `sample` shuffles the split with a seeded RNG; when n exceeds the split's size it
    makes further shuffled passes, so each task appears n // size or n // size + 1 times.
    """

    def __init__(self, name: str, tasks: Sequence[Task], default_verifier: str) -> None:
        self.name = name
        self.default_verifier = default_verifier
        self._by_split = {split: [t for t in tasks if t.split == split] for split in SPLITS}

    def sample(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        pool = self._by_split[split]
        if n > 0 and not pool:
            hint = (' (held-out evaluation needs them: give some lines "split": "heldout", '
                    'or set eval.heldout_per_domain: 0)') if split == "heldout" else ""
            raise ValueError(f"pack domain {self.name!r} has no {split!r} tasks{hint}")
        rng = random.Random(f"pack|{self.name}|{split}|{seed}")
        out: list[Task] = []
        while len(out) < n:
            out.extend(rng.sample(pool, min(len(pool), n - len(out))))
        return out


def task_line(task: Task) -> dict[str, Any]:
    """A Task as a pack line: the common fields, then its domain fields (entry_point, tests, ...)."""
    line: dict[str, Any] = {"id": task.id, "domain": task.domain, "prompt": task.prompt}
    if task.answer is not None:
        line["answer"] = task.answer
    line.update({k: v for k, v in task.data.items() if k not in ("solution", "kind", "family")})
    line.update(split=task.split, difficulty=task.difficulty)
    if task.metadata or "family" in task.data:
        line["metadata"] = {**task.metadata, **({"family": task.data["family"]} if "family" in task.data else {})}
    return line
