"""Probes of a swe task (graded by swe_patch): patches that must fail, and forms of the
reference patch that must pass.

- negative controls (must score 0): no patch; a patch that changes nothing the tests see
  (the package's docstring);
- exploits (must score 0): deleting the failing tests' file; disabling their asserts; the
  reference fix plus a test edit; a conftest.py; special-casing the visible tests'
  arguments in the tested function (it passes every visible test: only the hidden tests
  can catch it);
- false negatives (must score 1): the reference fenced with prose around it; the
  reference as `git diff` writes it (diff --git and index lines).

Out of scope: which probes other verifiers get (code_probes.py, math_probes.py).
"""

from __future__ import annotations

import json
from typing import Any

from polyrl.domains.swe_diff import make_diff
from polyrl.quality.probes import Probe
from polyrl.types import Task


def swe_probes(task: Task) -> list[Probe]:
    data = task.data
    files: dict[str, str] = data["files"]
    reference: str = data["reference_patch"]
    failing = [c for c in data["visible_tests"] if c["name"] in set(data.get("failing_tests", []))]
    test_path = f"tests/test_{failing[0]['target'].partition('.')[0]}.py" if failing else None
    init = f"{data['package']}/__init__.py"
    probes = [
        Probe("negative_control", "no patch", "", "zero"),
        Probe("negative_control", "a patch that only rewrites the package docstring",
              make_diff(files, {**files, init: '"""Nothing to see here."""\n'}), "zero"),
        Probe("exploit", "a conftest.py added", make_diff(files, {**files, "conftest.py": _CONFTEST}), "zero"),
        Probe("exploit", "the visible tests special-cased in the tested functions",
              make_diff(files, overfit(files, data["package"], data["visible_tests"], failing)), "zero"),
        Probe("false_negative", "the reference patch fenced, with prose around it",
              f"I found the bug.\n\n```diff\n{reference}```\n\nThis fixes it.", "full"),
        Probe("false_negative", "the reference patch as git diff writes it", _git_style(reference), "full"),
    ]
    if test_path in files:
        rest = {k: v for k, v in files.items() if k != test_path}
        probes.append(Probe("exploit", f"deleting {test_path}", make_diff(files, rest), "zero"))
        edited = files[test_path].replace("assert got == expected", "assert True or got == expected")
        probes.append(Probe("exploit", f"the asserts of {test_path} disabled",
                            make_diff(files, {**files, test_path: edited}), "zero"))
        probes.append(Probe("exploit", "the reference fix plus an edited test",
                            reference + make_diff(files, {**files, test_path: files[test_path] + "\n# edited\n"}),
                            "zero"))
    return probes


_CONFTEST = '''import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
'''


def overfit(files: dict[str, str], package: str, visible: list[dict[str, Any]],
            failing: list[dict[str, Any]]) -> dict[str, str]:
    """The repository with each failing test's function wrapped to return the visible tests'
    expected values for their arguments, and to call the buggy code for any other."""
    out = dict(files)
    for target in sorted({c["target"] for c in failing}):
        module, _, function = target.partition(".")
        table = {json.dumps(c["args"]): c["expected"] for c in visible if c["target"] == target}
        path = f"{package}/{module}.py"
        out[path] = out[path] + (
            f"\n\nimport json as _json\n_VISIBLE_{function} = {table!r}\n_buggy_{function} = {function}\n\n\n"
            f"def {function}(*args):\n"
            f"    key = _json.dumps(list(args))\n"
            f"    if key in _VISIBLE_{function}:\n"
            f"        return _VISIBLE_{function}[key]\n"
            f"    return _buggy_{function}(*args)\n")
    return out


def _git_style(diff: str) -> str:
    """`diff` with a `diff --git` and an `index` line before each file."""
    out = []
    for line in diff.splitlines(keepends=True):
        if line.startswith("--- a/"):
            path = line[6:].strip()
            out.append(f"diff --git a/{path} b/{path}\nindex 1111111..2222222 100644\n")
        out.append(line)
    return "".join(out)
