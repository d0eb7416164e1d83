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
from dataclasses import replace
from typing import Mapping

from polyrl.rewards.base import Verifier
from polyrl.rollout.dispatch import Rollout, record_episodes
from polyrl.rollout.groups import score_groups
from polyrl.rollout.episodes import Episode
from polyrl.types import Task


def evaluate(rollout: Rollout, heldout: Mapping[str, list[Task]], verifiers: Mapping[str, Verifier], seed: int,
             samples: int, greedy: bool, trace_prefix: str = "eval") -> dict[str, dict]:
    """Per domain of `heldout`: accuracy and the figures above; `seed` seeds the sampling."""
    results = {}
    for domain, tasks in heldout.items():
        spec = rollout.specs[domain]
        groups = rollout.groups(tasks, samples, lambda s: replace(s.eval_sampling, seed=seed), trace_prefix)
        score_groups(groups, verifiers, rollout.specs)
        record_episodes(groups, rollout.recorder)
        scores = [s for g in groups for s in g.scores]
        rewards = [s.value for s in scores]
        statuses = Counter(s.details.get("status", "?") for s in scores)
        lengths = [len(x.generated_ids) for g in groups for x in g.samples]
        result = {"accuracy": sum(rewards) / len(rewards), "tasks": len(tasks), "samples": samples,
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
        if greedy:
            g_groups = rollout.groups(tasks, 1, lambda s: replace(s.eval_sampling, seed=seed, temperature=0.0),
                                      f"{trace_prefix}-greedy")
            score_groups(g_groups, verifiers, rollout.specs)
            result["greedy_accuracy"] = sum(g.scores[0].value for g in g_groups) / len(g_groups)
        results[domain] = result
    return results
