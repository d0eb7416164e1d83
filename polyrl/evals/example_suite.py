"""`polyrl suite example`: a suite shaped like a business's own evaluation set, 100+ tasks.

Four families, each with typical inputs, edge cases and failure modes (`metadata.tag`):

    family            tasks  how it runs, how it is graded
    customer_service  40     agent episodes over the shop tools (price, stock, note, calc),
                             success_minus_cost: lookups and totals; an unknown item ("none"),
                             a gift note naming an item the shop does not sell (a tool
                             error), an ambiguous request that names no item the shop
                             knows, and a policy note whose answer lies past the tool-result cap
    code_fix          20     one call, unit_test_pass: a buggy function to fix, some tests shown
                             in the prompt and more hidden; the reference fix is on the line
    word_problem      24     one call, answer_verify: shop arithmetic, one and two steps, and
                             multi-step orders with distracting numbers
    long_document     20     one call, answer_verify: an order log of 5 to 60 lines and a
                             question about one order (or the sum over a customer's orders);
                             the exact answer is an integer

Every line is a valid task pack line of an existing domain (agent, code, math), so `polyrl
eval`, `polyrl audit` and `polyrl score` read it as it is; `split` is "heldout" throughout.
A customer-service line carries the calls a good agent makes (`gold_calls`), from which the
audit shows it solvable, except the long policy note's, whose answer is a phrase inside it.
The suite is a pure function of the seed.

Out of scope: natural-language variety beyond the templates, and long documents sized to a
particular tokenizer (the lengths are in lines; a character-level model sees ~50 tokens a line).
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable

from polyrl.domains.agent import generate as agent_problem
from polyrl.domains.agent_world import ITEMS, random_world
from polyrl.domains.math import generate as math_problem

Line = dict[str, Any]
_NAMES = ("Ada", "Ben", "Cai", "Dev", "Eli", "Fay", "Gus", "Hal", "Ivy", "Jon", "Kim", "Lea", "Max", "Noa", "Oli",
          "Pia", "Quin", "Rae", "Sol", "Tess")


def example_suite(seed: int = 0) -> list[Line]:
    """The suite's pack lines, in family order."""
    rng = random.Random(f"polyrl-example-suite|{seed}")
    return _customer_service(rng) + _code_fixes(rng) + _word_problems(rng) + _long_documents(rng)


def _line(family: str, tag: str, k: int, domain: str, prompt: str, difficulty: int, extra: dict[str, Any] | None = None,
          **fields: Any) -> Line:
    """A pack line; `extra` goes into its metadata beside the tag and the family."""
    return {"id": f"{family}-{tag}-{k:02d}", "domain": domain, "prompt": prompt, **fields, "split": "heldout",
            "difficulty": difficulty, "metadata": {"tag": tag, "family": family, **(extra or {})}}


# ------------------------------------------------------------------------ customer service


Gold = list[tuple[str, dict[str, Any]]] | None
"""The calls a good agent makes, as (tool, arguments); None when no call's result is the answer."""


def _agent_line(tag: str, k: int, prompt: str, world: Any, answer: str, case: str, level: int, gold: Gold) -> Line:
    calls = {} if gold is None else {"gold_calls": [{"name": name, "arguments": args} for name, args in gold]}
    return _line("customer_service", tag, k, "agent", prompt, level, {"case": case}, answer=answer,
                 verifier="success_minus_cost", world=world.to_json(), **calls)


Case = tuple[str, Any, str, str, Gold]
"""(prompt, world, answer, case, gold calls)."""


def _customer_service(rng: random.Random) -> list[Line]:
    out: list[Line] = []
    seen: set[str] = set()  # one prompt, one answer: `polyrl audit` fails a prompt graded two ways

    def draw(make: Callable[[random.Random], Case]) -> Case:
        for _ in range(1000):
            case = make(rng)
            if case[0] not in seen:
                seen.add(case[0])
                return case
        raise AssertionError(f"{make.__name__} ran out of distinct prompts")

    for k in range(20):  # typical: lookups, totals, comparisons (the agent domain's levels 1-3)
        level = 1 + k % 3
        prompt, world, answer, kind, gold = draw(lambda r: _generated(r, level))
        out.append(_agent_line("typical", k, prompt, world, answer, kind, level, gold))
    edges = [_unknown_item, _note_lookup, _out_of_stock, _shouting]
    for k in range(12):  # edge: unknown items, indirection through notes, zero stock, odd phrasing
        prompt, world, answer, case, gold = draw(edges[k % len(edges)])
        out.append(_agent_line("edge", k, prompt, world, answer, case, 4, gold))
    failures = [_gift_not_sold, _ambiguous, _long_policy]
    for k in range(8):  # failure modes: a tool error on the way, a request naming nothing, a long note
        prompt, world, answer, case, gold = draw(failures[k % len(failures)])
        out.append(_agent_line("failure_mode", k, prompt, world, answer, case, 4, gold))
    return out


def _generated(rng: random.Random, level: int) -> Case:
    prompt, world, gold, answer, kind = agent_problem(rng, level)
    return prompt, world, answer, kind, gold


def _unknown_item(rng: random.Random) -> Case:
    item = rng.choice(ITEMS)
    return (f"What is the price of a {item}?", random_world(rng, exclude=(item,)), "none", "unknown_item",
            [("price", {"item": item})])


def _note_lookup(rng: random.Random) -> Case:
    item, topic = rng.choice(ITEMS), rng.choice(("sale", "gift", "prize"))
    world = random_world(rng, include=(item,))
    world.notes[topic] = f"The {topic} is a {item}."
    ask = rng.choice(("What does the {} item cost?", "What is the price of the {} item?", "How much is the {} item?"))
    return (ask.format(topic), world, str(world.price(item)), "note_lookup",
            [("note", {"topic": topic}), ("price", {"item": item})])


def _out_of_stock(rng: random.Random) -> Case:
    item = rng.choice(ITEMS)
    world = random_world(rng, include=(item,))
    world.items[item]["stock"] = 0
    return (f"Do you have any {item}s left? How many are in stock?", world, "0", "out_of_stock",
            [("stock", {"item": item})])


def _shouting(rng: random.Random) -> Case:
    item = rng.choice(ITEMS)
    world = random_world(rng, include=(item,))
    return f"HOW MUCH IS ONE {item.upper()}??", world, str(world.price(item)), "odd_phrasing", [("price", {"item": item})]


def _gift_not_sold(rng: random.Random) -> Case:
    item, topic = rng.choice(ITEMS), rng.choice(("gift", "sale", "prize"))
    world = random_world(rng, exclude=(item,))
    world.notes[topic] = f"The {topic} is a {item}."
    ask = rng.choice(("What does the {} item cost?", "What is the {} item's price?", "How much for the {} item?"))
    return ask.format(topic), world, "none", "tool_error", [("note", {"topic": topic}), ("price", {"item": item})]


def _ambiguous(rng: random.Random) -> Case:
    topic = rng.choice(("bonus", "raffle", "special", "deal"))  # no note has it: the request names nothing
    ask = rng.choice(("What does the {} cost?", "How much is the {}?", "What's the price of the {}?"))
    return ask.format(topic), random_world(rng), "none", "ambiguous_request", [("note", {"topic": topic})]


def _long_policy(rng: random.Random) -> Case:
    world = random_world(rng)
    days = rng.randint(10, 60)
    filler = [f"Rule {i}: items from aisle {rng.randint(1, 9)} are checked at the front desk." for i in range(1, 9)]
    middle = len(filler) // 2
    text = " ".join(filler[:middle] + [f"The return window is {days} days."] + filler[middle:])
    world.notes["policy"] = text
    ask = rng.choice(("How many days is the return window? Check the policy note.",
                      "Check the policy note: how long is the return window, in days?",
                      "What is the return window in days? It is in the policy note."))
    return ask, world, str(days), "long_tool_result", None


# ------------------------------------------------------------------------------ code fixes

_CODE_FAMILIES: list[tuple[str, str, str, str, list[Any], Callable[[int, int, Any], Any]]] = [
    # (tag, buggy body, fixed body, argument, test inputs, what the fix returns); {a}, {b} drawn per task
    ("typical", "return {a} * x - {b}", "return {a} * x + {b}", "x", [0, 1, 2, 5, 9], lambda a, b, x: a * x + b),
    ("typical", "return x * x + {a}", "return x * x - {a}", "x", [0, 1, 3, 4, 7], lambda a, b, x: x * x - a),
    ("typical", "return s", "return s[::-1]", "s", ["tree", "bell", "ab", "kayak", "mug"], lambda a, b, s: s[::-1]),
    ("typical", "return s.lower()", "return s.upper()", "s", ["pen", "Cup", "a1", "mug", "KEY"],
     lambda a, b, s: s.upper()),
    ("typical", "return len(xs) + {a}", "return len(xs) * {a}", "xs", [[1], [1, 2], [], [5, 5, 5], [0, 1, 2, 3]],
     lambda a, b, xs: len(xs) * a),
    ("edge", "return xs[0] + sum(xs[1:])", "return sum(xs)", "xs", [[1, 2], [5], [], [3, -3], [10, 20, 30]],
     lambda a, b, xs: sum(xs)),
    ("edge", "best = 0\n    for x in xs:\n        best = max(best, x)\n    return best", "return max(xs)", "xs",
     [[1, 5, 2], [-3, -1, -7], [-5], [4, 4], [0, -2]], lambda a, b, xs: max(xs)),
    ("edge", "return sum(xs) // len(xs)", "return sum(xs) // len(xs) if xs else 0", "xs",
     [[2, 4], [], [9], [1, 2, 3, 4], [7, 7, 7]], lambda a, b, xs: sum(xs) // len(xs) if xs else 0),
    ("failure_mode", "return sum(range(1, x))", "return sum(range(1, x + 1))", "x", [1, 2, 3, 10, 0],
     lambda a, b, x: x * (x + 1) // 2),
    ("failure_mode", "r = 0\n    for i in range(1, x + 1):\n        r = r * i\n    return r",
     "r = 1\n    for i in range(1, x + 1):\n        r = r * i\n    return r", "x", [0, 1, 3, 5, 6],
     lambda a, b, x: math.factorial(x)),
]


def _code_fixes(rng: random.Random) -> list[Line]:
    out: list[Line] = []
    counts = {"typical": 0, "edge": 0, "failure_mode": 0}
    for rotation, (tag, buggy, fixed, arg, inputs, solve) in enumerate(_CODE_FAMILIES * 2):
        # each family twice: other constants, and other examples shown first
        a, b = rng.randint(2, 9), rng.randint(1, 9)
        shift = rotation // len(_CODE_FAMILIES)
        inputs = inputs[shift:] + inputs[:shift]
        buggy_body, fixed_body = buggy.format(a=a, b=b), fixed.format(a=a, b=b)
        signature = f"f({arg})"
        tests = [{"args": [v], "expected": solve(a, b, v)} for v in inputs]
        shown = "\n".join(f"f({v!r}) == {t['expected']!r}" for v, t in zip(inputs[:3], tests))
        prompt = (f"This function has a bug:\n```python\ndef {signature}:\n    {buggy_body}\n```\n"
                  f"Fix it. Write a Python function {signature} with:\n{shown}")
        reference = f"def {signature}:\n    {fixed_body}\n"
        out.append(_line("code_fix", tag, counts[tag], "code", prompt, 2, entry_point="f", tests=tests,
                         reference=reference))
        counts[tag] += 1
    return out


# --------------------------------------------------------------------------- word problems


def _word_problems(rng: random.Random) -> list[Line]:
    out: list[Line] = []
    seen: set[str] = set()
    for tag, count, level in (("typical", 12, 2), ("edge", 6, 3)):
        k = 0
        while k < count:  # the math domain's one-step (level 2) and two-step (level 3) word problems
            prompt, answer, _, kind = math_problem(rng, level)
            if kind == "word" and prompt not in seen:
                seen.add(prompt)
                out.append(_line("word_problem", tag, k, "math", prompt, level, answer=str(answer)))
                k += 1
    for k in range(6):  # failure modes: an order with a distracting number and three steps
        item, price, count, other, paid = rng.choice(ITEMS), rng.randint(3, 9), rng.randint(2, 6), \
            rng.randint(2, 5), 100
        name = rng.choice(_NAMES)
        prompt = (f"{name} buys {count} {item}s at {price} each and {other} gift wraps at 4 each. The shop opened "
                  f"{rng.randint(3, 20)} years ago. {name} pays {paid}. What change does {name} get?")
        answer = paid - count * price - other * 4
        out.append(_line("word_problem", "failure_mode", k, "math", prompt, 4, answer=str(answer)))
    return out


# ------------------------------------------------------------------------- long documents


def _order_log(rng: random.Random, lines: int) -> list[tuple[int, str, str, int]]:
    numbers = rng.sample(range(1000, 9999), lines)
    return [(n, rng.choice(_NAMES), rng.choice(ITEMS), rng.randint(1, 40)) for n in numbers]


def _document(orders: list[tuple[int, str, str, int]]) -> str:
    return "\n".join(f"Order {n}: {name} bought {qty} {item}s." for n, name, item, qty in orders)


def _long_documents(rng: random.Random) -> list[Line]:
    out: list[Line] = []
    plan = [("typical", 8, 5), ("edge", 6, 12), ("failure_mode", 6, 60)]
    for tag, count, length in plan:
        for k in range(count):
            orders = _order_log(rng, length)
            if tag == "edge":
                pick = (0, length - 1)[k % 2]  # the first or the last line of the log
            else:
                pick = rng.randrange(length)
            n, name, item, qty = orders[pick]
            question = f"How many {item}s were bought in order {n}?"
            answer = qty
            if tag == "failure_mode" and k % 2:  # aggregate over a customer's orders
                question = f"How many items did {name} buy in all orders together?"
                answer = sum(q for _, who, _, q in orders if who == name)
            prompt = (f"Here is the order log.\n{_document(orders)}\n\nQuestion: {question} "
                      f"Give the final answer as \\boxed{{N}}.")
            out.append(_line("long_document", tag, k, "math", prompt, {"typical": 2, "edge": 3}.get(tag, 4),
                             {"lines": length}, answer=str(answer)))
    return out
