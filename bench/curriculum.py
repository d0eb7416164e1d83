"""Does the capability-curve curriculum beat fixed mixes? The four-domain quickstart, three arms.

    python bench/curriculum.py [--seeds 0 1 2] [--tokens 250000] [--jobs 2] [--out bench/results/curriculum]

Arms, each run at every seed, every run stopped at the same number of generated rollout
tokens (trainer.max_rollout_tokens; domains differ in completion length, so equal steps
would not be equal compute):

- static:   the quickstart's seed weights (code .35, agent .30, math .20, alignment .15);
- curve:    curriculum: capability_curve, starting from the same weights;
- averaged: static, at the curve run's own time-averaged weights (same seed), so a win of
            `curve` shows that the dynamics matter, not just a better fixed mix (DoReMi's
            question, shared/research/curriculum.md section 3).

Everything else is the quickstart run file (polyrl/configs/quickstart.yaml), with a
cheaper held-out evaluation every --eval-every steps (--heldout tasks per domain, 2
samples each, no greedy pass): it is the curriculum's capability curve and the
tokens-to-target curve. `curve` and `static` runs go first (--jobs at a time, one torch
thread each), then `averaged`.

Reported per arm, mean over seeds with a 95% t-interval (n = seeds, so wide):
- final macro-average and worst-domain held-out score (mean reward, sampled at T = 0.7);
- rollout tokens until the macro score first reaches --target (default: the static arm's
  mean final macro score); a run that never reaches it counts as the budget;
- forgetting: mean over domains of best-during-training minus final;
- per-domain final scores;
and the paired differences curve - static and curve - averaged, seed by seed (macro, worst
domain, forgetting, and each domain's final score).

The results (every run's curve, the summary) go to OUT/results.json; runs to OUT/runs/.
Not covered: more than five seeds' worth of statistical power, other budgets, other
curricula (the SEC/DUMP |advantage| bandits).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
ARMS = ("static", "curve", "averaged")
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def run_file(arm: str, seed: int, weights: dict[str, float] | None, args: argparse.Namespace) -> dict:
    """The quickstart run file with this arm's curriculum and weights and the bench's budget."""
    cfg = yaml.safe_load((ROOT / "polyrl" / "configs" / "quickstart.yaml").read_text())
    cfg["name"], cfg["seed"] = f"{arm}-{seed}", seed
    cfg["curriculum"] = "capability_curve" if arm == "curve" else "static"
    for task in cfg["rl_tasks"]:
        if weights is not None:
            task["weight"] = round(weights[task["domain"]], 4)
    cfg["trainer"].update(steps=100000, max_minutes=None, max_rollout_tokens=args.tokens, checkpoint_every=100000)
    cfg["eval"] = {"every": args.eval_every, "heldout_per_domain": args.heldout, "samples": 2, "greedy": False}
    return cfg


def train(arm: str, seed: int, weights: dict[str, float] | None, args: argparse.Namespace) -> Path:
    run_dir = args.out / "runs" / f"{arm}-{seed}"
    if (run_dir / "eval" / "after.json").exists():
        print(f"  {arm}-{seed}: done before, reusing {run_dir}", flush=True)
        return run_dir
    if run_dir.exists():
        subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    path = args.out / "runs" / f"{arm}-{seed}.yaml"
    path.write_text(yaml.safe_dump(run_file(arm, seed, weights, args), sort_keys=False))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    start = time.time()
    print(f"  {arm}-{seed}: training ({path})", flush=True)
    with open(args.out / "runs" / f"{arm}-{seed}.log", "w") as log:
        subprocess.run([sys.executable, "-m", "polyrl.cli", "train", str(path), "--run-dir", str(run_dir)],
                       cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    print(f"  {arm}-{seed}: done in {time.time() - start:.0f}s", flush=True)
    return run_dir


def read_run(run_dir: Path) -> dict:
    """A run's capability curve (rollout tokens -> held-out scores), weights, final scores."""
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    before = json.loads((run_dir / "eval" / "before.json").read_text())
    after = json.loads((run_dir / "eval" / "after.json").read_text())
    curve = [(0, {d: r["accuracy"] for d, r in before.items()})]
    curve += [(m["rollout_tokens"], {d: r["accuracy"] for d, r in m["eval"].items()}) for m in metrics if "eval" in m]
    curve.append((metrics[-1]["rollout_tokens"], {d: r["accuracy"] for d, r in after.items()}))
    domains = sorted(after)
    mean_weights = {d: statistics.fmean(m["weights"][d] for m in metrics) for d in domains}
    final = curve[-1][1]
    return {"steps": len(metrics), "rollout_tokens": metrics[-1]["rollout_tokens"], "curve": curve,
            "final": final, "macro": statistics.fmean(final.values()), "worst": min(final.values()),
            "forgetting": statistics.fmean(max(p[1][d] for p in curve) - final[d] for d in domains),
            "mean_weights": mean_weights,
            "check_accuracy": after.get("alignment", {}).get("check_accuracy")}


def tokens_to(run: dict, target: float) -> int:
    """Rollout tokens until the macro score first reaches target (the run's budget if never)."""
    for tokens, scores in run["curve"]:
        if statistics.fmean(scores.values()) >= target:
            return tokens
    return run["rollout_tokens"]


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval (0 for one value)."""
    m = statistics.fmean(values)
    if len(values) < 2:
        return m, 0.0
    return m, T975.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))


def fmt(values: list[float], spec: str = ".3f") -> str:
    m, h = interval(values)
    return f"{m:{spec}} ± {h:{spec}}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--tokens", type=int, default=250_000, help="rollout tokens per run")
    p.add_argument("--eval-every", type=int, default=15)
    p.add_argument("--heldout", type=int, default=96)
    p.add_argument("--target", type=float, default=None)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "curriculum")
    args = p.parse_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.time()

    with ThreadPoolExecutor(args.jobs) as pool:  # the arms whose weights are known up front
        first = {(arm, s): pool.submit(train, arm, s, None, args) for s in args.seeds for arm in ("curve", "static")}
        dirs = {k: f.result() for k, f in first.items()}
    runs = {k: read_run(d) for k, d in dirs.items()}
    with ThreadPoolExecutor(args.jobs) as pool:
        later = {("averaged", s): pool.submit(train, "averaged", s, runs[("curve", s)]["mean_weights"], args)
                 for s in args.seeds}
        runs |= {k: read_run(f.result()) for k, f in later.items()}

    target = args.target if args.target is not None else statistics.fmean(runs[("static", s)]["macro"]
                                                                          for s in args.seeds)
    domains = sorted(runs[("static", args.seeds[0])]["final"])
    summary = {}
    print(f"\n{len(args.seeds)} seeds x {len(ARMS)} arms, {args.tokens} rollout tokens per run, "
          f"{(time.time() - start) / 60:.0f} min; mean ± 95% t-interval over seeds")
    print(f"{'arm':<9} {'macro':>15} {'worst':>15} {'forgetting':>15} {'tokens to ' + format(target, '.3f'):>20}  "
          + "  ".join(f"{d:>9}" for d in domains) + "  weights (time-averaged)")
    for arm in ARMS:
        rs = [runs[(arm, s)] for s in args.seeds]
        row = {"macro": [r["macro"] for r in rs], "worst": [r["worst"] for r in rs],
               "forgetting": [r["forgetting"] for r in rs], "tokens_to_target": [tokens_to(r, target) for r in rs],
               "final": {d: [r["final"][d] for r in rs] for d in domains},
               "mean_weights": {d: statistics.fmean(r["mean_weights"][d] for r in rs) for d in domains},
               "steps": [r["steps"] for r in rs], "alignment_check": [r["check_accuracy"] for r in rs]}
        summary[arm] = row
        print(f"{arm:<9} {fmt(row['macro']):>15} {fmt(row['worst']):>15} {fmt(row['forgetting']):>15} "
              f"{fmt(row['tokens_to_target'], '.0f'):>20}  "
              + "  ".join(f"{statistics.fmean(row['final'][d]):>9.3f}" for d in domains) + "  "
              + " ".join(f"{d} {w:.2f}" for d, w in row["mean_weights"].items()))
    paired = {}
    for other in ("static", "averaged"):
        diff = {k: [runs[("curve", s)][k] - runs[(other, s)][k] for s in args.seeds]
                for k in ("macro", "worst", "forgetting")}
        diff["final"] = {d: [runs[("curve", s)]["final"][d] - runs[(other, s)]["final"][d] for s in args.seeds]
                         for d in domains}
        paired[f"curve-{other}"] = diff
        print(f"curve - {other:<8}: macro {fmt(diff['macro'], '+.3f')}, worst {fmt(diff['worst'], '+.3f')}, "
              f"forgetting {fmt(diff['forgetting'], '+.3f')} (paired by seed)")
        print(f"{'':<17}  per domain: " + ", ".join(f"{d} {fmt(v, '+.3f')}" for d, v in diff["final"].items()))
    (args.out / "results.json").write_text(json.dumps(
        {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "target": target,
         "summary": summary, "paired": paired,
         "runs": {f"{arm}-{s}": r for (arm, s), r in runs.items()}}, indent=1))
    print(f"results: {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
