"""`polyrl train [RUN.yaml] [--run-dir DIR] [--ray [ADDRESS]] [--nproc N]` and `polyrl train --resume RUN_DIR`.

With no run file, the built-in quickstart (polyrl/configs/quickstart.yaml). The loop
itself is polyrl/train/loop.py. At the end it writes the run's report, RUN_DIR/report.html
(`polyrl report`), and prints its path; a report that cannot be written is a warning.
`--otel-endpoint URL` also exports the run's observability records as OTLP/HTTP spans.
Exit status: 0 trained (or the resumed run had already finished: nothing is repeated), 2 the
run file or run directory cannot be used (the message names the file, line and field, or says
what to do with the directory), 1 the disk filled up (the run stopped after its last whole
step: free space and `--resume`), 130 Ctrl-C (the same: `--resume` continues it). Any other
failure writes its traceback into the run directory.

`--nproc N` trains on N processes: the command runs itself again N times with the
environment torchrun sets (train/launch.py), and the trainer's ranks share each update
(train/ranks.py). Under a launcher (RANK set: this one, or `torchrun --nproc-per-node N -m
polyrl.cli train ...`) every rank runs this same command; only rank 0 checks and writes the
run directory and its report, and its exit status is the command's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from polyrl.train.launch import run_ranks


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_file", nargs="?", help="YAML run file (default: the built-in quickstart)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR (uses its config.yaml)")
    p.add_argument("--run-dir", help="where to write the run (default: run_dir from the file, else runs/<name>-<time>)")
    p.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                   help="run the rollout and reward roles as Ray actors (cluster.backend: ray); ADDRESS joins a "
                        "running cluster ('auto', 'ray://host:10001'), none starts a local one")
    p.add_argument("--otel-endpoint", metavar="URL", help="also export every model call, tool call and verdict, "
                                                          "training and evaluation, as OTLP/HTTP spans (polyrl[otel])")
    p.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="trainer processes sharing each update (FSDP over torch.distributed: gloo on CPU, one GPU "
                        "each on CUDA); rank 0 also runs the rollout and writes the run")


def main(args: argparse.Namespace) -> int:
    from polyrl.config import ConfigError, default_config, load_config
    from polyrl.train.run_dir import RunDir, RunDirError, is_disk_full

    if args.nproc < 1:
        print(f"polyrl train: --nproc {args.nproc}: give at least 1", file=sys.stderr)
        return 2
    if args.nproc > 1 and "RANK" not in os.environ:
        return _launch(args)
    if int(os.environ.get("RANK", "0")) > 0:
        return _follow(args)
    try:
        if args.resume:
            if args.run_file:
                print("polyrl train: give either a run file or --resume RUN_DIR, not both", file=sys.stderr)
                return 2
            run_dir = Path(args.resume)
            if not run_dir.is_dir():
                what = "is a file, not a run directory" if run_dir.exists() else "does not exist"
                print(f"polyrl train: --resume {run_dir} {what}", file=sys.stderr)
                return 2
            rd = RunDir(run_dir)
            if not rd.state.exists():
                print(f"polyrl train: {run_dir} holds no resumable run (no state/state.pt)", file=sys.stderr)
                return 2
            if rd.finished():
                print(f"polyrl train: {run_dir} already finished (eval/after.json and checkpoints/final are "
                      "written); nothing to resume", file=sys.stderr)
                return 0
            cfg = load_config(rd.config, ray=args.ray)
            rd.lock()  # fails fast when another process is writing the run; train() takes it again
            rd.close()
        else:
            cfg = load_config(args.run_file, ray=args.ray) if args.run_file else default_config(ray=args.ray)
            stamp = time.strftime("%Y%m%d-%H%M%S")
            run_dir = Path(args.run_dir or cfg.run_dir or f"runs/{cfg.name or 'run'}-{stamp}")
            if run_dir.exists() and not run_dir.is_dir():
                print(f"polyrl train: run directory {run_dir} is a file, not a directory", file=sys.stderr)
                return 2
            if RunDir(run_dir).state.exists():
                print(f"polyrl train: {run_dir} already holds a run; continue it with "
                      f"`polyrl train --resume {run_dir}` or choose another --run-dir", file=sys.stderr)
                return 2
    except ConfigError as err:
        print(f"polyrl train: invalid run file\n{err}", file=sys.stderr)
        return 2
    except RunDirError as err:
        print(f"polyrl train: {err}", file=sys.stderr)
        return err.exit_code

    from polyrl.train.loop import train

    export = None
    if getattr(args, "otel_endpoint", None):
        from polyrl.obs.otel import otlp_recorder

        try:
            export = otlp_recorder(args.otel_endpoint)
        except ImportError as err:
            print(f"polyrl train: --otel-endpoint: {err}", file=sys.stderr)
            return 2
    args.crash_dir = run_dir  # where cli.py writes the traceback of an internal error
    try:
        train(cfg, run_dir, resume=bool(args.resume), export=export)
    except KeyboardInterrupt:
        print(f"\npolyrl train: interrupted; the run keeps its last whole step: continue it with "
              f"`polyrl train --resume {run_dir}`", file=sys.stderr)
        return 130
    except RunDirError as err:
        print(f"polyrl train: {err}", file=sys.stderr)
        return err.exit_code
    except Exception as err:  # noqa: BLE001 -- a full disk outside the run directory's own writes (a checkpoint)
        if not is_disk_full(err):
            raise
        print(f"polyrl train: disk full ({err}); the run keeps its last whole step: free some space and continue "
              f"it with `polyrl train --resume {run_dir}`", file=sys.stderr)
        return 1
    write_report(run_dir)
    return 0


def _launch(args: argparse.Namespace) -> int:
    """This command again on args.nproc processes (train/launch.py); rank 0's exit status."""
    run_dir = args.resume or args.run_dir
    if not args.resume and not run_dir:  # one name for every rank (rank 0 alone writes it)
        from polyrl.config import ConfigError, default_config, load_config

        try:
            cfg = load_config(args.run_file, ray=args.ray) if args.run_file else default_config(ray=args.ray)
        except ConfigError as err:
            print(f"polyrl train: invalid run file\n{err}", file=sys.stderr)
            return 2
        run_dir = cfg.run_dir or f"runs/{cfg.name or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}"
    command = [sys.executable, "-m", "polyrl.cli", "train"]
    command += ["--resume", str(args.resume)] if args.resume else [*([args.run_file] if args.run_file else []),
                                                                     "--run-dir", str(run_dir)]
    command += ["--ray", args.ray] if args.ray is not None else []
    command += ["--otel-endpoint", args.otel_endpoint] if getattr(args, "otel_endpoint", None) else []
    return run_ranks(command, args.nproc)


def _follow(args: argparse.Namespace) -> int:
    """A rank > 0 under a launcher: the run's config, then the collectives rank 0 names."""
    from polyrl.config import default_config, load_config
    from polyrl.train.loop import train
    from polyrl.train.run_dir import RunDir

    if args.resume:
        rd = RunDir(Path(args.resume))
        if rd.finished():  # rank 0 says so and trains nothing: no collective to wait for
            return 0
        cfg = load_config(rd.config, ray=args.ray)
    else:
        cfg = load_config(args.run_file, ray=args.ray) if args.run_file else default_config(ray=args.ray)
    train(cfg, Path(args.resume or args.run_dir or "."), resume=bool(args.resume))
    return 0


def write_report(run_dir: Path) -> None:
    """Write RUN_DIR/report.html (`polyrl report`) and print its path; a failure is a warning."""
    try:
        from polyrl.report.build import write_report as build

        print(f"report: {build(run_dir)}")
    except Exception as err:  # noqa: BLE001 -- the run itself succeeded; its report is a by-product
        print(f"polyrl train: warning: the report was not written ({type(err).__name__}: {err}); "
              f"try `polyrl report {run_dir}`", file=sys.stderr)
