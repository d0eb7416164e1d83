"""`polyrl suite example -o FILE [--seed K]`: write an example evaluation suite.

The suite (polyrl/evals/example_suite.py) is 104 tasks shaped like a business's own:
customer-service agent tasks over the shop tools, code fixes, word problems and questions
about long documents, each tagged typical, edge or failure_mode. It is a task pack: run it
with `polyrl eval FILE --model M`, audit it with `polyrl audit FILE`, or edit it into your
own suite.

Out of scope: suites of other shapes (write a pack by hand; docs/packs.md gives the lines).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

KINDS = ("example",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", choices=KINDS, help="which suite: example (104 business-shaped tasks)")
    parser.add_argument("-o", "--out", help="output file (default: stdout)")
    parser.add_argument("--seed", type=int, default=0, help="a different seed draws other tasks of the same shape")


def main(args: argparse.Namespace) -> int:
    from polyrl.evals.example_suite import example_suite

    lines = example_suite(args.seed)
    text = "".join(json.dumps(line) + "\n" for line in lines)
    if not args.out:
        sys.stdout.write(text)
        return 0
    try:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as err:
        print(f"polyrl suite: cannot write {args.out}: {err.strerror or err}", file=sys.stderr)
        return 2
    tags = Counter(line["metadata"]["tag"] for line in lines)
    families = Counter(line["metadata"]["family"] for line in lines)
    print(f"wrote {len(lines)} tasks to {args.out} ({', '.join(f'{k} {v}' for k, v in tags.items())}; "
          f"{', '.join(f'{k} {v}' for k, v in families.items())})", file=sys.stderr)
    return 0
