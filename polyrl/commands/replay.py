"""`polyrl replay RUN_DIR [ID] [--list] [--failed] [--json]`: re-run a recorded execution.

A training run records every code execution (`RUN_DIR/executions.jsonl`, see
polyrl.sandbox.execution_log); a trajectory's reward details name theirs as
"execution". `polyrl replay RUN_DIR ID` runs that execution again in a sandbox with the
recorded request, limits and settings, re-judges it, and says whether the verdict
reproduces; where it does not, what differs (status, exit code, signal, per-test
verdicts). That separates a flaky environment (a timeout under load, a sandbox error)
from the model's own failure. `--list` prints the recorded executions instead (with
`--failed`, only those with a failed test).

Exit status: 0 reproduced (or listed), 1 not reproduced, 2 no such run or id.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXECUTIONS = "executions.jsonl"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a run directory written by `polyrl train`")
    parser.add_argument("id", nargs="?", help="execution id (a trajectory's details.execution), e.g. x000042")
    parser.add_argument("--list", action="store_true", help="list the recorded executions")
    parser.add_argument("--failed", action="store_true", help="with --list: only executions with a failed test")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def _verdict(rec: dict) -> str:
    verdicts = rec.get("verdicts") or []
    return f"{sum(v['passed'] for v in verdicts)}/{len(verdicts)} tests"


def main(args: argparse.Namespace) -> int:
    from polyrl.sandbox.execution_log import ExecutionLog, file_of, log_files

    first = Path(args.run_dir) / EXECUTIONS
    files = log_files(first)  # the first log and, with a pool of reward actors, theirs
    if not files:
        print(f"polyrl replay: {args.run_dir} has no {EXECUTIONS} (no code was executed in that run)", file=sys.stderr)
        return 2
    path = file_of(first, args.id)[0] if args.id and not args.list else first
    logs = [ExecutionLog(f) for f in files] if args.list or not args.id else [ExecutionLog(path)]
    log = logs[0]
    try:
        rows = [r for each in logs for r in each] if args.list or not args.id else []
        rec = log.get(args.id) if args.id and not args.list else None
    except KeyError:
        print(f"polyrl replay: no execution {args.id!r} in {path}; `polyrl replay {args.run_dir} --list` shows them",
              file=sys.stderr)
        return 2
    except ValueError as exc:  # a corrupt line inside the log (a torn last one is skipped)
        print(f"polyrl replay: {exc}", file=sys.stderr)
        return 2
    for note in (n for each in logs for n in each.notes):
        print(f"polyrl replay: note: {note}", file=sys.stderr)
    if args.list or not args.id:
        rows = [r for r in rows if not args.failed or not all(v["passed"] for v in r.get("verdicts") or [])]
        if args.json:
            print(json.dumps([{"id": r["id"], "task_id": r.get("task_id"), "status": r["result"]["status"],
                               "verdicts": r.get("verdicts")} for r in rows]))
        else:
            for r in rows:
                print(f"{r['id']}  {r.get('task_id', '-')}  {r['result']['status']}  {_verdict(r)}")
            print(f"{len(rows)} executions" + (" with a failed test" if args.failed else ""), file=sys.stderr)
        return 0
    assert rec is not None

    from polyrl.sandbox.replay import replay

    outcome = replay(rec)
    now = outcome.result
    if args.json:
        print(json.dumps({"id": args.id, "task_id": rec.get("task_id"), "reproduced": outcome.reproduced,
                          "differences": outcome.differences, "recorded": rec["result"],
                          "now": now.to_json() if now else None, "verdicts": outcome.verdicts}))
    else:
        print(f"{args.id}  task {rec.get('task_id', '-')}")
        print(f"  recorded: {rec['result']['status']}, exit {rec['result']['exit_code']}, {_verdict(rec)}")
        if now is not None:
            print(f"  now:      {now.status}, exit {now.exit_code}, {_verdict({'verdicts': outcome.verdicts})}")
        print("  reproduced" if outcome.reproduced else "  NOT reproduced:")
        for difference in outcome.differences:
            print(f"    {difference}")
    return 0 if outcome.reproduced else 1
