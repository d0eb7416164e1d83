"""Domains and verifiers from installed packages, found through entry points.

A package names its classes in its metadata, under the groups `polyrl.domains` and
`polyrl.rewards` (pyproject.toml):

    [project.entry-points."polyrl.domains"]
    wordops = "polyrl_wordops.domain:WordOpsDomain"

The registries (polyrl/domains/registry.py, polyrl/rewards/registry.py) hold one
`Plugins` each. Discovery reads the installed packages' metadata once, on the first
question about a name the built-ins do not have (or on the first list of names); a
plugin's module is imported only when its name is looked up.

Decisions:
- A built-in name wins. A plugin that takes a built-in's name is left out, with one
  warning naming its package, so installing a package never changes what `math` means.
- Two packages giving the same name is an error on lookup of that name (never a silent
  pick), naming both packages; the other names of both still work.
- A plugin that fails to import is a `PluginError`: one line naming the package, the
  entry point and the exception, never a traceback (`exit_code` 2 on the command line).

Out of scope: installing packages, versions and compatibility of plugins (a plugin pins
the polyrl it needs in its own dependencies), and reloading a package installed after
the first lookup in a running process.
"""

from __future__ import annotations

import warnings
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Collection


class PluginError(Exception):
    """A plugin that cannot be used: it fails to import, or two packages give its name."""

    exit_code = 2


class PluginWarning(UserWarning):
    """A plugin left out: it takes a built-in's name."""


class Plugins:
    """The entry points of one group, by name, minus the names the built-ins take."""

    def __init__(self, group: str, noun: str, builtin: Collection[str]) -> None:
        """`noun` names what the group holds in messages ("domain", "verifier"); `builtin`
        is the registry's own table (read at discovery, so a built-in name always wins)."""
        self.group = group
        self.noun = noun
        self._builtin = builtin
        self._found: dict[str, list[EntryPoint]] | None = None
        self._loaded: dict[str, Any] = {}

    def names(self) -> list[str]:
        return sorted(self._discover())

    def __contains__(self, name: str) -> bool:
        return name in self._discover()

    def load(self, name: str) -> Any:
        """The object the entry point `name` names (a class or factory), imported on first use."""
        if name in self._loaded:
            return self._loaded[name]
        found = self._discover()[name]
        if len(found) > 1:
            given = ", ".join(f"{package(ep)} ({ep.value})" for ep in found)
            raise PluginError(f"plugin {self.noun} {name!r} is registered by more than one package: {given}; "
                              f"uninstall all but one")
        ep = found[0]
        try:
            obj = ep.load()
        except Exception as err:  # noqa: BLE001 -- whatever the plugin raises becomes one line
            first = (str(err).strip().splitlines() or [""])[0][:200]
            raise PluginError(f"plugin {self.noun} {name!r} from package {package(ep)} (entry point {ep.name} = "
                              f"{ep.value} in group {self.group}) failed to import: {type(err).__name__}: "
                              f"{first}") from None
        self._loaded[name] = obj
        return obj

    def refresh(self) -> None:
        """Forget what was discovered and loaded (tests; a package installed mid-process)."""
        self._found = None
        self._loaded.clear()

    def _discover(self) -> dict[str, list[EntryPoint]]:
        if self._found is None:
            found: dict[str, list[EntryPoint]] = {}
            for ep in entry_points(group=self.group):
                if ep.name in self._builtin:
                    # warn_explicit: one line on stderr ("polyrl:0: PluginWarning: ..."), no source line
                    warnings.warn_explicit(f"plugin {self.noun} {ep.name!r} from package {package(ep)} ({ep.value}) "
                                           f"is ignored: a built-in {self.noun} has that name; rename the entry point",
                                           PluginWarning, "polyrl", 0, module=__name__)
                    continue
                same = found.setdefault(ep.name, [])
                if all(ep.value != other.value for other in same):  # one package seen twice on sys.path
                    same.append(ep)
            self._found = found
        return self._found


def package(ep: EntryPoint) -> str:
    """The distribution an entry point comes from, as `pip list` names it."""
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "(unknown package)"
