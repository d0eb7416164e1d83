"""`polyrl train [RUN.yaml] [--run-dir DIR]` and `polyrl train --resume RUN_DIR`.

With no run file, the built-in quickstart (polyrl/configs/quickstart.yaml). The loop
itself is polyrl/train/loop.py. Exit status: 0 trained, 2 the run file or run directory
cannot be used (the message names the file, line and field).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_file", nargs="?", help="YAML run file (default: the built-in quickstart)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR (uses its config.yaml)")
    p.add_argument("--run-dir", help="where to write the run (default: run_dir from the file, else runs/<name>-<time>)")


def main(args: argparse.Namespace) -> int:
    from polyrl.config import ConfigError, default_config, load_config

    try:
        if args.resume:
            if args.run_file:
                print("polyrl train: give either a run file or --resume RUN_DIR, not both", file=sys.stderr)
                return 2
            run_dir = Path(args.resume)
            if not (run_dir / "state" / "state.pt").exists():
                print(f"polyrl train: {run_dir} holds no resumable run (no state/state.pt)", file=sys.stderr)
                return 2
            cfg = load_config(run_dir / "config.yaml")
        else:
            cfg = load_config(args.run_file) if args.run_file else default_config()
            stamp = time.strftime("%Y%m%d-%H%M%S")
            run_dir = Path(args.run_dir or cfg.run_dir or f"runs/{cfg.name or 'run'}-{stamp}")
    except ConfigError as err:
        print(f"polyrl train: invalid run file\n{err}", file=sys.stderr)
        return 2

    from polyrl.train.loop import train

    train(cfg, run_dir, resume=bool(args.resume))
    return 0
