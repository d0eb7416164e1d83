"""Probes of an ops task (graded by world_state): episode records that must score 0, 1 or
something in between. Each is the JSON record an episode writes (`AgentResult.to_completion()`).

- the reference (solvability, must score 1): the reference solver's calls;
- negative controls (must score 0): no calls at all; the answer "done" as plain text; the
  reference without the retries its "service busy" writes need (when it has any); the
  reference without its last call that changes the world;
- exploits (must score 0): the gold state claimed in the record's "world" with no calls
  (the grader replays calls, it does not read claims); the reference plus a refund of an
  order nobody asked about; the reference plus a restock nobody asked for;
- false negatives (must score 1): the subtasks solved in the opposite order (any route to
  the gold state passes); the reference's calls with no counts in the record;
- cost (must score above 0 and below 1): the reference with every read made twice.

Out of scope: which probes other verifiers get (code_probes.py, math_probes.py, swe_probes.py).
"""

from __future__ import annotations

import json
from typing import Any

from polyrl.domains.ops_reference import solve
from polyrl.domains.ops_world import World, call_key
from polyrl.quality.probes import Probe
from polyrl.rewards.world_state import gold_state
from polyrl.types import Task

_READS = ("list_orders", "get_order", "get_stock", "list_bookings")


def record(actions: list[dict[str, Any]], counts: bool = True, **extra: Any) -> str:
    """An episode record with these tool calls, as an episode of one call per model turn writes it."""
    base = {"answer": "done", "steps": len(actions) + 1, "tool_calls": len(actions)} if counts else {"answer": "done"}
    return json.dumps({**base, "actions": actions, **extra})


def reference_probe(task: Task) -> Probe:
    return Probe("solvability", "the reference solver's calls", record(task.data["reference_calls"]), "full")


def ops_probes(task: Task) -> list[Probe]:
    data = task.data
    ref: list[dict[str, Any]] = data["reference_calls"]
    world = World.from_json(data["world"])
    changed = set(data["gold_changes"].get("orders", {}))
    probes = [
        Probe("negative_control", "no tool calls", record([]), "zero"),
        Probe("negative_control", "the answer 'done' as plain text", "<answer>done</answer>", "zero"),
        Probe("exploit", "the gold state claimed in the record, no calls",
              record([], world=gold_state(task)), "zero"),
        Probe("false_negative", "the reference's calls, no counts in the record", record(ref, counts=False), "full"),
        Probe("cost", "the reference with every read made twice",
              record([c for call in ref for c in ([call, call] if call["name"] in _READS else [call])]), "partial"),
    ]
    writes = [k for k, c in enumerate(ref) if c["name"] not in _READS + ("approve",)]
    if writes:
        probes.append(Probe("negative_control", "the reference without its last call that changes the world",
                            record(ref[:writes[-1]] + ref[writes[-1] + 1:]), "zero"))
    busy_writes = {k for k in world.busy if k.split(":")[0] not in _READS}  # a read that fails changes nothing
    if busy_writes:
        once = [c for k, c in enumerate(ref) if k == 0 or c != ref[k - 1] or call_key(c["name"], c["arguments"])
                not in busy_writes]
        probes.append(Probe("negative_control", "the reference without its retries of busy calls", record(once),
                            "zero"))
    bystander = next((k for k, o in world.orders.items() if o["status"] == "delivered" and k not in changed
                      and o["total"] <= world.approval_limit), None)
    if bystander is not None:
        extra = {"name": "refund", "arguments": {"order_id": bystander, "amount": world.orders[bystander]["total"]}}
        probes.append(Probe("exploit", f"the reference plus a refund of {bystander}, which nobody asked for",
                            record(ref + [extra]), "zero"))
    item = next(iter(world.stock))
    probes.append(Probe("exploit", f"the reference plus a restock of {item} nobody asked for",
                        record(ref + [{"name": "restock", "arguments": {"item": item, "qty": 1}}]), "zero"))
    if len(data["subtasks"]) > 1:
        other = solve(data["world"], list(reversed(data["subtasks"])))
        probes.append(Probe("false_negative", "the subtasks solved in the opposite order", record(other.calls),
                            "full"))
    return probes
