"""The quickstart's rollout, timed: this checkout's engine against another commit's (or settings).

    python bench/quickstart_rollout.py --before 48f1ba3 [--repeats 3] [--steps 12]
    python bench/quickstart_rollout.py --engines '{}' '{"workers": 2}' '{"decode_burst": 1}'

Each arm runs the rollout phase of `polyrl/configs/quickstart.yaml` (all four domains,
16 prompts x 8 samples per step, the agent's multi-turn episodes, the run file's
sampling) for --steps steps on the built-in tiny model's base weights, with no training
in between, so every arm generates for the same tasks. The first two steps are warm-up;
the arm's figure is its median rollout time per step over the rest. Arms run one at a
time in fresh processes, interleaved repeat by repeat (a slow minute on a shared
machine hits every arm), and the table gives each arm's median over repeats and its
ratio to the first arm.

Arms: `--before COMMIT` adds that commit's code (checked out into a temporary git
worktree, run on this virtualenv) with its default engine, ahead of this checkout's
arms; `--engines` lists this checkout's arms as `engine.native` settings in JSON
(default: the run file's own).

Not covered: reward and update time (the whole step: `polyrl train` prints it), other
models, the vLLM backend.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(steps: int, native: dict) -> dict:
    """Run in a fresh process whose polyrl is the arm's code: rollout times per step."""
    import copy

    from polyrl.config import load_config
    from polyrl.engine.factory import build_engine
    from polyrl.rl.curriculum import allocate
    from polyrl.models.loading import load_policy, resolve_model_dir
    from polyrl.rollout.dispatch import Rollout
    from polyrl.train.setup import build_domains, draw_tasks, rollout_sampling
    import polyrl

    cfg = load_config(Path(polyrl.__file__).parent / "configs" / "quickstart.yaml")
    if native:
        cfg.engine.native = type(cfg.engine.native).model_validate({**cfg.engine.native.model_dump(), **native})
    model_dir = resolve_model_dir(cfg.model.path, log=lambda *_: None)
    policy, tokenizer = load_policy(model_dir, cfg.model.dtype)
    engine = build_engine(cfg.engine, copy.deepcopy(policy), tokenizer, model_dir)
    doms = build_domains(cfg)
    rollout = Rollout(engine, tokenizer, doms.specs, policy.cfg.max_position_embeddings)
    times, tokens = [], 0
    for step in range(steps):
        counts = allocate(cfg.trainer.prompts_per_step, {d: s.weight for d, s in doms.specs.items()})
        tasks = draw_tasks(doms.specs, counts, cfg.seed, step)
        start = time.perf_counter()
        groups = rollout.groups(tasks, cfg.trainer.group_size, rollout_sampling(cfg.seed, step), f"s{step}")
        times.append(time.perf_counter() - start)
        tokens += sum(len(x.generated_ids) for g in groups for x in g.samples)
    engine.close()
    return {"times": times, "tokens": tokens}


def run_arm(code: Path, steps: int, native: dict) -> dict:
    env = dict(os.environ, PYTHONPATH=str(code))
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(native), "--steps", str(steps)],
                         env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"arm {code} {native} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", metavar="COMMIT", help="also time this commit's code, as the first arm")
    p.add_argument("--engines", nargs="*", default=["{}"], help="engine.native settings (JSON) of this checkout's arms")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.steps, json.loads(args.child))))
        return 0
    if args.steps < 3:
        p.error("--steps must be at least 3 (two are warm-up)")

    with tempfile.TemporaryDirectory() as tmp:
        arms = [(f"this checkout {e}", ROOT, json.loads(e)) for e in args.engines]
        if args.before:
            worktree = Path(tmp) / "before"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(worktree), args.before],
                           check=True, capture_output=True)
            arms.insert(0, (f"{args.before} (default engine)", worktree, {}))
        try:
            medians: dict[str, list[float]] = {name: [] for name, _, _ in arms}
            for r in range(args.repeats):
                for name, code, native in arms:
                    res = run_arm(code, args.steps, native)
                    medians[name].append(statistics.median(res["times"][2:]))
                    print(f"repeat {r + 1}/{args.repeats}  {name:<40} rollout {medians[name][-1]:.3f} s/step  "
                          f"({res['tokens']} tokens in {args.steps} steps)", flush=True)
        finally:
            if args.before:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                               check=False, capture_output=True)

    first = statistics.median(medians[arms[0][0]])
    print(f"\nquickstart rollout, median s/step over {args.repeats} repeats ({args.steps - 2} timed steps each)")
    for name, _, _ in arms:
        m = statistics.median(medians[name])
        print(f"  {name:<40} {m:.3f} s  ({first / m:.2f}x the first arm's speed)  runs: "
              + ", ".join(f"{v:.3f}" for v in medians[name]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
