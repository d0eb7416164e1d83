"""Held-out evaluation: a fixed task set per domain, scored by the domain's verifier.

Accuracy is the mean reward of `samples` completions per task at the rollout
temperature (sampled pass@1, averaged: the policy RL actually trains); greedy accuracy
on the same tasks is reported beside it. Agent domains run whole episodes and also
report their success rate, steps and tokens per success (what success_minus_cost
charges; prompt + completion tokens of every model call). A domain with an independent
check (`check_of`, e.g. alignment's rule_check beside its reward model) also reports
`check_accuracy`: the check's mean score on the very same sampled completions, which
the reward-hacking detector (quality/quarantine.py) compares with `accuracy`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from polyrl.engine.base import Engine, SamplingParams
from polyrl.models.tokenizer import Tokenizer
from polyrl.rewards.base import Verifier
from polyrl.rollout.dispatch import AgentRollout, record_episodes, rollout_groups
from polyrl.rollout.groups import score_groups
from polyrl.types import Task


def evaluate(engine: Engine, tokenizer: Tokenizer, heldout: dict[str, list[Task]], verifiers: dict[str, Verifier],
             default_verifier: dict[str, str], sampling: dict[str, SamplingParams], samples: int,
             greedy: bool, agents: AgentRollout | None = None, trace_prefix: str = "eval",
             check_of: dict[str, str] | None = None) -> dict[str, dict]:
    results = {}
    for domain, tasks in heldout.items():
        groups = rollout_groups(engine, tokenizer, tasks, samples, sampling, agents, trace_prefix)
        score_groups(groups, verifiers, default_verifier)
        record_episodes(groups, agents.recorder if agents else None)
        scores = [s for g in groups for s in g.scores]
        rewards = [s.value for s in scores]
        statuses = Counter(s.details.get("status", "?") for s in scores)
        lengths = [len(c.token_ids) for g in groups for c in g.completions]
        result = {"accuracy": sum(rewards) / len(rewards), "tasks": len(tasks), "samples": samples,
                  "mean_length": sum(lengths) / len(lengths), "statuses": dict(statuses)}
        if check_of and domain in check_of:
            checked = verifiers[check_of[domain]].score([g.task for g in groups for _ in g.completions],
                                                        [c.text for g in groups for c in g.completions])
            result["check_accuracy"] = sum(s.value for s in checked) / len(checked)
        if any(g.episodes for g in groups):
            successes = [s for s in scores if s.details.get("success")]
            result["success_rate"] = len(successes) / len(scores)
            result["tokens_per_success"] = (sum(s.details.get("tokens", 0) for s in scores) / len(successes)
                                            if successes else None)
            result["steps_per_success"] = (sum(s.details.get("steps", 0) for s in successes) / len(successes)
                                           if successes else None)
        if greedy:
            greedy_sampling = {d: replace(p, temperature=0.0) for d, p in sampling.items()}
            g_groups = rollout_groups(engine, tokenizer, tasks, 1, greedy_sampling, agents, f"{trace_prefix}-greedy")
            score_groups(g_groups, verifiers, default_verifier)
            result["greedy_accuracy"] = sum(g.scores[0].value for g in g_groups) / len(g_groups)
        results[domain] = result
    return results
