"""The built-in code domain: write a Python function from input/output examples.

Made for the built-in tiny model: a prompt shows three calls of `f` and their results,

    Write a Python function f(x) with:
    f(0) == 3
    f(1) == 4
    f(6) == 9

and a good answer is a fenced block defining it (`return x + 3`). The reward is
`unit_test_pass` on hidden args/expected tests: the three shown calls plus three inputs
the prompt does not show, so a function that only remembers the examples scores at most
one half. Difficulty levels:

1. one constant read off the examples: x + c, x - c, x * c
2. one list operation: sum, max, min, len, first, last, sorted, reversed
3. one string operation: upper, reversed, doubled, length, first, last character
4. a line a * x + b: `demonstration` works a out of f(1) - f(0) in a comment first

The shown calls always tell the function apart from the other operations of its level.
Which split a task belongs to is a stable hash of its prompt (`hash_split`), so train and
held-out never share a prompt. Each task carries its `reference` solution (the tests
check that every reference passes, in the sandbox).

Out of scope: stdin/stdout programs, several functions, prose specifications; real
models get code from the HumanEval pack (`humaneval.py`) or user task packs.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Callable

from polyrl.domains.generated import check_levels, draw_distinct
from polyrl.domains.pack import check_split, hash_split
from polyrl.types import Task

LEVELS = (1, 2, 3, 4)
_WORDS = ("cat", "dog", "sun", "map", "tree", "bird", "fish", "star", "moon", "lamp", "rain", "leaf",
          "road", "ship", "frog", "cake", "milk", "rock", "wind", "bell", "code", "data", "list", "word")


def _int_family(rng: random.Random) -> tuple[str, str, Callable[[int], int]]:
    kind = rng.choice(["add", "sub", "mul"])
    if kind == "mul":
        c = rng.randint(2, 9)
        return kind, f"x * {c}", lambda x: x * c
    c = rng.randint(1, 9)
    if kind == "add":
        return kind, f"x + {c}", lambda x: x + c
    return kind, f"x - {c}", lambda x: x - c


LIST_OPS: dict[str, Callable[[list[int]], Any]] = {
    "sum(xs)": sum, "max(xs)": max, "min(xs)": min, "len(xs)": len, "xs[0]": lambda xs: xs[0],
    "xs[-1]": lambda xs: xs[-1], "sorted(xs)": sorted, "xs[::-1]": lambda xs: xs[::-1],
}
STR_OPS: dict[str, Callable[[str], Any]] = {
    "s.upper()": str.upper, "s[::-1]": lambda s: s[::-1], "s + s": lambda s: s + s, "len(s)": len,
    "s[0]": lambda s: s[0], "s[-1]": lambda s: s[-1],
}


def _distinct_list(rng: random.Random) -> list[int]:
    return rng.sample(range(1, 10), rng.randint(3, 4))


def _task(rng: random.Random, level: int) -> tuple[str, str, list[list[Any]], str, Callable[..., Any]]:
    """(parameter, return expression, argument lists shown then hidden, family, function)."""
    if level == 1:
        kind, expr, fn = _int_family(rng)
        shown = [0, 1, rng.randint(2, 9)]
        hidden = rng.sample([x for x in range(-5, 20) if x not in shown], 3)
        return "x", expr, [[x] for x in shown + hidden], kind, fn
    if level in (2, 3):
        param, ops = ("xs", LIST_OPS) if level == 2 else ("s", STR_OPS)
        expr = rng.choice(list(ops))
        while True:  # the shown calls must tell this operation from every other one, and the
            # tests must not all expect one value (a constant return would pass them: polyrl audit)
            inputs = [_distinct_list(rng) for _ in range(6)] if level == 2 else rng.sample(_WORDS, 6)
            outputs = [ops[expr](v) for v in inputs[:3]]
            constant = len({repr(ops[expr](v)) for v in inputs}) == 1
            if not constant and not any(other != expr and [op(v) for v in inputs[:3]] == outputs
                                        for other, op in ops.items()):
                return param, expr, [[v] for v in inputs], expr, ops[expr]
    a, b = rng.randint(2, 9), rng.randint(1, 9)
    shown = [0, 1, rng.randint(2, 5)]
    hidden = rng.sample([x for x in range(-3, 12) if x not in shown], 3)
    return "x", f"{a} * x + {b}", [[x] for x in shown + hidden], "affine", lambda x: a * x + b


def _show(value: Any) -> str:
    return repr(value).replace("'", '"')


def generate(rng: random.Random, level: int) -> dict[str, Any]:
    """One task of `level` as its fields: prompt, tests, reference, solution lines, family."""
    param, expr, calls, family, fn = _task(rng, level)
    tests = [{"args": args, "expected": fn(*args)} for args in calls]
    shown = "\n".join(f"f({_show(t['args'][0])}) == {_show(t['expected'])}" for t in tests[:3])
    prompt = f"Write a Python function f({param}) with:\n{shown}"
    body = [f"return {expr}"]
    if family == "affine":
        f0, f1 = tests[0]["expected"], tests[1]["expected"]
        body = [f"# f(1) - f(0) = {f1} - {f0} = {f1 - f0}"] + body
    reference = f"def f({param}):\n" + "".join(f"    {line}\n" for line in body)
    return {"prompt": prompt, "tests": tests, "reference": reference, "family": family}


class CodeDomain:
    """Generated function-synthesis tasks graded by hidden unit tests; see the module docstring."""

    name = "code"
    default_verifier = "unit_test_pass"

    def __init__(self, levels: tuple[int, ...] = LEVELS, weights: tuple[float, ...] | None = None) -> None:
        """`levels` to draw from and, optionally, their relative `weights` (default equal)."""
        self.levels, self.weights = check_levels("code", levels, LEVELS, weights)

    def sample(self, split: str, n: int, seed: int) -> list[Task]:
        """n tasks of `split`; distinct prompts unless the levels' task space runs out."""
        check_split(split)
        return draw_distinct(random.Random(f"code|{split}|{seed}"), n, lambda rng: self._draw(rng, split))

    def _draw(self, rng: random.Random, split: str) -> tuple[str, Task] | None:
        """(prompt, task) of one draw, or None when the prompt belongs to the other split."""
        level = rng.choices(self.levels, self.weights)[0]
        fields = generate(rng, level)
        prompt = fields["prompt"]
        if hash_split(prompt) != split:
            return None
        sha = hashlib.sha256(prompt.encode()).hexdigest()
        return prompt, Task(
            id=f"code-{split}-{level}-{sha[:10]}", domain=self.name, prompt=prompt, split=split,
            difficulty=level,
            data={"entry_point": "f", "tests": fields["tests"], "reference": fields["reference"],
                  "family": fields["family"]},
        )

    @staticmethod
    def demonstration(task: Task) -> str:
        """The reference solution as an answer: one fenced Python block."""
        if "reference" not in task.data:
            raise ValueError(f"task {task.id!r} has no reference solution to demonstrate")
        return f"```python\n{task.data['reference']}```"
