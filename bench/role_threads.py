"""The trainer's update beside the role threads: OpenMP held to one thread in them, or not, or no threads.

    python bench/role_threads.py [--steps 15] [--repeats 2]

Each arm is the built-in quickstart (synchronous, K = 0) for `--steps` steps in a fresh
process, with 8 held-out tasks per domain so that the evaluations before and after stay
short; per arm, the medians over steps 3 onwards of the update, rollout and reward
seconds. Arms, interleaved repeat by repeat:

- "local": cluster.backend local, the roles in threads beside the trainer, their torch
  kernels held to one OpenMP thread (pipeline/openmp.py; what `polyrl train` does);
- "local, no hold": the same with the hold switched off (backend.one_thread_roles
  answering no role), as before the change;
- "inline": cluster.backend inline, the roles in the trainer's own thread (no second
  OpenMP team at all): the reference.

Every arm trains on the same samples (K = 0, the same seed), so the update does the same
work in each. Not covered: K > 0 (bench/pipeline.py), other machines.
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
import json, statistics, sys, tempfile
arm, steps = sys.argv[1], int(sys.argv[2])
if arm == "local, no hold":
    import polyrl.train.loop as loop
    loop.one_thread_roles = lambda cfg: ()  # the loop's own name for it
from polyrl.config import default_config
from polyrl.train.loop import train

if __name__ == "__main__":
    cfg = default_config()
    cfg = cfg.model_copy(update={
        "trainer": cfg.trainer.model_copy(update={"steps": steps, "max_minutes": None, "checkpoint_every": 10**6}),
        "cluster": cfg.cluster.model_copy(update={"backend": "inline" if arm == "inline" else "local"}),
        "eval": cfg.eval.model_copy(update={"heldout_per_domain": 8})})
    run_dir = tempfile.mkdtemp(prefix="polyrl-role-threads-")
    train(cfg, run_dir, log=lambda s: None)
    lines = [json.loads(x) for x in open(run_dir + "/metrics.jsonl")][3:]
    print(json.dumps({k: statistics.median(r["time"][k] for r in lines) for k in ("update", "rollout", "reward")}))
"""

ARMS = ("local", "local, no hold", "inline")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    results: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    for repeat in range(args.repeats):
        for arm in ARMS:
            out = subprocess.run([sys.executable, "-c", CHILD, arm, str(args.steps)], cwd=ROOT, capture_output=True,
                                 text=True)
            if out.returncode != 0:
                raise SystemExit(f"arm {arm!r} failed:\n{out.stderr[-3000:]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results[arm].append(r)
            print(f"repeat {repeat} {arm:15s} update {r['update']:.3f} s  rollout {r['rollout']:.3f} s  "
                  f"reward {r['reward']:.3f} s", flush=True)
    print(f"\nmedians over {args.repeats} repeats (each the median of steps 3..{args.steps - 1})")
    base = statistics.median(r["update"] for r in results["local"])
    for arm, rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("update", "rollout", "reward")}
        print(f"{arm:15s} update {med['update']:.3f} s ({med['update'] / base:.2f}x local's)  "
              f"rollout {med['rollout']:.3f} s  reward {med['reward']:.3f} s")


if __name__ == "__main__":
    main()
