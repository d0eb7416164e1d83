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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from polyrl.config import RunConfig
from polyrl.engine.factory import build_engine
from polyrl.engine.stats import counter_delta, engine_counters
from polyrl.models.hf_io import save_pretrained
from polyrl.rl.advantages import group_advantages, zero_variance_groups
from polyrl.rl.curriculum import CapabilityCurriculum, allocate
from polyrl.rl.kl_control import PerDomainKL
from polyrl.rl.loss import clipped_tokens, kl_k3, kl_penalty, policy_loss
from polyrl.rl.overlong import overlong_mask, overlong_rewards
from polyrl.obs.store import ObsStore
from polyrl.quality.quarantine import RewardMonitor
from polyrl.rollout.dispatch import record_episodes, rollout_groups
from polyrl.rollout.groups import Group, score_groups
from polyrl.sandbox.execution_log import ExecutionLog
from polyrl.train.batch import build_batch, token_entropy, token_logprobs
from polyrl.train.display import Display
from polyrl.train.evaluate import evaluate
from polyrl.train.packing import piece_logits, plan
from polyrl.train.run_dir import RunDir
from polyrl.train.setup import Domains, build_curriculum, build_domains, load_policy, resolve_model_dir, step_seed


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
    of resume, and for budgeting work across sessions.
    """
    rd = RunDir(run_dir)
    torch.manual_seed(cfg.seed)
    model_dir = resolve_model_dir(cfg.model.path, log=log)
    policy, tokenizer = load_policy(model_dir, cfg.model.dtype)
    engine = build_engine(cfg.engine, copy.deepcopy(policy), tokenizer, model_dir)
    doms = build_domains(cfg, ExecutionLog(rd.executions))
    obs = ObsStore.in_run_dir(rd.path) if doms.agents.toolbox_for else None  # agent calls, tools, verdicts
    doms.agents.recorder, doms.agents.context_window = obs, policy.cfg.max_position_embeddings
    curriculum = build_curriculum(cfg, doms.weights)  # None: static weights
    kl = PerDomainKL(doms.kl_coef, doms.kl_target, cfg.trainer.kl_horizon)
    uses_kl = any(c > 0 for c in doms.kl_coef.values())
    ref = copy.deepcopy(policy).eval().requires_grad_(False) if uses_kl else None
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.trainer.lr, betas=(0.9, 0.99),
                                  weight_decay=cfg.trainer.weight_decay)
    heldout = {name: d.sample("heldout", cfg.eval.heldout_per_domain, seed=cfg.seed) for name, d in doms.domains.items()}

    def run_eval(step: int) -> dict:
        return evaluate(engine, tokenizer, heldout, doms.verifiers, doms.verifier_of,
                        {d: replace(p, seed=step_seed(cfg.seed, step, "eval")) for d, p in doms.eval_sampling.items()},
                        cfg.eval.samples, cfg.eval.greedy, doms.agents, f"eval{step}", doms.check_of)

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
    monitor = RewardMonitor()  # suspicious reward patterns -> RUN_DIR/flags.jsonl (polyrl/quality/quarantine.py)
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
        weights, weight_reasons = (curriculum.weights, curriculum.reasons) if curriculum else (doms.weights, None)
        counts = allocate(cfg.trainer.prompts_per_step, weights)
        tasks = [t for d, k in counts.items() for t in doms.domains[d].sample("train", k, step_seed(cfg.seed, step, d))]
        sampling = {d: replace(p, seed=step_seed(cfg.seed, step, "rollout")) for d, p in doms.sampling.items()}
        groups = rollout_groups(engine, tokenizer, tasks, cfg.trainer.group_size, sampling, doms.agents, f"s{step}")
        t1 = time.perf_counter()
        rollout_counters = counter_delta(counters0, engine_counters(engine))
        rollout_tokens += sum(len(c.token_ids) for g in groups for c in g.completions)
        # 2. reward
        score_groups(groups, doms.verifiers, doms.verifier_of)
        record_episodes(groups, obs)
        t2 = time.perf_counter()
        # 3. advantage, with zero-variance groups dropped (they carry no signal)
        rewards = torch.tensor([overlong_rewards(g.rewards, [c.finish_reason for c in g.completions],
                                                 cfg.trainer.overlong) for g in groups])
        flat = zero_variance_groups(rewards) if cfg.trainer.drop_zero_variance else torch.zeros(len(groups), dtype=torch.bool)
        adv = group_advantages(rewards, [g.task.domain for g in groups])
        keep = [i for i in range(len(groups)) if not flat[i]]
        # 4. loss and optimizer step
        stats, coefs = {}, dict(kl.coefs)
        if keep:
            kept = [groups[i] for i in keep]
            masks = [overlong_mask([c.finish_reason for c in g.completions], cfg.trainer.overlong) for g in kept]
            batch = build_batch(kept, [adv[i].tolist() for i in keep], masks, coefs)
            stats = update(policy, ref, optimizer, batch, cfg, step)
            engine.update_weights(policy.state_dict(), version=step + 1)
            kl.update({d: stats[d]["kl"] for d in counts if d in stats},
                      {d: sum(len(g.completions) for g in kept if g.task.domain == d) for d in counts})
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
        rd.append(rd.flags, monitor.step(step, groups, record, doms.verifier_of))
        if (step + 1) % cfg.trainer.checkpoint_every == 0:
            save_checkpoint(rd, policy, model_dir, f"step-{step + 1:06d}")
        rd.save_state({"step": step + 1, "clock": clock, "rollout_tokens": rollout_tokens,
                       "policy": policy.state_dict(), "optimizer": optimizer.state_dict(),
                       "curriculum": curriculum.state_dict() if curriculum else None, "kl": kl.state_dict()})
        display.step(record)
        steps_done = step + 1
        if stop_after is not None and steps_done - start_step >= stop_after:
            display.close()
            doms.close()
            if obs:
                obs.close()
            return TrainResult(rd.path, steps_done, before, None, clock)
    display.close()

    after = run_eval(steps_done)
    rd.write_json(rd.eval_file("after"), after)
    save_checkpoint(rd, policy, model_dir, "final")
    doms.close()
    if obs:
        obs.close()
    display.summary(before, after, rd.path, clock)
    return TrainResult(rd.path, steps_done, before, after, clock)


def capability(evaluation: dict[str, dict]) -> dict[str, float]:
    """What the curriculum tracks of an evaluation: each domain's held-out mean reward."""
    return {d: r["accuracy"] for d, r in evaluation.items()}


def update(policy, ref, optimizer, batch, cfg: RunConfig, step: int) -> dict:
    """ppo_epochs passes of minibatch updates over one rollout batch; returns per-domain stats
    (KL, entropy, clip fraction) measured on the first pass.

    Each minibatch is one optimizer step over its pieces (train/packing.py: shared prefixes
    computed once, rows in length-sorted micro-batches of at most trainer.micro_batch_tokens),
    whose gradients add up to the whole minibatch's."""
    tc = cfg.trainer
    temperature = cfg.engine.temperature
    policy.train()
    ref_logp = reference_logprobs(ref, batch, tc, temperature) if ref is not None else None
    g = torch.Generator().manual_seed(step_seed(cfg.seed, step, "minibatch"))
    per_domain: dict[str, dict[str, list]] = {}
    for epoch in range(tc.ppo_epochs):
        order = torch.randperm(len(batch), generator=g)
        for rows in order.chunk(tc.minibatches):
            mb = batch.select(rows)
            mb_ref = ref_logp[rows] if ref_logp is not None else None
            count = mb.mask.sum().clamp(min=1.0)
            optimizer.zero_grad(set_to_none=True)
            loss_sum, pstats = 0.0, {"clip_frac": 0.0, "ratio_mean": 0.0}
            for piece in plan(mb, tc.micro_batch_tokens, tc.shared_prefix):
                mask, targets, old_logp = piece.take(mb.mask), piece.take(mb.targets), piece.take(mb.old_logp)
                adv, coef = mb.advantages[piece.rows], mb.kl_coef[piece.rows]
                logits = piece_logits(policy, piece, piece.take(mb.input_ids))  # (b, S, V)
                logp = token_logprobs(logits, targets, temperature)
                loss, part = policy_loss(logp, old_logp, adv, mask, tc.clip_low, tc.clip_high, count)
                piece_ref = piece.take(mb_ref) if mb_ref is not None else None
                if piece_ref is not None:
                    loss = loss + kl_penalty(logp, piece_ref, coef, mask, count)
                loss.backward()
                loss_sum += loss.item()
                pstats = {k: pstats[k] + part[k] for k in pstats}
                if epoch == 0:
                    with torch.no_grad():
                        domains = [mb.domains[i] for i in piece.rows.tolist()]
                        kl = kl_k3(logp, piece_ref) if piece_ref is not None else torch.zeros_like(logp)
                        add_domain_stats(per_domain, domains, mask, {
                            "kl": kl, "entropy": token_entropy(logits, temperature),
                            "clip_frac": clipped_tokens(logp, old_logp, adv, tc.clip_low, tc.clip_high)})
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), tc.max_grad_norm)
            optimizer.step()
    policy.eval()
    out = {"grad_norm": grad_norm.item(), "loss": loss_sum, "ratio_mean": pstats["ratio_mean"]}
    for d, acc in per_domain.items():
        n = max(sum(acc["tokens"]), 1.0)
        out[d] = {k: sum(acc[k]) / n for k in ("kl", "entropy", "clip_frac")}
    return out


@torch.no_grad()
def reference_logprobs(ref, batch, tc, temperature: float) -> torch.Tensor:
    """(B, T) the reference policy's logprobs of the batch's targets, in the batch's layout."""
    out = torch.zeros_like(batch.old_logp)
    for piece in plan(batch, tc.micro_batch_tokens, tc.shared_prefix):
        logits = piece_logits(ref, piece, piece.take(batch.input_ids))
        piece.put(out, token_logprobs(logits, piece.take(batch.targets), temperature))
    return out


def add_domain_stats(per_domain: dict, domains: list[str], mask: torch.Tensor, values: dict[str, torch.Tensor]) -> None:
    """Accumulate token-weighted sums of per-token values (b, S) over each domain's masked tokens."""
    for d in set(domains):
        m = mask * torch.tensor([x == d for x in domains], dtype=torch.float32)[:, None]
        acc = per_domain.setdefault(d, {"kl": [], "entropy": [], "clip_frac": [], "tokens": []})
        n = float(m.sum())
        acc["tokens"].append(n)
        for key, value in values.items():
            acc[key].append(float((value * m).sum()))


def step_metrics(step: int, groups: list[Group], flat: torch.Tensor, stats: dict, times: dict,
                 engine: dict | None = None) -> dict:
    """The metrics.jsonl line of one step: global timings, the engine's counters for the
    rollout (prefill computed vs cached, prefix hit rate, decode tokens, batch occupancy,
    preemptions; engine/stats.py) when it keeps them, plus a block per domain."""
    tokens = sum(len(c.token_ids) for g in groups for c in g.completions)
    record = {"step": step, "time": {k: round(v, 4) for k, v in times.items()},
              "tokens_per_s": round(tokens / max(times["rollout"], 1e-9), 1),
              "step_time": round(sum(times.values()), 4),
              "loss": stats.get("loss"), "grad_norm": stats.get("grad_norm"), "domains": {}}
    if engine:
        record["engine"] = engine
    for d in sorted({g.task.domain for g in groups}):
        idx = [i for i, g in enumerate(groups) if g.task.domain == d]
        samples = [(s, c) for i in idx for s, c in zip(groups[i].scores, groups[i].completions)]
        dstats = stats.get(d, {})
        record["domains"][d] = {
            "reward": sum(s.value for s, _ in samples) / len(samples),
            "response_length": sum(len(c.token_ids) for _, c in samples) / len(samples),
            "truncated": sum(c.finish_reason == "length" for _, c in samples) / len(samples),
            "groups": len(idx),
            "dropped_zero_variance": int(sum(bool(flat[i]) for i in idx)),
            "kl": dstats.get("kl"), "entropy": dstats.get("entropy"), "clip_frac": dstats.get("clip_frac"),
        }
    return record


def trajectory_records(step: int, groups: list[Group]) -> list[dict]:
    """One line per sample; an agent sample also carries its whole episode (calls, tool results)."""
    return [
        {"step": step, "task_id": g.task.id, "domain": g.task.domain, "group": gi, "sample": j,
         "prompt": g.task.prompt, "prompt_ids": g.prompt_ids, "completion": c.text, "token_ids": c.token_ids,
         "logprobs": [round(x, 5) for x in c.logprobs], "finish_reason": c.finish_reason,
         "reward": s.value, "details": s.details, "weight_version": c.weight_version, "answer": g.task.answer,
         **({"episode": g.episodes[j].result.to_json()} if g.episodes else {})}
        for gi, g in enumerate(groups) for j, (c, s) in enumerate(zip(g.completions, g.scores))
    ]


def save_checkpoint(rd: RunDir, policy, model_dir: Path, name: str) -> None:
    target = rd.checkpoint_dir(name)
    target.mkdir(parents=True, exist_ok=True)
    save_pretrained(policy, policy.cfg, target)
    rd.copy_tokenizer(model_dir, target)
