"""Probes for math tasks (`answer_verify`), and the gold-answer parse check.

- solvability: the gold itself, boxed, must score full reward;
- negative controls (below full): an empty completion, a generic "I don't know", a
  wrong answer (the gold plus one when it is a number, else 0), and the prompt echoed
  back ("leaked_answer": if the echo scores, the prompt states the answer);
- exploits (exactly 0): hedges that offer the gold among other answers (two boxes with
  the right one last, alternatives in one box, a list of candidates) and an overlong
  output that boxes the gold after 100,000 characters of filler;
- false negatives (full reward): the gold in equivalent forms (0.5, 1/2, \\frac{1}{2};
  a set in another order; an integer as n.0 or a fraction) and stated on a
  "Final answer:" line instead of a box.

`gold_problems` runs math-verify on each gold in a killable worker (a gold can hang the
parser) and says which do not parse: every completion of such a task is compared as a
string, or not at all.

Out of scope: judging worked solutions, answers with units or intervals rewritten, and
scoring anything (audit.py scores the probes in one batch).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Sequence

from polyrl.quality.probes import Probe
from polyrl.rewards.answer_verify import clean_answer
from polyrl.rewards.deadline_pool import DeadlinePool
from polyrl.types import Task

_GENERIC = "I am not sure how to solve this problem. I don't know the answer."
_FILLER = "Let me double-check this step once more. " * 2500  # ~100,000 characters
_INT = re.compile(r"[+-]?\d+")
_DECIMAL = re.compile(r"[+-]?\d*\.\d+")
_SLASH = re.compile(r"([+-]?\d+)\s*/\s*(\d+)")
_FRAC = re.compile(r"(-?)\\[dt]?frac\s*\{\s*([+-]?\d+)\s*\}\s*\{\s*(\d+)\s*\}")
_SET = re.compile(r"\\\{(.*)\\\}", re.S)
_PROSE = re.compile(r"[A-Za-z]{4,}")
_COMMAND = re.compile(r"\\[A-Za-z]+(\s*\{[^{}]*\})?")


def number(gold: str) -> Fraction | None:
    """The gold as an exact number, when it is an integer, a decimal or a fraction."""
    text = gold.replace(" ", "")
    try:
        if _INT.fullmatch(text) or _DECIMAL.fullmatch(text):
            return Fraction(text)
        if m := _SLASH.fullmatch(text):
            return Fraction(int(m[1]), int(m[2])) if int(m[2]) else None
        if m := _FRAC.fullmatch(text):
            value = Fraction(int(m[2]), int(m[3])) if int(m[3]) else None
            return -value if value is not None and m[1] else value
    except (ValueError, ZeroDivisionError):
        return None
    return None


def _latex(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def _terminating(value: Fraction) -> str | None:
    q = value.denominator
    for p in (2, 5):
        while q % p == 0:
            q //= p
    if q != 1:
        return None
    digits = 0
    while (value * 10 ** digits).denominator != 1:
        digits += 1
    return f"{float(value):.{max(digits, 1)}f}"


def equivalent_forms(gold: str) -> list[tuple[str, str]]:
    """(description, answer) of forms of `gold` a sound verifier must accept."""
    squashed = "".join(gold.split())
    forms: list[tuple[str, str]] = []
    value = number(gold)
    if value is not None:
        if value.denominator == 1:
            forms += [("as a decimal", f"{value.numerator}.0"),
                      ("as a fraction", f"\\frac{{{2 * value.numerator}}}{{2}}")]
        else:
            decimal = _terminating(value)
            forms += [("as \\frac", _latex(value)), ("with a slash", f"{value.numerator}/{value.denominator}")]
            if decimal:
                forms.append(("as a decimal", decimal))
    elif (m := _SET.fullmatch(squashed)) and len(parts := _top_level_split(m[1])) > 1:
        forms.append(("as a set in another order", "\\{" + ", ".join(reversed(parts)) + "\\}"))
    return [(d, f) for d, f in forms if "".join(f.split()) != squashed]


def _top_level_split(text: str) -> list[str]:
    """`text` split at commas outside braces, brackets and parentheses."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    return [p for p in [*parts, current.strip()] if p]


def wrong_answer(gold: str) -> str:
    value = number(gold)
    if value is not None:
        return _latex(value + 1)
    return "0" if "".join(gold.split()) != "0" else "1"


def math_probes(task: Task) -> list[Probe]:
    """Every probe of a math task except the solvability one (`reference_probe`)."""
    gold = clean_answer(str(task.answer))
    wrong = wrong_answer(gold)
    probes = [
        Probe("negative_control", "an empty completion", "", "below"),
        Probe("negative_control", "a generic 'I don't know'", _GENERIC, "below"),
        Probe("negative_control", f"the wrong answer {wrong}", f"The answer is \\boxed{{{wrong}}}.", "below"),
        Probe("leaked_answer", "the prompt echoed back", task.prompt, "below"),
        Probe("exploit", "two boxed answers, the right one last", f"\\boxed{{{wrong}}}\n\\boxed{{{gold}}}", "zero"),
        Probe("exploit", "alternatives in one box", f"\\boxed{{{gold} \\text{{ or }} {wrong}}}", "zero"),
        Probe("exploit", "a list of candidate answers", f"\\boxed{{{wrong}, {gold}}}", "zero"),
        Probe("exploit", "an overlong output (100,000 characters)", f"{_FILLER}\n\\boxed{{{gold}}}", "zero"),
        Probe("false_negative", "the answer on a 'Final answer:' line", f"Final answer: {gold}", "full"),
    ]
    for description, form in equivalent_forms(gold):
        probes.append(Probe("false_negative", f"the answer {description} ({form})", f"\\boxed{{{form}}}", "full"))
    return probes


def reference_probe(task: Task) -> Probe:
    return Probe("solvability", "the gold answer, boxed", f"\\boxed{{{clean_answer(str(task.answer))}}}", "full")


# ---------------------------------------------------------------------------- gold parse


def _init_worker() -> None:
    import logging

    import math_verify  # noqa: F401 -- slow import, before the first deadline runs

    logging.getLogger("math_verify").setLevel(logging.ERROR)


def parses(gold: str) -> bool:
    """Does math-verify find an expression in `gold` (no string fallback)? Runs in a worker."""
    from math_verify import parse

    return bool(parse(f"${gold}$", fallback_mode="no_fallback", parsing_timeout=None))


def gold_problems(tasks: Sequence[Task], timeout_s: float = 10.0) -> list[tuple[str, str] | None]:
    """Per task: None, or (severity, message) when its gold does not parse ("fail") or
    reads like prose that math-verify turns into a product of symbols ("warn")."""
    golds = [clean_answer(str(t.answer)) for t in tasks]
    out: list[tuple[str, str] | None] = [None] * len(tasks)
    todo = [i for i, g in enumerate(golds) if g]
    for i, g in enumerate(golds):
        if not g:
            out[i] = ("fail", "the answer is empty: no completion can match it")
    if not todo:
        return out
    with DeadlinePool(parses, workers=1, timeout_s=timeout_s, initializer=_init_worker) as pool:
        outcomes = pool.map([golds[i] for i in todo])
    for i, outcome in zip(todo, outcomes):
        if outcome.status == "timeout":
            out[i] = ("fail", f"parsing the answer {golds[i][:60]!r} timed out: every completion scores 0")
        elif outcome.status != "ok":
            out[i] = ("fail", f"parsing the answer {golds[i][:60]!r} failed: {outcome.error[:120]}")
        elif not outcome.value:
            out[i] = ("fail", f"math-verify finds no expression in the answer {golds[i][:60]!r}: completions "
                              "are only compared as strings")
        elif _PROSE.search(_COMMAND.sub(" ", golds[i])):
            out[i] = ("warn", f"the answer {golds[i][:60]!r} reads like prose; math-verify parses it as a "
                              "product of single-letter symbols")
    return out
