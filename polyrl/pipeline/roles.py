"""The pipeline's roles and what travels between them.

    Ticket        trainer -> rollout    step t may start: its version, weights, domain counts
    RolloutBatch  rollout -> reward     step t's groups, unscored, with the rollout's figures
    EvalBatch     rollout -> reward     a held-out evaluation generated at one version
    (both come back scored)    reward -> trainer

A role is built where it runs (this process, or a Ray actor: ray_roles.py) from the run
config, so nothing live crosses a process boundary: only tickets, batches, scores and
observability records, all plain data. Observability records made while a role works
(agent model and tool calls, episode verdicts) travel with the batch and are written by
the trainer when it commits the step, so a resumed run never keeps a killed step's.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

import torch

from polyrl.config import RunConfig
from polyrl.engine.factory import build_engine
from polyrl.engine.stats import counter_delta, engine_counters, sum_deltas
from polyrl.models.loading import load_policy
from polyrl.obs.records import ListRecorder, ObsRecord
from polyrl.pipeline.shared_engine import SharedEngine
from polyrl.rollout.dispatch import Rollout, record_episodes
from polyrl.rollout.groups import Group, score_groups
from polyrl.sandbox.execution_log import ExecutionLog, shard_log
from polyrl.train.evaluate import EvalRollout, eval_domains, eval_rollout, score_eval
from polyrl.train.setup import build_domains, draw_tasks, rollout_sampling, step_seed
from polyrl.types import Score, Task


@dataclass
class Ticket:
    """Permission to roll out `step`, with what it needs."""

    step: int
    version: int
    """the weight version this step samples with (staleness.py)"""
    counts: dict[str, int]
    """training prompts per domain"""
    weights: dict[str, torch.Tensor] | None = None
    """the weights of `version`, when the rollout role does not hold them yet"""
    eval_step: int | None = None
    """run the held-out evaluation of this step (train/loop.py: "eval{step}") at `version` first"""
    shard: tuple[int, int] = (0, 1)
    """(i, n): roll out the step's prompts i, i + n, i + 2n, ... (one engine of a rollout pool)"""
    levels: dict[str, tuple[float, ...]] | None = None
    """level weights of the domains with a level curriculum, for this step's draw (rl/level_curriculum.py)"""


@dataclass
class RolloutBatch:
    step: int
    version: int
    groups: list[Group]
    rollout_seconds: float
    sync_seconds: float
    """time the rollout role spent taking new weights before this batch"""
    engine: dict = field(default_factory=dict)
    """the engine's counters over this rollout (engine/stats.py)"""
    records: list[ObsRecord] = field(default_factory=list)
    reward_seconds: float = 0.0
    order: list[int] = field(default_factory=list)
    """each group's prompt's index among the step's prompts (to merge a rollout pool's shards)"""


@dataclass
class EvalBatch:
    step: int
    """the evaluation of this step (eval/before.json is step 0)"""
    version: int
    generated: EvalRollout | None
    records: list[ObsRecord] = field(default_factory=list)
    results: dict | None = None
    """per domain, once scored (train/evaluate.py)"""
    line: int | None = None
    """the step whose metrics line reports it (its execution records carry that step); None: `step`"""


def merge_shards(shards: list[RolloutBatch]) -> RolloutBatch:
    """One step's batch from the batches of a rollout pool's engines (Ticket.shard): the groups
    in the order of the step's prompts, the slowest engine's seconds, the engines' counters
    summed, the oldest version."""
    if len({b.step for b in shards}) != 1:
        raise ValueError(f"shards of different steps {[b.step for b in shards]}")
    placed = sorted(((k, n, g) for n, b in enumerate(shards) for k, g in zip(b.order, b.groups)), key=lambda x: x[:2])
    return RolloutBatch(shards[0].step, min(b.version for b in shards), [g for _, _, g in placed],
                        max(b.rollout_seconds for b in shards), max(b.sync_seconds for b in shards),
                        sum_deltas([b.engine for b in shards]), [r for b in shards for r in b.records],
                        order=[k for k, _, _ in placed])


class RolloutRole:
    """The engine and the domains' rollout settings: tickets in, unscored batches out."""

    def __init__(self, cfg: RunConfig, model_dir: Path, heldout: Mapping[str, list[Task]] | None = None) -> None:
        policy, tokenizer = load_policy(model_dir, cfg.model.dtype)
        self.cfg = cfg
        self.engine = build_engine(cfg.engine, policy, tokenizer, model_dir)
        self.specs = build_domains(cfg, verifiers=False).specs
        positions = policy.cfg.max_position_embeddings
        self.shared = SharedEngine(self.engine, cfg.scheduler) if cfg.scheduler is not None else None
        if self.shared is None:
            self.rollout = self.eval_rollout = Rollout(self.engine, tokenizer, self.specs, positions)
        else:  # training rollouts and evaluation as two loads of one engine (scheduler.py)
            self.rollout = Rollout(self.shared.client("train"), tokenizer, self.specs, positions)
            self.eval_rollout = Rollout(self.shared.client("eval"), tokenizer, self.specs, positions)
        self.heldout = dict(heldout or {})

    def sync(self, weights: Mapping[str, torch.Tensor], version: int) -> float:
        """Take new weights; returns the seconds it took."""
        start = time.perf_counter()
        (self.shared or self.engine).update_weights(weights, version=version)
        return time.perf_counter() - start

    def run(self, ticket: Ticket) -> list[RolloutBatch | EvalBatch]:
        """The ticket's evaluation (if any) and its rollout, each at ticket.version: one after
        the other, or with a scheduler both at once, sharing the engine's slots."""
        sync = self.sync(ticket.weights, ticket.version) if ticket.weights is not None else 0.0
        if ticket.eval_step is None:
            return [self.roll(ticket, sync)]
        if self.shared is None:
            return [self.evaluate(ticket.eval_step, ticket.step), self.roll(ticket, sync)]
        with ThreadPoolExecutor(1, thread_name_prefix="polyrl-eval") as beside:
            evaluation = beside.submit(self.evaluate, ticket.eval_step, ticket.step)
            batch = self.roll(ticket, sync)
            return [evaluation.result(), batch]

    def roll(self, ticket: Ticket, sync_seconds: float = 0.0) -> RolloutBatch:
        recorder = self.rollout.recorder = ListRecorder()
        start, counters = time.perf_counter(), engine_counters(self.engine)
        index, shards = ticket.shard
        drawn = draw_tasks(self.specs, ticket.counts, self.cfg.seed, ticket.step, ticket.levels)
        mine = {id(t): k for k, t in enumerate(drawn) if k % shards == index}
        tasks = [t for t in drawn if id(t) in mine]
        groups = self.rollout.groups(tasks, self.cfg.trainer.group_size, rollout_sampling(self.cfg.seed, ticket.step),
                                     f"s{ticket.step}" if shards == 1 else f"s{ticket.step}-{index}")
        return RolloutBatch(ticket.step, self.engine.weight_version, groups, time.perf_counter() - start, sync_seconds,
                            counter_delta(counters, engine_counters(self.engine)), recorder.records,
                            order=[mine[id(g.task)] for g in groups])

    def evaluate(self, step: int, line: int | None = None, every_domain: bool = False) -> EvalBatch:
        """The held-out tasks' responses for the evaluation of `step`, at the engine's current
        version, unscored; `line`: the step whose metrics line will report it. An evaluation during
        training scores eval.domains_per_eval domains in rotation (eval_domains); `every_domain`
        (before and after training) all of them."""
        recorder = self.eval_rollout.recorder = ListRecorder()
        c = self.cfg.eval
        heldout = self.heldout if every_domain else {
            d: self.heldout[d] for d in eval_domains(list(self.heldout), step, c.every, c.domains_per_eval)}
        generated = eval_rollout(self.eval_rollout, heldout, step_seed(self.cfg.seed, step, "eval"), c.samples,
                                 c.greedy, f"eval{step}")
        return EvalBatch(step, generated.version, generated, recorder.records, line=line)

    def close(self) -> None:
        (self.shared or self.engine).close()


class RewardRole:
    """The verifiers (sandbox pool, reward models): batches in, scores out."""

    def __init__(self, cfg: RunConfig, executions: Path | None = None, shard: int = 0) -> None:
        """`shard`: this role's place in a pool of reward actors (ray_roles.py); its code
        executions go to that writer's log beside `executions` (execution_log.shard_log)."""
        self.log = None
        if executions is not None:
            path, prefix = shard_log(executions, shard)
            self.log = ExecutionLog(path, prefix=prefix)
        self.domains = build_domains(cfg, self.log)
        self.specs = self.domains.specs

    def score(self, groups: list[Group]) -> tuple[list[list[Score]], list[ObsRecord]]:
        """Every sample's score, and the episode verdict records of agent groups."""
        score_groups(groups, self.domains.verifiers, self.specs)
        recorder = ListRecorder()
        record_episodes(groups, recorder)
        return [g.scores for g in groups], recorder.records

    def score_eval(self, generated: EvalRollout) -> tuple[dict, list[ObsRecord]]:
        recorder = ListRecorder()
        return score_eval(generated, self.domains.verifiers, self.specs, recorder), recorder.records

    def finish(self, item: RolloutBatch | EvalBatch) -> RolloutBatch | EvalBatch:
        """Score `item` (in place where it is local): what the reward stage does to each."""
        start = time.perf_counter()
        if self.log is not None:  # its execution records carry the step a resumed run would repeat
            self.log.step = item.step if isinstance(item, RolloutBatch) or item.line is None else item.line
        if isinstance(item, EvalBatch):
            assert item.generated is not None
            results, records = self.score_eval(item.generated)
            return replace(item, generated=None, results=results, records=item.records + records)
        scores, records = self.score(item.groups)
        for g, s in zip(item.groups, scores):
            g.scores = s
        return replace(item, records=item.records + records, reward_seconds=time.perf_counter() - start)

    def close(self) -> None:
        self.domains.close()
