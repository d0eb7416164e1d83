"""Verifier names -> implementations, imported lazily (a sandbox backend or a reward
model should not load when only math is scored), and the verifiers of installed packages
(entry point group `polyrl.rewards`, polyrl/plugins.py; a built-in name wins)."""

from __future__ import annotations

import importlib
from typing import Any

from polyrl.plugins import Plugins
from polyrl.rewards.base import Verifier

# name -> "module:Class". Each class takes keyword options and implements Verifier.
_VERIFIERS: dict[str, str] = {
    "answer_verify": "polyrl.rewards.answer_verify:AnswerVerify",
    "unit_test_pass": "polyrl.rewards.unit_test_pass:UnitTestPass",
    "success_minus_cost": "polyrl.rewards.success_minus_cost:SuccessMinusCost",
    "preference_model": "polyrl.rewards.preference_model:PreferenceModel",
    "rule_check": "polyrl.rewards.alignment_rules:AlignmentRules",
    "swe_patch": "polyrl.rewards.swe_patch:SwePatch",
    "world_state": "polyrl.rewards.world_state:WorldState",
}
PLUGINS = Plugins("polyrl.rewards", "verifier", _VERIFIERS)


class UnknownVerifier(KeyError):
    def __str__(self) -> str:
        return f"unknown verifier {self.args[0]!r}; available: {', '.join(available_verifiers())}"


def available_verifiers() -> list[str]:
    return sorted({*_VERIFIERS, *PLUGINS.names()})


def verifier_class(name: str) -> type:
    """The class behind a verifier name, imported but not constructed (to check its options)."""
    if name not in _VERIFIERS:
        if name in PLUGINS:
            return PLUGINS.load(name)
        raise UnknownVerifier(name)
    module_name, _, class_name = _VERIFIERS[name].partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def get_verifier(name: str, **options: Any) -> Verifier:
    return verifier_class(name)(**options)
