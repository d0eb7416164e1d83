"""Flags that act: what a run does when the reward monitor flags a domain.

The monitor (train/monitor.py) writes flags; each domain's `rl_tasks[].on_flag` says what
follows a domain-level one (a flag on the whole domain, not on one task):

    on_flag: {actions: [raise_kl, lower_weight], kl_factor: 4.0, weight: 0.05}

- raise_kl: the domain's KL coefficient times kl_factor, at least kl_min (PerDomainKL
  goes on adapting from there when the domain has a kl_target);
- lower_weight: the domain's share of each batch is capped at `weight` from the next
  admitted rollout on, the other domains sharing the rest in their own proportions;
- stop: the domain is drawn no more (its share 0); it is still evaluated.

    policy = FlagPolicy({"alignment": cfg.rl_tasks[3].on_flag})
    taken = policy.act(step, flags, kl)       # -> the metrics line's "flag_actions"
    weights, reasons = policy.shares(weights, reasons)   # at every admission

Caps only tighten: a later flag never raises a domain's share again. The state (caps and
their reasons) goes into the run's state for resume. Pure apart from the KL controller it
is handed: no I/O. `OnFlag` is the run file's schema of `rl_tasks[].on_flag`.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from polyrl.rl.kl_control import PerDomainKL


class OnFlag(BaseModel):
    """What the run does when the reward monitor flags the domain as a whole (flags.jsonl:
    train_heldout_divergence, the training reward rising while held-out accuracy does not;
    reward_without_check_heldout, the held-out reward rising while the independent check
    does not, or falling below its best or its start). Applied at the step of the flag, from
    the next admitted rollout on, and logged on that step's metrics line (`flag_actions`)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True,
                              allow_inf_nan=False)

    actions: list[Literal["raise_kl", "lower_weight", "stop"]] = Field(default_factory=list, max_length=3)
    """in order, at every new flag: raise_kl multiplies the domain's KL coefficient by kl_factor
    (at least kl_min); lower_weight caps its share of each batch at `weight`; stop trains it no
    more (it is still evaluated). [] = the flag is only written"""
    kl_factor: float = Field(4.0, gt=1, le=1000)
    """raise_kl: the factor on the domain's KL coefficient (at most 1000)"""
    kl_min: float = Field(0.05, gt=0, le=100)
    """raise_kl: the least coefficient afterwards, so that a domain trained without KL gets one"""
    weight: float = Field(0.05, gt=0, lt=1)
    """lower_weight: the largest share of each batch the domain keeps"""


class FlagPolicy:
    """Each domain's reaction to flags on it, and the share caps those reactions left."""

    def __init__(self, settings: Mapping[str, OnFlag]) -> None:
        self.settings = {d: s for d, s in settings.items() if s.actions}
        self.caps: dict[str, float] = {}
        """domain -> largest share of a batch it may get (0: stopped)"""
        self.reasons: dict[str, str] = {}
        """domain -> why its share is capped"""

    def act(self, step: int, flags: Sequence[dict[str, Any]], kl: PerDomainKL) -> list[dict[str, Any]]:
        """Apply the policy of every domain a domain-level flag in `flags` names; returns what
        was done, one record per flag: {"domain", "flag", "actions", "reason"}."""
        taken = []
        for flag in flags:
            domain = flag.get("domain")
            settings = self.settings.get(domain)
            if flag.get("task_id") is not None or settings is None:
                continue
            done = [self._apply(action, domain, settings, flag, step, kl) for action in settings.actions]
            taken.append({"domain": domain, "flag": flag["kind"], "actions": done, "reason": flag.get("reason", "")})
        return taken

    def _apply(self, action: str, domain: str, settings: OnFlag, flag: dict[str, Any], step: int,
               kl: PerDomainKL) -> str:
        why = f"{flag['kind']} at step {step}"
        if action == "raise_kl":
            before = kl.coefs[domain]
            after = max(before * settings.kl_factor, settings.kl_min)
            kl.raise_coef(domain, after, f"{why}: raised x{after / before if before else float('inf'):.3g} "
                                         f"-> {after:.6g} (on_flag)")
            return f"raise_kl {before:.6g} -> {after:.6g}"
        cap = 0.0 if action == "stop" else settings.weight
        self.caps[domain] = min(cap, self.caps.get(domain, 1.0))
        self.reasons[domain] = f"{why}: " + ("stopped (on_flag)" if self.caps[domain] == 0
                                             else f"share capped at {self.caps[domain]:g} (on_flag)")
        return "stop" if action == "stop" else f"lower_weight to {self.caps[domain]:g}"

    def shares(self, weights: Mapping[str, float], reasons: Mapping[str, str] | None) \
            -> tuple[dict[str, float], dict[str, str] | None]:
        """`weights` (any scale) as shares (summing to 1) with the caps applied, and their
        reasons (None stays None while nothing is capped); a stopped domain is left out."""
        total = sum(weights.values())
        shares = {d: w / total for d, w in weights.items()}
        if not self.caps:
            return shares, (dict(reasons) if reasons is not None else None)
        capped = {d: min(shares[d], self.caps[d]) for d in shares if d in self.caps}
        free = {d: s for d, s in shares.items() if d not in capped}
        room, free_total = 1.0 - sum(capped.values()), sum(free.values())
        if free_total > 0:  # the others share what the capped domains gave up, in their own proportions
            free = {d: s / free_total * room for d, s in free.items()}
        out = {d: s for d, s in {**free, **capped}.items() if s > 0}
        said = dict(reasons) if reasons is not None else {d: "static: the run file's weight" for d in weights}
        said.update({d: self.reasons[d] for d in capped})
        return {d: out[d] for d in weights if d in out}, {d: said[d] for d in weights}

    def state_dict(self) -> dict[str, Any]:
        return {"caps": dict(self.caps), "reasons": dict(self.reasons)}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        if state:
            self.caps, self.reasons = dict(state["caps"]), dict(state["reasons"])
