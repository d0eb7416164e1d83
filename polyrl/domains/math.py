"""The built-in math domain: procedurally generated problems with exact integer answers.

Made for the built-in character-level tiny model: prompts are short ASCII text
("What is 47 + 38?", "Solve for x: 3x + 4 = 19."), answers are integer strings, and
`MathDomain.demonstration(task)` gives a worked solution ending in `\\boxed{N}` to
pre-train on: sums, differences and products by one digit are worked column by column
(`column_work`). Difficulty levels:

1. single-digit +, -, *
2. two-digit +, -; two-digit * one-digit; one-step word problems
3. three-digit +, -; three-digit * one-digit; two-step word problems
4. linear equations a*x + b = c with integer x; three-number expressions

Which split a problem belongs to is a stable hash of its prompt (`hash_split`), so train
and held-out never share a prompt, whatever the seed or level mix.

Out of scope: competition math, fractions and non-integer answers, natural-language
variety. Real models get math from task packs (`polyrl.domains.pack`).
"""

from __future__ import annotations

import hashlib
import random
from typing import Callable

from polyrl.domains.generated import check_levels, draw_distinct
from polyrl.domains.pack import check_split, hash_split
from polyrl.types import Task

LEVELS = (1, 2, 3, 4)
_NAMES = ("Ann", "Ben", "Sam", "Mia", "Tom", "Eva", "Max", "Zoe")
_ITEMS = ("apples", "pens", "cups", "eggs", "cards", "books", "coins", "shells")

Problem = tuple[str, int, str, str]
"""(prompt, answer, worked solution without the box, kind)."""


def _digits(n: int) -> list[int]:
    """Least significant first."""
    return [int(c) for c in reversed(str(n))]


def column_work(a: int, op: str, b: int) -> str:
    """Worked solution of a op b, column by column from the ones digit, ending "a op b = r.".

    Single-digit facts are written as they are; larger sums, differences and products by
    one digit go through the columns with their carries and borrows. Every step is then
    a single-digit fact the model has seen thousands of times, so held-out problems are
    new combinations of known steps (a tiny model generalises to those; it cannot to
    unseen multi-digit facts).
    """
    result = {"+": a + b, "-": a - b, "*": a * b}[op]
    if a < 10 and b < 10 or a < 0 or b < 0 or (op == "*" and b >= 10):
        return f"{a} {op} {b} = {result}."
    if op == "-" and a < b:
        return f"{column_work(b, '-', a)[:-1]}, so {a} - {b} = {result}."
    xs, ys = _digits(a), _digits(b)
    steps, carry = [], 0
    for i, x in enumerate(xs if op == "*" else range(max(len(xs), len(ys)))):
        if op == "*":
            v = x * b + carry
            steps.append(f"{x} * {b}" + (f" + {carry}" if carry else "") + f" = {v}")
            carry = v // 10
            continue
        x, y = (xs[i] if i < len(xs) else 0), (ys[i] if i < len(ys) else 0)
        if op == "+":
            v = x + y + carry
            steps.append(f"{x} + {y}" + (f" + {carry}" if carry else "") + f" = {v}")
            carry = v // 10
        else:
            top = x - carry
            borrow = top < y
            steps.append(f"{top + 10 if borrow else top} - {y} = {top + 10 * borrow - y}"
                         if not carry else f"{x + 10 * borrow} - {carry} - {y} = {top + 10 * borrow - y}")
            carry = int(borrow)
    return ", ".join(steps) + f", {a} {op} {b} = {result}."


def _binary(a: int, op: str, b: int) -> Problem:
    result = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"What is {a} {op} {b}?", result, column_work(a, op, b), "arithmetic"


def _arithmetic(rng: random.Random, level: int) -> Problem:
    op = rng.choice("+-*")
    lo, hi = {1: (0, 9), 2: (10, 99), 3: (100, 999)}[level]
    a, b = rng.randint(lo, hi), rng.randint(lo, hi)
    if op == "*" and level > 1:
        b = rng.randint(2, 9)  # products by one digit, worked column by column
    if op == "-" and level < 3:
        a, b = max(a, b), min(a, b)  # negative results start at level 3
    return _binary(a, op, b)


def _word_one_step(rng: random.Random) -> Problem:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    template = rng.randrange(4)
    if template == 0:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        return f"{name} has {a} {item} and gets {b} more. How many now?", a + b, column_work(a, "+", b), "word"
    if template == 1:
        a = rng.randint(11, 99)
        b = rng.randint(10, a)
        return f"{name} has {a} {item} and gives away {b}. How many are left?", a - b, column_work(a, "-", b), "word"
    if template == 2:
        a, b = rng.randint(2, 9), rng.randint(10, 25)
        return f"{name} buys {a} bags of {b} {item}. How many {item}?", a * b, column_work(b, "*", a), "word"
    kids, each = rng.randint(2, 9), rng.randint(2, 12)
    total = kids * each
    return f"{total} {item} are shared by {kids} kids. How many each?", each, f"{total} / {kids} = {each}.", "word"


def _word_two_step(rng: random.Random) -> Problem:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    template = rng.randrange(3)
    if template == 0:
        a, bags, per = rng.randint(10, 99), rng.randint(2, 9), rng.randint(2, 12)
        r = a + bags * per
        prompt = f"{name} has {a} {item} and buys {bags} bags of {per}. How many now?"
        return prompt, r, f"{a} + {bags} * {per} = {a} + {bags * per} = {r}.", "word"
    if template == 1:
        a = rng.randint(20, 99)
        sold, got = rng.randint(2, a - 1), rng.randint(2, 50)
        r = a - sold + got
        prompt = f"{name} has {a} {item}, sells {sold} and gets {got}. How many now?"
        return prompt, r, f"{a} - {sold} + {got} = {a - sold} + {got} = {r}.", "word"
    bags, per = rng.randint(2, 9), rng.randint(2, 12)
    used = rng.randint(1, bags * per - 1)
    r = bags * per - used
    prompt = f"{name} buys {bags} bags of {per} {item} and uses {used}. How many left?"
    return prompt, r, f"{bags} * {per} - {used} = {bags * per} - {used} = {r}.", "word"


def _algebra(rng: random.Random) -> Problem:
    a, x, b = rng.randint(2, 9), rng.choice([v for v in range(-9, 21) if v != 0]), rng.randint(1, 40)
    sign = rng.choice("+-")
    c = a * x + b if sign == "+" else a * x - b
    undo = "-" if sign == "+" else "+"
    ax = a * x
    prompt = f"Solve for x: {a}x {sign} {b} = {c}."
    return prompt, x, f"{a}x = {c} {undo} {b} = {ax}, x = {ax} / {a} = {x}.", "algebra"


def _expression(rng: random.Random) -> Problem:
    a, b, c = rng.randint(10, 99), rng.randint(2, 9), rng.randint(10, 199)
    if rng.random() < 0.5:  # product first: "a * b - c"
        op = rng.choice("+-")
        r = a * b + c if op == "+" else a * b - c
        return f"What is {a} * {b} {op} {c}?", r, f"{a} * {b} = {a * b}, {a * b} {op} {c} = {r}.", "expression"
    op = rng.choice("+-")  # product last: "c - a * b"
    r = c + a * b if op == "+" else c - a * b
    return f"What is {c} {op} {a} * {b}?", r, f"{a} * {b} = {a * b}, {c} {op} {a * b} = {r}.", "expression"


_GENERATORS: dict[int, tuple[Callable[[random.Random], Problem], ...]] = {
    1: (lambda rng: _arithmetic(rng, 1),),
    2: (lambda rng: _arithmetic(rng, 2), _word_one_step),
    3: (lambda rng: _arithmetic(rng, 3), _word_two_step),
    4: (_algebra, _expression),
}


def generate(rng: random.Random, level: int) -> Problem:
    """One problem of `level`, drawn from `rng`."""
    return rng.choice(_GENERATORS[level])(rng)


class MathDomain:
    """Generated arithmetic, word and algebra problems; see the module docstring."""

    name = "math"
    default_verifier = "answer_verify"

    def __init__(self, levels: tuple[int, ...] = LEVELS, weights: tuple[float, ...] | None = None) -> None:
        """`levels` to draw from and, optionally, their relative `weights` (default equal)."""
        self.levels, self.weights = check_levels("math", levels, LEVELS, weights)

    def sample(self, split: str, n: int, seed: int) -> list[Task]:
        """n tasks of `split`; distinct prompts unless the levels' problem space runs out."""
        check_split(split)
        return draw_distinct(random.Random(f"math|{split}|{seed}"), n, lambda rng: self._draw(rng, split))

    def _draw(self, rng: random.Random, split: str) -> tuple[str, Task] | None:
        """(prompt, task) of one draw, or None when the prompt belongs to the other split."""
        level = rng.choices(self.levels, self.weights)[0]
        prompt, answer, solution, kind = generate(rng, level)
        if hash_split(prompt) != split:
            return None
        sha = hashlib.sha256(prompt.encode()).hexdigest()
        return prompt, Task(
            id=f"math-{split}-{level}-{sha[:10]}",
            domain=self.name,
            prompt=prompt,
            answer=str(answer),
            split=split,
            difficulty=level,
            data={"kind": kind, "solution": solution},
        )

    @staticmethod
    def demonstration(task: Task) -> str:
        """A short worked solution of a generated task, ending in `\\boxed{answer}`."""
        if "solution" not in task.data:
            raise ValueError(f"task {task.id!r} was not generated by MathDomain; it has no worked solution")
        return f"{task.data['solution']}\n\\boxed{{{task.answer}}}"

