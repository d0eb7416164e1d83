"""Step time of runs of 4, 20 and 100 generated domains with one batch, evaluation included.

    python bench/many_domains.py [--repeats 3] [--steps 11] [--every 5] [--per-eval 4]

Each run trains a tiny random model (tests/helpers.py; no built-in model is built) on
generated math domains (rl_tasks[].expand over level weightings (k, k, k, k) of levels 1-4,
tests/many_domains_runs.py: one task distribution, domains that differ in name and state
only, so the sizes differ in nothing else) with the same batch at every size: 16 prompts x 4 samples a
step, so at 100 domains most domains get no prompt in a step and the sampler decides
which do (rl/curriculum.py allocate). The capability-curve curriculum and an adaptive KL
per domain are on; rewards are length_parity (tests/helpers.py), so groups have variance
and every step updates.

Two arms per size:

- "every": eval.domains_per_eval null, every domain evaluated at every held-out
  evaluation (the behaviour before generated domains);
- "rotate": eval.domains_per_eval --per-eval, a rotating block of domains per evaluation.

Printed per arm, medians over repeats (arms and sizes interleaved within each repeat,
so load from other jobs hits them alike): the loop's seconds per step (metrics.jsonl
clock, which leaves held-out evaluation out; median over the steps after the first),
the in-training evaluation's seconds per step (its total over the run / steps; the
evaluations before and after training are left out), their sum, and the ratio of that
sum to the 4-domain run's of the same arm. Also each arm's metrics line size.

Not covered: verifiers with a sandbox (code), agent episodes, real models.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from polyrl.config import load_config_text  # noqa: E402
from polyrl.pipeline import roles  # noqa: E402
from polyrl.rewards import registry  # noqa: E402
from polyrl.train.loop import train  # noqa: E402
from tests.helpers import random_model_dir  # noqa: E402
from tests.many_domains_runs import generated_run  # noqa: E402

SIZES = (4, 20, 100)


class EvalTimer:
    """Seconds of held-out evaluation (generation and scoring) per evaluated step."""

    def __init__(self) -> None:
        self.seconds: dict[int, float] = {}
        real_eval, real_finish = roles.RolloutRole.evaluate, roles.RewardRole.finish

        def evaluate(role, step, *args):
            start = time.perf_counter()
            try:
                return real_eval(role, step, *args)
            finally:
                self.seconds[step] = self.seconds.get(step, 0.0) + time.perf_counter() - start

        def finish(role, item):
            start = time.perf_counter()
            try:
                return real_finish(role, item)
            finally:
                if isinstance(item, roles.EvalBatch):
                    self.seconds[item.step] = self.seconds.get(item.step, 0.0) + time.perf_counter() - start

        roles.RolloutRole.evaluate, roles.RewardRole.finish = evaluate, finish


def run_once(model: Path, work: Path, domains: int, per_eval: int | None, args, timer: EvalTimer) -> dict:
    text = generated_run(model, domains, steps=args.steps, per_eval=per_eval, prompts=16, every=args.every,
                         heldout=args.heldout, max_tokens=16).replace("group_size: 2", "group_size: 4")
    run = work / f"d{domains}-{per_eval}-{time.monotonic_ns()}"
    timer.seconds.clear()
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):  # the per-step display
        train(load_config_text(text), run, log=lambda *_: None)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    clock = [x["clock"] for x in lines]
    loop = statistics.median(b - a for a, b in zip(clock, clock[1:]))
    evals = sum(s for step, s in timer.seconds.items() if 0 < step < args.steps) / args.steps
    size = statistics.median(len(x) for x in (run / "metrics.jsonl").read_text().splitlines())
    return {"loop": loop, "eval": evals, "total": loop + evals, "line_bytes": size}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=11)
    p.add_argument("--every", type=int, default=5, help="eval.every")
    p.add_argument("--heldout", type=int, default=4, help="eval.heldout_per_domain")
    p.add_argument("--per-eval", type=int, default=4, help="eval.domains_per_eval of the rotate arm")
    args = p.parse_args()
    registry._VERIFIERS["length_parity"] = "tests.helpers:ParityVerifier"
    arms = {"every": None, "rotate": args.per_eval}
    results: dict[tuple[str, int], list[dict]] = {}
    timer = EvalTimer()
    load = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = random_model_dir(work / "model")
        for r in range(args.repeats):
            for domains in SIZES:
                for arm, per_eval in arms.items():
                    results.setdefault((arm, domains), []).append(run_once(model, work, domains, per_eval, args, timer))
                    load.append(os.getloadavg()[0])
                    print(f"repeat {r + 1}/{args.repeats}  {arm:>6}  {domains:>3} domains  "
                          f"{results[(arm, domains)][-1]['total']:.4f} s/step", file=sys.stderr)
    med = {k: {f: statistics.median(x[f] for x in v) for f in v[0]} for k, v in results.items()}
    print(f"16 prompts x 4 samples a step, {args.steps} steps, eval every {args.every} "
          f"({args.heldout} held-out tasks x 1 sample per evaluated domain), {args.repeats} repeats interleaved; "
          f"medians. Load average (1 min) during the runs: min {min(load):.2f}, median {statistics.median(load):.2f}, "
          f"max {max(load):.2f} on {os.cpu_count()} CPUs")
    print(f"{'arm':>6} {'domains':>7} {'loop s/step':>12} {'eval s/step':>12} {'total s/step':>13} "
          f"{'vs 4 domains':>13} {'metrics line':>13}")
    for arm in arms:
        for domains in SIZES:
            m = med[(arm, domains)]
            print(f"{arm:>6} {domains:>7} {m['loop']:>12.4f} {m['eval']:>12.4f} {m['total']:>13.4f} "
                  f"{m['total'] / med[(arm, 4)]['total']:>12.2f}x {m['line_bytes']:>11.0f} B")
    for domains in SIZES:
        speedup = med[("every", domains)]["total"] / med[("rotate", domains)]["total"]
        print(f"rotate vs every at {domains:>3} domains: {speedup:.2f}x faster per step")


if __name__ == "__main__":
    main()
