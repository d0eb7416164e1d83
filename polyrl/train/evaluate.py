"""Held-out evaluation: a fixed task set per domain, scored by the domain's verifier.

Accuracy is the mean reward of `samples` responses per task at the rollout
temperature (sampled pass@1, averaged: the policy RL actually trains); greedy accuracy
on the same tasks is reported beside it. Agent domains run whole episodes and also
report their success rate, steps and tokens per success (what success_minus_cost
charges; prompt + completion tokens of every model call). A domain with an independent
check (`DomainSpec.check`, e.g. alignment's rule_check beside its reward model) also
reports `check_accuracy`: the check's mean score on the very same sampled responses,
which the reward-hacking detector (train/monitor.py) compares with `accuracy`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from polyrl.obs.records import Recorder
from polyrl.rewards.base import Verifier
from polyrl.rollout.dispatch import Rollout, record_episodes
from polyrl.rollout.episodes import Episode
from polyrl.rollout.groups import Group, score_groups
from polyrl.rollout.spec import DomainSpec
from polyrl.types import Task


@dataclass
class EvalRollout:
    """The generated half of an evaluation: per domain, `samples` sampled responses per task
    and (greedy) one greedy response per task, not yet scored. It travels from the engine's
    role to the reward role in an asynchronous run (polyrl/pipeline/)."""

    version: int
    """The weight version every response was generated with."""
    sampled: dict[str, list[Group]]
    greedy: dict[str, list[Group]] = field(default_factory=dict)
    samples: int = 1


def eval_domains(domains: Sequence[str], step: int, every: int, per_eval: int | None) -> list[str]:
    """The domains the held-out evaluation of `step` (during training, a multiple of `every`)
    scores: all of them when per_eval is None or covers them; else the next `per_eval` of the
    sorted names after the previous evaluation's, wrapping around. Evaluation n = step / every
    (n >= 1) starts at name (n - 1) * per_eval mod D, so any ceil(D / per_eval) evaluations in
    a row score every domain at least once."""
    names = sorted(domains)
    if per_eval is None or per_eval >= len(names) or every <= 0:
        return names
    start = (max(step // every, 1) - 1) * per_eval % len(names)
    return sorted(names[(start + j) % len(names)] for j in range(per_eval))


def evaluate(rollout: Rollout, heldout: Mapping[str, list[Task]], verifiers: Mapping[str, Verifier], seed: int,
             samples: int, greedy: bool, trace_prefix: str = "eval") -> dict[str, dict]:
    """Per domain of `heldout`: accuracy and the figures above; `seed` seeds the sampling."""
    return score_eval(eval_rollout(rollout, heldout, seed, samples, greedy, trace_prefix), verifiers, rollout.specs,
                      rollout.recorder)


def eval_rollout(rollout: Rollout, heldout: Mapping[str, list[Task]], seed: int, samples: int, greedy: bool,
                 trace_prefix: str = "eval") -> EvalRollout:
    """Generate every held-out response (domain by domain: sampled, then greedy)."""
    out = EvalRollout(rollout.engine.weight_version, {}, {}, samples)
    for domain, tasks in heldout.items():
        out.sampled[domain] = rollout.groups(tasks, samples, lambda s: replace(s.eval_sampling, seed=seed), trace_prefix)
        if greedy:
            out.greedy[domain] = rollout.groups(tasks, 1, lambda s: replace(s.eval_sampling, seed=seed, temperature=0.0),
                                                f"{trace_prefix}-greedy")
    return out


def score_eval(generated: EvalRollout, verifiers: Mapping[str, Verifier], specs: Mapping[str, DomainSpec],
               recorder: Recorder | None = None) -> dict[str, dict]:
    """Score an EvalRollout: per domain, accuracy and the figures in the module docstring."""
    results = {}
    for domain, groups in generated.sampled.items():
        spec = specs[domain]
        score_groups(groups, verifiers, specs)
        record_episodes(groups, recorder)
        scores = [s for g in groups for s in g.scores]
        rewards = [s.value for s in scores]
        statuses = Counter(s.details.get("status", "?") for s in scores)
        lengths = [len(x.generated_ids) for g in groups for x in g.samples]
        result = {"accuracy": sum(rewards) / len(rewards), "tasks": len(groups), "samples": generated.samples,
                  "mean_length": sum(lengths) / len(lengths), "statuses": dict(statuses)}
        if spec.check is not None:
            checked = verifiers[spec.check].score([g.task for g in groups for _ in g.samples],
                                                  [x.response for g in groups for x in g.samples])
            result["check_accuracy"] = sum(s.value for s in checked) / len(checked)
        if any(isinstance(x, Episode) for g in groups for x in g.samples):
            successes = [s for s in scores if s.details.get("success")]
            result["success_rate"] = len(successes) / len(scores)
            result["tokens_per_success"] = (sum(s.details.get("tokens", 0) for s in scores) / len(successes)
                                            if successes else None)
            result["steps_per_success"] = (sum(s.details.get("steps", 0) for s in successes) / len(successes)
                                           if successes else None)
        if domain in generated.greedy:
            g_groups = generated.greedy[domain]
            score_groups(g_groups, verifiers, specs)
            result["greedy_accuracy"] = sum(g.scores[0].value for g in g_groups) / len(g_groups)
        results[domain] = result
    return results
