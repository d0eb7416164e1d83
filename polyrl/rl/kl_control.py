"""Per-domain adaptive KL coefficient: drive each domain's measured KL toward its own target.

The proportional controller of Ziegler et al. 2019 ("Fine-Tuning Language Models from
Human Preferences"), as TRL's AdaptiveKLController and ROLL code it, once per domain:

    error  = clip(KL_d / target_d - 1, -clip, +clip)
    beta_d = beta_d * (1 + error * min(n_d / horizon, 1))

where KL_d is the domain's mean per-token KL to the reference this step and n_d the
number of its samples in the step. KL above target raises beta_d, below lowers it;
the clip bounds the change per step to ±clip · n_d / horizon. A domain whose target is
None keeps its coefficient fixed (verifiable domains usually want beta = 0 and only a
logged KL; preference domains want a target).

With a small domain the proportional step is tiny (20 samples a step over a horizon of
10,000 move beta by 0.04%), so a KL 90 times its target is still there hundreds of steps
later. `rate` selects a controller in log space instead, one step per optimizer step:

    beta_d = beta_d * exp(rate * clip(ln(KL_d / target_d), -1, +1))

so beta moves by up to a factor e^rate a step whatever the domain's size: rate = 0.1
takes beta up 100-fold in 46 steps when the KL sits far above target, and the change
shrinks as ln(KL / target) nears 0. In this mode the starting coefficient is also the
least one: early in a run, while the policy is still at the reference and its KL near 0,
an unbounded controller would shrink beta for dozens of steps and then need as many to
climb back once the policy drifts (seen in a quickstart: 0.01 down to 0.0008 by step 40).
`raise_coef` sets a coefficient from outside (the run's reaction to a reward-hacking
flag, train/flag_policy.py); the controller goes on from the new value.

    kl = PerDomainKL({"math": 0.0, "alignment": 0.01}, {"math": None, "alignment": 0.05}, horizon=10000)
    coefs = kl.update({"alignment": 0.09}, {"alignment": 24})   # after each optimizer step
    kl.reasons["alignment"]            # "KL 0.0900 vs target 0.0500: x1.000480 -> 0.0100048"
    PerDomainKL.from_state(kl.state_dict())

Pure: no I/O, no models. Out of scope: the KL estimator (loss.kl_k3) and where the
penalty enters the loss (loss.kl_penalty, with the per-sample coefficient of each
sample's domain); cross-domain rules such as "double beta_d when another domain forgets".
"""

from __future__ import annotations

import math


def adaptive_kl_coef(coef: float, measured: float, target: float, n: int, horizon: int, clip: float = 0.2) -> float:
    """One proportional-controller step of a KL coefficient (see the module docstring)."""
    assert coef >= 0 and measured >= 0 and target > 0 and n >= 0 and horizon > 0 and clip > 0
    error = max(-clip, min(clip, measured / target - 1.0))
    return coef * (1.0 + error * min(n / horizon, 1.0))


def log_kl_coef(coef: float, measured: float, target: float, rate: float) -> float:
    """One step of the log-space controller (see the module docstring); measured may be 0."""
    assert coef >= 0 and measured >= 0 and target > 0 and rate > 0
    error = max(-1.0, min(1.0, math.log(max(measured, 1e-12) / target)))
    return coef * math.exp(rate * error)


class PerDomainKL:
    """Each domain's KL coefficient; adaptive where it has a target, fixed where it has None."""

    def __init__(self, coefs: dict[str, float], targets: dict[str, float | None], horizon: int = 10000,
                 clip: float = 0.2, rate: float | None = None) -> None:
        """coefs: starting coefficient per domain (> 0 where a target is set: a multiplicative
        controller cannot move away from 0); targets: per-token KL target, or None = fixed;
        rate: the log-space controller's largest log-change per step (None: proportional)."""
        if set(coefs) != set(targets):
            raise ValueError(f"coefs and targets must name the same domains; got {sorted(coefs)} and {sorted(targets)}")
        for d, t in targets.items():
            if t is not None and (t <= 0 or coefs[d] <= 0):
                raise ValueError(f"domain {d!r}: an adaptive KL needs target > 0 and a starting coefficient > 0; "
                                 f"got target {t}, coefficient {coefs[d]}")
        assert horizon > 0 and clip > 0 and (rate is None or rate > 0)
        self.coefs = {d: float(c) for d, c in coefs.items()}
        self.targets = dict(targets)
        self.horizon, self.clip, self.rate = horizon, clip, rate
        self.floors = {d: float(c) for d, c in coefs.items()} if rate is not None else {}
        """rate mode: the least coefficient of each domain (its starting one)"""
        self.reasons: dict[str, str] = {d: "fixed coefficient" if targets[d] is None else "start" for d in coefs}

    def update(self, measured: dict[str, float | None], samples: dict[str, int]) -> dict[str, float]:
        """Move each adaptive coefficient from this step's measured KL; returns all coefficients.

        measured: domain -> mean per-token KL this step (None or missing: the domain had no
        trained tokens, its coefficient stays); samples: domain -> samples of the domain in
        the step (completions, not tokens, as in TRL's n_steps).
        """
        for d, target in self.targets.items():
            kl = measured.get(d)
            if target is None:
                self.reasons[d] = "fixed coefficient"
            elif kl is None or samples.get(d, 0) == 0:
                self.reasons[d] = f"no samples this step; stays {self.coefs[d]:.6g}"
            else:
                before = self.coefs[d]
                self.coefs[d] = (adaptive_kl_coef(before, max(0.0, kl), target, samples[d], self.horizon, self.clip)
                                 if self.rate is None
                                 else max(self.floors[d], log_kl_coef(before, max(0.0, kl), target, self.rate)))
                self.reasons[d] = (f"KL {kl:.4f} vs target {target:.4f}: "
                                   f"x{self.coefs[d] / before:.6f} -> {self.coefs[d]:.6g}")
        return dict(self.coefs)

    def raise_coef(self, domain: str, coef: float, reason: str) -> None:
        """Set `domain`'s coefficient to `coef` (a reaction from outside the controller), saying why."""
        assert coef >= 0
        self.coefs[domain] = float(coef)
        self.reasons[domain] = reason

    def state_dict(self) -> dict:
        return {"coefs": dict(self.coefs), "targets": dict(self.targets), "horizon": self.horizon, "clip": self.clip,
                "rate": self.rate, "floors": dict(self.floors)}

    @classmethod
    def from_state(cls, state: dict) -> PerDomainKL:
        kl = cls(state["coefs"], state["targets"], state["horizon"], state["clip"], state.get("rate"))
        kl.floors.update(state.get("floors", {}))
        return kl
