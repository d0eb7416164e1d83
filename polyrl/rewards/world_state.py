"""world_state: did the episode leave the world as the task asked, and how many calls did it take.

    success = replay(task's world, the episode's tool calls).state() == the gold state
    reward  = success - min(max_cost, alpha * max(0, tool calls - min_calls) + beta * tokens)

The grader never trusts the graded: it rebuilds the task's world from its JSON
(task.data["world"]) and replays the episode's tool calls on it (`EpisodeOutcome.actions`,
in order, through the same ToolBox, so "service busy" and approval errors fall where they
fell in the episode), then compares the whole judged state (every order's and booking's
status and refund, every stock count; ops_world.World.state) with the initial state plus
the task's `gold_changes`. Everything is compared, not only the targets: an extra refund,
a restock nobody asked for or a cancelled bystander's booking fails, as in AppWorld's
collateral-damage checks. A world state the episode reports (`EpisodeOutcome.world`) is
not believed; when it disagrees with the replay, details say so (`world_mismatch`: a
world that is not deterministic, or tools that ran elsewhere on other data).

The answer text is not graded. The cost is success_minus_cost's rule (CostRule) over the
tool calls beyond the task's `min_calls` (the reference solver's, retries included), so a
solution as short as the reference scores 1 and a longer one less; tokens cost nothing
by default (a long-horizon episode's prompts add up to far more than its output; its
token budget bounds them). With `gate_cost_on_success` (default) a failure scores 0.

From a file (`polyrl score`, the audit's probes) a response is an episode record with
"actions" (`AgentResult.to_completion()`); any other text has made no calls.

Out of scope: partial credit per subtask, and answer text checks (tau-bench's COMMUNICATE).
"""

from __future__ import annotations

from typing import Sequence

from polyrl.agent.outcome import EpisodeOutcome
from polyrl.agent.tools import ToolCall
from polyrl.domains.ops_world import World, apply_changes, state_diff
from polyrl.rewards.success_minus_cost import CostRule, read_response
from polyrl.types import Score, Task

MAX_ACTIONS = 5000
"""Tool calls replayed at most; a record with more scores 0 ("malformed")."""


def replay(task: Task, actions: Sequence[dict]) -> World:
    """A fresh world of `task` after `actions` ran on it through its tools."""
    world = World.from_json(task.data["world"])
    tools = world.toolbox()
    for k, action in enumerate(actions):
        tools.run(ToolCall(f"replay_{k}", action.get("name"), dict(action.get("arguments") or {})))
    return world


def gold_state(task: Task) -> dict:
    """The state the task asks for: its initial world's state with `gold_changes` laid over it."""
    return apply_changes(World.from_json(task.data["world"]).state(), task.data["gold_changes"])


class WorldState:
    name = "world_state"

    def __init__(self, alpha: float = 0.01, beta: float = 0.0, max_cost: float = 0.5,
                 gate_cost_on_success: bool = True) -> None:
        """alpha: cost per tool call beyond the task's min_calls; beta: cost per token (prompt +
        completion); max_cost: cap on the total cost, below 1; gate_cost_on_success: failures score 0."""
        self.rule = CostRule(self.name, alpha, beta, max_cost, gate_cost_on_success)

    def score(self, tasks: Sequence[Task], responses: Sequence[str | EpisodeOutcome]) -> list[Score]:
        if len(tasks) != len(responses):
            raise ValueError(f"{len(tasks)} tasks but {len(responses)} responses")
        return [self._one(t, r) for t, r in zip(tasks, responses)]

    def _one(self, task: Task, response: str | EpisodeOutcome) -> Score:
        missing = [k for k in ("world", "gold_changes", "min_calls") if k not in task.data]
        if missing:
            raise ValueError(f"task {task.id!r}: world_state needs {', '.join(missing)} in the task's data")
        try:
            outcome = read_response(response)
        except ValueError as err:
            return Score(0.0, {"status": "malformed", "error": str(err)})
        if len(outcome.actions) > MAX_ACTIONS:
            return Score(0.0, {"status": "malformed", "error": f"{len(outcome.actions)} tool calls, more than "
                                                               f"the {MAX_ACTIONS} replayed"})
        final = replay(task, outcome.actions).state()
        expected = gold_state(task)
        success = final == expected
        calls = max(outcome.tool_calls, len(outcome.actions))
        excess = max(0, calls - int(task.data["min_calls"]))
        cost = self.rule.cost(excess, outcome.tokens)
        details = {"status": "success" if success else "wrong_state", "success": success,
                   "differences": state_diff(expected, final), "tool_calls": calls,
                   "min_calls": task.data["min_calls"], "excess_calls": excess, "steps": outcome.steps,
                   "tokens": outcome.tokens, "cost": round(cost, 6), "answer": outcome.answer}
        if outcome.world is not None and outcome.world != final:
            details["world_mismatch"] = state_diff(outcome.world, final)
        if outcome.stop_reason is not None:
            details["stop_reason"] = outcome.stop_reason
        return Score(self.rule.reward(success, cost), details)

    def close(self) -> None:
        pass
