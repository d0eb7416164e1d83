"""What the generated built-in domains (math, code, agent, alignment) share: the check of
their `levels` option, and the loop that draws n distinct tasks.

The draws themselves stay in each domain's `draw_one(rng)`: `draw_distinct` only decides
which draws to keep, so a domain's tasks for a (split, n, seed) follow from its own
generator and nothing here calls the random generator.

Out of scope: pack domains (`pack.PackDomain` shuffles a fixed list of tasks).
"""

from __future__ import annotations

import random
from typing import Any, Callable, Optional, Sequence, TypeVar

T = TypeVar("T")

MAX_DUPLICATE_DRAWS = 200
"""Consecutive duplicate draws tolerated before a sample may repeat a task: a level's
problem space can be smaller than n (math level 1 has a few hundred prompts)."""


def check_levels(domain: str, levels: Sequence[Any], allowed: tuple[Any, ...], weights: Sequence[float] | None = None,
                 *, noun: str = "levels") -> tuple[tuple[Any, ...], tuple[float, ...]]:
    """`levels` and their relative `weights` (default equal) as tuples, or a ValueError
    that names the domain: levels must be a non-empty subset of `allowed`, weights one
    non-negative number per level, not all zero. `noun` names the option in the message."""
    if not levels or any(level not in allowed for level in levels):
        raise ValueError(f"{domain} {noun} must be a non-empty subset of {allowed}, got {levels!r}")
    if weights is not None and (len(weights) != len(levels) or any(w < 0 for w in weights) or not sum(weights)):
        raise ValueError(f"{domain} weights must be one non-negative number per level {levels!r}, not all zero; "
                         f"got {weights!r}")
    return tuple(levels), tuple(weights) if weights is not None else (1.0,) * len(levels)


def draw_distinct(rng: random.Random, n: int, draw_one: Callable[[random.Random], Optional[tuple[str, T]]], *,
                  max_duplicates_in_a_row: int | None = MAX_DUPLICATE_DRAWS, keep_repeating: bool = False) -> list[T]:
    """n items of `draw_one(rng)`, which gives a (key, item) or None for a draw to skip
    (one of the other split's).

    An item whose key came before is skipped, up to `max_duplicates_in_a_row` in a row:
    the draw after such a run keeps its item even when repeated (the space is smaller
    than n) and the count starts again. With `keep_repeating`, the first such run marks
    the space exhausted and every later repeat is kept at once. With None, a repeat is
    never kept: `draw_one` must then bound its own draws.
    """
    items: list[T] = []
    seen: set[str] = set()
    in_a_row, exhausted = 0, False
    while len(items) < n:
        drawn = draw_one(rng)
        if drawn is None:
            continue
        key, item = drawn
        if key in seen and not exhausted and (max_duplicates_in_a_row is None or in_a_row < max_duplicates_in_a_row):
            in_a_row += 1
            exhausted = keep_repeating and max_duplicates_in_a_row is not None and in_a_row >= max_duplicates_in_a_row
            continue
        in_a_row = 0
        seen.add(key)
        items.append(item)
    return items
