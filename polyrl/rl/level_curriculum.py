"""A curriculum inside a domain: its difficulty levels weighted by the signal they give.

GRPO learns only from groups whose samples score differently; a group all right or all wrong
is dropped (rl/advantages.py: zero_variance_groups). A domain whose levels are mostly solved,
or mostly out of reach, spends most of its share of the batch on such groups. `LevelSignal`
keeps, per domain and level, an exponential average of the share of its groups that carried
a signal, and draws the next steps' prompts of each level in proportion to it. A level's
share is lifted to `floor` before the shares are normalised again, so a level that went flat
is still sampled (at about `floor`) and comes back when it moves again.

    signal = LevelSignal({"math": (1, 2, 3, 4)})
    signal.update([("math", 1, True), ("math", 3, False), ...])   # (domain, level, had a signal)
    signal.weights()   # {"math": (0.31, 0.27, 0.14, 0.28)}: the relative weights of its levels

Only training draws follow it; the held-out set keeps the run file's levels and weights.
Measured on the quickstart (docs/results.md, 2026-12-07): the weights moved, the agent's and
math's held-out gains did not, so the quickstart leaves it off.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

FLOOR = 0.1
"""Each level's weight is at least this share of its domain's (before normalising)."""
RATE = 0.2
"""Each step moves a level's signal this far toward the share seen in that step's groups."""


class LevelSignal:
    def __init__(self, levels: dict[str, tuple[int, ...]], floor: float = FLOOR, rate: float = RATE) -> None:
        most = max((len(v) for v in levels.values()), default=1)
        if not 0 <= floor * most <= 1:
            raise ValueError(f"floor must be in [0, 1 / levels] = [0, {1 / most:.3g}], got {floor}")
        if not 0 < rate <= 1:
            raise ValueError(f"rate must be in (0, 1], got {rate}")
        self.levels = {d: tuple(v) for d, v in levels.items()}
        self.floor, self.rate = floor, rate
        self.signal = {d: {lv: 1.0 for lv in v} for d, v in self.levels.items()}  # no evidence yet: uniform

    def update(self, groups: Iterable[tuple[str, Any, bool]]) -> None:
        """One step's groups as (domain, level, had_signal); domains and levels not tracked are ignored."""
        seen: dict[tuple[str, Any], list[bool]] = defaultdict(list)
        for domain, level, had_signal in groups:
            if level in self.signal.get(domain, {}):
                seen[(domain, level)].append(bool(had_signal))
        for (domain, level), flags in seen.items():
            share = sum(flags) / len(flags)
            self.signal[domain][level] += self.rate * (share - self.signal[domain][level])

    def weights(self) -> dict[str, tuple[float, ...]]:
        """Per domain, its levels' relative weights (summing to 1), in the order of its levels."""
        out = {}
        for domain, levels in self.levels.items():
            raw = [self.signal[domain][lv] for lv in levels]
            total = sum(raw)
            shares = [r / total if total > 0 else 1 / len(raw) for r in raw]
            lifted = [max(s, self.floor) for s in shares]
            out[domain] = tuple(round(x / sum(lifted), 6) for x in lifted)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"signal": {d: [[lv, s] for lv, s in v.items()] for d, v in self.signal.items()}}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        for domain, pairs in ((state or {}).get("signal") or {}).items():
            for level, value in pairs:
                if level in self.signal.get(domain, {}):
                    self.signal[domain][level] = float(value)
