"""`polyrl audit PACK.jsonl [--policy MODEL] [--json]` and `polyrl audit --domain NAME [--n N]`:
prove a task set's tasks solvable and their rewards right and hard to game, before training.

The checks and their stages are polyrl/quality/audit.py; docs/packs.md walks through an
author's workflow. Progress goes to stderr; stdout is the summary, or with `--json`
exactly one document (polyrl/quality/report.py). `--write-quarantine PATH` writes the
ids of the failing tasks, one per line, for a run file's `rl_tasks[].quarantine`.

Exit status: 0 when no task fails (warnings allowed), 1 when some task fails, 2 when the
pack cannot be read or the arguments are wrong.

Out of scope: fixing tasks, and auditing agent domains' episodes.
"""

from __future__ import annotations

import argparse
import json
import sys

from polyrl.commands import at_least, positive_number


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pack", nargs="?", help="task pack, JSONL (one task per line)")
    parser.add_argument("--domain", help="audit a built-in or plugin domain instead (math, code, humaneval, swe, ...)")
    parser.add_argument("--n", type=at_least(1), default=50, help="with --domain: tasks to sample (default 50)")
    parser.add_argument("--seed", type=int, default=0, help="with --domain: sampling seed")
    parser.add_argument("--policy", metavar="MODEL", help="Hugging Face model directory (or builtin:tiny) to "
                                                          "sample k completions per task from: pass@k, difficulty")
    parser.add_argument("--samples", "-k", type=at_least(1), default=4, help="with --policy: samples per task (default 4)")
    parser.add_argument("--max-tokens", type=at_least(1), default=512, help="with --policy: completion length")
    parser.add_argument("--repeats", type=at_least(0), default=2, help="extra scorings of each reference (determinism)")
    parser.add_argument("--mutants", type=at_least(0), default=2, help="mutants of each kind per reference (default 2)")
    parser.add_argument("--timeout", type=positive_number, default=3.0, help="per-test timeout of code probes that must pass")
    parser.add_argument("--workers", type=at_least(1), help="sandbox workers (default: one per core)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the summary")
    parser.add_argument("--write-quarantine", metavar="PATH", help="write the failing tasks' ids to PATH")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def main(args: argparse.Namespace) -> int:
    from polyrl.quality.audit import AuditOptions, audit_domain, audit_pack
    from polyrl.quality.report import format_text, to_json
    from polyrl.quality.scoring import stderr_progress

    if bool(args.pack) == bool(args.domain):
        print("polyrl audit: give a pack file or --domain NAME (not both)", file=sys.stderr)
        return 2
    if args.samples < 1 or args.n < 1:
        print("polyrl audit: --samples and --n must be at least 1", file=sys.stderr)
        return 2
    options = AuditOptions(repeats=args.repeats, samples=args.samples, mutants_per_kind=args.mutants,
                           per_test_timeout_s=args.timeout, workers=args.workers)
    progress = None if args.quiet else stderr_progress
    policy = None
    if args.policy:
        from polyrl.quality.policy import EnginePolicy

        try:
            policy = EnginePolicy(args.policy, max_tokens=args.max_tokens, seed=args.seed)
        except (FileNotFoundError, OSError, ValueError) as err:
            print(f"polyrl audit: cannot load --policy {args.policy}: {err}", file=sys.stderr)
            return 2
    if args.domain:
        from polyrl.domains.registry import UnknownDomain

        try:
            result = audit_domain(args.domain, args.n, args.seed, policy, options, progress)
        except UnknownDomain as err:
            print(f"polyrl audit: {err}", file=sys.stderr)
            return 2
    else:
        from polyrl.domains.pack import EmptyPack

        try:
            result = audit_pack(args.pack, policy, options, progress)
        except OSError as err:
            print(f"polyrl audit: cannot read {args.pack}: {err.strerror or err}", file=sys.stderr)
            return 2
        except EmptyPack as err:
            print(f"polyrl audit: {err}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(to_json(result), default=str))
    else:
        print(format_text(result))
    if args.write_quarantine:
        from polyrl.domains.quarantine import write_quarantine

        failing = [a.id for a in result.tasks if a.status == "fail" and a.id is not None]
        write_quarantine(args.write_quarantine, failing, f"tasks failing `polyrl audit` of {result.source}")
        print(f"wrote {len(failing)} failing task ids to {args.write_quarantine}", file=sys.stderr)
    return 1 if result.failed else 0
