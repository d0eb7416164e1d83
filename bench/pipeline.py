"""The pipeline's speed-up: the quickstart synchronous (K = 0) against K = 1, 2, 4, and local
threads against Ray actors.

    python bench/pipeline.py [--steps 120] [--seeds 0 1 2] [--ks 0 1 2 4] [--ray-ks 0 1] [--ray-trainer-ks 0 1]

Each arm is the built-in quickstart (polyrl/configs/quickstart.yaml: four domains, 16
prompts x 8 samples a step, two engine workers) with `trainer.max_staleness: K`, the same
number of steps for every arm (so the same number of samples: matched samples, not matched
time), no time limit, and held-out evaluations every `--eval-every` steps. Arms run one at
a time, each in a fresh process, interleaved seed by seed (a slow minute on a shared
machine hits every arm). Per arm and seed:

- samples/s: samples trained on / training seconds (the run's clock: held-out evaluation
  run between steps, K = 0, is not counted; with K > 0 it runs beside training and is);
- the step's split: median seconds of rollout, reward and update per step, and each
  role's idle seconds per step (waiting on the queues);
- held-out scores per domain before and after, and the training seconds at which the
  mean held-out score first reached the synchronous arm's final mean at that seed
  ("time to the same score"; '-' when never).

Then the table of medians over seeds, with each arm's throughput ratio to K = 0, and the
phase times `bench/pipeline_model.py --measured` takes to calibrate its model.
The Ray arms (`--ray-ks`) run the same run with cluster.backend: ray on a local Ray
cluster started by the run (rollout and reward roles as actors): steps per minute beside
the local backend's; the `--ray-trainer-ks` arms also move the trainer into an actor
(cluster.trainer_actors: 1), so that each role has a process of its own.

Not covered: more than one machine (the model predicts it), GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys
from polyrl.config import default_config
from polyrl.train.loop import train
arm = json.loads(sys.argv[1])
if arm.get("threads"):
    import torch
    torch.set_num_threads(arm["threads"])
cfg = default_config()
trainer = cfg.trainer.model_copy(update={"steps": arm["steps"], "max_minutes": None, "max_staleness": arm["k"],
                                         "checkpoint_every": 10**6})
cluster = cfg.cluster.model_copy(update={"backend": arm["backend"], "trainer_actors": arm.get("trainer_actors", 0),
                                         "split_cores": arm.get("split_cores", False)})
ev = cfg.eval.model_copy(update={"every": arm["eval_every"]})
engine = cfg.engine
if arm.get("workers"):
    engine = engine.model_copy(update={"native": engine.native.model_copy(update={"workers": arm["workers"]})})
cfg = cfg.model_copy(update={"seed": arm["seed"], "trainer": trainer, "cluster": cluster, "eval": ev, "engine": engine})
res = train(cfg, arm["run_dir"], log=lambda s: None)
print(json.dumps({"train_seconds": res.train_seconds, "steps": res.steps_done}))
"""


def run_arm(k: int, seed: int, steps: int, eval_every: int, backend: str, work: Path, workers: int = 0,
            threads: int = 0) -> dict:
    trainer_actors = 1 if backend == "ray-trainer" else 0
    run_dir = work / f"{backend}-k{k}-w{workers}-t{threads}-s{seed}"
    arm = {"k": k, "seed": seed, "steps": steps, "eval_every": eval_every,
           "backend": backend.removesuffix("-trainer").removesuffix("-cores"), "run_dir": str(run_dir),
           "workers": workers, "threads": threads, "trainer_actors": trainer_actors,
           "split_cores": backend == "local-cores"}
    start, cpu0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(arm)], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    wall = time.perf_counter() - start
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit(f"arm {arm} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return summarise(run_dir, result, wall) | {"cores_busy": cpu / wall}


def summarise(run_dir: Path, result: dict, wall: float) -> dict:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    samples = sum(d["groups"] for r in lines for d in r["domains"].values()) * 8
    before = json.loads((run_dir / "eval" / "before.json").read_text())
    after = json.loads((run_dir / "eval" / "after.json").read_text())
    curve = [(0.0, mean_score(before))] + [(r["clock"], mean_score(r["eval"])) for r in lines if r.get("eval")]
    curve.append((result["train_seconds"], mean_score(after)))

    def med(key: str) -> float:
        return statistics.median(r["time"][key] for r in lines)

    def idle(role: str) -> float:
        return statistics.mean(r["pipeline"]["idle_s"].get(role, 0.0) for r in lines)

    return {"samples": samples, "train_s": result["train_seconds"], "wall_s": wall,
            "samples_per_s": samples / result["train_seconds"], "steps_per_min": len(lines) / result["train_seconds"] * 60,
            "rollout": med("rollout"), "reward": med("reward"), "update": med("update"),
            "idle": {r: idle(r) for r in ("rollout", "reward", "trainer")},
            "before": {d: v["accuracy"] for d, v in before.items()},
            "after": {d: v["accuracy"] for d, v in after.items()}, "curve": curve,
            "staleness_mean": statistics.mean(r["pipeline"]["staleness"]["mean"] for r in lines),
            "dropped_stale": sum(r["pipeline"]["dropped_stale"] for r in lines)}


def mean_score(evaluation: dict) -> float:
    return statistics.mean(v["accuracy"] for v in evaluation.values())


def time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    return next((t for t, score in curve if score >= target), None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--eval-every", type=int, default=0,
                   help="held-out evaluation every N steps (0: before and after only, both outside the clock)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--ks", type=int, nargs="*", default=[0, 1, 2, 4])
    p.add_argument("--ray-ks", type=int, nargs="*", default=[0, 1], help="arms on the Ray backend (first seed only)")
    p.add_argument("--ray-trainer-ks", type=int, nargs="*", default=[],
                   help="arms on the Ray backend with the trainer as an actor too (cluster.trainer_actors: 1; first seed only)")
    p.add_argument("--split-cores-ks", type=int, nargs="*", default=[],
                   help="local arms with cluster.split_cores: the trainer on half the cores, the roles on the rest")
    p.add_argument("--split", nargs="*", default=[], metavar="K:WORKERS:THREADS",
                   help="extra local arms with the cores split: engine workers and the trainer's torch threads")
    p.add_argument("--json", help="write every arm's figures here")
    args = p.parse_args()

    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="polyrl-pipeline-") as tmp:
        for seed in args.seeds:
            arms = [("local", k, 0, 0) for k in args.ks] + [("local", *map(int, x.split(":"))) for x in args.split]
            arms += [("local-cores", k, 0, 0) for k in args.split_cores_ks]
            arms += [("ray", k, 0, 0) for k in args.ray_ks if seed == args.seeds[0]]
            arms += [("ray-trainer", k, 0, 0) for k in args.ray_trainer_ks if seed == args.seeds[0]]
            for backend, k, workers, threads in arms:
                r = run_arm(k, seed, args.steps, args.eval_every, backend, Path(tmp), workers, threads)
                name = f"{backend} K={k}" + (f" w{workers}t{threads}" if workers or threads else "")
                results.setdefault(name, []).append(r | {"seed": seed})
                print(f"seed {seed} {name}: {r['samples_per_s']:.1f} samples/s, {r['cores_busy']:.2f} cores busy, "
                      f"{r['steps_per_min']:.1f} steps/min, rollout {r['rollout']:.3f} reward {r['reward']:.3f} "
                      f"update {r['update']:.3f} s, held-out after {fmt(r['after'])}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    report(results, args)


def fmt(scores: dict) -> str:
    return " ".join(f"{d} {v:.3f}" for d, v in sorted(scores.items()))


def report(results: dict[str, list[dict]], args: argparse.Namespace) -> None:
    sync = {r["seed"]: r for r in results.get("local K=0", [])}
    base = statistics.median(r["samples_per_s"] for r in sync.values()) if sync else None
    print(f"\nmedians over seeds {args.seeds}, {args.steps} steps each ({args.steps * 128} samples)")
    print(f"{'arm':16s} {'samples/s':>9s} {'ratio':>6s} {'steps/min':>9s} {'rollout':>8s} {'reward':>7s} "
          f"{'update':>7s} {'idle r/w/t':>16s} {'stale':>5s} {'cores':>5s} {'t-to-score':>10s}  held-out after (mean over seeds)")
    for name, rs in results.items():
        sps = statistics.median(r["samples_per_s"] for r in rs)
        reach = [time_to(r["curve"], mean_score({d: {"accuracy": v} for d, v in sync[r["seed"]]["after"].items()}))
                 for r in rs if r["seed"] in sync]
        reached = [t for t in reach if t is not None]
        t_score = f"{statistics.median(reached):.0f}s ({len(reached)}/{len(reach)})" if reached else "-"
        after = {d: statistics.mean(r["after"][d] for r in rs) for d in rs[0]["after"]}
        idle = "/".join(f"{statistics.median(r['idle'][x] for r in rs):.2f}" for x in ("rollout", "reward", "trainer"))
        print(f"{name:16s} {sps:9.1f} {sps / base if base else float('nan'):6.2f} "
              f"{statistics.median(r['steps_per_min'] for r in rs):9.1f} "
              f"{statistics.median(r['rollout'] for r in rs):8.3f} {statistics.median(r['reward'] for r in rs):7.3f} "
              f"{statistics.median(r['update'] for r in rs):7.3f} {idle:>16s} "
              f"{statistics.median(r['staleness_mean'] for r in rs):5.2f} {statistics.median(r['cores_busy'] for r in rs):5.2f} {t_score:>10s}  {fmt(after)}")
    if sync:
        s = list(sync.values())
        print("\nfor bench/pipeline_model.py: --rollout {:.3f} --reward {:.3f} --update {:.3f}".format(
            *(statistics.median(r[k] for r in s) for k in ("rollout", "reward", "update"))))


if __name__ == "__main__":
    main()
