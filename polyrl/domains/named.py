"""A domain trained under another name: a generated domain (rl_tasks[].expand, or an entry
with its own `name`) is a built-in or plugin domain with options, whose tasks must carry the
run's name for it, since every stage keys its per-domain state by `task.domain`
(advantage normalisation, KL coefficient, curriculum share, metrics).

Out of scope: the task ids; two generated domains of one family may draw the same task
(different options usually make them differ), which is harmless: each trains under its own name.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from polyrl.domains.base import Domain
from polyrl.types import Task


class NamedDomain:
    """`inner`'s tasks, their `domain` set to `name`; everything else is `inner`'s."""

    def __init__(self, inner: Domain, name: str) -> None:
        self.inner, self.name, self.default_verifier = inner, name, inner.default_verifier

    def __getattr__(self, attr: str) -> Any:  # toolbox, demonstration, default_check, ...
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def sample(self, split: str, n: int, seed: int) -> list[Task]:
        return [replace(t, domain=self.name) for t in self.inner.sample(split, n, seed)]
