"""`polyrl` command line.

  polyrl train [RUN.yaml] [--run-dir DIR]   train; no file = the built-in quickstart
  polyrl train --resume RUN_DIR             continue a stopped run where it stopped
  polyrl score PACK.jsonl --completions C.jsonl [--json]
  polyrl audit PACK.jsonl [--policy MODEL] [--json] | --domain NAME [--n N]   audit a task set before training
  polyrl pack NAME [-o OUT.jsonl]           write a built-in task set (humaneval, code, math) as a pack
  polyrl replay RUN_DIR [ID] [--list]       re-run a recorded code execution and compare its verdict
  polyrl agent [PACK.jsonl] [--model M | --openai-base-url URL] [--budget N]   run agent tasks, live view
  polyrl obs RUN_DIR [--json] [--price-input P --price-output P]             per-call figures of a run
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_file", nargs="?", help="YAML run file (default: the built-in quickstart)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR (uses its config.yaml)")
    p.add_argument("--run-dir", help="where to write the run (default: run_dir from the file, else runs/<name>-<time>)")


def train_main(args: argparse.Namespace) -> int:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="polyrl", description="Multi-domain RL with verifiable rewards.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_arguments(sub.add_parser("train", help="train with GRPO (no file: the built-in quickstart)"))

    from polyrl import audit_cli, pack_cli, replay, score
    from polyrl.agent import cli as agent_cli
    from polyrl.obs import report as obs_report

    commands = {"score": score, "pack": pack_cli, "replay": replay, "agent": agent_cli, "obs": obs_report,
                "audit": audit_cli}
    score.add_arguments(sub.add_parser("score", help="score completions of a task pack, no model needed"))
    audit_cli.add_arguments(sub.add_parser("audit", help="prove a task set solvable and its reward sound"))
    pack_cli.add_arguments(sub.add_parser("pack", help="write a built-in task set as a JSONL task pack"))
    replay.add_arguments(sub.add_parser("replay", help="re-run a recorded code execution and compare its verdict"))
    agent_cli.add_arguments(sub.add_parser("agent", help="run agent tasks against a model, with a live view"))
    obs_report.add_arguments(sub.add_parser("obs", help="token, cache, tool and budget figures of a run"))
    args = parser.parse_args(argv)
    if args.command == "train":
        return train_main(args)
    return commands[args.command].main(args)


if __name__ == "__main__":
    sys.exit(main())
