"""The training loop: rollout -> reward -> advantage -> loss -> step, top to bottom.

The trainer's side of the pipeline (polyrl/pipeline/): the rollout and reward roles run
in threads of this process, or as Ray actors (cluster.backend), joined to it by bounded
queues; this loop admits rollout tickets, takes each step's scored batch in order,
updates the policy and sends the rollout role new weights with a version.

    trainer.max_staleness: 0   the synchronous loop: step t is rolled out with the weights
                               of step t-1's update, held-out evaluation runs between steps
    trainer.max_staleness: K   step t+K may be rolled out while step t updates: tickets are
                               admitted at the current version, so no sample is more than
                               K versions behind (pipeline/staleness.py); the update corrects
                               with decoupled PPO (rl/offpolicy.py); evaluation runs on the
                               rollout role beside training and is reported on a later line

Two controls sit around the step. The domain shares of each batch come from the
curriculum (static: the run file's weights; capability_curve: moved after every
held-out evaluation, rl/curriculum.py), and each domain's KL coefficient from its own
controller (rl/kl_control.py: adaptive toward rl_tasks[].kl_target, else fixed). Both
are logged on every metrics line with the reason for their values, and saved in the
state for resume. A flag of the reward monitor on a domain acts through both, as the
domain's rl_tasks[].on_flag says (train/flag_policy.py: raise its KL coefficient, cap or
stop its share); the metrics line of the flag's step says what was done and why. Inside a
domain with rl_tasks[].level_curriculum, its levels' shares follow the share of their recent
groups that carried a signal (rl/level_curriculum.py; `level_weights` on the line).

Interruptions: the run directory is locked and, on resume, rolled back to the last whole
step (train/run_dir.py); Ctrl-C ends the run at the next step boundary
(train/interrupts.py). With K > 0 an evaluation still in the pipeline when the run stops
runs on resume, at the resumed run's first version.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from polyrl.config import RunConfig
from polyrl.models.hf_io import save_weights
from polyrl.models.loading import resolve_model_dir
from polyrl.obs.records import PHASE, ObsRecord, Recorder, Tee, stamped
from polyrl.pipeline.backend import one_thread_roles, split_cores, start_roles
from polyrl.pipeline.roles import EvalBatch, RolloutBatch, Ticket
from polyrl.pipeline.staleness import staleness_stats
from polyrl.pipeline.stream import InlineStream, Stream
from polyrl.rl.advantages import group_advantages, zero_variance_groups
from polyrl.rl.curriculum import CapabilityCurriculum, allocate
from polyrl.rl.kl_control import PerDomainKL
from polyrl.rl.level_curriculum import LevelSignal
from polyrl.rl.overlong import overlong_mask, overlong_rewards
from polyrl.rollout.groups import Group
from polyrl.train.batch import build_batch
from polyrl.train.display import Display
from polyrl.train.distributed import SingleProcess, init_from_env
from polyrl.train.flag_policy import FlagPolicy
from polyrl.train.interrupts import StopAtStepBoundary
from polyrl.train.monitor import RewardMonitor
from polyrl.train.run_dir import RunDir
from polyrl.train.setup import build_curriculum, build_domains, level_source, step_seed
from polyrl.train.ranks import Leader, Trainer, follow, lead
from polyrl.train.ray_trainer import RayTrainer, start_ray_trainer


@dataclass
class TrainResult:
    run_dir: Path
    steps_done: int
    before: dict
    after: dict | None
    train_seconds: float


def train(cfg: RunConfig, run_dir: str | Path, resume: bool = False, log: Callable[[str], None] = print,
          stop_after: int | None = None, export: Recorder | None = None) -> TrainResult:
    """Run (or, with resume=True, continue) the run described by cfg in run_dir.

    stop_after ends the process after that many steps as if it had been killed: for tests
    of resume, and for budgeting work across sessions. `export` (an OpenTelemetry recorder,
    obs/otel.py) also receives every observability record the run commits, with its phase. The engine, the verifiers and the
    observability store are closed on every way out, errors included.
    """
    dp = init_from_env(cfg.trainer.device)  # several trainer processes: train/ranks.py
    with ExitStack() as closing:
        closing.callback(dp.close)
        if dp.rank > 0:  # rank 0 runs the loop; this rank makes the collectives it names
            follow(cfg, dp, log)
            return TrainResult(Path(run_dir), 0, {}, None, 0.0)
        leader = Leader(dp)
        closing.callback(leader.stop)  # on every way out: the other ranks end too
        return _train(cfg, RunDir(run_dir), resume, log, stop_after, closing, dp, leader, export)


def _train(cfg: RunConfig, rd: RunDir, resume: bool, log: Callable[[str], None], stop_after: int | None,
           closing: ExitStack, dp: SingleProcess, leader: Leader, export: Recorder | None = None) -> TrainResult:
    state = rd.open(resume, None if resume else cfg.to_yaml())  # the lock; a resumed run's logs rolled back
    closing.callback(rd.close)
    for note in rd.notes:
        log(note)
    if state is not None and rd.finished():
        log(f"{rd.path} has already finished its {state['step']} steps; nothing to do")
        return TrainResult(rd.path, state["step"], rd.read_json(rd.eval_file("before")),
                           rd.read_json(rd.eval_file("after")), state["clock"])
    torch.manual_seed(cfg.seed)
    if cfg.trainer.context_parallel > 1:
        raise RuntimeError(f"trainer.context_parallel: {cfg.trainer.context_parallel} is not wired into polyrl train "
                           "yet (polyrl.train.context_parallel runs under a torchrun launch); set it to 1")
    model_dir = resolve_model_dir(cfg.model.path, log=log)
    specs = build_domains(cfg, verifiers=False).specs
    heldout = {d: s.source.sample("heldout", cfg.eval.heldout_per_domain, seed=cfg.seed) for d, s in specs.items()}
    roles = start_roles(cfg, model_dir, heldout, rd.executions)
    closing.callback(roles.close)
    store = rd.obs_store()  # every model call, agent tool calls and verdicts; training and evaluation apart
    closing.callback(store.close)
    obs = Tee(store, export)
    curriculum = build_curriculum(cfg, {d: s.weight for d, s in specs.items()})  # None: static weights
    level_signal = LevelSignal({t.run_name: level_source(specs[t.run_name].source).levels
                                for t in cfg.domain_tasks() if t.level_curriculum})  # levels inside a domain
    kl = PerDomainKL({d: s.kl_coef for d, s in specs.items()}, {d: s.kl_target for d, s in specs.items()},
                     cfg.trainer.kl_horizon, rate=cfg.trainer.kl_rate)
    on_flag = FlagPolicy({t.run_name: t.on_flag for t in cfg.domain_tasks()})
    uses_kl = any(s.kl_coef > 0 for s in specs.values()) or any("raise_kl" in t.on_flag.actions for t in cfg.rl_tasks)
    if cfg.cluster.trainer_actors:  # in Ray actors of its own (FSDP among them)
        if dp.world_size > 1:
            raise RuntimeError("cluster.trainer_actors runs the trainer's ranks as Ray actors: launch one driver, "
                               "without --nproc or torchrun")
        trainer = start_ray_trainer(cfg, model_dir, uses_kl)
        closing.callback(trainer.close)
    else:  # here, and on every rank of a launch (ranks.py)
        trainer = lead(cfg, dp, leader, model_dir, uses_kl)
    K = cfg.trainer.max_staleness
    stop = closing.enter_context(StopAtStepBoundary(log))  # Ctrl-C: end at the next step boundary

    def run_eval(step: int, line: int, every_domain: bool = False) -> dict:
        # both roles idle, the engine holding the policy's weights; every_domain: before and after training
        scored = roles.reward.finish(roles.rollout.evaluate(step, line, every_domain))
        write_records(obs, scored.records, "eval")
        return scored.results

    if state is None:
        log(f"evaluating the base model on {cfg.eval.heldout_per_domain} held-out tasks per domain")
        before = run_eval(0, 0, True)
        rd.write_json(rd.eval_file("before"), before)
        if curriculum:
            curriculum.update(0, capability(before))
        start_step, clock, rollout_tokens, version = 0, 0.0, 0, 0
    else:
        trainer.load(state)
        version = state.get("policy_version", state["step"])
        roles.rollout.sync(trainer.weights(), version)
        before, start_step, clock = rd.read_json(rd.eval_file("before")), state["step"], state["clock"]
        rollout_tokens = state.get("rollout_tokens", 0)
        if curriculum and state.get("curriculum"):
            curriculum = CapabilityCurriculum.from_state(state["curriculum"], curriculum.settings)
        if state.get("kl"):
            kl = PerDomainKL.from_state(state["kl"])
        on_flag.load_state_dict(state.get("on_flag"))
        level_signal.load_state_dict(state.get("level_signal"))
        log(f"resuming {rd.path} at step {start_step}")

    def shares() -> tuple[dict[str, float], dict | None]:
        """The domain shares a rollout admitted now uses, and their reasons (a stopped domain left out)."""
        if curriculum:
            return on_flag.shares(curriculum.weights, curriculum.reasons)
        return on_flag.shares({d: s.weight for d, s in specs.items()}, None)

    display = Display(cfg.trainer.steps, start_step, before, log)
    closing.callback(display.close)
    monitor = RewardMonitor()  # suspicious reward patterns -> RUN_DIR/flags.jsonl (train/monitor.py)
    monitor.load_state_dict(state.get("monitor") if state else None)
    if cfg.cluster.backend == "inline":
        stream = InlineStream(roles.rollout, roles.reward, depth=K + 1)
    else:
        cores, undo = split_cores(cfg, log)
        closing.callback(undo)
        stream = Stream(roles.rollout, roles.reward, depth=K + 1, one_thread=one_thread_roles(cfg), cores=cores)
    closing.callback(stream.close)
    admitted: dict[int, tuple] = {}  # step -> the shares its rollout drew with (the metrics line names them)
    sparse = len(specs) > cfg.trainer.prompts_per_step  # more domains than a batch holds: reasons only when changed
    said: dict[str, dict[str, str]] = {"weight_reasons": {}, "kl_coef_reasons": {}}  # the reasons logged last

    def admit(step: int, weights: dict | None = None, eval_step: int | None = None) -> bool:
        """Submit step's rollout ticket; False when every domain has been stopped (on_flag)."""
        admitted[step] = shares()
        if not admitted[step][0]:
            return False
        counts = allocate(cfg.trainer.prompts_per_step, admitted[step][0], step_seed(cfg.seed, step, "allocate"))
        stream.submit(Ticket(step, version, counts, weights, eval_step, levels=level_signal.weights() or None))
        return True

    pending = unreported_evals(rd, cfg.eval.every, start_step, cfg.trainer.steps - K) if K > 0 and state else []
    for t in range(start_step, min(start_step + K + 1, cfg.trainer.steps)):  # admitted from the start
        admit(t, eval_step=pending.pop(0) if pending else None)  # a resumed run's evaluations still owed
    engine_version = version  # the version the rollout role holds once its tickets have run
    steps_done = start_step
    mark, idle0 = time.perf_counter(), dict(stream.idle)
    for step in range(start_step, cfg.trainer.steps):
        if stop.requested:
            log(stop.message(rd.path))
            return TrainResult(rd.path, steps_done, before, None, clock)
        if cfg.trainer.max_minutes and clock >= cfg.trainer.max_minutes * 60:
            log(f"stopping at step {step}: trainer.max_minutes={cfg.trainer.max_minutes} reached")
            break
        if cfg.trainer.max_rollout_tokens and rollout_tokens >= cfg.trainer.max_rollout_tokens:
            log(f"stopping at step {step}: trainer.max_rollout_tokens={cfg.trainer.max_rollout_tokens} reached")
            break
        # 1-2. rollout and reward, by the roles (an evaluation they ran beside training comes first)
        item, evals = stream.next(), []
        while isinstance(item, EvalBatch):
            evals.append(item)
            item = stream.next()
        batch: RolloutBatch = item
        assert batch.step == step, (batch.step, step)
        t2 = time.perf_counter()
        groups = batch.groups
        rollout_tokens += sum(len(x.generated_ids) for g in groups for x in g.samples)
        trainer_version = version
        fresh, dropped_stale = split_stale(groups, trainer_version, K)
        # 3. advantage, with zero-variance groups dropped (they carry no signal)
        finished = [[x.finish_reason for x in g.samples] for g in groups]
        rewards = torch.tensor([overlong_rewards(g.rewards, f, cfg.trainer.overlong) for g, f in zip(groups, finished)])
        flat = zero_variance_groups(rewards) if cfg.trainer.drop_zero_variance else torch.zeros(len(groups), dtype=torch.bool)
        adv = group_advantages(rewards, [g.task.domain for g in groups])
        if level_signal.levels:  # the level curriculum follows which levels' groups carried a signal
            no_signal = flat if cfg.trainer.drop_zero_variance else zero_variance_groups(rewards)
            level_signal.update((g.task.domain, g.task.difficulty, not bool(no_signal[i])) for i, g in enumerate(groups))
        keep = [i for i in range(len(groups)) if not flat[i] and fresh[i]]
        # 4. loss and optimizer step
        stats, coefs = {}, dict(kl.coefs)
        if keep:
            kept = [groups[i] for i in keep]
            masks = [overlong_mask(finished[i], cfg.trainer.overlong) for i in keep]
            train_batch = build_batch(kept, [adv[i].tolist() for i in keep], masks, coefs)
            stats = trainer.update(train_batch, step)
            version = step + 1
            domains = batch_domains(groups)
            kl.update({d: stats["domains"][d]["kl"] for d in domains if d in stats["domains"]},
                      {d: sum(len(g.samples) for g in kept if g.task.domain == d) for d in domains})
        t3 = time.perf_counter()

        weights, weight_reasons = admitted.pop(step)
        record = step_metrics(step, groups, flat, stats, {"rollout": batch.rollout_seconds,
                                                          "reward": batch.reward_seconds, "update": t3 - t2},
                              batch.engine)
        record["rollout_tokens"] = rollout_tokens
        record["weights"] = {d: round(w, 4) for d, w in sorted(weights.items())}
        record["weight_reasons"] = reasons_line(weight_reasons or {d: "static: the run file's weight" for d in weights},
                                                said["weight_reasons"], sparse)
        record["kl_coef"] = {d: coefs[d] for d in sorted(coefs)}
        if level_signal.levels:  # the level weights the next admitted step draws with
            record["level_weights"] = {d: dict(zip(map(str, level_signal.levels[d]), w))
                                       for d, w in level_signal.weights().items()}
        record["kl_coef_reasons"] = reasons_line(dict(kl.reasons), said["kl_coef_reasons"], sparse)
        for ev in evals:  # an evaluation the rollout role ran beside training (max_staleness > 0)
            record["eval"] = ev.results
            record["eval_of"] = {"step": ev.step, "version": ev.version}
            if curriculum:
                moved = curriculum.update(ev.step, capability(ev.results))
                record["curriculum_update"] = {"weights": {d: round(w, 4) for d, w in sorted(moved.weights.items())},
                                               "reasons": moved.reasons}
        # 5. admit the next step the roles may start (step + 1 + K) at this version
        eval_due = bool(cfg.eval.every) and (step + 1) % cfg.eval.every == 0 and step + 1 < cfg.trainer.steps
        new_weights = trainer.weights() if version != engine_version else None
        eval_seconds = 0.0
        if eval_due and K == 0:  # synchronous: evaluate now, before the next rollout
            if new_weights is not None:
                roles.rollout.sync(new_weights, version)
                new_weights, engine_version = None, version
            eval_start = time.perf_counter()
            record["eval"] = run_eval(step + 1, step)
            eval_seconds = time.perf_counter() - eval_start
            if curriculum:  # the shares of the steps from here to the next evaluation
                moved = curriculum.update(step + 1, capability(record["eval"]))
                record["curriculum_update"] = {"weights": {d: round(w, 4) for d, w in sorted(moved.weights.items())},
                                               "reasons": moved.reasons}
        flags = monitor.step(step, groups, record, specs)  # suspicious patterns -> flags.jsonl, and what they do
        actions = on_flag.act(step, flags, kl)
        if actions:
            record["flag_actions"] = actions
            for a in actions:
                log(f"step {step}: {a['domain']} flagged ({a['flag']}): {', '.join(a['actions'])}")
        exhausted = False
        if step + 1 + K < cfg.trainer.steps:
            exhausted = not admit(step + 1 + K, new_weights, step + 1 if eval_due and K > 0 else None)
            engine_version = version
        record["pipeline"] = pipeline_metrics(K, batch, trainer_version, dropped_stale, stream, idle0)
        record["pipeline"].update({k: v for k, v in stats.items() if k in ("iw", "mismatch_kl")})
        idle0 = dict(stream.idle)
        now = time.perf_counter()
        clock += now - mark - eval_seconds  # training time: held-out evaluation between steps excluded
        mark = now
        record["clock"] = round(clock, 3)
        write_records(obs, batch.records, "train")
        write_records(obs, [r for ev in evals for r in ev.records], "eval")
        rd.append(rd.metrics, [record])
        rd.append(rd.trajectories, trajectory_records(step, groups))
        rd.append(rd.flags, flags)
        if (step + 1) % cfg.trainer.checkpoint_every == 0:
            save_checkpoint(rd, trainer, model_dir, f"step-{step + 1:06d}", new_weights)
        rd.save_state({"step": step + 1, "clock": clock, "rollout_tokens": rollout_tokens, "policy_version": version,
                       **trainer.state(),
                       "curriculum": curriculum.state_dict() if curriculum else None, "kl": kl.state_dict(),
                       "on_flag": on_flag.state_dict(), "monitor": monitor.state_dict(),
                       "level_signal": level_signal.state_dict()})
        display.step(record)
        steps_done = step + 1
        if stop_after is not None and steps_done - start_step >= stop_after:
            return TrainResult(rd.path, steps_done, before, None, clock)
        if exhausted:
            log(f"stopping after step {step}: every domain has been stopped by its on_flag policy")
            break
    stream.close()  # rollouts admitted past the last step are dropped
    display.close()

    final = trainer.weights()
    roles.rollout.sync(final, version)
    after = run_eval(steps_done, steps_done, True)
    rd.write_json(rd.eval_file("after"), after)
    save_checkpoint(rd, trainer, model_dir, "final", final)
    display.summary(before, after, rd.path, clock)
    return TrainResult(rd.path, steps_done, before, after, clock)


def unreported_evals(rd: RunDir, every: int, start_step: int, last: int) -> list[int]:
    """The held-out evaluations due by `start_step` that no metrics line reports: with
    max_staleness K > 0 they were still in the pipeline when the run stopped. (An evaluation
    rides on the ticket of step e + K, so only those before `last` = steps - K are run at all.)
    A resumed run runs them at its first version (eval_of says which)."""
    if not every:
        return []
    reported = {r["eval_of"]["step"] for r in rd.records(rd.metrics) if r.get("eval_of")}
    return [e for e in range(every, min(start_step + 1, last), every) if e not in reported]


def split_stale(groups: list[Group], version: int, max_staleness: int) -> tuple[list[bool], int]:
    """Which groups are fresh enough to train on (every sample at most max_staleness versions
    behind `version`), and how many samples were not: the admission rule's backstop."""
    fresh = [all(version - x.weight_version <= max_staleness for x in g.samples) for g in groups]
    return fresh, sum(len(g.samples) for g, ok in zip(groups, fresh) if not ok)


def batch_domains(groups: list[Group]) -> list[str]:
    return sorted({g.task.domain for g in groups})


def pipeline_metrics(K: int, batch: RolloutBatch, trainer_version: int, dropped_stale: int, stream: Stream | InlineStream,
                     idle0: dict[str, float]) -> dict:
    """The pipeline's block of a metrics line: how stale the step's samples were (versions
    behind the trainer's at the start of the update), what waited and for how long."""
    return {"max_staleness": K, "behaviour_version": batch.version,
            "staleness": staleness_stats(trainer_version, [x.weight_version for g in batch.groups for x in g.samples]),
            "dropped_stale": dropped_stale, "weight_sync_s": round(batch.sync_seconds, 4),
            "queues": stream.depths(),
            "idle_s": {k: round(v - idle0.get(k, 0.0), 4) for k, v in stream.idle.items()}}


def write_records(obs: Recorder | None, records: list[ObsRecord], phase: str) -> None:
    """Commit a step's observability records with their phase ("train" or "eval"); the store
    tags them with the step in flight, so a resume at that step removes them."""
    if obs is not None:
        for r in stamped(records, **{PHASE: phase}):
            obs.record(r)


def reasons_line(reasons: dict[str, str], said: dict[str, str], sparse: bool) -> dict[str, str]:
    """A metrics line's reasons block: every domain's reason; with `sparse` (a run of more domains
    than prompts per step) only those that changed since the last line, so a line stays the size of
    its batch, not of the run (report/run_data.py's reason_changes reads both the same way)."""
    out = {d: r for d, r in reasons.items() if not sparse or said.get(d) != r}
    said.update(out)
    return out


def capability(evaluation: dict[str, dict]) -> dict[str, float]:
    """What the curriculum tracks of an evaluation: each domain's held-out mean reward."""
    return {d: r["accuracy"] for d, r in evaluation.items()}


def step_metrics(step: int, groups: list[Group], flat: torch.Tensor, stats: dict, times: dict,
                 engine: dict | None = None) -> dict:
    """The metrics.jsonl line of one step: global timings, the update's statistics (update()),
    the engine's counters for the rollout (prefill computed vs cached, prefix hit rate,
    decode tokens, batch occupancy, preemptions; engine/stats.py) when it keeps them, plus
    a block per domain (agent domains also count `budget_stops`: episodes their token budget ended)."""
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
        stops = [getattr(x.response, "stop_reason", None) for _, x in samples]
        if any(stops):  # agent episodes: how many ran out of their token budget
            record["domains"][d]["budget_stops"] = sum(s == "budget" for s in stops)
    return record


def trajectory_records(step: int, groups: list[Group]) -> list[dict]:
    """One line per sample; an agent sample also carries its whole episode (calls, tool results)."""
    return [
        {"step": step, "task_id": g.task.id, "domain": g.task.domain, "group": gi, "sample": j,
         "prompt": g.task.prompt, **x.record(), "token_ids": x.generated_ids,
         "logprobs": [round(v, 5) for v in x.generated_logprobs], "finish_reason": x.finish_reason,
         "reward": s.value, "details": s.details, "weight_version": x.weight_version, "answer": g.task.answer,
         **({"token_versions": x.token_versions} if len(set(x.token_versions)) > 1 else {})}
        for gi, g in enumerate(groups) for j, (x, s) in enumerate(zip(g.samples, g.scores))
    ]


def save_checkpoint(rd: RunDir, trainer: Trainer | RayTrainer, model_dir: Path, name: str,
                    weights: dict[str, torch.Tensor] | None = None) -> None:
    """The policy as a Hugging Face directory in the run's checkpoints (`weights`: its full
    weights when the caller already has them; gathering them is a collective)."""
    weights = trainer.weights() if weights is None else weights
    target = rd.checkpoint_dir(name)
    target.mkdir(parents=True, exist_ok=True)
    save_weights(weights, trainer.model_cfg, target)
    rd.copy_tokenizer(model_dir, target)
