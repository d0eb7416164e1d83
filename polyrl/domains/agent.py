"""The built-in agent domain: multi-step questions about a simulated shop, answered with tools.

Each task carries its own world (agent_world.py: prices, stock, notes; hidden from
the prompt, so the agent must call tools) and the gold calls a good agent makes.
Difficulty levels, by the calls needed:

1. one lookup            "What is the price of a pen?"              price
2. lookup and combine    "What do 3 pens cost?"                     price, calc
                         "Which costs more, a pen or a cup?"        price, price
3. two lookups, combine  "What do 2 pens and 3 cups cost?"          price, price, calc
                         "What are the pens in stock worth?"        stock, price, calc
4. indirection, errors   "What do 3 gift items cost?"               note, price, calc
                         "How many gift items are in stock?"        note, stock
                         "What is the price of a kite?" (not sold)  price -> error, answer "none"

Answers are integers, an item name, or "none". Which split a task belongs to is a
stable hash of its prompt (`hash_split`), as in the math domain: a held-out question
is never asked in training, whatever its world.

`demonstration(task)` gives the whole episode a good agent produces (system prompt,
question, one call per turn in the text format, the world's real results, the final
<answer>), for supervised pre-training; `polyrl.agent.engine_model.training_tokens`
lays it out as token ids with the loss mask on the assistant turns.

Pack lines of this domain: {"id", "domain": "agent", "prompt", "answer",
"verifier": "success_minus_cost", "world": {"items": {...}, "notes": {...}}}.

Out of scope: tasks that change the world, multi-agent or user-simulator tasks
(tau-bench style), and natural-language variety.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from typing import Any, Callable

from polyrl.agent.call_format import format_answer, format_call, system_prompt
from polyrl.agent.model import Message
from polyrl.agent.tools import ToolBox, ToolCall
from polyrl.domains.agent_world import ITEMS, TOPICS, World, random_world
from polyrl.domains.generated import check_levels, draw_distinct
from polyrl.domains.pack import check_split, hash_split
from polyrl.types import Task

LEVELS = (1, 2, 3, 4)
_MAX_DRAWS = 100_000
"""Generator calls one sample may make before it gives up (a question recurs only with
another world, so repeats are never kept and the draws are bounded instead)."""

Problem = tuple[str, World, list[tuple[str, dict[str, Any]]], str, str]
"""(prompt, world, gold calls as (tool, arguments), answer, kind)."""


def _plural(item: str) -> str:
    return item + "s"  # every item in ITEMS takes a plain -s


_PRICE_QUESTIONS = ("What is the price of a {}?", "What does a {} cost?")
_STOCK_QUESTIONS = ("How many {}s are in stock?", "How many {}s are left?")


def _lookup(rng: random.Random) -> Problem:
    item = rng.choice(ITEMS)
    world = random_world(rng, include=(item,))
    if rng.random() < 0.5:
        return (rng.choice(_PRICE_QUESTIONS).format(item), world, [("price", {"item": item})],
                str(world.price(item)), "price")
    return (rng.choice(_STOCK_QUESTIONS).format(item), world, [("stock", {"item": item})],
            str(world.stock(item)), "stock")


def _combine(rng: random.Random) -> Problem:
    if rng.random() < 0.5:
        item, k = rng.choice(ITEMS), rng.randint(2, 9)
        world = random_world(rng, include=(item,))
        p = world.price(item)
        return (f"What do {k} {_plural(item)} cost?", world,
                [("price", {"item": item}), ("calc", {"expr": f"{k}*{p}"})], str(k * p), "cost")
    a, b = rng.sample(ITEMS, 2)
    world = random_world(rng, include=(a, b))
    winner = a if world.price(a) > world.price(b) else b  # prices in a world are distinct
    return (f"Which costs more, a {a} or a {b}?", world, [("price", {"item": a}), ("price", {"item": b})],
            winner, "compare")


def _two_lookups(rng: random.Random) -> Problem:
    if rng.random() < 0.5:
        a, b = rng.sample(ITEMS, 2)
        k, m = rng.randint(2, 9), rng.randint(2, 9)
        world = random_world(rng, include=(a, b))
        pa, pb = world.price(a), world.price(b)
        return (f"What do {k} {_plural(a)} and {m} {_plural(b)} cost?", world,
                [("price", {"item": a}), ("price", {"item": b}), ("calc", {"expr": f"{k}*{pa}+{m}*{pb}"})],
                str(k * pa + m * pb), "cost2")
    item = rng.choice(ITEMS)
    world = random_world(rng, include=(item,))
    s, p = world.stock(item), world.price(item)
    return (f"What are the {_plural(item)} in stock worth?", world,
            [("stock", {"item": item}), ("price", {"item": item}), ("calc", {"expr": f"{s}*{p}"})],
            str(s * p), "worth")


def _indirect(rng: random.Random) -> Problem:
    kind = rng.randrange(3)
    if kind == 2:  # an item the shop does not have: the tool's error is the answer
        item = rng.choice(ITEMS)
        world = random_world(rng, exclude=(item,))
        return (rng.choice(_PRICE_QUESTIONS).format(item), world, [("price", {"item": item})], "none",
                "absent")
    topic, item = rng.choice(TOPICS), rng.choice(ITEMS)
    world = random_world(rng, include=(item,))
    world.notes[topic] = f"The {topic} is a {item}."
    if kind == 0:
        k = rng.randint(2, 9)
        p = world.price(item)
        return (f"What do {k} {topic} items cost?", world,
                [("note", {"topic": topic}), ("price", {"item": item}), ("calc", {"expr": f"{k}*{p}"})],
                str(k * p), "note_cost")
    return (f"How many {topic} items are in stock?", world,
            [("note", {"topic": topic}), ("stock", {"item": item})], str(world.stock(item)), "note_stock")


_GENERATORS: dict[int, Callable[[random.Random], Problem]] = {1: _lookup, 2: _combine, 3: _two_lookups,
                                                             4: _indirect}


def generate(rng: random.Random, level: int) -> Problem:
    return _GENERATORS[level](rng)


class AgentDomain:
    """Generated shop questions answered with tools; see the module docstring."""

    name = "agent"
    default_verifier = "success_minus_cost"

    def __init__(self, levels: tuple[int, ...] = LEVELS, weights: tuple[float, ...] | None = None) -> None:
        """`levels` to draw from and, optionally, their relative `weights` (default equal)."""
        self.levels, self.weights = check_levels("agent", levels, LEVELS, weights)

    def sample(self, split: str, n: int, seed: int) -> list[Task]:
        """n distinct tasks of `split` (a question may recur with another world)."""
        check_split(split)
        draws = itertools.count(1)

        def draw_one(rng: random.Random) -> tuple[str, Task]:
            level = rng.choices(self.levels, self.weights)[0]
            while True:  # draw within the level, so both splits follow the level weights
                if next(draws) > _MAX_DRAWS:
                    raise RuntimeError(f"agent domain: could not draw {n} distinct {split!r} tasks "
                                       f"of levels {self.levels}")
                prompt, world, gold, answer, kind = generate(rng, level)
                if hash_split(prompt) == split:
                    break
            digest = hashlib.sha256((prompt + json.dumps(world.to_json(), sort_keys=True)).encode()).hexdigest()
            return digest, Task(
                id=f"agent-{split}-{level}-{digest[:10]}", domain=self.name, prompt=prompt, answer=answer,
                split=split, difficulty=level,
                data={"world": world.to_json(), "kind": kind, "optimal_steps": len(gold) + 1,
                      "gold_calls": [{"name": name, "arguments": args} for name, args in gold]})

        return draw_distinct(random.Random(f"agent|{split}|{seed}"), n, draw_one, max_duplicates_in_a_row=None)

    @staticmethod
    def toolbox(task: Task) -> ToolBox:
        """A fresh world of `task` with its tools (one per episode)."""
        if "world" not in task.data:
            raise ValueError(f"task {task.id!r} has no 'world'; agent tasks carry the world their tools read")
        return World.from_json(task.data["world"]).toolbox()

    @staticmethod
    def system_prompt(task: Task) -> str:
        """The system prompt the agent loop renders by default for the tiny model (compact tools)."""
        return system_prompt(AgentDomain.toolbox(task), "compact")

    @staticmethod
    def demonstration(task: Task) -> list[Message]:
        """The full episode of a good agent: system, user, then (assistant call, tool
        result) per gold call, and the final assistant <answer>. Results come from the
        task's world through the same ToolBox the agent loop runs."""
        if "gold_calls" not in task.data:
            raise ValueError(f"task {task.id!r} was not generated by AgentDomain; it has no gold calls")
        tools = AgentDomain.toolbox(task)
        messages: list[Message] = [{"role": "system", "content": system_prompt(tools, "compact")},
                                   {"role": "user", "content": task.prompt}]
        for k, gold in enumerate(task.data["gold_calls"]):
            call = ToolCall(f"call_{k}_0", gold["name"], dict(gold["arguments"]))
            outcome = tools.run(call)
            messages.append({"role": "assistant", "content": format_call(gold["name"], gold["arguments"])})
            messages.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": outcome.content})
        messages.append({"role": "assistant", "content": format_answer(str(task.answer))})
        return messages
