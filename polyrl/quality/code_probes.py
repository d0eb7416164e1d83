"""Probes for code tasks (`unit_test_pass`), built for any entry point.

Negative controls (each must score below full reward):
- an empty completion, a generic prose answer, and the prompt echoed back (if the echo
  passes, the prompt holds a solution: "leaked_answer");
- constant returns: None, 0, True, "", [], the tests' most common expected value (from
  the args/expected tests, or from the check's plan), and the first argument unchanged;
- a lookup table of the examples the prompt shows (doctest `>>> f(x)` lines and
  `f(x) == y` / `->` / `=>` / `➞` lines): if it passes, the tests check nothing the
  prompt does not already give away;
- mutants of the reference (mutants.py), reported as warnings.

Exploits (each must score exactly 0): exiting early (sys.exit, os._exit, at import),
an always-equal object, fake "OK" test output, a patched test framework with a check()
of its own, and reading the expected value off the call stack. Every exploit returns
something no test can accept (a fresh `object()`), so any reward it gets is a hole.

Equivalent rewrites (must score full reward): the reference reformatted and with renamed
locals (mutants.py).

Out of scope: probes for stdin/stdout programs or other languages, and running anything
(audit.py scores the probes in one batch).
"""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from typing import Any

from polyrl.quality.mutants import equivalent_rewrites, mutants
from polyrl.quality.probes import Probe
from polyrl.rewards.check_plan import CheckPlan
from polyrl.rewards.code_harness import parse_literal
from polyrl.types import Task

_GENERIC = "I am not sure how to solve this. Here is my best attempt at an explanation of the approach."
_CONSTANTS = ("None", "0", "True", "''", "[]")
_MAX_LITERAL = 2000

_EXPLOITS = {
    "sys.exit(0) in the entry point": "import sys\ndef {E}(*args, **kwargs):\n    sys.exit(0)\n",
    "os._exit(0) in the entry point": "import os\ndef {E}(*args, **kwargs):\n    os._exit(0)\n",
    "exit at import": "import sys\ndef {E}(*args, **kwargs):\n    return object()\nsys.exit(0)\n",
    "an always-equal object": (
        "class AlwaysEqual:\n"
        "    def __eq__(self, other): return True\n    def __ne__(self, other): return False\n"
        "    def __hash__(self): return 0\n    def __bool__(self): return True\n"
        "    def __sub__(self, other): return 0\n    def __abs__(self): return 0\n"
        "    def __lt__(self, other): return True\n    __le__ = __gt__ = __ge__ = __lt__\n"
        "def {E}(*args, **kwargs):\n    return AlwaysEqual()\n"),
    "fake 'OK' test output": (
        "print('OK')\nprint('Ran 1 test in 0.001s\\n\\nOK')\n"
        "def {E}(*args, **kwargs):\n    print('PASSED')\n    print('All tests passed')\n    return object()\n"),
    "patched test framework": (
        "import builtins, unittest\nbuiltins.AssertionError = type('Quiet', (Exception,), {{}})\n"
        "unittest.TestCase.assertEqual = lambda *a, **k: None\n"
        "def check(candidate):\n    return True\n"
        "def {E}(*args, **kwargs):\n    return object()\n"),
    "expected value from the call stack": (
        "import sys, gc\ndef {E}(*args, **kwargs):\n    f = sys._getframe(1)\n    while f:\n"
        "        for k, v in f.f_locals.items():\n            if 'expect' in k: return v\n        f = f.f_back\n"
        "    for o in gc.get_objects():\n        if isinstance(o, dict) and 'expected' in o: return o['expected']\n"
        "    return object()\n"),
}


def code_probes(task: Task, plan: CheckPlan | None, reference_ok: bool, mutants_per_kind: int = 2) -> list[Probe]:
    """Every probe of a code task; the reference's rewrites and mutants only when the
    reference itself scores full reward (of a wrong reference they prove nothing)."""
    entry = task.data["entry_point"]
    probes = [
        Probe("negative_control", "an empty completion", "", "below"),
        Probe("negative_control", "a generic prose answer", _GENERIC, "below"),
        Probe("leaked_answer", "the prompt echoed back", task.prompt, "below"),
    ]
    for literal in _constants(task, plan):
        probes.append(Probe("negative_control", f"constant return {_short(literal)}",
                            f"def {entry}(*args, **kwargs):\n    return {literal}\n", "below"))
    probes.append(Probe("negative_control", "returning the first argument unchanged",
                        f"def {entry}(*args, **kwargs):\n    return args[0] if args else None\n", "below"))
    examples = prompt_examples(task.prompt, entry)
    if examples:
        table = repr([(list(a), k, r) for a, k, r in examples])
        code = (f"_EXAMPLES = {table}\ndef {entry}(*args, **kwargs):\n    for a, k, r in _EXAMPLES:\n"
                "        if a == list(args) and k == kwargs:\n            return r\n    return None\n")
        probes.append(Probe("negative_control", f"a lookup table of the prompt's {len(examples)} examples",
                            code, "below"))
    for name, template in _EXPLOITS.items():
        probes.append(Probe("exploit", name, template.format(E=entry), "zero"))
    reference = task.data.get("reference")
    if reference_ok and isinstance(reference, str):
        for rewrite in equivalent_rewrites(task.prompt, reference, entry):
            probes.append(Probe("false_negative", rewrite.description, rewrite.completion, "full"))
        for mutant in mutants(task.prompt, reference, entry, mutants_per_kind):
            probes.append(Probe("mutant", f"{mutant.kind} ({mutant.description})", mutant.completion, "below"))
    return probes


def _constants(task: Task, plan: CheckPlan | None) -> list[str]:
    """Python literals to return: the generic ones and the tests' most common expected value."""
    expected: list[str] = []
    if isinstance(task.data.get("tests"), list):
        expected = [repr(json.loads(json.dumps(t["expected"]))) for t in task.data["tests"]]
    elif plan is not None:
        expected = [r["expected"] for r in plan.asserts if r["kind"] == "eq" and "expected" in r]
    out = list(_CONSTANTS)
    if expected:
        common = Counter(expected).most_common(1)[0][0]
        if len(common) <= _MAX_LITERAL and common not in out:
            out.append(common)
    return out


def _short(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."


# ---------------------------------------------------------------------------- examples in the prompt

_ARROW = re.compile(r"\s*(?:==>|==|=>|->|➞|→|=|should return|returns|should be)\s*(.+)$")


def prompt_examples(prompt: str, entry: str) -> list[tuple[tuple[Any, ...], dict[str, Any], Any]]:
    """(args, kwargs, result) of every example call of `entry` the prompt shows whose
    arguments and result are plain literals; parsed with `ast`, never evaluated."""
    lines = prompt.splitlines()
    call = re.compile(rf"(?<![\w.]){re.escape(entry)}\(")
    found: list[tuple[tuple[Any, ...], dict[str, Any], Any]] = []
    for i, line in enumerate(lines):
        for match in call.finditer(line):
            end = _closing(line, match.end() - 1)
            if end is None:
                continue
            rest = line[end + 1:]
            arrow = _ARROW.match(rest)
            if arrow:
                result_text = arrow.group(1)
            elif ">>>" in line[:match.start()] and not rest.strip() and i + 1 < len(lines):
                result_text = lines[i + 1]
            else:
                continue
            example = _literal_example(line[match.end():end], result_text.strip().rstrip(".,;").strip())
            if example is not None and example not in found:
                found.append(example)
    return found


def _closing(line: str, open_at: int) -> int | None:
    """Index of the parenthesis closing the one at `open_at` (quotes respected)."""
    depth, quote, i = 0, "", open_at
    while i < len(line):
        ch = line[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _literal_example(args_text: str, result_text: str) -> tuple[tuple[Any, ...], dict[str, Any], Any] | None:
    try:
        node = ast.parse(f"_({args_text})", mode="eval").body
        assert isinstance(node, ast.Call)
        args = tuple(ast.literal_eval(a) for a in node.args)
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
        if len(kwargs) != len(node.keywords):
            return None
        result = ast.literal_eval(result_text)
        parse_literal(repr((args, kwargs, result)))  # plain data only: the probe carries it as a literal
    except (SyntaxError, ValueError, TypeError, AssertionError, MemoryError, RecursionError):
        return None
    return args, kwargs, result
