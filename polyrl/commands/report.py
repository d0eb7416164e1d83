"""`polyrl report RUN_DIR|EVAL_DIR [-o FILE.html]`: the HTML report of a run or an evaluation.

One self-contained page (inline SVG plots, inline CSS, no script, nothing fetched), written
to RUN_DIR/report.html unless -o says elsewhere; the page's path is printed. A training run
gets its reward and held-out curves, curriculum shares with their reasons, KL per domain,
step-time split, throughput and budget use; an evaluation its side-by-side table,
attribution by tag and a per-task drill-down. What each page holds is polyrl/report/.
Exit status: 0 written, 2 the directory is neither a run nor an evaluation (one line).
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="RUN_DIR|EVAL_DIR",
                        help="a run directory (metrics.jsonl) or an evaluation directory (results.json)")
    parser.add_argument("-o", "--output", metavar="FILE.html", help="where to write the page (default: DIR/report.html)")


def main(args: argparse.Namespace) -> int:
    from polyrl.report.build import NotAReportDir, write_report
    from polyrl.report.eval_data import EvalDirError

    try:
        path = write_report(args.dir, args.output)
    except (NotAReportDir, EvalDirError) as err:
        print(f"polyrl report: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0
