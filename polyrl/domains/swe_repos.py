"""A seeded generator of small Python repositories with one planted bug (the swe domain).

`generate(seed, level, families)` builds a package of 2-4 modules that call each other
(swe_templates.py), draws test cases for its functions, plants one bug from a family, and
keeps the draw only when the bug shows: at least one visible test fails, one passes, and
at least one hidden test fails. Visible tests become tests/test_<module>.py files the model
reads and runs; hidden tests stay data, never shown. A test case is data:
`{"name", "target": "module.function", "args": [...], "expected": ...}`.

Levels: 1 two modules, 2 three, 3-4 four; at levels 3-4 only the top modules (grades,
report) have visible tests, so a bug in calc or words shows through a call across modules.

Expected values come from running the original package, and the buggy one, in this
process: both are our own fixed templates, never a model's code (`evaluate`). Model
patches only ever run in the sandbox (rewards/swe_patch.py).

Out of scope: more than one bug per repository, repositories of other languages.
"""

from __future__ import annotations

import json
import random
import sys
import types
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

from polyrl.domains.swe_diff import make_diff
from polyrl.domains.swe_templates import LEVEL_MODULES, MODULES, Site

LEVELS = (1, 2, 3, 4)
VISIBLE_MODULES = {1: ("calc", "words"), 2: ("calc", "words", "grades"), 3: ("grades", "report"),
                   4: ("grades", "report")}
_VISIBLE_PER_FUNCTION = 2
_HIDDEN_PER_FUNCTION = 4
_TEST_DRAWS = 6
"""draws of the test cases per bug site before the next site is tried"""
_SYLLABLES = ("nor", "val", "ka", "bri", "tom", "ell", "ash", "dun", "mer", "ro", "sil", "ford", "wick", "lan")


@dataclass(frozen=True)
class Repo:
    package: str
    level: int
    site: Site
    module: str
    """the module the bug is planted in"""
    original: dict[str, str]
    buggy: dict[str, str]
    """path -> text: the package and the visible test files (what the model works on)"""
    visible: list[dict[str, Any]]
    hidden: list[dict[str, Any]]
    failing: list[dict[str, Any]]
    """the visible tests the bug fails, each with "got": what the buggy code returned"""

    @property
    def reference_patch(self) -> str:
        return make_diff(self.buggy, self.original)


def package_name(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))) + "lib"


def generate(seed: int, level: int, families: Sequence[str]) -> Repo | None:
    """The repository of (seed, level), or None when no site of `families` at this level
    shows on the drawn tests (the caller draws another seed)."""
    rng = random.Random(f"swe-repo|{seed}|{level}")
    package = package_name(rng)
    names = LEVEL_MODULES[level]
    constants = {k: draw(rng) for name in names for k, draw in sorted(MODULES[name].constants.items())}
    if "PASS_MARK" in constants and constants["TOP_MARK"] - constants["PASS_MARK"] < 5:
        constants["TOP_MARK"] = constants["PASS_MARK"] + 20
    sources = {name: _fill(MODULES[name].source, constants) for name in names}
    sites = [(name, s) for name in names for s in MODULES[name].sites if s.family in families]
    if not sites:
        return None
    family = rng.choice(sorted({s.family for _, s in sites}))
    candidates = [(name, s) for name, s in sites if s.family == family]
    rng.shuffle(candidates)
    for module, site in candidates:
        assert sources[module].count(site.old) == 1, (module, site)
        buggy_sources = {**sources, module: sources[module].replace(site.old, site.new)}
        for _ in range(_TEST_DRAWS):
            visible, hidden = _draw_cases(rng, names, VISIBLE_MODULES[level], constants)
            cases = visible + hidden
            want = evaluate(package, sources, cases)
            got = evaluate(package, buggy_sources, cases)
            keep = {k for k, (ok, _) in enumerate(want) if ok}  # the original never raises; kept anyway
            for k in keep:
                cases[k]["expected"] = want[k][1]
            visible, hidden = ([c for k, c in enumerate(part, start=start) if k in keep]
                               for part, start in ((visible, 0), (hidden, len(visible))))
            broken = {cases[k]["name"]: got[k] for k in keep if got[k] != want[k]}
            failing = [{**c, "got": _shown(broken[c["name"]])} for c in visible if c["name"] in broken]
            if failing and len(failing) < len(visible) and any(c["name"] in broken for c in hidden):
                original = _files(package, sources, visible)
                return Repo(package, level, site, module, original, _files(package, buggy_sources, visible),
                            visible, hidden, failing)
    return None


def _fill(source: str, constants: dict[str, int]) -> str:
    for key, value in constants.items():
        source = source.replace("{" + key + "}", str(value))
    return source


def _draw_cases(rng: random.Random, names: Sequence[str], visible_modules: Sequence[str],
                constants: dict[str, int]) -> tuple[list[dict], list[dict]]:
    """Visible and hidden cases; no two of one function share arguments."""
    visible, hidden = [], []
    for name in names:
        for function, gen in MODULES[name].tests.items():
            shown = _VISIBLE_PER_FUNCTION if name in visible_modules else 0
            seen: set[str] = set()
            drawn: list[list[Any]] = []
            for _ in range(10 * (shown + _HIDDEN_PER_FUNCTION)):
                args = gen(rng, constants)
                key = json.dumps(args)
                if key not in seen:
                    seen.add(key)
                    drawn.append(args)
                if len(drawn) == shown + _HIDDEN_PER_FUNCTION:
                    break
            for k, args in enumerate(drawn):
                test = {"target": f"{name}.{function}", "args": args}
                if k < shown:
                    visible.append({"name": f"test_{function}_{k + 1}", **test})
                else:
                    hidden.append({"name": f"hidden_{function}_{k - shown + 1}", **test})
    return visible, hidden


def evaluate(package: str, sources: dict[str, str], cases: Sequence[dict]) -> list[tuple[bool, Any]]:
    """(True, value) or (False, "ExcType: message") per case, running `sources` (our own
    templates; see the module docstring) as a fresh package in this process."""
    root = f"_polyrl_swe_{uuid.uuid4().hex}"
    loaded: dict[str, types.ModuleType] = {}
    package_module = types.ModuleType(root)
    package_module.__path__ = []  # type: ignore[attr-defined]
    sys.modules[root] = package_module
    try:
        for name, source in sources.items():  # in dependency order (LEVEL_MODULES)
            module = types.ModuleType(f"{root}.{name}")
            module.__package__ = root
            sys.modules[module.__name__] = module
            exec(compile(source, f"{package}/{name}.py", "exec"), module.__dict__)  # noqa: S102 -- our templates
            setattr(package_module, name, module)
            loaded[name] = module
        out = []
        for case in cases:
            module_name, _, function = case["target"].partition(".")
            try:
                value = getattr(loaded[module_name], function)(*json.loads(json.dumps(case["args"])))
                out.append((True, json.loads(json.dumps(value))))
            except Exception as err:  # noqa: BLE001 -- a planted bug may raise
                out.append((False, f"{type(err).__name__}: {err}"))
        return out
    finally:
        for name in [root] + [f"{root}.{n}" for n in sources]:
            sys.modules.pop(name, None)


def _shown(outcome: tuple[bool, Any]) -> str:
    ok, value = outcome
    return repr(value) if ok else f"raised {value}"


def call_text(case: dict[str, Any]) -> str:
    function = case["target"].partition(".")[2]
    return f"{function}({', '.join(repr(a) for a in case['args'])})"


def _files(package: str, sources: dict[str, str], visible: list[dict[str, Any]]) -> dict[str, str]:
    files = {f"{package}/__init__.py": f'"""{package}: a small package."""\n'}
    files.update({f"{package}/{name}.py": source for name, source in sources.items()})
    by_module: dict[str, list[dict[str, Any]]] = {}
    for case in visible:
        by_module.setdefault(case["target"].partition(".")[0], []).append(case)
    for module, cases in by_module.items():
        functions = sorted({c["target"].partition(".")[2] for c in cases})
        body = [f"from {package}.{module} import {', '.join(functions)}\n"]
        for case in cases:
            call = call_text(case)
            body.append(f"\n\ndef {case['name']}():\n"
                        f"    expected = {case['expected']!r}\n"
                        f"    got = {call}\n"
                        f"    assert got == expected, {call!r} + \" returned %r, expected %r\" % (got, expected)\n")
        files[f"tests/test_{module}.py"] = "".join(body)
    return files


def test_file(case: dict[str, Any]) -> str:
    return f"tests/test_{case['target'].partition('.')[0]}.py"
