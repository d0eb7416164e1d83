"""The domain contract: a domain yields tasks and names its default verifier.

Domains know nothing of models or training. Built-in domains generate tasks
procedurally from a seed; pack domains serve the lines of a JSONL task pack.
"""

from __future__ import annotations

from typing import Protocol

from polyrl.types import Task


class Domain(Protocol):
    name: str
    default_verifier: str

    def sample(self, split: str, n: int, seed: int) -> list[Task]:
        """n tasks of `split` ("train" or "heldout"), a pure function of (split, n, seed).

        Train and held-out tasks never overlap. Held-out sets are fixed: the same seed
        gives the same set, so before/after evaluations are comparable.
        """
        ...
