"""Held-out evaluation: a fixed task set per domain, scored by the domain's verifier.

Accuracy is the mean reward of `samples` completions per task at the rollout
temperature (sampled pass@1, averaged: the policy RL actually trains); greedy accuracy
on the same tasks is reported beside it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from polyrl.engine.base import Engine, SamplingParams
from polyrl.models.tokenizer import Tokenizer
from polyrl.rewards.base import Verifier
from polyrl.rollout.groups import sample_groups, score_groups
from polyrl.types import Task


def evaluate(engine: Engine, tokenizer: Tokenizer, heldout: dict[str, list[Task]], verifiers: dict[str, Verifier],
             default_verifier: dict[str, str], sampling: dict[str, SamplingParams], samples: int,
             greedy: bool) -> dict[str, dict[str, float]]:
    results = {}
    for domain, tasks in heldout.items():
        groups = sample_groups(engine, tokenizer, tasks, samples, sampling)
        score_groups(groups, verifiers, default_verifier)
        rewards = [r for g in groups for r in g.rewards]
        statuses = Counter(s.details.get("status", "?") for g in groups for s in g.scores)
        lengths = [len(c.token_ids) for g in groups for c in g.completions]
        result = {"accuracy": sum(rewards) / len(rewards), "tasks": len(tasks), "samples": samples,
                  "mean_length": sum(lengths) / len(lengths), "statuses": dict(statuses)}
        if greedy:
            greedy_sampling = {d: replace(p, temperature=0.0) for d, p in sampling.items()}
            g_groups = sample_groups(engine, tokenizer, tasks, 1, greedy_sampling)
            score_groups(g_groups, verifiers, default_verifier)
            result["greedy_accuracy"] = sum(g.rewards[0] for g in g_groups) / len(g_groups)
        results[domain] = result
    return results
