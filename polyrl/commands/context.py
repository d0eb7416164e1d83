"""`polyrl context extend|train|eval`: give a model a longer window, and measure how far it reads.

    polyrl context extend builtin:tiny -o models/tiny-8k --rope yarn --factor 16
    polyrl context train [SCHEDULE.yaml] -o runs/tiny-8k [--resume]
    polyrl context eval --model builtin:tiny --model models/tiny-8k --lengths 256,512,1024,2048

`extend` writes a copy of a model directory with RoPE scaling and factor x its window
(polyrl/models/context_extension.py): untrained, it is the "scaling alone" baseline; a run
file whose model.path names it fine-tunes it at the longer length.

`train` runs a schedule of context stages (polyrl/train/context_schedule.py; without a
file, the built-in polyrl/configs/context_stages.yaml takes the built-in model from 512 to
8,192 tokens): each stage's RoPE scaling, fine-tuning on packed long-dependency documents,
and after each stage the model saved (DIR/stage-K, DIR/final) and scored on held-out
questions at each length (teacher-forced greedy answer accuracy). `--resume` goes on from
the last saved stage.

`eval` asks the long-context domain's held-out questions (multi-hop variable tracking,
multi-key retrieval, consistency, aggregation, code questions) and a single-needle
retrieval control at each length, and prints accuracy per kind and length and the
effective length: the longest length at which accuracy stays at or above 80% of the
model's own at the shortest (polyrl/evals/context_sweep.py). A model is what `polyrl eval`
takes: builtin:NAME, a Hugging Face directory, a run directory, or openai:BASE_URL#MODEL
(lengths measured with --tokenizer for an endpoint). `--json` prints one document;
`-o FILE` writes it too.

Exit status 0 when it ran, 2 with one line when a model, a length or the output cannot be used.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from polyrl.commands import at_least


class ContextError(ValueError):
    exit_code = 2


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    ext = sub.add_parser("extend", help="write a copy of a model with RoPE scaling and a longer window")
    ext.add_argument("model", help="builtin:tiny or a Hugging Face model directory")
    ext.add_argument("-o", "--out", required=True, metavar="DIR", help="the new model directory (must not exist)")
    ext.add_argument("--rope", default="yarn", choices=["linear", "dynamic", "yarn", "llama3"],
                     help="RoPE scaling type (default yarn)")
    ext.add_argument("--factor", type=float, required=True, help="how many times the original window")
    tr = sub.add_parser("train", help="staged context extension: train through a schedule of longer windows")
    tr.add_argument("schedule", nargs="?", help="schedule file (default: the built-in 512 -> 8,192 schedule)")
    tr.add_argument("-o", "--out", required=True, metavar="DIR", help="run directory (stage-K/, final/, *.jsonl)")
    tr.add_argument("--resume", action="store_true", help="go on in an existing run directory")
    tr.add_argument("--quiet", action="store_true", help="no progress bar")
    ev = sub.add_parser("eval", help="accuracy per kind and length, and the effective length")
    ev.add_argument("--model", action="append", required=True, metavar="MODEL",
                    help="builtin:tiny, a Hugging Face dir, a run dir, or openai:BASE_URL#MODEL (repeatable)")
    ev.add_argument("--lengths", default="256,512,1024,2048,4096,8192,16384",
                    help="prompt lengths in the model's tokens, comma-separated (default 256 to 16384)")
    ev.add_argument("--per-cell", type=at_least(1), default=8, metavar="N", help="questions per kind and length")
    ev.add_argument("--kinds", help="comma-separated kinds (default: every kind and the needle control)")
    ev.add_argument("--level", type=int, default=1, choices=[0, 1, 2, 3, 4],
                    help="difficulty level (default 1; 0 is the warm-up)")
    ev.add_argument("--max-tokens", type=at_least(1), default=32, help="completion tokens per answer")
    ev.add_argument("--tokenizer", default="builtin:tiny",
                    help="tokenizer that measures lengths for openai: models (local models use their own)")
    ev.add_argument("--json", action="store_true", help="print the results document instead of the tables")
    ev.add_argument("-o", "--out", metavar="FILE", help="also write the results document to FILE")
    ev.add_argument("--quiet", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    return {"extend": _extend, "train": _train, "eval": _eval}[args.action](args)


def _extend(args: argparse.Namespace) -> int:
    from polyrl.models.context_extension import extend_context
    from polyrl.models.loading import resolve_model_dir

    try:
        src = resolve_model_dir(args.model, log=lambda m: print(m, file=sys.stderr))
        out = extend_context(src, args.out, args.rope, args.factor)
    except (FileNotFoundError, ValueError) as err:
        raise ContextError(f"extend: {err}") from None
    window = json.loads((out / "config.json").read_text())["max_position_embeddings"]
    print(f"wrote {out}: {args.model} with {args.rope} RoPE scaling x{args.factor:g}, window {window} tokens")
    return 0


def _train(args: argparse.Namespace) -> int:
    from importlib.resources import as_file, files
    from pathlib import Path

    from polyrl.train.context_schedule import ScheduleError, load_schedule
    from polyrl.train.context_stages import train_stages

    try:
        if args.schedule:
            schedule = load_schedule(args.schedule)
        else:
            with as_file(files("polyrl") / "configs" / "context_stages.yaml") as path:
                schedule = load_schedule(path)
    except ScheduleError as err:
        raise ContextError(f"train: {err}") from None
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ContextError(f"train: {out} is a file, not a run directory")
    if out.is_dir() and any(out.iterdir()) and not args.resume:
        raise ContextError(f"train: {out} exists; pass --resume to go on in it, or choose another -o")
    log = lambda message: print(message, file=sys.stderr)  # noqa: E731
    try:
        records = train_stages(schedule, out, log=log, progress=None if args.quiet else _bar("context train"))
    except (FileNotFoundError, ValueError) as err:
        raise ContextError(f"train: {err}") from None
    lengths = list(records[-1]["lengths"])
    print(f"\nanswer accuracy (%) after each stage, by length in tokens (teacher-forced greedy; {out}/eval.jsonl)")
    print(f"{'stage':<24}" + "".join(f"{n:>8}" for n in lengths))
    for r in records:
        label = f"{r['stage']}: {r['max_length']} {r['rope']}" + (f" x{r['factor']:g}" if r["factor"] else "")
        print(f"{label:<24}" + "".join(f"{_pct(r['lengths'][n]):>8}" for n in lengths))
    print(f"model: {out}/final")
    return 0


def _pct(cell: dict) -> str:
    return "-" if cell["accuracy"] is None else f"{100 * cell['accuracy']:.0f}"


def _lengths(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ContextError(f"eval: --lengths must be integers separated by commas, got {text!r}") from None


def _eval(args: argparse.Namespace) -> int:
    from polyrl.domains.longctx import LongContextDomain
    from polyrl.evals.context_sweep import SWEEP_KINDS, run_sweep, sweep_tasks
    from polyrl.evals.limits import EvalLimits
    from polyrl.evals.models import ModelError, load_model

    lengths = _lengths(args.lengths)
    kinds = tuple(args.kinds.split(",")) if args.kinds else SWEEP_KINDS
    try:
        LongContextDomain(kinds=kinds)  # the kinds' one-line error, before any model loads
    except ValueError as err:
        raise ContextError(f"eval: {err}") from None
    limits = EvalLimits(max_tokens=args.max_tokens)
    results = []
    for spec in dict.fromkeys(args.model):
        try:
            adapter = load_model(spec)
        except ModelError as err:
            raise ContextError(f"eval: {err}") from None
        try:
            tokenizer = getattr(adapter, "_tokenizer", None) or args.tokenizer
            try:
                cells = sweep_tasks(tokenizer, lengths, args.per_cell, kinds, args.level)
            except ValueError as err:
                raise ContextError(f"eval: {err}") from None
            results.append(run_sweep(adapter, cells, limits, None if args.quiet else _bar(spec)))
        finally:
            adapter.close()
    doc = {"lengths": lengths, "level": args.level, "per_cell": args.per_cell, "max_tokens": args.max_tokens,
           "models": results}
    if args.out:
        try:
            with open(args.out, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=1)
        except OSError as err:
            raise ContextError(f"eval: cannot write {args.out}: {err.strerror or err}") from None
    if args.json:
        print(json.dumps(doc))
    else:
        for result in results:
            _print_table(result)
    return 0


def _bar(spec: str):
    from tqdm import tqdm

    state: dict[str, Any] = {}

    def progress(done: int, total: int, label: str) -> None:
        if "bar" not in state:
            state["bar"] = tqdm(total=total, desc=spec, file=sys.stderr, leave=False)
        state["bar"].update(done - state["bar"].n)  # done: tasks asked, or tokens trained
        state["bar"].set_postfix_str(label.removeprefix(spec).strip())
        if done >= total:
            state["bar"].close()

    return progress


def _print_table(result: dict[str, Any]) -> None:
    lengths = result["lengths"]
    print(f"\n{result['model']}: accuracy (%) by kind and prompt length in tokens")
    print(f"{'kind':<20}" + "".join(f"{n:>8}" for n in lengths) + "   effective")
    for kind in result["kinds"]:
        row = result["accuracy"][kind]
        cells = "".join(f"{'-' if row[str(n)] is None else round(100 * row[str(n)]['accuracy']):>8}" for n in lengths)
        print(f"{kind:<20}{cells}   {result['effective_length_by_kind'][kind] or '-'}")
    overall = "".join(f"{'-' if result['overall'][str(n)] is None else round(100 * result['overall'][str(n)]):>8}"
                      for n in lengths)
    print(f"{'all (common kinds)':<20}{overall}   {result['effective_length'] or '-'}")
    overflow = sum(c["overflow"] for row in result["accuracy"].values() for c in row.values() if c)
    print(f"effective length: {result['effective_length'] or 'none (0% at the shortest length)'} "
          f"(accuracy >= {result['ratio']:.0%} of the shortest length's); '-' = the kind does not fit; "
          f"{overflow} prompts longer than the model's window counted as failures")
