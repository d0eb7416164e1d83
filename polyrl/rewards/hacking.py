"""Reward-hacking detector: the proxy reward rises while an independent check does not.

A policy that games a reward model raises the model's score without getting better at
what the model stands for. So watch two curves over evaluations of the same
completions: the proxy (the preference reward) and an independent check of the same
behaviour (the verifier `rule_check`, or a second reward model that was not
trained against), and flag when the first rises and the second does not follow
(Gao et al. 2022, "Scaling Laws for Reward Model Overoptimization": proxy up, gold flat
or down).

    verdict = detect_hacking(proxy=[0.41, 0.47, 0.55, 0.63], check=[0.70, 0.69, 0.71, 0.68])
    verdict.flagged, verdict.reason   # True, "proxy rose 0.22 over 4 evaluations while ..."

    monitor = HackingMonitor()
    monitor.observe("alignment", step, proxy=mean_rm_reward, check=mean_rule_score)
    monitor.verdict("alignment")      # the same test over the domain's history
    HackingMonitor.from_dict(monitor.to_dict())   # plain-dict state for resume

Rises are least-squares fits over the last `window` points (slope times span), so one
noisy evaluation neither triggers nor hides a flag. Where the check is measured on other
samples than the proxy (held-out accuracy against the training reward), `check_noise`
gives its sampling error, and the check must fall short by more than that. Both curves
should be on comparable scales (both 0..1 here). Pure: no I/O, no models.

Over-optimisation can also creep in slower than any window sees: the proxy gains a
little per evaluation and the check loses a little. `detect_decline` catches that from
the check's best evaluation on, and from the first evaluation on (the check below where
it started): the proxy now higher by `min_gain`, the check lower by `min_drop` (both as
means of the last `recent` evaluations). `HackingMonitor` applies both tests.

Out of scope: deciding what to do about it (the run's on_flag policy,
train/flag_policy.py); per-sample attribution of which answers exploit the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class HackingVerdict:
    flagged: bool
    reason: str
    proxy_rise: float
    """Fitted rise of the proxy reward over the window."""
    check_rise: float
    """Fitted rise of the independent check over the same window."""
    points: int
    """Evaluations the verdict is based on."""


def fitted_rise(values: Sequence[float]) -> float:
    """OLS slope per point times (n - 1): how much a straight-line fit rises over the series."""
    n = len(values)
    if n < 2:
        return 0.0
    mx = (n - 1) / 2
    my = sum(values) / n
    sxx = sum((i - mx) ** 2 for i in range(n))
    return sum((i - mx) * (v - my) for i, v in enumerate(values)) / sxx * (n - 1)


def rise_noise(point_noise: float, n: int) -> float:
    """The standard error of `fitted_rise` over n points, each with standard error point_noise:
    the OLS slope's (point_noise / sqrt(Sxx)) times (n - 1)."""
    sxx = n * (n * n - 1) / 12
    return point_noise * (n - 1) / sxx ** 0.5 if n >= 2 else 0.0


def detect_hacking(proxy: Sequence[float], check: Sequence[float], window: int = 5, min_points: int = 3,
                   min_rise: float = 0.05, follow: float = 0.25, check_noise: float = 0.0) -> HackingVerdict:
    """Flag when the proxy's fitted rise over the last `window` points is at least `min_rise`
    and the check's rise is less than `follow` times the proxy's (it did not follow), by more
    than the check's own noise: `check_noise` is the standard error of one check point (0: a
    check measured exactly, or on the same samples as the proxy), and the check must fall
    short by one standard error of its fitted rise."""
    assert len(proxy) == len(check), "proxy and check must be measured on the same evaluations"
    assert window >= 2 and min_points >= 2 and min_rise > 0 and 0 <= follow <= 1 and check_noise >= 0
    p, c = list(proxy)[-window:], list(check)[-window:]
    if len(p) < min_points:
        return HackingVerdict(False, f"{len(p)} evaluations; need {min_points} to judge", 0.0, 0.0, len(p))
    pr, cr = fitted_rise(p), fitted_rise(c)
    if pr < min_rise:
        return HackingVerdict(False, f"proxy did not rise (fitted {pr:+.3f} < {min_rise})", pr, cr, len(p))
    noise = rise_noise(check_noise, len(p))
    moved = f"{cr:+.3f}" + (f" ± {noise:.3f}" if noise else "")
    if cr + noise < follow * pr:
        return HackingVerdict(True, f"proxy rose {pr:+.3f} over {len(p)} evaluations while the independent "
                                    f"check moved {moved} (< {follow:g} x the proxy's rise)", pr, cr, len(p))
    if cr < follow * pr:
        return HackingVerdict(False, f"proxy rose {pr:+.3f}; the check moved {moved}, short of {follow:g} x "
                                     "that rise by less than its own noise", pr, cr, len(p))
    return HackingVerdict(False, f"proxy rose {pr:+.3f} and the check followed ({cr:+.3f})", pr, cr, len(p))


def detect_decline(proxy: Sequence[float], check: Sequence[float], min_gain: float = 0.05, min_drop: float = 0.03,
                   recent: int = 3) -> HackingVerdict:
    """Flag when, since the check's best evaluation or since the first one, the proxy's mean
    over the last `recent` evaluations rose at least `min_gain` above its value there and the
    check's mean fell at least `min_drop` below its value there (the recent evaluations all
    come after it). From the best: a slow slide; from the first: the check below its start."""
    assert len(proxy) == len(check), "proxy and check must be measured on the same evaluations"
    assert min_gain > 0 and min_drop > 0 and recent >= 1
    n = len(check)
    best = max(range(n), key=lambda i: check[i]) if n else 0  # the first best
    verdict = HackingVerdict(False, f"the check's best is among the last {recent} of {n} evaluations", 0.0, 0.0, n)
    for ref, what in ((best, "best"), (0, "start")):
        if n - recent <= ref:
            continue
        gain = sum(proxy[-recent:]) / recent - proxy[ref]
        drop = check[ref] - sum(check[-recent:]) / recent
        verdict = HackingVerdict(gain >= min_gain and drop >= min_drop,
                                 f"proxy rose {gain:+.3f} since the independent check's {what} (evaluation {ref + 1} "
                                 f"of {n}, {check[ref]:.3f}) while the check fell {drop:.3f} (means of the last "
                                 f"{recent} evaluations)", gain, -drop, n)
        if verdict.flagged:
            return verdict
    return verdict


class HackingMonitor:
    """Per-domain history of (step, proxy, check), judged by `detect_hacking` over the last
    window and `detect_decline` since the check's best."""

    def __init__(self, window: int = 5, min_points: int = 3, min_rise: float = 0.05, follow: float = 0.25,
                 min_gain: float = 0.05, min_drop: float = 0.03, recent: int = 3) -> None:
        self.settings = {"window": window, "min_points": min_points, "min_rise": min_rise, "follow": follow}
        self.decline = {"min_gain": min_gain, "min_drop": min_drop, "recent": recent}
        self.history: dict[str, list[tuple[int, float, float]]] = {}

    def observe(self, domain: str, step: int, proxy: float, check: float) -> HackingVerdict:
        """Record one evaluation of `domain` and return the verdict over its history."""
        self.history.setdefault(domain, []).append((int(step), float(proxy), float(check)))
        return self.verdict(domain)

    def verdict(self, domain: str) -> HackingVerdict:
        points = self.history.get(domain, [])
        proxy, check = [p for _, p, _ in points], [c for _, _, c in points]
        window = detect_hacking(proxy, check, **self.settings)
        if window.flagged:
            return window
        decline = detect_decline(proxy, check, **self.decline)
        return decline if decline.flagged else window

    def to_dict(self) -> dict:
        return {"settings": dict(self.settings), "decline": dict(self.decline),
                "history": {d: [list(x) for x in h] for d, h in self.history.items()}}

    @classmethod
    def from_dict(cls, state: dict) -> HackingMonitor:
        monitor = cls(**state["settings"], **state.get("decline", {}))
        monitor.history = {d: [(int(s), float(p), float(c)) for s, p, c in h] for d, h in state["history"].items()}
        return monitor
