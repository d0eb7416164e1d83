"""Domain shares of each batch: `allocate` splits a batch by weights; the capability-curve
curriculum moves the weights from held-out progress.

`curriculum: static` keeps the run file's weights. `curriculum: capability_curve`
(learning progress, measured on held-out capability alone) tracks each domain's held-out
score c_d over evaluations and, after each one, sets

    target_d ∝ seed_d · headroom_d · exp(min(3, max(slope_d, 0) / progress_scale))

- slope_d: least-squares slope of c_d over the last `window` evaluations (per evaluation),
  so a rapidly improving domain gains weight (learning progress, as TSCL);
- headroom_d: 1 below `saturation - saturation_margin`, falling linearly to 0 at
  `saturation`: a saturating domain fades toward its floor (it wastes compute);
- every share keeps at least `floor` (replay against forgetting);
- a domain that regressed (best_d - c_d > regress_tolerance) is boosted for
  `boost_updates` updates (re-armed while it stays below): its share is at least
  boost · seed_d, at most an equal split of what the other floors leave (a short refresh repairs
  forgetting; 2606.02398);
- no share moves more than `max_change` per update (the step toward the target is
  scaled down, so floors and boosts are reached over a few updates).

    cur = CapabilityCurriculum({"math": 0.2, "code": 0.35}, CurveSettings())
    upd = cur.update(step, {"math": 0.81, "code": 0.42})   # after each held-out evaluation
    upd.weights, upd.reasons                                # shares (sum 1), why each moved
    CapabilityCurriculum.from_state(cur.state_dict())       # plain dict, for resume

Pure: no I/O, no models; the loop calls `update` and logs what it returns.
Out of scope: within-domain difficulty (DAPO's zero-variance filter lives in
advantages.py), learnability from training rewards, bandit exploration bonuses.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field


def allocate(total: int, weights: dict[str, float], seed: int | None = None) -> dict[str, int]:
    """Split `total` prompts across domains in proportion to `weights` (largest remainder).

    Every domain with a positive weight gets at least one prompt when total allows it, so
    a small domain is never starved by rounding. When it does not (more domains than
    prompts) and a `seed` is given, the split is drawn instead (`systematic`): each domain
    gets the floor or the ceiling of its exact share, its expected count is exactly that
    share, and which domains get the prompts changes with the seed (largest remainder would
    give the same few domains every step and starve the rest).
    """
    assert total > 0 and weights and all(w > 0 for w in weights.values())
    names = sorted(weights)
    s = sum(weights.values())
    if seed is not None and total < len(names):
        return systematic(total, {d: weights[d] / s for d in names}, random.Random(seed).random())
    exact = {d: total * weights[d] / s for d in names}
    counts = {d: math.floor(exact[d]) for d in names}
    if total >= len(names):
        for d in names:
            counts[d] = max(counts[d], 1)
    while sum(counts.values()) > total:  # the floor-of-one bumps may overshoot
        d = max((d for d in names if counts[d] > 1), key=lambda d: counts[d] - exact[d])
        counts[d] -= 1
    for d in sorted(names, key=lambda d: (counts[d] - exact[d], d)):
        if sum(counts.values()) == total:
            break
        counts[d] += 1
    return counts


def systematic(total: int, shares: dict[str, float], u: float) -> dict[str, int]:
    """Systematic sampling of `total` prompts by `shares` (summing to 1), in the given order:
    the points (u + k) / total for k = 0..total-1 fall into consecutive intervals of lengths
    `shares`; a domain's count is the number of points in its interval (u in [0, 1))."""
    assert 0 <= u < 1 and total > 0
    counts, edge = {}, 0.0
    for d, share in shares.items():
        # points below a cumulative share c: ceil(c * total - u) of them
        before, edge = edge, edge + share
        counts[d] = max(0, math.ceil(edge * total - u - 1e-9)) - max(0, math.ceil(before * total - u - 1e-9))
    last = next(reversed(counts))
    counts[last] += total - sum(counts.values())  # float round-off at the last edge
    return counts


# ---------------------------------------------------------------- capability curve

MAX_PROGRESS_EXPONENT = 3.0
"""Cap on slope / progress_scale: one lucky evaluation gives at most e^3 = 20x."""


@dataclass(frozen=True)
class CurveSettings:
    """Knobs of the capability-curve curriculum (polyrl.config.CapabilityCurveConfig documents them)."""

    window: int = 4
    saturation: float = 0.95
    saturation_margin: float = 0.25
    progress_scale: float = 0.05
    floor: float = 0.05
    max_change: float = 0.1
    regress_tolerance: float = 0.05
    boost: float = 2.0
    boost_updates: int = 2

    def __post_init__(self) -> None:
        assert self.window >= 2 and 0 < self.saturation <= 1 and self.saturation_margin > 0
        assert self.progress_scale > 0 and 0 < self.floor < 1 and 0 < self.max_change <= 1
        assert self.regress_tolerance >= 0 and self.boost >= 1 and self.boost_updates >= 1


@dataclass(frozen=True)
class DomainSignal:
    """What the curriculum read off one domain's curve at one update."""

    capability: float
    best: float
    slope: float
    """Held-out score per evaluation, least squares over the window."""
    headroom: float
    """1 far from saturation, 0 at or above it."""
    progress_gain: float
    """exp(min(3, max(slope, 0) / progress_scale)): the improving domain's multiplier."""
    boosted: int
    """Updates of regression boost left, this one included; 0 = not boosted."""


@dataclass
class CurriculumUpdate:
    weights: dict[str, float]
    """New shares, summing to 1."""
    reasons: dict[str, str]
    """Per domain, why its share moved (for metrics.jsonl and the display)."""
    signals: dict[str, DomainSignal] = field(default_factory=dict)


def slope(values: list[float]) -> float:
    """Least-squares slope of values against 0, 1, 2, ... (0 for fewer than two points)."""
    n = len(values)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, sum(values) / n
    return sum((i - mx) * (v - my) for i, v in enumerate(values)) / sum((i - mx) ** 2 for i in range(n))


def headroom(capability: float, saturation: float, margin: float) -> float:
    """1 below saturation - margin, linear to 0 at saturation, 0 above."""
    return min(1.0, max(0.0, (saturation - capability) / margin))


def apply_floor(weights: dict[str, float], floor: float | dict[str, float]) -> dict[str, float]:
    """Normalise and raise every share to at least its floor (one number, or one per domain),
    taking the difference from the others in proportion to their shares (water-filling)."""
    floors = floor if isinstance(floor, dict) else {d: floor for d in weights}
    assert sum(floors.values()) <= 1 + 1e-9, f"floors {floors} add up to more than 1"
    total = sum(weights.values())
    w = {d: v / total for d, v in weights.items()} if total > 0 else {d: 1 / len(weights) for d in weights}
    pinned: set[str] = set()
    while True:
        free = [d for d in w if d not in pinned]
        mass = 1 - sum(floors[d] for d in pinned)
        free_total = sum(w[d] for d in free)
        scaled = {d: (w[d] / free_total * mass if free_total > 0 else mass / len(free)) for d in free}
        low = {d for d, v in scaled.items() if v < floors[d]}
        if not low or len(low) == len(free):
            return {d: (floors[d] if d in pinned or d in low else scaled[d]) for d in w}
        pinned |= low


def share_floors(seed: dict[str, float], signals: dict[str, DomainSignal], s: CurveSettings) -> dict[str, float]:
    """`floor` for every domain; for a boosted one boost * seed share (the seed, not the current
    share, so a long regression does not compound), capped at an equal split of what the
    unboosted domains' floors leave."""
    boosted = [d for d, sig in signals.items() if sig.boosted]
    floors = {d: s.floor for d in seed}
    if boosted:
        cap = (1 - s.floor * (len(seed) - len(boosted))) / len(boosted)
        for d in boosted:
            floors[d] = max(s.floor, min(s.boost * seed[d], cap))
    return floors


def rate_limit(prev: dict[str, float], target: dict[str, float], max_change: float) -> tuple[dict[str, float], bool]:
    """Step from prev toward target, scaled so no share moves more than max_change.

    A convex combination of two share vectors: it still sums to 1 and keeps both floors.
    Returns (new shares, whether the step was cut).
    """
    biggest = max(abs(target[d] - prev[d]) for d in target)
    lam = 1.0 if biggest <= max_change else max_change / biggest
    return {d: prev[d] + lam * (target[d] - prev[d]) for d in target}, lam < 1.0


def target_weights(seed: dict[str, float], signals: dict[str, DomainSignal], s: CurveSettings) -> dict[str, float]:
    """Unnormalised targets from the signals (the module docstring's formula; boosts and
    floors come after, in share_floors and apply_floor)."""
    raw = {d: seed[d] * sig.headroom * sig.progress_gain for d, sig in signals.items()}
    if sum(raw.values()) <= 0:  # every domain saturated: nothing to prefer, go back to the seed mix
        return dict(seed)
    return raw


class CapabilityCurriculum:
    """The capability-curve curriculum's state: per-domain history, best score, boosts, shares."""

    def __init__(self, seed_weights: dict[str, float], settings: CurveSettings = CurveSettings()) -> None:
        assert seed_weights and all(w > 0 for w in seed_weights.values())
        total = sum(seed_weights.values())
        self.settings = settings
        self.seed = {d: w / total for d, w in sorted(seed_weights.items())}
        self.weights = apply_floor(self.seed, settings.floor)
        self.history: dict[str, list[tuple[int, float]]] = {d: [] for d in self.seed}
        self.best: dict[str, float] = {}
        self.boost_left: dict[str, int] = {d: 0 for d in self.seed}
        self.reasons: dict[str, str] = {d: "seed weight (no evaluation yet)" for d in self.seed}

    def signals(self) -> dict[str, DomainSignal]:
        s = self.settings
        out = {}
        for d, points in self.history.items():
            values = [c for _, c in points[-s.window:]]
            g = slope(values)
            out[d] = DomainSignal(capability=values[-1], best=self.best[d], slope=g,
                                  headroom=headroom(values[-1], s.saturation, s.saturation_margin),
                                  progress_gain=math.exp(min(MAX_PROGRESS_EXPONENT, max(g, 0.0) / s.progress_scale)),
                                  boosted=self.boost_left[d])
        return out

    def update(self, step: int, capability: dict[str, float]) -> CurriculumUpdate:
        """Record one held-out evaluation (domain -> score) and move the shares.

        Call it after every held-out evaluation, the one before training included; the
        shares it returns hold until the next call. The first must score every domain; a
        later one may score some (an evaluation of a rotating subset, eval.domains_per_eval):
        the others keep their curves as they were.
        """
        first = not self.best
        if not set(capability) <= set(self.seed) or (first and set(capability) != set(self.seed)):
            raise ValueError(f"capability must score {'every domain' if first else 'domains'} of "
                             f"{sorted(self.seed)}; got {sorted(capability)}")
        s = self.settings
        for d, c in capability.items():
            self.history[d] = (self.history[d] + [(int(step), float(c))])[-s.window:]
            # regression is measured against the best before this evaluation
            if d in self.best and self.best[d] - c > s.regress_tolerance:
                self.boost_left[d] = s.boost_updates
            self.best[d] = max(self.best.get(d, c), c)
        signals = self.signals()
        prev = self.weights
        target = apply_floor(target_weights(self.seed, signals, s), share_floors(self.seed, signals, s))
        new, cut = rate_limit(prev, target, s.max_change)
        self.weights = new
        self.reasons = {d: _reason(signals[d], prev[d], new[d], target[d], s, cut, len(self.history[d]))
                        for d in new}
        for d in self.boost_left:
            self.boost_left[d] = max(0, self.boost_left[d] - 1)
        return CurriculumUpdate(dict(new), dict(self.reasons), signals)

    def state_dict(self) -> dict:
        """Everything `from_state` needs, as plain JSON-able values."""
        return {"settings": asdict(self.settings), "seed": dict(self.seed), "weights": dict(self.weights),
                "history": {d: [list(p) for p in h] for d, h in self.history.items()}, "best": dict(self.best),
                "boost_left": dict(self.boost_left), "reasons": dict(self.reasons)}

    @classmethod
    def from_state(cls, state: dict, settings: CurveSettings | None = None) -> CapabilityCurriculum:
        """Restore a curriculum; `settings` overrides the saved ones (e.g. from the run file)."""
        cur = cls(state["seed"], settings or CurveSettings(**state["settings"]))
        cur.weights = {d: float(w) for d, w in state["weights"].items()}
        cur.history = {d: [(int(st), float(c)) for st, c in h] for d, h in state["history"].items()}
        cur.best = {d: float(b) for d, b in state["best"].items()}
        cur.boost_left = {d: int(b) for d, b in state["boost_left"].items()}
        cur.reasons = dict(state.get("reasons", cur.reasons))
        return cur


def _reason(sig: DomainSignal, before: float, after: float, target: float, s: CurveSettings, cut: bool,
            evaluations: int) -> str:
    where = f"capability {sig.capability:.3f} (best {sig.best:.3f})"
    if sig.boosted:
        why = (f"regression boost: share >= {s.boost:g} x seed, {sig.boosted - 1} more update(s) "
               f"(now {sig.best - sig.capability:.3f} below its best; tolerance {s.regress_tolerance:g})")
    elif sig.headroom == 0:
        why = f"saturated: >= {s.saturation:g}, held at the floor"
    elif sig.headroom < 1:
        why = f"near saturation: headroom {sig.headroom:.2f}"
    elif evaluations < 2:
        why = "first evaluation: no slope yet"
    elif sig.progress_gain > 1.1:
        why = f"improving: slope {sig.slope:+.3f}/eval, x{sig.progress_gain:.2f}"
    else:
        why = f"flat: slope {sig.slope:+.3f}/eval"
    notes = (["at the floor"] if after <= s.floor + 1e-9 and not sig.headroom == 0 else []) + \
            ([f"rate-limited toward {target:.3f}"] if cut and abs(after - target) > 1e-9 else [])
    tail = f" ({', '.join(notes)})" if notes else ""
    return f"{where}; {why}; weight {before:.3f} -> {after:.3f}{tail}"
