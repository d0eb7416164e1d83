"""`polyrl obs RUN_DIR [--phase train|eval|all] [--json] [--price-input P --price-output P]`:
per-call figures of a run.

A training run's records carry their phase: "train" (the rollouts the policy learns from)
and "eval" (held-out evaluations). By default each phase is reported apart, training
first; `--phase` picks one (`all` pools every record). `--json` prints one document: the
figures of the records asked for, and, by default, a "phases" object with each phase's.
`--otel-endpoint URL` also sends the records asked for as OTLP/HTTP spans (polyrl[otel]).
The figures and what they mean are polyrl/obs/report.py; this is the command line.
Exit status: 0 printed, 2 no observability records at that path (or not a readable store).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from polyrl.commands import non_negative_number
from polyrl.obs.report import Prices, build_report, format_report
from polyrl.obs.store import ObsStoreError, read_phases

TITLES = {"train": "training rollouts (phase train)", "eval": "evaluation (phase eval)",
          "": "records without a phase (polyrl agent)"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="run directory holding obs.sqlite (or the .sqlite file itself)")
    parser.add_argument("--phase", choices=("train", "eval", "all"),
                        help="only training or evaluation records, or all pooled (default: each phase apart)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON document")
    parser.add_argument("--otel-endpoint", metavar="URL",
                        help="also export the records as OTLP/HTTP spans, e.g. http://localhost:4318/v1/traces")
    parser.add_argument("--price-input", type=non_negative_number, help="price per million input tokens (uncached)")
    parser.add_argument("--price-cached", type=non_negative_number, help="price per million cache-read input tokens "
                                                           "(default: the input price)")
    parser.add_argument("--price-output", type=non_negative_number, help="price per million output tokens")


def main(args: argparse.Namespace) -> int:
    given = (args.price_input, args.price_cached, args.price_output)
    prices = None if all(p is None for p in given) else Prices(args.price_input or 0.0, args.price_output or 0.0,
                                                                args.price_cached)
    try:
        if args.otel_endpoint:
            exported = _export(args.run_dir, args.otel_endpoint, None if args.phase in (None, "all") else args.phase)
            print(f"polyrl obs: exported {exported} record(s) to {args.otel_endpoint}", file=sys.stderr)
        if args.phase is not None:
            rep = build_report(args.run_dir, prices, None if args.phase == "all" else args.phase)
            print(json.dumps(asdict(rep)) if args.json else format_report(rep))
            return 0
        phases = read_phases(args.run_dir)
        reports = {p: build_report(args.run_dir, prices, p) for p in phases}
        pooled = build_report(args.run_dir, prices) if args.json or len(phases) != 1 else None
    except (FileNotFoundError, ObsStoreError, ImportError) as exc:
        print(f"polyrl obs: {exc}", file=sys.stderr)
        return 2
    if args.json:
        assert pooled is not None
        print(json.dumps({**asdict(pooled), "phases": {p: asdict(r) for p, r in reports.items()}}))
    elif len(reports) <= 1 and "" in reports or not reports:  # no phases (polyrl agent): one report, as before
        print(format_report(reports.get("") or pooled))
    else:
        print("\n\n".join(f"== {TITLES.get(p, f'phase {p}')} ==\n{format_report(r)}" for p, r in reports.items()))
    return 0


def _export(path: str, endpoint: str, phase: str | None) -> int:
    from polyrl.obs.otel import export_store, flush, otlp_recorder

    recorder = otlp_recorder(endpoint)
    n = export_store(path, recorder, phase)
    flush(recorder)
    return n
