"""The modules a generated swe repository is built from, their tested functions, and the
places a bug can be planted in each.

A module is source text with `{NAME}` placeholders for constants the generator draws,
the modules it imports (relative imports, so the package name is free), an argument
generator per tested function, and bug sites: an exact fragment of the source and what
it becomes, tagged with a family:

- off_by_one: a range, slice or comparison bound moved by one;
- wrong_branch: a condition inverted or made strict/non-strict;
- missing_case: a guard for an input the code must handle is gone;
- wrong_call: a call to the wrong function of another module.

Every fragment occurs exactly once in its module (tests/test_swe_domain.py checks it).
Whether a site's bug shows on the drawn tests is checked when a task is generated.

Out of scope: classes, state, I/O, modules outside this list.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

FAMILIES = ("off_by_one", "wrong_branch", "missing_case", "wrong_call")

ArgGen = Callable[[random.Random, dict[str, int]], list[Any]]


@dataclass(frozen=True)
class Site:
    family: str
    function: str
    """the function the bug is planted in"""
    old: str
    new: str


@dataclass(frozen=True)
class Module:
    name: str
    source: str
    imports: tuple[str, ...]
    tests: dict[str, ArgGen]
    """tested function -> its argument generator (rng, constants) -> args"""
    sites: tuple[Site, ...]
    constants: dict[str, Callable[[random.Random], int]]


_WORDS = ("apple", "pear", "plum", "fig", "kiwi", "lime")
_NAMES = ("ada", "grace", "alan", "edsger", "barbara", "donald", "margaret", "ken")


def _ints(rng: random.Random, lo: int = 0, hi: int = 6) -> list[int]:
    return [rng.randint(-9, 20) for _ in range(rng.randint(lo, hi))]


def _sentence(rng: random.Random) -> str:
    words = []
    for _ in range(rng.randint(0, 7)):
        word = rng.choice(_WORDS)
        word = word.capitalize() if rng.random() < 0.3 else word
        word += rng.choice(("", "", "", ".", ",", "!"))
        words.append(word if rng.random() > 0.1 else rng.choice(("!!", "--", "?")))
    return " ".join(words)


def _name(rng: random.Random) -> str:
    return " ".join(rng.choice(_NAMES).capitalize() if rng.random() < 0.5 else rng.choice(_NAMES)
                    for _ in range(rng.randint(1, 3)))


def _score(rng: random.Random, c: dict[str, int]) -> int:
    roll = rng.random()
    if roll < 0.35:
        return rng.choice((c["PASS_MARK"], c["TOP_MARK"], c["PASS_MARK"] - 1, c["TOP_MARK"] - 1))
    return rng.randint(-10, 110)


def _clamp_args(rng: random.Random, c: dict[str, int]) -> list[Any]:
    low = rng.randint(-5, 5)
    high = low + rng.randint(1, 10)
    return [rng.choice((low, high, low - rng.randint(1, 5), high + rng.randint(1, 5), rng.randint(low, high))),
            low, high]


CALC = Module(
    name="calc",
    source='''"""Small numeric helpers."""


def clamp(value, low, high):
    if value < low:
        return low
    if value > high:
        return high
    return value


def total(values):
    result = 0
    for index in range(len(values)):
        result += values[index]
    return result


def largest(values):
    if not values:
        return None
    best = values[0]
    for value in values[1:]:
        if value > best:
            best = value
    return best


def smallest(values):
    if not values:
        return None
    best = values[0]
    for value in values[1:]:
        if value < best:
            best = value
    return best


def window_sums(values, size):
    if size <= 0:
        return []
    sums = []
    for start in range(len(values) - size + 1):
        sums.append(total(values[start:start + size]))
    return sums
''',
    imports=(),
    tests={
        "clamp": _clamp_args,
        "total": lambda rng, c: [_ints(rng)],
        "largest": lambda rng, c: [_ints(rng)],
        "smallest": lambda rng, c: [_ints(rng)],
        "window_sums": lambda rng, c: [_ints(rng, 0, 7), rng.randint(0, 4)],
    },
    sites=(
        Site("off_by_one", "total", "range(len(values)):", "range(len(values) - 1):"),
        Site("off_by_one", "window_sums", "range(len(values) - size + 1)", "range(len(values) - size)"),
        Site("off_by_one", "largest", "for value in values[1:]:\n        if value > best",
             "for value in values[1:-1]:\n        if value > best"),
        Site("wrong_branch", "clamp", "if value > high:", "if value >= low:"),
        Site("wrong_branch", "smallest", "if value < best:", "if value > best:"),
        Site("missing_case", "window_sums", "    if size <= 0:\n        return []\n", ""),
        Site("missing_case", "largest", "def largest(values):\n    if not values:\n        return None\n",
             "def largest(values):\n"),
    ),
    constants={},
)

WORDS = Module(
    name="words",
    source='''"""Word counting and small text helpers."""


def normalize(word):
    return word.strip(".,;:!?-").lower()


def count_words(text):
    counts = {}
    for word in text.split():
        key = normalize(word)
        if key:
            counts[key] = counts.get(key, 0) + 1
    return counts


def top_word(text):
    counts = count_words(text)
    best = None
    for word in sorted(counts):
        if best is None or counts[word] > counts[best]:
            best = word
    return best


def initials(name):
    return "".join(part[0].upper() for part in name.split())


def shorten(text, limit):
    if len(text) <= limit:
        return text
    return text[:limit - 3] + "..."
''',
    imports=(),
    tests={
        "normalize": lambda rng, c: [rng.choice(("", " ")) + rng.choice(_WORDS).upper() + rng.choice(("!", ".", ""))],
        "count_words": lambda rng, c: [_sentence(rng)],
        "top_word": lambda rng, c: [_sentence(rng)],
        "initials": lambda rng, c: [_name(rng)],
        "shorten": lambda rng, c: (lambda s: [s, rng.choice((len(s), len(s) - 1, len(s) + 1, 4, 6))])(
            " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 4)))),
    },
    sites=(
        Site("off_by_one", "shorten", "if len(text) <= limit:", "if len(text) < limit:"),
        Site("off_by_one", "shorten", "text[:limit - 3]", "text[:limit - 2]"),
        Site("wrong_branch", "top_word", "counts[word] > counts[best]", "counts[word] >= counts[best]"),
        Site("missing_case", "count_words", "        if key:\n            counts[key] = counts.get(key, 0) + 1\n",
             "        counts[key] = counts.get(key, 0) + 1\n"),
    ),
    constants={},
)

GRADES = Module(
    name="grades",
    source='''"""Letter grades from scores."""

from .calc import clamp, largest, smallest

PASS_MARK = {PASS_MARK}
TOP_MARK = {TOP_MARK}


def grade(score):
    score = clamp(score, 0, 100)
    if score >= TOP_MARK:
        return "A"
    if score >= PASS_MARK:
        return "B"
    return "F"


def pass_count(scores):
    count = 0
    for score in scores:
        if grade(score) != "F":
            count += 1
    return count


def best_grade(scores):
    if not scores:
        return None
    return grade(largest(scores))


def worst_grade(scores):
    if not scores:
        return None
    return grade(smallest(scores))
''',
    imports=("calc",),
    tests={
        "grade": lambda rng, c: [_score(rng, c)],
        "pass_count": lambda rng, c: [[_score(rng, c) for _ in range(rng.randint(0, 5))]],
        "best_grade": lambda rng, c: [[_score(rng, c) for _ in range(rng.randint(0, 4))]],
        "worst_grade": lambda rng, c: [[_score(rng, c) for _ in range(rng.randint(0, 4))]],
    },
    sites=(
        Site("wrong_branch", "grade", "if score >= PASS_MARK:", "if score > PASS_MARK:"),
        Site("wrong_branch", "pass_count", 'if grade(score) != "F":', 'if grade(score) == "A":'),
        Site("wrong_call", "best_grade", "return grade(largest(scores))", "return grade(smallest(scores))"),
        Site("missing_case", "worst_grade", "def worst_grade(scores):\n    if not scores:\n        return None\n",
             "def worst_grade(scores):\n"),
    ),
    constants={"PASS_MARK": lambda rng: rng.randint(40, 60), "TOP_MARK": lambda rng: rng.randint(75, 95)},
)

REPORT = Module(
    name="report",
    source='''"""Summaries built from the other modules."""

from . import calc, words


def average(values):
    if not values:
        return 0
    return calc.total(values) / len(values)


def spread(values):
    if not values:
        return 0
    return calc.largest(values) - calc.smallest(values)


def label(name, values):
    return words.initials(name) + ":" + str(calc.total(values))


def headline(text, limit):
    word = words.top_word(text)
    if word is None:
        return ""
    return words.shorten(word.upper() + "!", limit)
''',
    imports=("calc", "words"),
    tests={
        "average": lambda rng, c: [_ints(rng)],
        "spread": lambda rng, c: [_ints(rng)],
        "label": lambda rng, c: [_name(rng), _ints(rng, 0, 4)],
        "headline": lambda rng, c: [_sentence(rng), rng.randint(4, 7)],
    },
    sites=(
        Site("missing_case", "average", "    if not values:\n        return 0\n    return calc.total",
             "    return calc.total"),
        Site("wrong_call", "spread", "calc.largest(values) - calc.smallest(values)",
             "calc.largest(values) - calc.total(values)"),
        Site("wrong_call", "label", "words.initials(name)", "words.normalize(name)"),
        Site("wrong_call", "average", "calc.total(values) / len(values)", "calc.largest(values) / len(values)"),
    ),
    constants={},
)

MODULES = {m.name: m for m in (CALC, WORDS, GRADES, REPORT)}
LEVEL_MODULES = {1: ("calc", "words"), 2: ("calc", "words", "grades"), 3: ("calc", "words", "grades", "report"),
                 4: ("calc", "words", "grades", "report")}
"""Modules of a level's repository (each module's imports are among the earlier ones)."""
