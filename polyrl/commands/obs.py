"""`polyrl obs RUN_DIR [--json] [--price-input P --price-output P]`: per-call figures of a run.

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
from polyrl.obs.store import ObsStoreError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="run directory holding obs.sqlite (or the .sqlite file itself)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON document")
    parser.add_argument("--price-input", type=non_negative_number, help="price per million input tokens (uncached)")
    parser.add_argument("--price-cached", type=non_negative_number, help="price per million cache-read input tokens "
                                                           "(default: the input price)")
    parser.add_argument("--price-output", type=non_negative_number, help="price per million output tokens")


def main(args: argparse.Namespace) -> int:
    given = (args.price_input, args.price_cached, args.price_output)
    prices = None if all(p is None for p in given) else Prices(args.price_input or 0.0, args.price_output or 0.0,
                                                                args.price_cached)
    try:
        rep = build_report(args.run_dir, prices)
    except (FileNotFoundError, ObsStoreError) as exc:
        print(f"polyrl obs: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(asdict(rep)) if args.json else format_report(rep))
    return 0
