"""The simulated tool world of the agent domain: a tiny shop with a price list, stock
counts, a few notes, and a calculator.

    price(item)   -> "12"                     the item's price
    stock(item)   -> "7"                      units in stock
    note(topic)   -> "The gift is a lamp."    a short document
    calc(expr)    -> "36"                     integers with + - * and parentheses

An unknown item or topic makes the tool raise (KeyError), a bad expression too
(ValueError); the agent loop turns both into "Error: ..." observations, which some
tasks need the agent to read ("none" is the answer when the item does not exist).

Tools take an item as the model writes it: case and a plural "s" are forgiven
("Pens" finds "pen"). Every output is a few characters, so an episode fits the tiny
model's 512-token context.

Out of scope: tools that change the world (orders, updates) and checks of the final
world state; tasks here are read-only questions graded on the answer.
"""

from __future__ import annotations

import ast
import random
from dataclasses import dataclass
from typing import Any

from polyrl.agent.tools import Tool, ToolBox

ITEMS = ("pen", "cup", "book", "lamp", "bag", "hat", "ball", "mug", "key", "sock", "fan", "cap", "doll", "kite",
         "rug", "bell")
TOPICS = ("gift", "sale", "prize")
WORLD_ITEMS = 4
"""Items in one world's shop."""
_MAX_EXPR_CHARS = 60


@dataclass
class World:
    items: dict[str, dict[str, int]]
    """item -> {"price": int, "stock": int}"""
    notes: dict[str, str]
    """topic -> text"""

    def to_json(self) -> dict[str, Any]:
        return {"items": self.items, "notes": self.notes}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "World":
        if not isinstance(data, dict) or not isinstance(data.get("items"), dict):
            raise ValueError("an agent task's 'world' must be an object with 'items' (and optionally 'notes')")
        items = {str(k): {"price": int(v["price"]), "stock": int(v["stock"])} for k, v in data["items"].items()}
        return cls(items, {str(k): str(v) for k, v in (data.get("notes") or {}).items()})

    def _item(self, item: str) -> dict[str, int]:
        key = item.strip().lower()
        if key not in self.items and key.endswith("s") and key[:-1] in self.items:
            key = key[:-1]
        if key not in self.items:
            raise KeyError(f"no item {item}")
        return self.items[key]

    def price(self, item: str) -> int:
        return self._item(item)["price"]

    def stock(self, item: str) -> int:
        return self._item(item)["stock"]

    def note(self, topic: str) -> str:
        key = topic.strip().lower()
        if key not in self.notes:
            raise KeyError(f"no note {topic}")
        return self.notes[key]

    def toolbox(self) -> ToolBox:
        def string_arg(name: str, description: str) -> dict[str, Any]:
            return {"type": "object", "properties": {name: {"type": "string", "description": description}},
                    "required": [name], "additionalProperties": False}

        return ToolBox([
            Tool("price", "Price of one unit of an item.", string_arg("item", "item name, e.g. pen"), self.price),
            Tool("stock", "Units of an item in stock.", string_arg("item", "item name, e.g. pen"), self.stock),
            Tool("calc", "Integer arithmetic with + - * and parentheses.",
                 string_arg("expr", "e.g. 3*12+5"), calc),
            Tool("note", "A short note on a topic.", string_arg("topic", "e.g. gift"), self.note),
        ])


def calc(expr: str) -> int:
    """The integer value of `expr` (+, -, *, parentheses, integer literals); ValueError otherwise."""
    if len(expr) > _MAX_EXPR_CHARS:
        raise ValueError(f"expression longer than {_MAX_EXPR_CHARS} characters")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot read {expr!r}; use integers with + - * ( )") from None
    return _eval(tree.body, expr)


def _eval(node: ast.AST, expr: str) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand, expr)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
        a, b = _eval(node.left, expr), _eval(node.right, expr)
        return a + b if isinstance(node.op, ast.Add) else a - b if isinstance(node.op, ast.Sub) else a * b
    raise ValueError(f"cannot compute {expr!r}; use integers with + - * ( )")


def random_world(rng: random.Random, include: tuple[str, ...] = (), exclude: tuple[str, ...] = ()) -> World:
    """A shop of WORLD_ITEMS items (those in `include` among them, none of `exclude`),
    with distinct prices 2..30, stock 0..15, and a note per topic naming one item."""
    rest = [i for i in ITEMS if i not in include and i not in exclude]
    names = list(include) + rng.sample(rest, WORLD_ITEMS - len(include))
    rng.shuffle(names)
    prices = rng.sample(range(2, 31), len(names))
    items = {name: {"price": p, "stock": rng.randint(0, 15)} for name, p in zip(names, prices)}
    notes = {topic: f"The {topic} is a {rng.choice(names)}." for topic in TOPICS}
    return World(items, notes)
