"""`polyrl` command line: train, score (more subcommands join as they land)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="polyrl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    from polyrl import score

    score.add_arguments(sub.add_parser("score", help="score completions of a task pack, no model needed"))
    args = parser.parse_args(argv)
    if args.command == "score":
        return score.main(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
