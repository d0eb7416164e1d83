"""`polyrl score PACK.jsonl --completions COMPLETIONS.jsonl [--json]`: grade given
completions with each task's verifier, no model involved.

COMPLETIONS lines are `{"id": ..., "completion": "..."}`; an id may appear on several
lines (G samples of one prompt), each is scored. Completions are batched per verifier
(the task's own `verifier`, else its domain's default).

Every problem with one line is an error entry naming the file and the line, and the
rest is still scored: a malformed pack or completions line, an id the pack does not
have (or whose pack line is malformed), an unknown verifier, a verifier that fails to
load or raises on a task. With `--json`, stdout is exactly one JSON document:

    {"results": [{"id", "line", "reward", "details"}, ...],
     "summary": {"scored", "errors", "mean_reward", "by_status"},
     "errors": [{"file", "line", "id", "message"}, ...]}

Without it, a table on stdout and the errors on stderr. Exit status: 0 when every
completion line was scored, 1 otherwise, 2 when a file cannot be read or is empty.

Out of scope: generating completions (that needs a model: `polyrl eval`), auditing the
pack itself (`polyrl audit`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from polyrl.domains.pack import load_pack, read_json_line, verifier_for
from polyrl.rewards.registry import UnknownVerifier, get_verifier
from polyrl.types import Score, Task


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pack", help="task pack, JSONL (one task per line)")
    parser.add_argument(
        "--completions", required=True, help='JSONL, one {"id": ..., "completion": "..."} per line'
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")


@dataclass
class _Entry:
    """One completions line to score."""

    line: int
    task: Task
    completion: str


class _Report:
    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []
        self.errors: list[dict[str, Any]] = []
        self.completion_lines = 0
        """Non-blank lines of the completions file: each must end up in `results`."""

    def error(self, file: str, line: int, task_id: str | None, message: str) -> None:
        self.errors.append({"file": file, "line": line, "id": task_id, "message": message})

    def scored(self, entry: _Entry, score: Score) -> None:
        self.results.append(
            {"id": entry.task.id, "line": entry.line, "reward": score.value, "details": score.details}
        )


def _read_completions(path: str, report: _Report) -> list[tuple[int, str, str]]:
    """(line, id, completion) for each well-formed line; the others go to `report`."""
    out = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            report.completion_lines += 1
            try:
                obj = read_json_line(raw)
            except ValueError as exc:
                report.error(path, number, None, str(exc))
                continue
            if not isinstance(obj, dict):
                report.error(path, number, None, f"a line must be a JSON object, got {type(obj).__name__}")
                continue
            task_id, completion = obj.get("id"), obj.get("completion")
            if not isinstance(task_id, str) or not task_id:
                report.error(path, number, None, "field 'id' must be a non-empty string")
            elif not isinstance(completion, str):
                report.error(path, number, task_id, "field 'completion' must be a string")
            else:
                out.append((number, task_id, completion))
    return out


def _score_batch(name: str, entries: list[_Entry], path: str, report: _Report) -> None:
    """Score `entries` with verifier `name`; a verifier that cannot load or that raises
    becomes an error of each line it could not score."""
    try:
        verifier = get_verifier(name)
    except UnknownVerifier as exc:
        for e in entries:
            report.error(path, e.line, e.task.id, str(exc))
        return
    except Exception as exc:  # noqa: BLE001 -- e.g. a verifier module that fails to import
        for e in entries:
            report.error(path, e.line, e.task.id, f"verifier {name!r} failed to load: {type(exc).__name__}: {exc}")
        return
    try:
        try:
            scores = verifier.score([e.task for e in entries], [e.completion for e in entries])
        except Exception:  # noqa: BLE001 -- find out which lines make it raise
            for e in entries:
                try:
                    report.scored(e, verifier.score([e.task], [e.completion])[0])
                except Exception as exc:  # noqa: BLE001
                    report.error(path, e.line, e.task.id, f"verifier {name!r} raised {type(exc).__name__}: {exc}")
        else:
            for e, score in zip(entries, scores):
                report.scored(e, score)
    finally:
        verifier.close()


def _print_table(report: _Report, summary: dict[str, Any]) -> None:
    width = max([len("id"), *(len(r["id"]) for r in report.results)])
    print(f"{'line':>5}  {'id':<{width}}  {'reward':>6}  status")
    for r in report.results:
        print(f"{r['line']:>5}  {r['id']:<{width}}  {r['reward']:>6.3f}  {r['details'].get('status', '')}")
    mean = "n/a" if summary["mean_reward"] is None else f"{summary['mean_reward']:.3f}"
    statuses = ", ".join(f"{k} {v}" for k, v in summary["by_status"].items())
    line = f"scored {summary['scored']}, errors {summary['errors']}, mean reward {mean}"
    print(line + (f" ({statuses})" if statuses else ""))
    for e in report.errors:
        print(f"{e['file']}:{e['line']}: {e['id'] or '-'}: {e['message']}", file=sys.stderr)


def main(args: argparse.Namespace) -> int:
    report = _Report()
    try:
        pack = load_pack(args.pack)
        completions = _read_completions(args.completions, report)
    except OSError as exc:
        print(f"polyrl score: cannot read {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    for name, empty in ((args.pack, not pack.lines), (args.completions, not report.completion_lines)):
        if empty:
            print(f"polyrl score: {name} is empty: nothing to score", file=sys.stderr)
            return 2

    for err in pack.errors:
        report.error(args.pack, err.line, err.id, err.message)
    tasks = {task.id: task for _, task in pack.tasks}
    broken = {err.id: err.line for err in pack.errors if err.id is not None}
    by_verifier: dict[str, list[_Entry]] = defaultdict(list)
    for number, task_id, completion in completions:
        if task_id in tasks:
            task = tasks[task_id]
            by_verifier[verifier_for(task)].append(_Entry(number, task, completion))
        elif task_id in broken:
            message = f"task {task_id!r} did not load (pack line {broken[task_id]})"
            report.error(args.completions, number, task_id, message)
        else:
            report.error(args.completions, number, task_id, f"unknown id {task_id!r}: not in {args.pack}")
    for name, entries in by_verifier.items():
        _score_batch(name, entries, args.completions, report)

    report.results.sort(key=lambda r: r["line"])
    report.errors.sort(key=lambda e: (e["file"] != args.pack, e["line"]))
    rewards = [r["reward"] for r in report.results]
    summary = {
        "scored": len(rewards),
        "errors": len(report.errors),
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "by_status": dict(Counter(r["details"].get("status", "unknown") for r in report.results)),
    }
    if args.json:
        doc = {"results": report.results, "summary": summary, "errors": report.errors}
        print(json.dumps(doc, default=str))
    else:
        _print_table(report, summary)
    return 0 if len(report.results) == report.completion_lines else 1
