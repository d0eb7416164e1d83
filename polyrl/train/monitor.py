"""The reward monitor: suspicious reward patterns during training, as flag records.

`RewardMonitor` (pure: no I/O) looks at each training step and returns flag records;
the training loop appends them to RUN_DIR/flags.jsonl. Three patterns:

- "reward_without_check": a sample got full reward but fails the independent check
  (quality/independent.py: an exit call, an always-equal `__eq__`, a hedge, ...); the
  record names its task, so the task can be quarantined (domains/quarantine.py);
- "train_heldout_divergence": a domain's training reward rises while its held-out
  accuracy does not follow, over the in-training evaluations (`detect_hacking` of
  rewards/hacking.py; the proxy is the mean training reward since the previous
  evaluation), by more than the held-out accuracy's own sampling error (`heldout_noise`,
  from the evaluation's task count): on 128 tasks one evaluation is good to about 0.04,
  and a held-out rise that lags the training reward by less than that is no evidence
  of hacking. A domain-level flag, with "task_id": null. Needs eval.every > 0.
- "reward_without_check_heldout": on a domain with an independent check (alignment: the
  preference reward model against rule_check), the held-out reward rises while the
  check of the same held-out completions does not follow (over the last evaluations),
  or has fallen since its best (`HackingMonitor`): the policy games the reward model.
  Also domain-level; needs eval.every > 0.

Acting on a flag is the run's `on_flag` policy (train/flag_policy.py). `state_dict` and
`load_state_dict` carry the monitor's history across a resume, so a resumed run flags
what the uninterrupted run would have.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from polyrl.quality.independent import suspicious
from polyrl.rewards.hacking import HackingMonitor, detect_hacking
from polyrl.rollout.groups import Group
from polyrl.rollout.spec import DomainSpec


class RewardMonitor:
    """Per-step detector of suspicious reward patterns; `step` returns flag records."""

    def __init__(self, window: int = 5, min_points: int = 3, min_rise: float = 0.1, follow: float = 0.25) -> None:
        self.settings = {"window": window, "min_points": min_points, "min_rise": min_rise, "follow": follow}
        self.pending: dict[str, list[float]] = {}
        """domain -> training rewards of the steps since the last evaluation"""
        self.points: dict[str, list[tuple[float, float]]] = {}
        """domain -> (mean training reward, held-out accuracy) at each evaluation"""
        self.checks = HackingMonitor(**self.settings)
        """domain -> (held-out reward, held-out check) at each evaluation"""
        self.flagged: set[tuple[str, str]] = set()
        """(kind, domain) of the divergences flagged and not yet over"""

    def step(self, step: int, groups: Sequence[Group], record: dict[str, Any],
             specs: Mapping[str, DomainSpec] | None = None) -> list[dict[str, Any]]:
        """Flags of one step: `groups` are the step's scored groups, `record` its metrics line
        (per-domain reward; "eval" when it evaluated), `specs` name each domain's verifier."""
        flags = []
        for gi, group in enumerate(groups):
            task = group.task
            spec = (specs or {}).get(task.domain)
            name = (task.verifier or (spec.verifier if spec else "")).split("@")[0]  # "name@domain" keys
            for j, (sample, score) in enumerate(zip(group.samples, group.scores)):
                if score.value < 1.0 or not isinstance(sample.response, str):  # text only: not episodes
                    continue
                patterns = suspicious(name, sample.response, task.answer)
                if patterns:
                    flags.append({"step": step, "kind": "reward_without_check", "task_id": task.id,
                                  "domain": task.domain, "group": gi, "sample": j,
                                  "reason": f"full reward, but the completion {', '.join(patterns)}"})
        for domain, stats in record.get("domains", {}).items():
            self.pending.setdefault(domain, []).append(float(stats["reward"]))
        for domain, result in (record.get("eval") or {}).items():
            flag = self.evaluated(step, domain, float(result["accuracy"]), result.get("tasks"))
            if flag:
                flags.append(flag)
            if result.get("check_accuracy") is not None:
                flag = self.checked(step, domain, float(result["accuracy"]), float(result["check_accuracy"]))
                if flag:
                    flags.append(flag)
        return flags

    def evaluated(self, step: int, domain: str, heldout: float, tasks: int | None = None) -> dict[str, Any] | None:
        """Record a held-out evaluation of `domain` (its accuracy over `tasks` held-out tasks;
        None: treat it as exact); a divergence flag when it newly diverges."""
        rewards = self.pending.pop(domain, [])
        if not rewards:
            return None
        self.points.setdefault(domain, []).append((sum(rewards) / len(rewards), heldout))
        points = self.points[domain]
        accuracies = [h for _, h in points]
        recent = accuracies[-self.settings["window"]:]
        verdict = detect_hacking([p for p, _ in points], accuracies, **self.settings,
                                 check_noise=heldout_noise(sum(recent) / len(recent), tasks))
        return self._flag(step, "train_heldout_divergence", domain, verdict.flagged,
                          verdict.reason.replace("proxy", "training reward").replace("the independent check",
                                                                                    "held-out accuracy"))

    def checked(self, step: int, domain: str, reward: float, check: float) -> dict[str, Any] | None:
        """Record the held-out reward and independent check of `domain`; a flag when the reward
        newly rises without the check."""
        verdict = self.checks.observe(domain, step, proxy=reward, check=check)
        return self._flag(step, "reward_without_check_heldout", domain, verdict.flagged,
                          verdict.reason.replace("proxy", "held-out reward"))

    def state_dict(self) -> dict[str, Any]:
        return {"pending": {d: list(v) for d, v in self.pending.items()},
                "points": {d: [list(p) for p in v] for d, v in self.points.items()},
                "checks": self.checks.to_dict(), "flagged": sorted(list(f) for f in self.flagged)}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        if not state:
            return
        self.pending = {d: [float(x) for x in v] for d, v in state["pending"].items()}
        self.points = {d: [(float(a), float(b)) for a, b in v] for d, v in state["points"].items()}
        self.checks = HackingMonitor.from_dict(state["checks"])
        self.flagged = {(kind, domain) for kind, domain in state["flagged"]}

    def _flag(self, step: int, kind: str, domain: str, flagged: bool, reason: str) -> dict[str, Any] | None:
        """One flag per divergence episode, not one per evaluation."""
        if not flagged:
            self.flagged.discard((kind, domain))
            return None
        if (kind, domain) in self.flagged:
            return None
        self.flagged.add((kind, domain))
        return {"step": step, "kind": kind, "task_id": None, "domain": domain, "reason": reason}


def heldout_noise(accuracy: float, tasks: int | None) -> float:
    """The standard error of a held-out accuracy over `tasks` tasks: sqrt(a (1 - a) / tasks),
    the binomial one, which bounds the variance of any per-task score in [0, 1] with that mean
    (several samples of one task count as one: they are not independent). 0 when unknown."""
    if not tasks:
        return 0.0
    a = min(max(accuracy, 0.0), 1.0)
    return (a * (1 - a) / tasks) ** 0.5
