"""Quarantine: suspicious reward patterns during training, and the list of tasks to leave out.

The detector (`RewardMonitor`, pure: no I/O) looks at each training step and returns flag
records; the training loop appends them to RUN_DIR/flags.jsonl. Three patterns:

- "reward_without_check": a sample got full reward but fails the independent check
  (independent.py: an exit call, an always-equal `__eq__`, a hedge, ...); the record
  names its task, so the task can be quarantined;
- "train_heldout_divergence": a domain's training reward rises while its held-out
  accuracy does not follow, over the in-training evaluations (`detect_hacking` of
  rewards/hacking.py; the proxy is the mean training reward since the previous
  evaluation). A domain-level flag, with "task_id": null. Needs eval.every > 0.
- "reward_without_check_heldout": on a domain with an independent check (alignment: the
  preference reward model against rule_check), the held-out reward rises while the
  check of the same held-out completions does not follow (over the last evaluations),
  or has fallen since its best (`HackingMonitor`): the policy games the reward model.
  Also domain-level; needs eval.every > 0.

A quarantine list is a file of task ids: one per line (blank lines and `# comments`
skipped), or JSONL objects with "id" or "task_id" (so RUN_DIR/flags.jsonl and
`polyrl audit --write-quarantine` output both work; records whose id is null are
domain-level and skipped). A run file names it per domain with
`rl_tasks[].quarantine: PATH`; `build_domains` drops those tasks (`drop_quarantined`
for packs, `QuarantinedDomain` for built-in domains).

Out of scope: deciding automatically what to quarantine (a person reads the flags),
and restoring the monitor's history on resume (it restarts from the resumed step).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from polyrl.domains.base import Domain
from polyrl.quality.independent import suspicious
from polyrl.rewards.hacking import HackingMonitor, detect_hacking
from polyrl.types import Task

# ---------------------------------------------------------------------------- the list file


def read_quarantine(path: str | Path) -> set[str]:
    """The task ids in a quarantine file; a line that is neither an id nor a JSON object
    with a string "id"/"task_id" (or null) is a ValueError naming the line."""
    ids: set[str] = set()
    for number, raw in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not line.startswith("{"):
            ids.add(line)
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not valid JSON: {err}") from None
        task_id = record.get("id", record.get("task_id"))
        if task_id is not None and not isinstance(task_id, str):
            raise ValueError(f"{path}:{number}: 'id' must be a string, got {type(task_id).__name__}")
        if task_id:
            ids.add(task_id)
    return ids


def write_quarantine(path: str | Path, ids: Sequence[str], reason: str) -> None:
    """One id per line under a comment saying why."""
    Path(path).write_text(f"# {reason}\n" + "".join(f"{i}\n" for i in ids), encoding="utf-8")


def drop_quarantined(tasks: list[Task], path: str | Path) -> list[Task]:
    """`tasks` without those listed in the quarantine file at `path`; an error when none is left."""
    ids = read_quarantine(path)
    kept = [t for t in tasks if t.id not in ids]
    if tasks and not kept:
        raise ValueError(f"quarantine {path}: every task of the pack is quarantined")
    return kept


class QuarantinedDomain:
    """A built-in domain whose samples skip quarantined ids (drawing more until n are kept)."""

    def __init__(self, inner: Domain, ids: set[str], max_rounds: int = 8) -> None:
        self.inner, self.ids, self.max_rounds = inner, ids, max_rounds
        self.name, self.default_verifier = inner.name, inner.default_verifier

    def __getattr__(self, name: str) -> Any:  # toolbox, demonstration, ...
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def sample(self, split: str, n: int, seed: int) -> list[Task]:
        want = n
        for _ in range(self.max_rounds):
            kept = [t for t in self.inner.sample(split, want, seed) if t.id not in self.ids]
            if len(kept) >= n:
                return kept[:n]
            want = 2 * want + len(self.ids)
        raise ValueError(f"domain {self.name!r}: cannot draw {n} {split} tasks outside the quarantine")


# ---------------------------------------------------------------------------- the detector


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

    def step(self, step: int, groups: Sequence[Any], record: dict[str, Any],
             verifier_of: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """Flags of one step: `groups` are the step's scored groups (task, completions,
        scores), `record` its metrics line (per-domain reward; "eval" when it evaluated)."""
        flags = []
        for gi, group in enumerate(groups):
            task = group.task
            name = (task.verifier or (verifier_of or {}).get(task.domain, "")).split("@")[0]  # "name@domain" keys
            for j, (completion, score) in enumerate(zip(group.completions, group.scores)):
                if score.value < 1.0:
                    continue
                patterns = suspicious(name, completion.text, task.answer)
                if patterns:
                    flags.append({"step": step, "kind": "reward_without_check", "task_id": task.id,
                                  "domain": task.domain, "group": gi, "sample": j,
                                  "reason": f"full reward, but the completion {', '.join(patterns)}"})
        for domain, stats in record.get("domains", {}).items():
            self.pending.setdefault(domain, []).append(float(stats["reward"]))
        for domain, result in (record.get("eval") or {}).items():
            flag = self.evaluated(step, domain, float(result["accuracy"]))
            if flag:
                flags.append(flag)
            if result.get("check_accuracy") is not None:
                flag = self.checked(step, domain, float(result["accuracy"]), float(result["check_accuracy"]))
                if flag:
                    flags.append(flag)
        return flags

    def evaluated(self, step: int, domain: str, heldout: float) -> dict[str, Any] | None:
        """Record a held-out evaluation of `domain`; a divergence flag when it newly diverges."""
        rewards = self.pending.pop(domain, [])
        if not rewards:
            return None
        self.points.setdefault(domain, []).append((sum(rewards) / len(rewards), heldout))
        points = self.points[domain]
        verdict = detect_hacking([p for p, _ in points], [h for _, h in points], **self.settings)
        return self._flag(step, "train_heldout_divergence", domain, verdict.flagged,
                          verdict.reason.replace("proxy", "training reward").replace("the independent check",
                                                                                    "held-out accuracy"))

    def checked(self, step: int, domain: str, reward: float, check: float) -> dict[str, Any] | None:
        """Record the held-out reward and independent check of `domain`; a flag when the reward
        newly rises without the check."""
        verdict = self.checks.observe(domain, step, proxy=reward, check=check)
        return self._flag(step, "reward_without_check_heldout", domain, verdict.flagged,
                          verdict.reason.replace("proxy", "held-out reward"))

    def _flag(self, step: int, kind: str, domain: str, flagged: bool, reason: str) -> dict[str, Any] | None:
        """One flag per divergence episode, not one per evaluation."""
        if not flagged:
            self.flagged.discard((kind, domain))
            return None
        if (kind, domain) in self.flagged:
            return None
        self.flagged.add((kind, domain))
        return {"step": step, "kind": kind, "task_id": None, "domain": domain, "reason": reason}
