"""Built-in domain names -> implementations, imported lazily (asking for "math" should
not load a code sandbox), and the domains of installed packages (entry point group
`polyrl.domains`, polyrl/plugins.py; a built-in name wins). User task packs are not
registered here: they are loaded by path with `polyrl.domains.pack`."""

from __future__ import annotations

import importlib
from typing import Any

from polyrl.domains.base import Domain
from polyrl.plugins import Plugins

# name -> "module:Class". Each class takes keyword options and implements Domain.
_DOMAINS: dict[str, str] = {
    "math": "polyrl.domains.math:MathDomain",
    "code": "polyrl.domains.code:CodeDomain",
    "humaneval": "polyrl.domains.humaneval:HumanEvalDomain",
    "agent": "polyrl.domains.agent:AgentDomain",
    "alignment": "polyrl.domains.alignment:AlignmentDomain",
    "longctx": "polyrl.domains.longctx:LongContextDomain",
    "swe": "polyrl.domains.swe:SweDomain",
    "ops": "polyrl.domains.ops:OpsDomain",
}
PLUGINS = Plugins("polyrl.domains", "domain", _DOMAINS)


class UnknownDomain(KeyError):
    def __str__(self) -> str:
        return f"unknown domain {self.args[0]!r}; available: {', '.join(available_domains())}"


def available_domains() -> list[str]:
    return sorted({*_DOMAINS, *PLUGINS.names()})


def domain_class(name: str) -> type:
    """The class of a domain, imported on first use (PluginError: a plugin that does not import)."""
    if name not in _DOMAINS:
        if name in PLUGINS:
            return PLUGINS.load(name)
        raise UnknownDomain(name)
    module_name, _, class_name = _DOMAINS[name].partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def get_domain(name: str, **options: Any) -> Domain:
    """A domain by name, constructed with `options` (e.g. levels=(1, 2))."""
    return domain_class(name)(**options)
