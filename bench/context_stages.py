"""Staged context extension against one jump and against scaling alone, on one token budget.

    PYTHONPATH=. .venv/bin/python bench/context_stages.py --tokens 2000000 --seeds 0 1 2
    PYTHONPATH=. .venv/bin/python bench/context_stages.py --kinds variable_tracking --split 5,1,2 ...
    PYTHONPATH=. .venv/bin/python bench/context_stages.py --kinds consistency --level 0 ...

Arms (every trained arm gets the same number of training tokens, documents of the
long-context domain's train split; see polyrl/train/context_stages.py):
- staged: 512 tokens with the original positions, then 2,048 with YaRN x4, then 8,192 with
  YaRN x16, in eighths of the budget given by `--split` (default 2,1,5: a task the model
  learns quickly, such as retrieval, spends most at the final length; one it learns slowly,
  such as variable tracking, needs most at 512 first);
- jump: 8,192 with YaRN x16 from the start (the whole budget);
- short+scale: the whole budget at 512 with the original positions, then YaRN x16 applied
  with no further training (the task learnt short, the window stretched);
- scale only: the built-in model with YaRN x16 and no training.
A length trains with the same step (2,048 / 4,096 / 16,384 tokens) and learning rate (1e-3 /
1e-3 / 5e-4) in every arm. Every arm ends with YaRN x16 (a window of 8,192) and is scored on the same held-out
questions at 512 to 8,192 tokens: teacher-forced greedy answer accuracy and the answer's
negative log-likelihood per token (polyrl/evals/answer_accuracy.py). Medians over seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from polyrl.models.hf_io import load_pretrained
from polyrl.models.loading import resolve_model_dir
from polyrl.models.tokenizer import Tokenizer
from polyrl.train.context_schedule import EvalSpec, Schedule, Stage
from polyrl.train.context_stages import apply_config, evaluate, stage_config, train_stages

FINAL = Stage(max_length=8192, rope="yarn", factor=16, tokens=1)


def arms(tokens: int, split: tuple[int, int, int] = (2, 1, 5)) -> dict[str, list[Stage]]:
    """The arms' stages; a length trains with the same step size and learning rate in every arm.
    `split`: the staged arm's eighths of the budget at 512, 2,048 and 8,192 tokens."""
    if len(split) != 3 or sum(split) != 8 or min(split) < 1:
        raise ValueError(f"--split takes three positive eighths that sum to 8, got {split}")

    def at(length: int, share: int, rope: str = "yarn") -> Stage:
        batch, lr = {512: (2048, 1e-3), 2048: (4096, 1e-3), 8192: (16384, 5e-4)}[length]
        return Stage(max_length=length, rope=rope, factor=None if rope == "none" else length / 512,
                     tokens=tokens * share // 8, batch_tokens=batch, lr=lr)

    return {
        "staged": [at(512, split[0], "none"), at(2048, split[1]), at(8192, split[2])],
        "jump": [at(8192, 8)],
        "short+scale": [at(512, 8, "none")],
        "scale only": [],
    }


def run_arm(name: str, stages: list[Stage], base: dict, seed: int, work: Path) -> dict:
    start = time.perf_counter()
    model_dir = resolve_model_dir("builtin:tiny")
    original = json.loads((model_dir / "config.json").read_text())
    schedule = Schedule(**{**base, "seed": seed, "stages": stages or [FINAL]})
    if stages:
        out = work / f"{name.replace(' ', '_').replace('+', '_')}-{seed}"
        train_stages(schedule, out, log=lambda m: None)
        model, _ = load_pretrained(out / "final")
    else:
        model, _ = load_pretrained(model_dir)
    apply_config(model, stage_config(original, FINAL))  # every arm is scored with YaRN x16
    model.eval()
    result = evaluate(model, Tokenizer.from_dir(model_dir), schedule)
    return {"arm": name, "seed": seed, "seconds": round(time.perf_counter() - start, 1), **result}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=2_000_000, help="training tokens of every trained arm")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--kinds", default="needle")
    p.add_argument("--level", type=int, default=1, choices=[0, 1, 2, 3, 4],
                   help="difficulty level of training and held-out questions (0: the warm-up)")
    p.add_argument("--lengths", default="512,1024,2048,4096,8192")
    p.add_argument("--per-length", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--arms", default="staged,jump,short+scale,scale only")
    p.add_argument("--split", default="2,1,5", help="the staged arm's eighths of the budget at 512, 2,048, 8,192")
    p.add_argument("-o", "--out", help="write every record to this JSON file")
    args = p.parse_args()
    lengths = tuple(int(x) for x in args.lengths.split(","))
    base = {"kinds": tuple(args.kinds.split(",")), "level": args.level, "lr": args.lr, "batch_tokens": args.batch_tokens,
            "eval": EvalSpec(lengths=lengths, per_length=args.per_length)}
    split = tuple(int(x) for x in args.split.split(","))
    chosen = {k: v for k, v in arms(args.tokens, split).items() if k in args.arms.split(",")}  # type: ignore[arg-type]
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:  # arms interleaved within each seed
            for name, stages in chosen.items():
                record = run_arm(name, stages, base, seed, Path(tmp))
                records.append(record)
                print(json.dumps({k: record[k] for k in ("arm", "seed", "seconds")}),
                      {n: (c["accuracy"], c["answer_nll"]) for n, c in record["lengths"].items()}, flush=True)
                if args.out:  # after every arm, so a run cut short keeps what it measured
                    Path(args.out).write_text(json.dumps(records, indent=1))
    print(f"\n{args.tokens:,} training tokens per trained arm (staged: eighths {args.split}); kinds {args.kinds} "
          f"at level {args.level}; "
          f"{args.per_length} held-out "
          f"questions per length; seeds {args.seeds}; medians over seeds; every arm scored with YaRN x16")
    print("answer accuracy (%)")
    print(f"{'arm':<12}" + "".join(f"{n:>8}" for n in lengths) + f"{'seconds':>10}")
    for name in chosen:
        rows = [r for r in records if r["arm"] == name]
        acc = [statistics.median(100 * r["lengths"][str(n)]["accuracy"] for r in rows) for n in lengths]
        secs = statistics.median(r["seconds"] for r in rows)
        print(f"{name:<12}" + "".join(f"{a:>8.1f}" for a in acc) + f"{secs:>10.0f}")
    print("answer NLL (nats per token)")
    for name in chosen:
        rows = [r for r in records if r["arm"] == name]
        nll = [statistics.median(r["lengths"][str(n)]["answer_nll"] for r in rows) for n in lengths]
        print(f"{name:<12}" + "".join(f"{x:>8.3f}" for x in nll))


if __name__ == "__main__":
    main()
