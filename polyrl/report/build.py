"""Which report a directory gets, and writing it.

    path = write_report(DIR)                 # DIR/report.html
    path = write_report(DIR, "out.html")

A directory holding metrics.jsonl is a training run (train/run_dir.py); one holding
results.json is an evaluation (`polyrl eval -o DIR`). Anything else is a NotAReportDir
(exit status 2) that says what was looked for. The page is written to a temporary file
and renamed over the target, so a reader never sees half a report.

Out of scope: what the pages say (run_page.py, eval_page.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from polyrl.report.eval_data import RESULTS, is_eval_dir, read_eval
from polyrl.report.run_data import METRICS, is_run_dir, read_run

FILENAME = "report.html"


class NotAReportDir(Exception):
    """A path that is neither a run directory nor an evaluation directory."""

    exit_code = 2


def render(path: str | Path) -> str:
    """The report page of the run or evaluation directory at `path`."""
    path = Path(path)
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is a file"
        raise NotAReportDir(f"{path} {what}; give a run directory (with {METRICS}) or an evaluation directory "
                            f"(with {RESULTS})")
    if is_run_dir(path):
        from polyrl.report.run_page import run_page

        return run_page(read_run(path))
    if is_eval_dir(path):
        from polyrl.report.eval_page import eval_page

        return eval_page(read_eval(path))
    raise NotAReportDir(f"{path} is neither a run directory (no {METRICS}) nor an evaluation directory "
                        f"(no {RESULTS})")


def write_report(path: str | Path, out: str | Path | None = None) -> Path:
    """Render the report of `path` and write it to `out` (default: path/report.html)."""
    text = render(path)
    target = Path(out) if out is not None else Path(path) / FILENAME
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target
