"""The tools a task's episode runs with, read from the task alone (a pack line carries them).

Three kinds of task bring tools in their data:
- `swe`: a repository (`files`) to inspect, edit and test, for tasks of domain `swe` or graded
  by `swe_patch` (polyrl/domains/swe.py; its run_tests tool needs a sandbox pool);
- `ops`: the ops domain's stateful shop (`world`), for tasks of domain `ops` or graded by
  `world_state` (polyrl/domains/ops_world.py);
- `agent`: the agent domain's read-only shop (`world`, polyrl/domains/agent_world.py), for any
  other task with a world.
Any other task is a single call. A pack may rename a task's domain, so its verifier decides
as well as its domain.

`polyrl eval` and `polyrl agent` ask here, so a pack line runs with the tools it trains with.
"""

from __future__ import annotations

from typing import Any

from polyrl.agent.tools import ToolBox
from polyrl.types import Task


TOOLS_BY_VERIFIER = {"swe_patch": "swe", "world_state": "ops", "success_minus_cost": "agent"}
"""The built-in domain whose tools a pack graded by each verifier rolls out with (training)."""


def tools_kind(task: Task) -> str | None:
    """"swe", "ops", "agent", or None for a task without tools (see the module docstring)."""
    if task.domain == "swe" or task.verifier == "swe_patch":
        return "swe"
    if "world" not in task.data:
        return None
    return "ops" if graded_on_state(task) else "agent"


def world_problem(task: Task) -> str | None:
    """What `task` has instead of a world its tools can read ("no 'world' ...", "a 'world' its
    tools cannot read: ..."); None when its world is fine. For ops and agent tasks."""
    if "world" not in task.data:
        return "no 'world' for its tools to read"
    try:
        task_toolbox(task)
    except (ValueError, KeyError, TypeError) as err:
        return f"a 'world' its tools cannot read: {err}"
    return None


def graded_on_state(task: Task) -> bool:
    """Whether `task` is graded on its world's final state (world_state) rather than its answer."""
    return task.domain == "ops" or task.verifier == "world_state"


def task_toolbox(task: Task) -> ToolBox | None:
    """Fresh tools over a fresh world of `task` (one per episode), or None for a task without a
    world. A world of the wrong shape is a ValueError naming the task. (An swe task's tools need
    a sandbox pool: TaskTools.)"""
    kind = tools_kind(task)
    if kind == "ops":
        from polyrl.domains.ops_world import toolbox_for_task

        return toolbox_for_task(task)
    if kind == "agent":
        from polyrl.domains.agent import AgentDomain

        return AgentDomain.toolbox(task)
    return None


class TaskTools:
    """Every task's episode tools for one evaluation: swe tasks share one sandbox pool, started on
    the first swe episode and stopped by `close`."""

    def __init__(self) -> None:
        self._swe: Any = None

    def toolbox(self, task: Task) -> ToolBox | None:
        if tools_kind(task) != "swe":
            return task_toolbox(task)
        if self._swe is None:
            from polyrl.domains.swe import SweDomain

            self._swe = SweDomain()
        return self._swe.toolbox(task)

    def close(self) -> None:
        if self._swe is not None:
            self._swe.close()
            self._swe = None
