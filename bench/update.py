"""The update phase, timed: the padded layout against shared prefixes and length-sorted pieces.

    python bench/update.py [--repeats 3] [--steps 6] [--pass-costs 0,128,256,512,1024]

The update is one forward, backward and AdamW step over a step's samples
(train/update.py `update`). Arms differ only in the layout of that pass
(train/packing.py):

- "padded": every sample's whole row (prompt and completion), all rows padded to the
  longest one, in one pass (`micro_batch_tokens: null, shared_prefix: false`; the
  layout before packing.py);
- "pieces": whole rows, in length-sorted pieces (cut where the padding saved outweighs
  a pass) of at most 8,192 padded tokens;
- "shared": the default: each group's shared prefix once, then pieces.

Two workloads, on the built-in tiny model (base weights, built once and cached):

1. quickstart: --steps steps of the quickstart's rollout (polyrl/configs/quickstart.yaml:
   code, agent, math and alignment, 16 prompts x 8 samples, agent episodes of several
   turns), with random advantages so that every sample is in the batch (the quickstart
   drops groups whose rewards are all equal), and the reference model of its KL term;
2. rl-step: bench/engine.py's RL step shape: 16 short prompts x 8 samples x 32 tokens.

Each arm keeps its own policy and optimizer; per batch, the arms run one after another,
so load from other jobs hits them alike. Printed: the median seconds per update of each
arm over batches and repeats (the first batch is warm-up), its speed-up over "padded",
and the tokens each layout computes.

Not covered: the rollout, rewards, other models; tests/test_packing.py pins that the
layouts give the same weights.
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ARMS = {"padded": (dict(micro_batch_tokens=None, shared_prefix=False), None),  # (trainer settings, pass cost)
        "pieces": (dict(micro_batch_tokens=8192, shared_prefix=False), None),
        "shared": (dict(micro_batch_tokens=8192, shared_prefix=True), None)}


def quickstart_batches(steps: int):
    """Training batches of `steps` quickstart rollouts (random advantages), the policy, and a
    reference model when the run file has a KL term."""
    from polyrl.config import load_config
    from polyrl.engine.factory import build_engine
    from polyrl.rl.curriculum import allocate
    from polyrl.models.loading import load_policy, resolve_model_dir
    from polyrl.rollout.dispatch import Rollout
    from polyrl.train.setup import build_domains, draw_tasks, rollout_sampling
    import polyrl

    cfg = load_config(Path(polyrl.__file__).parent / "configs" / "quickstart.yaml")
    model_dir = resolve_model_dir(cfg.model.path, log=lambda *_: None)
    policy, tokenizer = load_policy(model_dir, cfg.model.dtype)
    engine = build_engine(cfg.engine, copy.deepcopy(policy), tokenizer, model_dir)
    doms = build_domains(cfg)
    rollout = Rollout(engine, tokenizer, doms.specs, policy.cfg.max_position_embeddings)
    batches = []
    for step in range(steps):
        counts = allocate(cfg.trainer.prompts_per_step, {d: s.weight for d, s in doms.specs.items()})
        tasks = draw_tasks(doms.specs, counts, cfg.seed, step)
        groups = rollout.groups(tasks, cfg.trainer.group_size, rollout_sampling(cfg.seed, step), f"s{step}")
        batches.append(training_batch(groups, {d: s.kl_coef for d, s in doms.specs.items()}, step))
    doms.close()
    engine.close()
    return batches, policy, any(s.kl_coef > 0 for s in doms.specs.values()), cfg


def rl_step_batches(steps: int):
    """bench/engine.py's RL step: 16 prompts x 8 samples x 32 sampled tokens, on the tiny model's shape."""
    from bench.engine_parts import TRL_PROMPTS, make_model_dir
    from polyrl.engine.base import SamplingParams
    from polyrl.engine.paged import PagedEngine
    from polyrl.models.hf_io import load_pretrained
    from polyrl.models.tokenizer import Tokenizer
    from polyrl.rollout.groups import Group, SingleTurn
    from polyrl.types import Task

    model_dir = make_model_dir("tiny", Path("/tmp/polyrl-bench"))
    tok = Tokenizer.from_dir(model_dir)
    policy = load_pretrained(model_dir)[0]
    engine = PagedEngine(copy.deepcopy(policy), tok)
    prompt_ids = [tok.encode(p) for p in TRL_PROMPTS]
    batches = []
    for step in range(steps):
        outs = engine.generate(prompt_ids, 8, SamplingParams(temperature=1.0, max_tokens=32, seed=step))
        groups = [Group(Task(str(i), "bench", p), [SingleTurn(prompt_ids[i], c) for c in outs[i * 8:(i + 1) * 8]])
                  for i, p in enumerate(TRL_PROMPTS)]
        batches.append(training_batch(groups, {"bench": 0.0}, step))
    cfg = SimpleNamespace(seed=0, engine=SimpleNamespace(temperature=1.0))
    return batches, policy, False, cfg


def training_batch(groups, kl_coef: dict[str, float], seed: int):
    from polyrl.rl.advantages import group_advantages
    from polyrl.train.batch import build_batch

    rng = random.Random(seed)
    rewards = torch.tensor([[rng.random() for _ in g.samples] for g in groups])
    adv = group_advantages(rewards, [g.task.domain for g in groups])
    return build_batch(groups, adv.tolist(), [[1.0] * len(g.samples) for g in groups], kl_coef)


def time_arms(name: str, arms: dict, batches, policy, with_ref: bool, cfg, repeats: int) -> None:
    from polyrl.config import TrainerConfig
    from polyrl.train import packing
    from polyrl.train.update import update
    from polyrl.train.packing import plan

    default_cost = packing.PASS_COST_TOKENS
    ref = copy.deepcopy(policy).requires_grad_(False) if with_ref else None
    times: dict[str, list[float]] = {a: [] for a in arms}
    for r in range(repeats):
        state = {}
        for arm, (layout, _) in arms.items():
            p = copy.deepcopy(policy)
            trainer = TrainerConfig(lr=1e-4, **layout)
            state[arm] = (p, torch.optim.AdamW(p.parameters(), lr=1e-4, betas=(0.9, 0.99)),
                          SimpleNamespace(seed=0, engine=cfg.engine, trainer=trainer))
        for i, batch in enumerate(batches):
            for arm, (_, cost) in arms.items():
                p, opt, arm_cfg = state[arm]
                packing.PASS_COST_TOKENS = default_cost if cost is None else cost
                t = time.perf_counter()
                update(p, ref, opt, batch, arm_cfg, step=i)
                if i > 0:
                    times[arm].append(time.perf_counter() - t)
        print(f"  repeat {r + 1}/{repeats}: " + ", ".join(
            f"{a} {statistics.median(v[-(len(batches) - 1):]):.3f} s" for a, v in times.items()), flush=True)
    tokens = {}
    for arm, (layout, cost) in arms.items():
        packing.PASS_COST_TOKENS = default_cost if cost is None else cost
        tokens[arm] = statistics.mean(sum(pc.tokens for pc in plan(b, layout["micro_batch_tokens"], layout["shared_prefix"]))
                                      for b in batches)
    packing.PASS_COST_TOKENS = default_cost
    real = statistics.mean(int(b.lengths.sum()) for b in batches)
    print(f"\n{name}: {len(batches[0])} rows, {real:.0f} real tokens per batch on average; "
          f"median s/update over {repeats} repeats x {len(batches) - 1} batches")
    base = statistics.median(times["padded"])
    width = max(map(len, arms))
    for arm, v in times.items():
        m = statistics.median(v)
        print(f"  {arm:<{width}} {m:.3f} s  {base / m:.2f}x padded   tokens computed {tokens[arm]:,.0f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=6, help="batches per workload (the first is warm-up)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workloads", default="quickstart,rl-step")
    p.add_argument("--pass-costs", help="instead of the pieces arm, the shared arm at each of these "
                   "packing.PASS_COST_TOKENS values (comma-separated), to tune it")
    args = p.parse_args()
    arms = dict(ARMS)
    if args.pass_costs:
        del arms["pieces"], arms["shared"]
        arms.update({f"shared, pass cost {c}": (ARMS["shared"][0], int(c)) for c in args.pass_costs.split(",")})
    torch.set_num_threads(args.threads)
    for name in args.workloads.split(","):
        make = {"quickstart": quickstart_batches, "rl-step": rl_step_batches}[name]
        print(f"{name}: rolling out {args.steps} batches ...", flush=True)
        time_arms(name, arms, *make(args.steps), args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
