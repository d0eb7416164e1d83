"""A suite: a task pack read for evaluation, every line of which must load.

Any task pack is a suite (polyrl/domains/pack.py: math, code, agent, alignment lines, and
any domain that names its verifier). For evaluation a pack line may also carry, in its
`metadata`:

- `tag`: "typical", "edge" or "failure_mode" (what kind of business case it is; results
  are broken down by it). A line without one is "untagged".
- `limits`: overrides of the run's limits for this task (limits.py fields, e.g.
  `{"budget": 600}`), checked here.

A task runs as an agent episode when it brings tools (a shop or ops `world`, an swe
repository: polyrl/domains/task_tools.py), else as one call; it is graded by its verifier,
the same one training uses (`verifier_for`).

Unlike training, which quarantines bad lines, a suite is all or nothing: comparing models on
a silently shrunken suite misleads, so the first bad line is a `SuiteError` (exit status 2)
naming the file, the line and what is wrong.

Out of scope: suites spread over several files, and fetching them from anywhere but a path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polyrl.domains.pack import load_pack, verifier_for, verifier_misfit
from polyrl.domains.task_tools import tools_kind, world_problem
from polyrl.evals.limits import EvalLimits
from polyrl.rewards.registry import available_verifiers
from polyrl.types import Task

TAGS = ("typical", "edge", "failure_mode")
UNTAGGED = "untagged"


class SuiteError(ValueError):
    """A suite that cannot be read or used; the command exits 2 with this message."""

    exit_code = 2


@dataclass(frozen=True)
class SuiteTask:
    task: Task
    line: int
    """1-based line of the pack file."""
    tag: str
    """One of TAGS, or UNTAGGED."""
    verifier: str
    """The verifier that grades it (the task's own, else its domain's)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Fields of EvalLimits this task sets for itself."""

    @property
    def is_agent(self) -> bool:
        """Runs as an agent episode with the tools its data brings (`tools_kind`)."""
        return tools_kind(self.task) is not None

    def limits(self, base: EvalLimits) -> EvalLimits:
        return base.with_overrides(self.overrides)


@dataclass(frozen=True)
class Suite:
    path: str
    tasks: list[SuiteTask]

    def select(self, ids: list[str] | None = None, tags: list[str] | None = None,
               limit: int | None = None) -> "Suite":
        """The tasks with these ids and tags (None = all), the first `limit` of them."""
        if ids:
            missing = sorted(set(ids) - {t.task.id for t in self.tasks})
            if missing:
                raise SuiteError(f"{self.path}: no task with id {', '.join(map(repr, missing))}")
        chosen = [t for t in self.tasks if (not ids or t.task.id in ids) and (not tags or t.tag in tags)]
        chosen = chosen[:limit] if limit is not None else chosen
        if not chosen:
            raise SuiteError(f"{self.path}: no task matches the selection")
        return Suite(self.path, chosen)


def load_suite(path: str | Path, base: EvalLimits | None = None) -> Suite:
    """Every task of the pack at `path`, or a SuiteError on the first line that cannot be used."""
    base = base or EvalLimits()
    try:
        loaded = load_pack(path)
    except IsADirectoryError:
        raise SuiteError(f"cannot read suite {path}: it is a directory, not a JSONL task pack") from None
    except OSError as err:
        raise SuiteError(f"cannot read suite {path}: {err.strerror or err}") from None
    if not loaded.lines:
        raise SuiteError(f"suite {path} is empty: a suite is a task pack with one task per line")
    if loaded.errors:
        first = loaded.errors[0]
        more = f" (and {len(loaded.errors) - 1} more bad lines)" if len(loaded.errors) > 1 else ""
        raise SuiteError(f"{path}:{first.line}: {first.message}{more}")
    tasks = []
    for line, task in loaded.tasks:
        tasks.append(_suite_task(path, line, task, base))
    return Suite(str(path), tasks)


def _suite_task(path: str | Path, line: int, task: Task, base: EvalLimits) -> SuiteTask:
    where = f"{path}:{line}: task {task.id!r}"
    try:
        verifier = verifier_for(task)
    except ValueError as err:
        raise SuiteError(f"{path}:{line}: {err}") from None
    if verifier not in available_verifiers():
        raise SuiteError(f"{where}: unknown verifier {verifier!r}; available: {', '.join(available_verifiers())}")
    misfit = verifier_misfit(task, verifier)
    if misfit:
        raise SuiteError(f"{where}: {misfit}")
    tag = task.metadata.get("tag", UNTAGGED)
    if tag not in TAGS + (UNTAGGED,):
        raise SuiteError(f"{where}: metadata.tag must be one of {', '.join(TAGS)}, got {tag!r}")
    overrides = task.metadata.get("limits") or {}
    if not isinstance(overrides, dict):
        raise SuiteError(f"{where}: metadata.limits must be an object of limits, got {type(overrides).__name__}")
    try:
        base.with_overrides(overrides)
    except ValueError as err:
        raise SuiteError(f"{where}: metadata.{err}") from None
    if "world" in task.data and (problem := world_problem(task)):
        raise SuiteError(f"{where}: it has {problem}")
    return SuiteTask(task, line, tag, verifier, dict(overrides))
