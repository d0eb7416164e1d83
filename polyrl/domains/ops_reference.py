"""The ops domain's reference solver: a scripted agent that plays a task through the tools.

It knows only what an agent knows: the request (the task's `subtasks`) and the approval
limit the prompt and the tools' descriptions state (read from the world's JSON). Everything else it reads from tool results, parsed
from the same text a model reads: it walks every page of a listing, opens each delivered
order to see whether it came late, approves before a refund or cancellation over the
limit, merges restocks of one item into one call, and repeats a call the world answers
"service busy". So its calls are the fewest that solve the task; the generator records
them (`reference_calls`), their number (`min_calls`) and the state they leave
(`gold_changes`), and the audit replays them as the reference that must score 1.

Subtasks (JSON, task.data["subtasks"]):

    {"kind": "late_refunds", "customer": "ann"}     refund in full each delivered order that
                                                    came late, restock its items
    {"kind": "cancel_pending", "customer": "bob"}   cancel each pending order
    {"kind": "cancel_bookings", "customer": "cai", "day": 12}
                                                    cancel each active booking on that day

Out of scope: recovering from a tool error other than "service busy" (a reference that
meets one is a bug in the generator: AssertionError).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from polyrl.agent.tools import ToolBox, ToolCall
from polyrl.domains.ops_world import World

SUBTASK_KINDS = ("late_refunds", "cancel_pending", "cancel_bookings")
MAX_RETRIES = 10

_ORDER_ROW = re.compile(r"^(O-\d+) (\w+) total (\d+)$", re.M)
_BOOKING_ROW = re.compile(r"^(B-\d+) day (\d+) deposit (\d+) (\w+)$", re.M)
_ORDER = re.compile(r"item (\w+) x(\d+), total (\d+), status (\w+), promised day (\d+), "
                    r"delivered (?:day (\d+)|not yet)")


@dataclass
class Solution:
    calls: list[dict[str, Any]]
    """Every call made, retries included, as {"name", "arguments"}."""
    state: dict[str, Any]
    """The world's state() afterwards."""


class _Player:
    def __init__(self, tools: ToolBox) -> None:
        self.tools = tools
        self.calls: list[dict[str, Any]] = []

    def __call__(self, name: str, **arguments: Any) -> str:
        for _ in range(MAX_RETRIES):
            self.calls.append({"name": name, "arguments": dict(arguments)})
            outcome = self.tools.run(ToolCall(f"ref_{len(self.calls)}", name, dict(arguments)))
            if outcome.error_type != "ServiceBusy":
                assert outcome.ok, f"reference call {name}({arguments}) failed: {outcome.content}"
                return outcome.content
        raise AssertionError(f"{name}({arguments}) stayed busy after {MAX_RETRIES} tries")

    def pages(self, tool: str, customer: str) -> str:
        """Every page of a listing, joined."""
        text, page = "", 1
        while True:
            shown = self(tool, customer=customer, page=page)
            text += shown + "\n"
            if "\nnext: " not in shown:
                return text
            page += 1


def solve(world_json: dict[str, Any], subtasks: list[dict[str, Any]]) -> Solution:
    """Play `subtasks` on a fresh world of `world_json`; see the module docstring."""
    world = World.from_json(world_json)
    play = _Player(world.toolbox())
    limit = world.approval_limit
    for sub in subtasks:
        kind, who = sub["kind"], sub["customer"]
        if kind == "late_refunds":
            restock: dict[str, int] = {}
            for ref, status, _ in _ORDER_ROW.findall(play.pages("list_orders", who)):
                if status != "delivered":
                    continue
                match = _ORDER.search(play("get_order", order_id=ref))
                assert match is not None, f"unreadable get_order({ref})"
                item, qty, total, _, promised, delivered = match.groups()
                if delivered and int(delivered) > int(promised):
                    if int(total) > limit:
                        play("approve", ref=ref)
                    play("refund", order_id=ref, amount=int(total))
                    restock[item] = restock.get(item, 0) + int(qty)
            for item, qty in restock.items():
                play("restock", item=item, qty=qty)
        elif kind == "cancel_pending":
            for ref, status, total in _ORDER_ROW.findall(play.pages("list_orders", who)):
                if status == "pending":
                    if int(total) > limit:
                        play("approve", ref=ref)
                    play("cancel_order", order_id=ref)
        elif kind == "cancel_bookings":
            for ref, day, deposit, status in _BOOKING_ROW.findall(play.pages("list_bookings", who)):
                if int(day) == sub["day"] and status == "active":
                    if int(deposit) > limit:
                        play("approve", ref=ref)
                    play("cancel_booking", booking_id=ref)
        else:
            raise ValueError(f"unknown ops subtask kind {kind!r}; kinds: {', '.join(SUBTASK_KINDS)}")
    return Solution(play.calls, world.state())
