"""What an agent episode comes to, as a verifier reads it: the answer and what it cost.

    outcome = result.outcome                    # AgentResult (loop.py) -> EpisodeOutcome
    verifier.score([task], [outcome])           # success_minus_cost grades it directly
    EpisodeOutcome.from_json(text)              # an episode record written as JSON (`polyrl score`)

Training passes the typed value from rollout to reward, so no reward function reads
JSON. The JSON form is for files: `polyrl agent` writes it, and `polyrl score` reads it
back from a completions file.

For worlds whose tools change state (polyrl.domains.ops), an outcome also carries the
tool calls the episode made (`actions`, in order) and the state its tools reported at
the end (`world`, `ToolBox.state()`). A grader that must not trust the graded replays
`actions` on a fresh world rather than believing `world` (rewards/world_state.py). Both
are left out of the JSON record while empty, so read-only domains write what they
always wrote.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

_COUNTS = ("steps", "tokens", "input_tokens", "output_tokens", "tool_calls", "tool_errors")


@dataclass(frozen=True)
class EpisodeOutcome:
    answer: str | None
    """The final answer; None when the episode ended without one."""
    steps: int = 0
    """Model calls made (the stage conclusion's included)."""
    tokens: int = 0
    """Prompt + completion tokens of every model call (what a budget charges)."""
    input_tokens: int = 0
    output_tokens: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    stop_reason: str | None = None
    """Why the episode stopped (loop.STOP_REASONS); None when not recorded."""
    actions: tuple[dict[str, Any], ...] = ()
    """Every tool call that was parsed, in order, as {"name", "arguments"} (malformed ones left out:
    they never reach a tool)."""
    world: dict[str, Any] | None = None
    """The tools' world state when the episode ended (ToolBox.state()); None for stateless tools."""

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["actions"] = [dict(a) for a in self.actions]
        for key in ("actions", "world"):
            if not out[key]:
                del out[key]
        return out

    @classmethod
    def from_json(cls, text: str) -> EpisodeOutcome | None:
        """The outcome a JSON episode record holds; None when `text` is not one (not a JSON
        object with an "answer"). A record whose counts are not non-negative integers is a
        ValueError."""
        stripped = text.strip()
        if not stripped.startswith("{"):
            return None
        try:
            obj = json.loads(stripped)
        except (json.JSONDecodeError, RecursionError):
            return None
        if not isinstance(obj, dict) or "answer" not in obj:
            return None
        counts = {k: obj.get(k, 0) for k in _COUNTS}
        bad = [k for k, v in counts.items() if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0)]
        if bad:
            raise ValueError(f"episode record: {', '.join(bad)} must be non-negative integers")
        actions, world = obj.get("actions") or [], obj.get("world")
        if not isinstance(actions, list) or not all(
                isinstance(a, dict) and isinstance(a.get("name"), str) and isinstance(a.get("arguments", {}), dict)
                for a in actions):
            raise ValueError('episode record: actions must be a list of {"name": str, "arguments": object}')
        if world is not None and not isinstance(world, dict):
            raise ValueError("episode record: world must be an object")
        answer, stop = obj["answer"], obj.get("stop_reason")
        return cls(None if answer is None else str(answer), **counts,
                   stop_reason=None if stop is None else str(stop),
                   actions=tuple({"name": a["name"], "arguments": dict(a.get("arguments", {}))} for a in actions),
                   world=world)
