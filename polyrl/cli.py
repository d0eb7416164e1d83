"""`polyrl` command line: one subcommand per module of polyrl/commands/.

  polyrl train [RUN.yaml] [--run-dir DIR]   train; no file = the built-in quickstart
  polyrl train --resume RUN_DIR             continue a stopped run where it stopped
  polyrl score PACK.jsonl --completions C.jsonl [--json]
  polyrl audit PACK.jsonl [--policy MODEL] [--json] | --domain NAME [--n N]   audit a task set before training
  polyrl pack NAME [-o OUT.jsonl]           write a built-in task set (humaneval, code, math) as a pack
  polyrl replay RUN_DIR [ID] [--list]       re-run a recorded code execution and compare its verdict
  polyrl agent [PACK.jsonl] [--model M | --openai-base-url URL] [--budget N]   run agent tasks, live view
  polyrl obs RUN_DIR [--phase train|eval|all] [--json] [--price-input P ...]  per-call figures of a run
  polyrl report RUN_DIR|EVAL_DIR [-o FILE.html]   one self-contained HTML page with plots
  polyrl eval SUITE --model A [--model B ...] [-o DIR] [--json]            compare models on a suite, failures attributed
  polyrl suite example -o FILE              write an example suite of 104 business-shaped tagged tasks
  polyrl serve [MODEL] [--host H] [--port P] [--tiers standard,fast]        OpenAI-compatible server
  polyrl context extend MODEL -o DIR --factor F | eval --model M [--lengths ...]   longer windows, measured

One error path for every command (`run_command`): a user's mistake prints one line to stderr
and exits 2 (argparse errors too, and any exception whose class sets `exit_code`, such as
ConfigError or RunDirError); an internal error prints one line saying where its full
traceback was written (the command's `crash_dir` when it set one, else the temp directory)
and exits 1; Ctrl-C prints one line and exits 130; a closed stdout (`| head`) exits quietly.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

COMMANDS = {
    "train": "train with GRPO (no file: the built-in quickstart)",
    "score": "score completions of a task pack, no model needed",
    "audit": "prove a task set solvable and its reward sound",
    "pack": "write a built-in task set as a JSONL task pack",
    "replay": "re-run a recorded code execution and compare its verdict",
    "agent": "run agent tasks against a model, with a live view",
    "obs": "token, cache, tool and budget figures of a run",
    "report": "an HTML report with plots of a run or an evaluation",
    "eval": "compare models on a task suite, each failure attributed",
    "suite": "write an example evaluation suite",
    "serve": "serve a model over an OpenAI-compatible API, standard and fast tiers",
    "context": "extend a model's context window, and measure its effective length",
}


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors in one line (subcommand parsers are of this class too)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="polyrl", description="Multi-domain RL with verifiable rewards.")
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {name: importlib.import_module(f"polyrl.commands.{name}") for name in COMMANDS}
    for name, module in modules.items():
        module.add_arguments(sub.add_parser(name, help=COMMANDS[name]))
    args = parser.parse_args(argv)
    return run_command(f"polyrl {args.command}", lambda: modules[args.command].main(args), args)


def run_command(prog: str, command: Callable[[], int], args: argparse.Namespace | None = None) -> int:
    """Run one command; every way it can fail becomes a line on stderr and an exit status."""
    try:
        return command()
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed early (`polyrl ... | head`): nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as err:  # noqa: BLE001 -- the one place errors become exit statuses
        code = getattr(type(err), "exit_code", None)
        if isinstance(code, int):
            print(f"{prog}: {err}", file=sys.stderr)
            return code
        if _disk_full(err):
            print(f"{prog}: disk full ({err}); free some space and run it again", file=sys.stderr)
            return 1
        where = _write_traceback(prog, getattr(args, "crash_dir", None))
        first = (str(err).strip().splitlines() or [""])[0][:200]
        print(f"{prog}: internal error: {type(err).__name__}: {first}; the full traceback is in {where}",
              file=sys.stderr)
        return 1


def _disk_full(err: BaseException) -> bool:
    return (isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)) or "disk is full" in str(err)


def _write_traceback(prog: str, crash_dir: str | Path | None) -> str:
    """Write the current exception's traceback to a file and return its path (or say why not)."""
    text = f"{prog} (pid {os.getpid()}, {time.strftime('%Y-%m-%d %H:%M:%S')})\n" + traceback.format_exc()
    name = f"polyrl-crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
    for folder in ([Path(crash_dir)] if crash_dir else []) + [Path(tempfile.gettempdir())]:
        try:
            if folder.is_dir():
                (folder / name).write_text(text)
                return str(folder / name)
        except OSError:
            continue
    sys.stderr.write(text)
    return "the text above (no folder could hold it)"


if __name__ == "__main__":
    sys.exit(main())
