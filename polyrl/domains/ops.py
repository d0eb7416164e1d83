"""The built-in ops domain: back-office requests carried out with tools that change a world.

A task is a list of requests (subtasks, ops_reference.py) about a shop's orders, stock
and bookings (ops_world.py): refund every late order of a customer and restock its
items, cancel a customer's pending orders, cancel their bookings on a day. Success is the
world's final state, not the answer text: the verifier (rewards/world_state.py) replays
the episode's tool calls on a fresh world and compares every order, booking and stock
count with the gold state, so an extra refund or a restock nobody asked for fails.

Levels raise the entities, the subtasks and the failures on the way (calls of the
reference solver, retries included; tests/test_ops_domain.py pins the ranges):

    level  subtasks  entities per subtask  busy calls  approvals  calls (min-median-max)
    1      1         4-5                   0           0          3-3-9
    2      1-2       5-8                   1           0-1        4-11-21
    3      2         11-15                 2-3         1-2        17-32-41
    4      3         15-26                 3-6         2-4        51-69-84

(200 train tasks per level; a busy call fails once, at level 4 sometimes twice; every
world also holds a bystander customer's late order and booking, which must stay as they are.)

Splits: a stable hash of the request (`hash_split` of the prompt, as in the agent domain),
decided before the world is built: a held-out request is never made in training, whatever
its world. One `sample` never repeats a request (level 1 has a few hundred).

Task data: world (the initial world's JSON), subtasks, gold_changes (what the reference
changes: orders/bookings -> {status, refunded}, stock -> units), min_calls (the
reference's calls), reference_calls ({"name", "arguments"} each), seed. Pack lines:
{"id", "domain": "ops", "prompt", "verifier": "world_state", "world", "subtasks", ...}.

Out of scope: natural-language variety, requests that need judgment (partial refunds,
priorities between customers), and users who talk back.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from typing import Any

from polyrl.agent.call_format import format_answer, format_call, system_prompt
from polyrl.agent.model import Message
from polyrl.agent.tools import ToolBox, ToolCall
from polyrl.domains.agent_world import ITEMS
from polyrl.domains.generated import check_levels, draw_distinct
from polyrl.domains.ops_reference import SUBTASK_KINDS, solve
from polyrl.domains.ops_world import World, call_key, state_changes, toolbox_for_task
from polyrl.domains.pack import check_split, hash_split
from polyrl.types import Task

LEVELS = (1, 2, 3, 4)
CUSTOMERS = ("ann", "bob", "cai", "dev", "eli", "fay", "gus", "hal", "ivy", "jon", "kim", "lea", "max", "ned",
             "oli", "pam", "rex", "sam", "tia", "uma")
APPROVAL_LIMIT = 100


@dataclass(frozen=True)
class Level:
    subtasks: tuple[int, int]
    entities: tuple[int, int]
    busy: tuple[int, int]
    approvals: tuple[int, int]


LEVEL_SHAPES = {1: Level((1, 1), (4, 5), (0, 0), (0, 0)), 2: Level((1, 2), (5, 8), (1, 1), (0, 1)),
                3: Level((2, 2), (11, 15), (2, 3), (1, 2)), 4: Level((3, 3), (15, 26), (3, 6), (2, 4))}

_RULES = (f"Listings are paginated: read every page. A refund or cancellation over {APPROVAL_LIMIT} needs "
          "approve(ref) first. A tool may answer \"service busy\": make the same call again. Change nothing "
          "you were not asked to. When everything is done, answer <answer>done</answer>.")


class OpsDomain:
    """Generated back-office requests on a stateful world; see the module docstring."""

    name = "ops"
    default_verifier = "world_state"
    result_chars = 400
    """cap on each tool result an episode shows the model (a listing page is ~150 characters)"""
    max_steps = 150
    """model calls an episode may make, unless the run file sets rl_tasks[].max_steps (level 4 needs up to ~100)"""

    def __init__(self, levels: tuple[int, ...] = LEVELS, weights: tuple[float, ...] | None = None) -> None:
        """`levels` to draw from and, optionally, their relative `weights` (default equal)."""
        self.levels, self.weights = check_levels("ops", levels, LEVELS, weights)

    def sample(self, split: str, n: int, seed: int) -> list[Task]:
        """n distinct tasks of `split`, a pure function of (split, n, seed)."""
        check_split(split)
        return draw_distinct(random.Random(f"ops|{split}|{seed}"), n, lambda rng: self._draw(rng, split))

    def _draw(self, rng: random.Random, split: str) -> tuple[str, Task] | None:
        level = rng.choices(self.levels, self.weights)[0]
        return make_task(rng.randrange(2**32), level, split)

    @staticmethod
    def toolbox(task: Task) -> ToolBox:
        """Fresh tools over a fresh world of `task` (one per episode)."""
        return toolbox_for_task(task)

    @staticmethod
    def demonstration(task: Task) -> list[Message]:
        """The reference episode, for supervised warm-up before RL: system, user, then
        (assistant call, tool result) per reference call, busy answers and retries included,
        and the final <answer>done</answer>. Results come from the task's world through the
        same ToolBox the agent loop runs."""
        tools = toolbox_for_task(task)
        messages: list[Message] = [{"role": "system", "content": system_prompt(tools, "compact")},
                                   {"role": "user", "content": task.prompt}]
        for k, ref in enumerate(task.data["reference_calls"]):
            call = ToolCall(f"call_{k}_0", ref["name"], dict(ref["arguments"]))
            outcome = tools.run(call)
            messages.append({"role": "assistant", "content": format_call(ref["name"], ref["arguments"])})
            messages.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": outcome.content})
        messages.append({"role": "assistant", "content": format_answer("done")})
        return messages


def make_task(task_seed: int, level: int, split: str) -> tuple[str, Task] | None:
    """The task of (seed, level), keyed by its prompt: its world, request, reference solution
    and gold changes; None when its request belongs to the other split."""
    rng = random.Random(f"ops-task|{level}|{task_seed}")
    shape = LEVEL_SHAPES[level]
    customers = rng.sample(CUSTOMERS, rng.randint(*shape.subtasks) + 1)  # the last one only as a distractor
    subtasks = [_subtask(rng, kind, who) for kind, who in zip(_kinds(rng, len(customers) - 1), customers)]
    text = prompt(subtasks)
    if hash_split(text) != split:  # decided before the world is built
        return None
    world = _world(rng, subtasks, customers[-1], shape)
    first = solve(world.to_json(), subtasks)
    keys = sorted({call_key(c["name"], c["arguments"]) for c in first.calls})  # calls every solution makes
    busy = rng.sample(keys, min(len(keys), rng.randint(*shape.busy)))
    world.busy = {k: 2 if level == 4 and rng.random() < 0.3 else 1 for k in busy}
    solution = solve(world.to_json(), subtasks)
    changes = state_changes(World.from_json(world.to_json()).state(), solution.state)
    data = {"world": world.to_json(), "subtasks": subtasks, "gold_changes": changes,
            "min_calls": len(solution.calls), "reference_calls": solution.calls, "seed": task_seed}
    sha = hashlib.sha256(json.dumps([text, data["world"]], sort_keys=True).encode()).hexdigest()
    return text, Task(id=f"ops-{split}-{level}-{sha[:10]}", domain="ops", prompt=text, split=split,
                     difficulty=level, data=data)


def prompt(subtasks: list[dict[str, Any]]) -> str:
    lines = ["You run the back office of a shop. Carry out every request below with the tools:"]
    for k, sub in enumerate(subtasks, start=1):
        who = sub["customer"]
        lines.append(f"{k}. " + {
            "late_refunds": f"Customer {who}: refund in full every delivered order that arrived late (delivered "
                            "after its promised day), and put each such order's items back in stock.",
            "cancel_pending": f"Customer {who}: cancel every pending order (cancelling puts the items back in "
                              "stock by itself).",
            "cancel_bookings": f"Customer {who}: cancel every active booking on day {sub.get('day')} (cancelling "
                               "refunds the deposit by itself).",
        }[sub["kind"]])
    lines.append(_RULES)
    return "\n".join(lines)


def _kinds(rng: random.Random, n: int) -> list[str]:
    kinds = list(SUBTASK_KINDS)
    rng.shuffle(kinds)
    return [kinds[k % len(kinds)] for k in range(n)]


def _subtask(rng: random.Random, kind: str, who: str) -> dict[str, Any]:
    return {"kind": kind, "customer": who, **({"day": rng.randint(1, 28)} if kind == "cancel_bookings" else {})}


class _Ids:
    def __init__(self, rng: random.Random) -> None:
        self.orders = iter(rng.sample(range(1000, 10000), 400))
        self.bookings = iter(rng.sample(range(100, 1000), 400))


def _world(rng: random.Random, subtasks: list[dict[str, Any]], bystander: str, shape: Level) -> World:
    """Entities for each subtask (targets among distractors of the same customer), a few of a
    bystander customer's, and stock for every item ordered. `shape.approvals` targets go over
    the approval limit."""
    ids, orders, bookings = _Ids(rng), {}, {}
    counts = [rng.randint(*shape.entities) for _ in subtasks]
    targets = [max(1, round(n * 0.4)) for n in counts]
    big = set(rng.sample([(s, t) for s, k in enumerate(targets) for t in range(k)],
                         min(sum(targets), rng.randint(*shape.approvals))))
    for s, (sub, n, k) in enumerate(zip(subtasks, counts, targets)):
        roles = ["target"] * k + ["other"] * (n - k)
        rng.shuffle(roles)
        t = 0
        for role in roles:
            over = role == "target" and (s, t) in big
            t += role == "target"
            if sub["kind"] == "cancel_bookings":
                bookings[f"B-{next(ids.bookings)}"] = _booking(rng, sub, role, over)
            else:
                orders[f"O-{next(ids.orders)}"] = _order(rng, sub, role, over)
    for _ in range(rng.randint(1, 3)):  # a bystander with late, pending and booked entities: never touched
        orders[f"O-{next(ids.orders)}"] = _order(rng, {"kind": "late_refunds", "customer": bystander}, "target", False)
        bookings[f"B-{next(ids.bookings)}"] = _booking(rng, {"customer": bystander, "day": rng.randint(1, 28)},
                                                       "target", False)
    stock = {o["item"]: rng.randint(0, 20) for o in orders.values()}
    stock.update({item: rng.randint(0, 20) for item in rng.sample(ITEMS, 2) if item not in stock})
    return World(orders, bookings, dict(sorted(stock.items())), APPROVAL_LIMIT)


def _order(rng: random.Random, sub: dict[str, Any], role: str, over: bool) -> dict[str, Any]:
    """An order of the subtask's customer: a target of its kind, or one it must leave alone."""
    qty = rng.randint(4, 5) if over else rng.randint(1, 5)
    price = rng.randint(26, 40) if over else rng.randint(2, APPROVAL_LIMIT // qty)
    promised = rng.randint(3, 24)
    on_time, late = promised - rng.randint(0, 2), promised + rng.randint(1, 6)
    if sub["kind"] == "late_refunds":
        status, delivered, refunded = ("delivered", late, 0) if role == "target" else rng.choice(
            [("delivered", on_time, 0), ("delivered", on_time, 0), ("pending", None, 0), ("refunded", late, -1)])
    else:  # cancel_pending
        status, delivered, refunded = ("pending", None, 0) if role == "target" else rng.choice(
            [("delivered", on_time, 0), ("delivered", late, 0), ("cancelled", None, 0)])
    total = qty * price
    return {"customer": sub["customer"], "item": rng.choice(ITEMS), "qty": qty, "total": total, "status": status,
            "promised_day": promised, "delivered_day": delivered, "refunded": total if refunded < 0 else refunded}


def _booking(rng: random.Random, sub: dict[str, Any], role: str, over: bool) -> dict[str, Any]:
    day = sub["day"]
    deposit = rng.randint(APPROVAL_LIMIT + 1, 2 * APPROVAL_LIMIT) if over else rng.randint(10, APPROVAL_LIMIT)
    if role == "target":
        return {"customer": sub["customer"], "day": day, "deposit": deposit, "status": "active", "refunded": 0}
    if rng.random() < 0.3:  # the right day, already cancelled
        return {"customer": sub["customer"], "day": day, "deposit": deposit, "status": "cancelled",
                "refunded": deposit}
    other = rng.choice([d for d in range(1, 29) if d != day])
    return {"customer": sub["customer"], "day": other, "deposit": deposit, "status": "active", "refunded": 0}
