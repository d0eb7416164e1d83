"""The training loop: rollout -> reward -> advantage -> loss -> step, top to bottom.

One synchronous GRPO step per iteration. The engine holds its own copy of the policy
and receives new weights (with a version) after every optimizer step, exactly as a
remote or vLLM engine would, so nothing here assumes rollouts come from this process.

Two controls sit around the step. The domain shares of each batch come from the
curriculum (static: the run file's weights; capability_curve: moved after every
held-out evaluation, rl/curriculum.py), and each domain's KL coefficient from its own
controller (rl/kl_control.py: adaptive toward rl_tasks[].kl_target, else fixed). Both
are logged on every metrics line with the reason for their values, and saved in the
state for resume.
"""

from __future__ import annotations

import copy
import time
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from polyrl.config import RunConfig
from polyrl.engine.base import SamplingParams
from polyrl.engine.factory import build_engine
from polyrl.engine.stats import counter_delta, engine_counters
from polyrl.models.hf_io import save_pretrained
from polyrl.models.loading import load_policy, resolve_model_dir
from polyrl.rl.advantages import group_advantages, zero_variance_groups
from polyrl.rl.curriculum import CapabilityCurriculum, allocate
from polyrl.rl.kl_control import PerDomainKL
from polyrl.rl.overlong import overlong_mask, overlong_rewards
from polyrl.obs.store import ObsStore
from polyrl.rollout.dispatch import Rollout, record_episodes
from polyrl.rollout.groups import Group, score_groups
from polyrl.rollout.spec import DomainSpec
from polyrl.sandbox.execution_log import ExecutionLog
from polyrl.train.batch import build_batch
from polyrl.train.display import Display
from polyrl.train.evaluate import evaluate
from polyrl.train.monitor import RewardMonitor
from polyrl.train.run_dir import RunDir
from polyrl.train.setup import build_curriculum, build_domains, step_seed
from polyrl.train.update import update
from polyrl.types import Task


@dataclass
class TrainResult:
    run_dir: Path
    steps_done: int
    before: dict
    after: dict | None
    train_seconds: float


def train(cfg: RunConfig, run_dir: str | Path, resume: bool = False, log: Callable[[str], None] = print,
          stop_after: int | None = None) -> TrainResult:
    """Run (or, with resume=True, continue) the run described by cfg in run_dir.

    stop_after ends the process after that many steps as if it had been killed: for tests
    of resume, and for budgeting work across sessions. The engine, the verifiers and the
    observability store are closed on every way out, errors included.
    """
    with ExitStack() as closing:
        return _train(cfg, RunDir(run_dir), resume, log, stop_after, closing)


def _train(cfg: RunConfig, rd: RunDir, resume: bool, log: Callable[[str], None], stop_after: int | None,
           closing: ExitStack) -> TrainResult:
    torch.manual_seed(cfg.seed)
    model_dir = resolve_model_dir(cfg.model.path, log=log)
    policy, tokenizer = load_policy(model_dir, cfg.model.dtype)
    engine = build_engine(cfg.engine, copy.deepcopy(policy), tokenizer, model_dir)
    closing.callback(engine.close)
    doms = build_domains(cfg, ExecutionLog(rd.executions))
    closing.callback(doms.close)
    specs = doms.specs
    obs = None
    if any(spec.agent for spec in specs.values()):  # agent calls, tools, verdicts
        obs = ObsStore.in_run_dir(rd.path)
        closing.callback(obs.close)
    rollout = Rollout(engine, tokenizer, specs, policy.cfg.max_position_embeddings, obs)
    curriculum = build_curriculum(cfg, {d: s.weight for d, s in specs.items()})  # None: static weights
    kl = PerDomainKL({d: s.kl_coef for d, s in specs.items()}, {d: s.kl_target for d, s in specs.items()},
                     cfg.trainer.kl_horizon)
    uses_kl = any(s.kl_coef > 0 for s in specs.values())
    ref = copy.deepcopy(policy).eval().requires_grad_(False) if uses_kl else None
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.trainer.lr, betas=(0.9, 0.99),
                                  weight_decay=cfg.trainer.weight_decay)
    heldout = {d: s.source.sample("heldout", cfg.eval.heldout_per_domain, seed=cfg.seed) for d, s in specs.items()}

    def run_eval(step: int) -> dict:
        return evaluate(rollout, heldout, doms.verifiers, step_seed(cfg.seed, step, "eval"), cfg.eval.samples,
                        cfg.eval.greedy, f"eval{step}")

    state = rd.load_state() if resume else None
    if state is None:
        rd.create(cfg.to_yaml())
        log(f"evaluating the base model on {cfg.eval.heldout_per_domain} held-out tasks per domain")
        before = run_eval(0)
        rd.write_json(rd.eval_file("before"), before)
        if curriculum:
            curriculum.update(0, capability(before))
        start_step, clock, rollout_tokens = 0, 0.0, 0
    else:
        policy.load_state_dict(state["policy"])
        optimizer.load_state_dict(state["optimizer"])
        engine.update_weights(policy.state_dict(), version=state["step"])
        rd.truncate_after(state["step"])
        before, start_step, clock = rd.read_json(rd.eval_file("before")), state["step"], state["clock"]
        rollout_tokens = state.get("rollout_tokens", 0)
        if curriculum and state.get("curriculum"):
            curriculum = CapabilityCurriculum.from_state(state["curriculum"], curriculum.settings)
        if state.get("kl"):
            kl = PerDomainKL.from_state(state["kl"])
        log(f"resuming {rd.path} at step {start_step}")

    display = Display(cfg.trainer.steps, start_step, before, log)
    closing.callback(display.close)
    monitor = RewardMonitor()  # suspicious reward patterns -> RUN_DIR/flags.jsonl (train/monitor.py)
    steps_done = start_step
    for step in range(start_step, cfg.trainer.steps):
        if cfg.trainer.max_minutes and clock >= cfg.trainer.max_minutes * 60:
            log(f"stopping at step {step}: trainer.max_minutes={cfg.trainer.max_minutes} reached")
            break
        if cfg.trainer.max_rollout_tokens and rollout_tokens >= cfg.trainer.max_rollout_tokens:
            log(f"stopping at step {step}: trainer.max_rollout_tokens={cfg.trainer.max_rollout_tokens} reached")
            break
        t0 = time.perf_counter()
        counters0 = engine_counters(engine)
        # 1. rollout: this step's prompts, G samples each
        weights, weight_reasons = (curriculum.weights, curriculum.reasons) if curriculum else (
            {d: s.weight for d, s in specs.items()}, None)
        counts = allocate(cfg.trainer.prompts_per_step, weights)
        tasks = draw_tasks(specs, counts, cfg.seed, step)
        groups = rollout.groups(tasks, cfg.trainer.group_size, rollout_sampling(cfg.seed, step), f"s{step}")
        t1 = time.perf_counter()
        rollout_counters = counter_delta(counters0, engine_counters(engine))
        rollout_tokens += sum(len(x.generated_ids) for g in groups for x in g.samples)
        # 2. reward
        score_groups(groups, doms.verifiers, specs)
        record_episodes(groups, obs)
        t2 = time.perf_counter()
        # 3. advantage, with zero-variance groups dropped (they carry no signal)
        finished = [[x.finish_reason for x in g.samples] for g in groups]
        rewards = torch.tensor([overlong_rewards(g.rewards, f, cfg.trainer.overlong) for g, f in zip(groups, finished)])
        flat = zero_variance_groups(rewards) if cfg.trainer.drop_zero_variance else torch.zeros(len(groups), dtype=torch.bool)
        adv = group_advantages(rewards, [g.task.domain for g in groups])
        keep = [i for i in range(len(groups)) if not flat[i]]
        # 4. loss and optimizer step
        stats, coefs = {}, dict(kl.coefs)
        if keep:
            kept = [groups[i] for i in keep]
            masks = [overlong_mask(finished[i], cfg.trainer.overlong) for i in keep]
            batch = build_batch(kept, [adv[i].tolist() for i in keep], masks, coefs)
            stats = update(policy, ref, optimizer, batch, cfg, step)
            engine.update_weights(policy.state_dict(), version=step + 1)
            kl.update({d: stats["domains"][d]["kl"] for d in counts if d in stats["domains"]},
                      {d: sum(len(g.samples) for g in kept if g.task.domain == d) for d in counts})
        t3 = time.perf_counter()
        clock += t3 - t0

        record = step_metrics(step, groups, flat, stats, {"rollout": t1 - t0, "reward": t2 - t1, "update": t3 - t2},
                              rollout_counters)
        record["rollout_tokens"] = rollout_tokens
        record["weights"] = {d: round(w, 4) for d, w in sorted(weights.items())}
        record["weight_reasons"] = weight_reasons or {d: "static: the run file's weight" for d in weights}
        record["kl_coef"] = {d: coefs[d] for d in sorted(coefs)}
        record["kl_coef_reasons"] = dict(kl.reasons)
        if cfg.eval.every and (step + 1) % cfg.eval.every == 0 and step + 1 < cfg.trainer.steps:
            record["eval"] = run_eval(step + 1)
            if curriculum:  # the shares of the steps from here to the next evaluation
                moved = curriculum.update(step + 1, capability(record["eval"]))
                record["curriculum_update"] = {"weights": {d: round(w, 4) for d, w in sorted(moved.weights.items())},
                                               "reasons": moved.reasons}
        rd.append(rd.metrics, [record])
        rd.append(rd.trajectories, trajectory_records(step, groups))
        rd.append(rd.flags, monitor.step(step, groups, record, specs))
        if (step + 1) % cfg.trainer.checkpoint_every == 0:
            save_checkpoint(rd, policy, model_dir, f"step-{step + 1:06d}")
        rd.save_state({"step": step + 1, "clock": clock, "rollout_tokens": rollout_tokens,
                       "policy": policy.state_dict(), "optimizer": optimizer.state_dict(),
                       "curriculum": curriculum.state_dict() if curriculum else None, "kl": kl.state_dict()})
        display.step(record)
        steps_done = step + 1
        if stop_after is not None and steps_done - start_step >= stop_after:
            return TrainResult(rd.path, steps_done, before, None, clock)
    display.close()

    after = run_eval(steps_done)
    rd.write_json(rd.eval_file("after"), after)
    save_checkpoint(rd, policy, model_dir, "final")
    display.summary(before, after, rd.path, clock)
    return TrainResult(rd.path, steps_done, before, after, clock)


def draw_tasks(specs: dict[str, DomainSpec], counts: dict[str, int], seed: int, step: int) -> list[Task]:
    """A step's training prompts: counts[d] train tasks of each domain d, seeded by (run seed, step, d)."""
    return [t for d, k in counts.items() for t in specs[d].source.sample("train", k, step_seed(seed, step, d))]


def rollout_sampling(seed: int, step: int) -> Callable[[DomainSpec], SamplingParams]:
    """Each domain's rollout sampling at a step: its own settings, one seed per (run seed, step)."""
    step_sampling_seed = step_seed(seed, step, "rollout")
    return lambda spec: replace(spec.sampling, seed=step_sampling_seed)


def capability(evaluation: dict[str, dict]) -> dict[str, float]:
    """What the curriculum tracks of an evaluation: each domain's held-out mean reward."""
    return {d: r["accuracy"] for d, r in evaluation.items()}


def step_metrics(step: int, groups: list[Group], flat: torch.Tensor, stats: dict, times: dict,
                 engine: dict | None = None) -> dict:
    """The metrics.jsonl line of one step: global timings, the update's statistics (update()),
    the engine's counters for the rollout (prefill computed vs cached, prefix hit rate,
    decode tokens, batch occupancy, preemptions; engine/stats.py) when it keeps them, plus
    a block per domain."""
    tokens = sum(len(x.generated_ids) for g in groups for x in g.samples)
    record = {"step": step, "time": {k: round(v, 4) for k, v in times.items()},
              "tokens_per_s": round(tokens / max(times["rollout"], 1e-9), 1),
              "step_time": round(sum(times.values()), 4),
              "loss": stats.get("loss"), "grad_norm": stats.get("grad_norm"),
              "ratio_mean": stats.get("ratio_mean"), "clip_frac": stats.get("clip_frac"), "domains": {}}
    if engine:
        record["engine"] = engine
    for d in sorted({g.task.domain for g in groups}):
        idx = [i for i, g in enumerate(groups) if g.task.domain == d]
        samples = [(s, x) for i in idx for s, x in zip(groups[i].scores, groups[i].samples)]
        dstats = stats.get("domains", {}).get(d, {})
        record["domains"][d] = {
            "reward": sum(s.value for s, _ in samples) / len(samples),
            "response_length": sum(len(x.generated_ids) for _, x in samples) / len(samples),
            "truncated": sum(x.finish_reason == "length" for _, x in samples) / len(samples),
            "groups": len(idx),
            "dropped_zero_variance": int(sum(bool(flat[i]) for i in idx)),
            "kl": dstats.get("kl"), "entropy": dstats.get("entropy"), "clip_frac": dstats.get("clip_frac"),
        }
    return record


def trajectory_records(step: int, groups: list[Group]) -> list[dict]:
    """One line per sample; an agent sample also carries its whole episode (calls, tool results)."""
    return [
        {"step": step, "task_id": g.task.id, "domain": g.task.domain, "group": gi, "sample": j,
         "prompt": g.task.prompt, **x.record(), "token_ids": x.generated_ids,
         "logprobs": [round(v, 5) for v in x.generated_logprobs], "finish_reason": x.finish_reason,
         "reward": s.value, "details": s.details, "weight_version": x.weight_version, "answer": g.task.answer}
        for gi, g in enumerate(groups) for j, (x, s) in enumerate(zip(g.samples, g.scores))
    ]


def save_checkpoint(rd: RunDir, policy, model_dir: Path, name: str) -> None:
    target = rd.checkpoint_dir(name)
    target.mkdir(parents=True, exist_ok=True)
    save_pretrained(policy, policy.cfg, target)
    rd.copy_tokenizer(model_dir, target)
