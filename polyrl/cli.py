"""`polyrl` command line: one subcommand per module of polyrl/commands/.

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
import importlib
import sys

COMMANDS = {
    "train": "train with GRPO (no file: the built-in quickstart)",
    "score": "score completions of a task pack, no model needed",
    "audit": "prove a task set solvable and its reward sound",
    "pack": "write a built-in task set as a JSONL task pack",
    "replay": "re-run a recorded code execution and compare its verdict",
    "agent": "run agent tasks against a model, with a live view",
    "obs": "token, cache, tool and budget figures of a run",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="polyrl", description="Multi-domain RL with verifiable rewards.")
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {name: importlib.import_module(f"polyrl.commands.{name}") for name in COMMANDS}
    for name, module in modules.items():
        module.add_arguments(sub.add_parser(name, help=COMMANDS[name]))
    args = parser.parse_args(argv)
    return modules[args.command].main(args)


if __name__ == "__main__":
    sys.exit(main())
