"""`polyrl eval SUITE --model A [--model B ...] [-o DIR] [--json]`: compare candidate models on
a task suite, each failure attributed to engineering or capability.

    polyrl suite example -o suite.jsonl
    polyrl eval suite.jsonl --model builtin:tiny -o evals/tiny
    polyrl eval suite.jsonl --model builtin:tiny --model runs/quickstart --prices prices.yaml
    polyrl eval suite.jsonl --model openai:http://localhost:8000/v1#default --json

SUITE is any task pack (polyrl/evals/suite.py: lines may carry metadata.tag and
metadata.limits). A model is builtin:tiny, a Hugging Face directory, a run directory (its
final or latest checkpoint), or openai:BASE_URL#MODEL (polyrl/evals/models.py). Every task
runs once per model, greedy by default, graded by the task's own verifier, the one training
uses; each failure is labelled and its engineering evidence tested by a re-run with the
limit lifted (polyrl/evals/attribution.py).

Output: a table per model (success rate with its 95% interval, tokens, latency, cost,
results by tag, attribution) and the paired comparison of the candidates; with `--json`
exactly one document on stdout (polyrl/evals/document.py). `-o DIR` writes DIR/results.json
(that document), DIR/tasks.jsonl (trajectories) and DIR/obs.sqlite (every model and tool
call, phase "eval", for `polyrl obs DIR`), only once every task has run. Progress
is a bar on stderr (`--quiet`: none).

Exit status: 0 when it ran (whatever the models scored), 2 with one line on stderr when the
suite, a model, the price card or DIR cannot be used.

Out of scope: several samples per task, parallel tasks, and resuming a stopped evaluation.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from polyrl.commands import at_least, non_negative_number, positive_number
from polyrl.obs.records import ListRecorder


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("suite", help="the suite: a task pack (JSONL), e.g. from `polyrl suite example -o FILE`")
    p.add_argument("--model", action="append", required=True, metavar="MODEL",
                   help="builtin:tiny, a Hugging Face dir, a run dir, or openai:BASE_URL#MODEL (repeatable)")
    p.add_argument("-o", "--out", metavar="DIR",
                   help="write DIR/results.json, DIR/tasks.jsonl and the per-call records DIR/obs.sqlite")
    p.add_argument("--json", action="store_true", help="print the results document instead of the tables")
    p.add_argument("--prices", metavar="FILE", help="price card (YAML/JSON, per million tokens); default: all 0")
    p.add_argument("--id", action="append", default=[], help="only this task id (repeatable)")
    p.add_argument("--tag", action="append", default=[], choices=["typical", "edge", "failure_mode", "untagged"],
                   help="only tasks of this tag (repeatable)")
    p.add_argument("--limit", type=at_least(1), metavar="N", help="only the first N selected tasks")
    p.add_argument("--max-tokens", type=at_least(1), default=256, help="completion tokens of a single-call task")
    p.add_argument("--agent-max-tokens", type=at_least(1), default=64, help="completion tokens per agent call")
    p.add_argument("--max-steps", type=at_least(1), default=8, help="model calls per agent episode")
    p.add_argument("--budget", type=at_least(1), help="token budget per agent episode (default: none)")
    p.add_argument("--result-chars", type=at_least(1), default=400,
                   help="cap on each tool result the model is shown (default 400)")
    p.add_argument("--context-window", type=at_least(1),
                   help="prompt + completion tokens per call (default: the model's own)")
    p.add_argument("--timeout", type=positive_number, help="seconds per agent episode (default: none)")
    p.add_argument("--temperature", type=non_negative_number, default=0.0, help="sampling temperature (0 = greedy)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    from polyrl.evals.document import build_document, trajectories, write_outputs
    from polyrl.evals.limits import EvalLimits
    from polyrl.evals.models import load_model
    from polyrl.evals.prices import load_price_card
    from polyrl.evals.session import run_eval
    from polyrl.evals.suite import load_suite

    limits = EvalLimits(max_tokens=args.max_tokens, agent_max_tokens=args.agent_max_tokens, max_steps=args.max_steps,
                        budget=args.budget, result_chars=args.result_chars,
                        context_window=args.context_window or "model", timeout_s=args.timeout)
    duplicates = sorted({m for m in args.model if args.model.count(m) > 1})
    if duplicates:
        print(f"polyrl eval: --model {duplicates[0]} is given twice", file=sys.stderr)
        return 2
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        print(f"polyrl eval: -o {args.out} is a file; give a directory", file=sys.stderr)
        return 2
    # SuiteError, ModelError and PriceError carry exit_code 2: cli.run_command prints their one line.
    suite = load_suite(args.suite, limits).select(args.id or None, args.tag or None, args.limit)
    prices = load_price_card(args.prices)
    adapters = [load_model(spec, args.temperature, args.seed) for spec in args.model]
    calls = ListRecorder()  # written with the results, so that a broken run leaves nothing
    try:
        records = run_eval(suite, adapters, limits, _progress_bar(args.quiet), calls)
    finally:
        for adapter in adapters:
            adapter.close()
    doc = build_document(suite, adapters, limits, records, prices)
    if args.out:
        write_outputs(args.out, doc, trajectories(records))
        _write_calls(Path(args.out), calls)
    if args.json:
        print(json.dumps(doc, default=str))
    else:
        print(format_text(doc))
        if args.out:
            print(f"wrote {args.out}/results.json, {args.out}/tasks.jsonl and {args.out}/obs.sqlite "
                  f"(per-call records: polyrl obs {args.out})")
    return 0


def _write_calls(out: Path, calls: ListRecorder) -> None:
    """DIR/obs.sqlite with this evaluation's records only (an earlier one's is replaced)."""
    from polyrl.obs.store import ObsStore, store_path

    path = store_path(out)
    path.unlink(missing_ok=True)
    with ObsStore(path) as store:
        for rec in calls.records:
            store.record(rec)


def _progress_bar(quiet: bool):
    """A progress callback drawing a tqdm bar on stderr (none when quiet or stderr is not a terminal)."""
    if quiet:
        return None
    from tqdm import tqdm

    bar: dict[str, Any] = {}

    def progress(done: int, total: int, label: str) -> None:
        if "bar" not in bar:
            bar["bar"] = tqdm(total=total, file=sys.stderr, unit="task", dynamic_ncols=True, leave=False,
                              disable=None)  # None: no bar when stderr is not a terminal
        bar["bar"].set_postfix_str(label[-40:], refresh=False)
        bar["bar"].update(1)
        if done == total:
            bar["bar"].close()

    return progress


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def format_text(doc: dict[str, Any]) -> str:
    """The candidates side by side, results by tag, attribution, and the paired comparisons."""
    models = doc["models"]
    width = max(12, *(len(m["model"]) for m in models))
    lines = [f"suite {doc['suite']['path']}: {doc['suite']['tasks']} tasks "
             f"({', '.join(f'{k} {v}' for k, v in doc['suite']['tags'].items())})", ""]
    lines.append(f"{'model':<{width}}  {'success':>15}  {'95% CI':>13}  {'tok/succ':>9}  {'tok/step':>8}  "
                 f"{'p50 s':>6}  {'p95 s':>6}  {'cost/succ':>9}  {'budget out':>10}")
    for m in models:
        ci = m["success_ci95"]
        lines.append(f"{m['model']:<{width}}  {m['successes']:>4}/{m['tasks']:<4} {_pct(m['success_rate']):>6}  "
                     f"{(_pct(ci[0]) + '-' + _pct(ci[1])) if ci else '-':>13}  {_num(m['tokens_per_success']):>9}  "
                     f"{_num(m['tokens_per_step']):>8}  {_num(m['latency_p50_s'], 2):>6}  "
                     f"{_num(m['latency_p95_s'], 2):>6}  {_num(m['cost_per_success'], 4):>9}  "
                     f"{m['budget_exhausted']:>10}")
    tags = list(doc["summary"]["by_tag"])
    lines += ["", "success by tag:", f"{'model':<{width}}  " + "  ".join(f"{t:>14}" for t in tags)]
    for m in models:
        cells = [f"{m['by_tag'][t]['successes']}/{m['by_tag'][t]['tasks']} {_pct(m['by_tag'][t]['success_rate'])}"
                 if t in m["by_tag"] else "-" for t in tags]
        lines.append(f"{m['model']:<{width}}  " + "  ".join(f"{c:>14}" for c in cells))
    lines += ["", "failures (engineering = its evidence was confirmed: the re-run with the limit lifted succeeded):"]
    for m in models:
        a = m["attribution"]
        kinds = ", ".join(f"{k} {v['confirmed']}/{v['seen']}" for k, v in a["by_evidence"].items()) or "none"
        lines.append(f"{m['model']:<{width}}  {a['failures']} failed: {a['engineering']} engineering, "
                     f"{a['capability']} capability; re-run {a['tested']}, flipped {a['flipped']} "
                     f"(flip rate {_pct(a['flip_rate'])}); evidence confirmed/seen: {kinds}")
    for c in doc["summary"]["comparisons"]:
        lines += ["", f"{c['a']} vs {c['b']} on {c['tasks']} tasks: both {c['both']}, only {c['a']} "
                      f"{c['only_a']}, only {c['b']} {c['only_b']}, neither {c['neither']}; "
                      f"exact McNemar p = {c['p_value']:.3g}"]
    return "\n".join(lines)
