"""Accuracy over context length: the long-context domain's held-out questions, and a
retrieval control, at a sweep of prompt lengths, on any model `polyrl eval` can call.

    cells = sweep_tasks(tokenizer, lengths=(256, 512, 1024), per_cell=8, kinds=SWEEP_KINDS, level=1)
    result = run_sweep(adapter, cells, limits)          # one model
    result["effective_length"]                          # e.g. 512

Every length asks the same questions (the domain draws its questions independently of the
length and tokenizer), so accuracies at two lengths are paired comparisons. Lengths are the
prompt's length in the model's own tokens (an endpoint's are measured with the tokenizer
the caller passes). A kind whose evidence alone is longer than a length has no cell there
("does not fit"), not a zero.

Effective length (after RULER): the longest length L of the sweep such that accuracy at
every length up to L stays at or above `ratio` (0.8) times the accuracy at the shortest
length. It is computed over all kinds together (only the kinds that fit at every length, so
the accuracies compare like with like) and per kind (from that kind's shortest length).
None when the accuracy at the shortest length is 0: no baseline to hold.

A prompt longer than the model's window is not sent (runner.py: stop reason
"context_overflow") and counts as a failure: a model cannot use context it cannot read.

Out of scope: several samples per task (greedy, one each), lengths below MIN_TOKENS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from polyrl.domains.longctx import CONTROLS, KINDS, MIN_TOKENS, LongContextDomain
from polyrl.evals.limits import EvalLimits
from polyrl.evals.models import ModelAdapter
from polyrl.evals.runner import TaskRun, Verifiers, run_task
from polyrl.evals.suite import UNTAGGED, SuiteTask

SWEEP_KINDS = KINDS + CONTROLS
DEFAULT_LENGTHS = (256, 512, 1024, 2048, 4096, 8192, 16384)
RATIO = 0.8
SEED = 0


@dataclass(frozen=True)
class Cell:
    """The tasks of one (length, kind), or why there are none."""

    length: int
    kind: str
    tasks: tuple[SuiteTask, ...]
    skipped: str | None = None
    """Why the cell is empty ("does not fit": the kind's evidence is longer than the length)."""


def sweep_tasks(tokenizer: Any, lengths: Sequence[int], per_cell: int, kinds: Sequence[str] = SWEEP_KINDS,
                level: int = 1, seed: int = SEED) -> list[Cell]:
    """`per_cell` held-out questions of each kind at `level`, assembled at each length."""
    if not lengths or any(n < MIN_TOKENS for n in lengths) or list(lengths) != sorted(set(lengths)):
        raise ValueError(f"lengths must be increasing, distinct and at least {MIN_TOKENS} tokens, got {list(lengths)}")
    cells = []
    for length in lengths:
        for kind in kinds:
            domain = LongContextDomain(levels=(level,), kinds=(kind,), tokens=length, tokenizer=tokenizer)
            try:
                tasks = domain.sample("heldout", per_cell, seed)
            except ValueError as err:
                if "too short" not in str(err):
                    raise
                cells.append(Cell(length, kind, (), "does not fit"))
                continue
            cells.append(Cell(length, kind, tuple(SuiteTask(t, 0, UNTAGGED, domain.default_verifier) for t in tasks)))
    return cells


def run_sweep(adapter: ModelAdapter, cells: Sequence[Cell], limits: EvalLimits,
              progress: Callable[[int, int, str], None] | None = None) -> dict[str, Any]:
    """Every cell's tasks on one model; the accuracy table and effective lengths as a dict."""
    verifiers = Verifiers()
    runs: dict[tuple[int, str], list[TaskRun]] = {}
    total, done = sum(len(c.tasks) for c in cells), 0
    try:
        for cell in cells:
            for k, suite_task in enumerate(cell.tasks):
                run = run_task(suite_task, adapter, limits, verifiers, f"sweep-{cell.length}-{cell.kind}-{k}")
                runs.setdefault((cell.length, cell.kind), []).append(run)
                done += 1
                if progress is not None:
                    progress(done, total, f"{adapter.spec} {cell.length} {cell.kind}")
    finally:
        verifiers.close()
    return summarise(adapter.spec, cells, runs)


def summarise(model: str, cells: Sequence[Cell], runs: dict[tuple[int, str], list[TaskRun]]) -> dict[str, Any]:
    lengths = sorted({c.length for c in cells})
    kinds = list(dict.fromkeys(c.kind for c in cells))
    table: dict[str, dict[str, Any]] = {}
    for cell in cells:
        got = runs.get((cell.length, cell.kind), [])
        table.setdefault(cell.kind, {})[str(cell.length)] = None if cell.skipped else {
            "tasks": len(got), "successes": sum(r.success for r in got),
            "accuracy": sum(r.success for r in got) / len(got) if got else None,
            "overflow": sum(r.stop_reason == "context_overflow" for r in got)}
    common = [k for k in kinds if all(table[k][str(n)] is not None for n in lengths)]
    overall = {}
    for n in lengths:
        got = [r for k in common for r in runs.get((n, k), [])]
        overall[str(n)] = sum(r.success for r in got) / len(got) if got else None
    per_kind = {k: effective_length({int(n): c["accuracy"] for n, c in table[k].items() if c is not None})
                for k in kinds}
    return {"model": model, "lengths": lengths, "kinds": kinds, "common_kinds": common, "accuracy": table,
            "overall": overall, "effective_length": effective_length({int(n): a for n, a in overall.items()}),
            "effective_length_by_kind": per_kind, "ratio": RATIO}


def effective_length(accuracy: dict[int, float | None], ratio: float = RATIO) -> int | None:
    """The longest length up to which accuracy stays >= ratio x accuracy at the shortest one."""
    lengths = sorted(n for n, a in accuracy.items() if a is not None)
    if not lengths or not accuracy[lengths[0]]:
        return None
    floor = ratio * accuracy[lengths[0]]
    best = lengths[0]
    for n in lengths[1:]:
        if accuracy[n] < floor:
            break
        best = n
    return best
