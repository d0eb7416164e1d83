"""The first run's model builds, before and after their speed-ups, in one script.

    python bench/base_build.py [--steps 150] [--repeats 2]
    python bench/base_build.py --reward-models [--repeats 2]
    python bench/base_build.py --cold

The base model (default):
Each arm builds the built-in tiny model's recipe (polyrl/builtin/tiny.py) cut to `--steps`
optimizer steps, in a fresh process with an empty cache, and reads the SFT seconds from the
model card (`sft_seconds`: the optimizer steps only, without the data, tokenizer and
encoding). Arms, interleaved repeat by repeat:

- "before": rows of 512 tokens, float32 products (the recipe up to 2026-12-06);
- "rows 256": rows of 256 tokens, float32 products;
- "after": rows of 256 tokens, bfloat16 products where the CPU multiplies them natively (AMX or
  AVX512-BF16; today's recipe).

Every arm trains on the same demonstrations in the same order; only the row length and
the products' dtype differ. Seconds per step are projected to the full recipe's 1,000 steps.
Not covered: the data preparation (the same in every arm), other machines.

The reward models (--reward-models): the three members of the built-in ensemble
(polyrl/builtin/tiny_rm.py), built into an empty directory one after another in this
process ("before") and side by side, one process each ("after"); wall seconds, interleaved.
The members' weights are the same either way (tests/test_tiny_rm.py).

The first run (--cold): everything a first `polyrl train` builds before it trains, the base
model then the reward models, into an empty cache directory, once; wall seconds of each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, tempfile
from pathlib import Path
from polyrl.builtin.tiny import TinyRecipe, build_tiny_model
pack_length, bf16, steps = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
out = Path(tempfile.mkdtemp(prefix="polyrl-base-build-"))
build_tiny_model(TinyRecipe(steps=steps, pack_length=pack_length, bf16_products=bf16), out, log=lambda s: None)
card = json.loads((out / "polyrl_recipe.json").read_text())
print(json.dumps({"sft_seconds": card["sft_seconds"], "products": card["products"], "final_loss": card["final_loss"]}))
"""

ARMS = {"before": (512, False), "rows 256": (256, False), "after": (256, True)}
FULL_STEPS = 1000


def reward_models(repeats: int) -> None:
    import tempfile
    import time

    from polyrl.builtin import tiny_rm

    side_by_side = tiny_rm.PARALLEL_PAIRS
    seconds: dict[str, list[float]] = {"before": [], "after": []}
    for repeat in range(repeats):
        for arm in seconds:
            tiny_rm.PARALLEL_PAIRS = 10**9 if arm == "before" else side_by_side  # before: never a process
            start = time.perf_counter()
            tiny_rm.ensure_tiny_reward_models(log=lambda s: None, root=Path(tempfile.mkdtemp(prefix="polyrl-rm-")))
            seconds[arm].append(time.perf_counter() - start)
            print(f"repeat {repeat} {arm:6s} {seconds[arm][-1]:5.1f} s for the three reward models", flush=True)
    before = statistics.median(seconds["before"])
    for arm, xs in seconds.items():
        print(f"{arm:6s} median {statistics.median(xs):5.1f} s ({before / statistics.median(xs):.2f}x before)")


def cold() -> None:
    import os
    import tempfile
    import time

    os.environ["POLYRL_CACHE"] = tempfile.mkdtemp(prefix="polyrl-cold-")
    from polyrl.builtin.tiny import ensure_tiny_model
    from polyrl.builtin.tiny_rm import ensure_tiny_reward_models

    start = time.perf_counter()
    ensure_tiny_model(log=lambda s: None)
    base = time.perf_counter() - start
    ensure_tiny_reward_models(log=lambda s: None)
    total = time.perf_counter() - start
    print(f"from an empty cache: base model {base:.0f} s, reward models {total - base:.0f} s, in all {total:.0f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--reward-models", action="store_true", help="time the reward models' builds instead")
    p.add_argument("--cold", action="store_true", help="time a first run's builds from an empty cache instead")
    args = p.parse_args()
    if args.cold:
        return cold()
    if args.reward_models:
        return reward_models(args.repeats)
    per_step: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for repeat in range(args.repeats):
        for arm, (pack_length, bf16) in ARMS.items():
            out = subprocess.run([sys.executable, "-c", CHILD, str(pack_length), "1" if bf16 else "0", str(args.steps)],
                                 cwd=ROOT, capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"arm {arm!r} failed:\n{out.stderr[-3000:]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            per_step[arm].append(r["sft_seconds"] / args.steps)
            print(f"repeat {repeat} {arm:9s} {r['sft_seconds']:6.1f} s for {args.steps} steps "
                  f"({per_step[arm][-1]:.3f} s a step, products {r['products']}, loss {r['final_loss']})", flush=True)
    before = statistics.median(per_step["before"])
    print(f"\nmedians over {args.repeats} repeats; projected to the recipe's {FULL_STEPS} steps")
    for arm, xs in per_step.items():
        m = statistics.median(xs)
        print(f"{arm:9s} {m:.3f} s a step, {m * FULL_STEPS:5.0f} s of SFT ({before / m:.2f}x before)")


if __name__ == "__main__":
    main()
