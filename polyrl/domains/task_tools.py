"""The tools a task's episode runs with, read from the task alone (a pack line carries its world).

Two worlds travel inside task data under `"world"`:
- the ops domain's stateful shop (polyrl/domains/ops_world.py), for tasks of domain `ops` or
  graded by `world_state` (a pack may rename the domain, never the verifier);
- the agent domain's read-only shop (polyrl/domains/agent_world.py), for any other task with
  a world.

`polyrl eval` and `polyrl agent` ask here, so an `ops` pack line runs with the ops tools there
as it does in training. A task without a world is a single call (None).

Out of scope: the swe domain's tools, which need the domain's sandbox pool (its episodes run
in training, `SweDomain.toolbox`); an swe pack line is evaluated on the patch it answers with.
"""

from __future__ import annotations

from polyrl.agent.tools import ToolBox
from polyrl.types import Task


def graded_on_state(task: Task) -> bool:
    """Whether `task` is graded on its world's final state (world_state) rather than its answer."""
    return task.domain == "ops" or task.verifier == "world_state"


def task_toolbox(task: Task) -> ToolBox | None:
    """Fresh tools over a fresh world of `task` (one per episode), or None for a task without a
    world. A world of the wrong shape is a ValueError naming the task."""
    if "world" not in task.data:
        return None
    if graded_on_state(task):
        from polyrl.domains.ops_world import toolbox_for_task

        return toolbox_for_task(task)
    from polyrl.domains.agent import AgentDomain

    return AgentDomain.toolbox(task)
