"""Quarantine lists: task ids to leave out of training, and the domains that skip them.

A quarantine list is a file of task ids: one per line (blank lines and `# comments`
skipped), or JSONL objects with "id" or "task_id" (so a run's flags.jsonl and
`polyrl audit --write-quarantine` output both work; records whose id is null are
domain-level and skipped). A run file names it per domain with
`rl_tasks[].quarantine: PATH`; training drops those tasks (`drop_quarantined` for packs,
`QuarantinedDomain` for built-in domains).

Out of scope: deciding what to quarantine (a person reads the flags of
polyrl/train/monitor.py and the audit's failures).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from polyrl.domains.base import Domain
from polyrl.types import Task


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
