"""swe_patch: 1 when a patch repairs a swe task's repository, visible and hidden tests alike.

The response is the model's final answer (text, or an agent episode's `EpisodeOutcome`)
holding a unified diff (domains/swe_diff.py reads it: fenced or not, prose before it
allowed). The reward is 1 only when every test passes, else 0. Statuses in `details`:

- "passed" / "failed": the patch applied and the tests ran (per-test verdicts in "tests",
  each marked "hidden" or not; "passed" and "total" count them);
- "no_patch": no diff in the answer;
- "edits_tests": the patch touches tests/ or a test file (test_*.py, *_test.py,
  conftest.py) anywhere: 0 whatever the tests say, deleting tests included;
- "patch_failed": the diff cannot be read or does not apply to the buggy repository
  ("error" says which file and hunk);
- "sandbox_error": the sandbox itself failed.

How it grades: the patch is applied on the host as text (nothing runs here), then one
fresh sandbox run per distinct patched package (code_harness.py, harness_main.py) imports
the package and calls each test's target on its arguments. Only the package's files and
the tests' arguments enter the sandbox; the test files are not run (their cases are data
in the task: visible_tests, hidden_tests) and expected values never go in; return values
come back on nonce-tagged lines and are compared here (unit_test_pass.judge_tests). A
call that raises, hangs, exits or returns a non-data object fails that test.

Not covered: files outside the package (a patch may change them; they are not graded), and
partial credit (a fraction of tests is in details, the reward stays 0 or 1).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from polyrl.agent.outcome import EpisodeOutcome
from polyrl.domains.swe_diff import apply_diff, extract_diff, parse_diff, touched_paths
from polyrl.rewards.base import Response
from polyrl.rewards.code_harness import call_literal, candidate_request, parse_outcomes
from polyrl.rewards.unit_test_pass import judge_tests
from polyrl.sandbox.pool import SandboxBackend, SandboxPool
from polyrl.sandbox.types import Limits, RunRequest, SandboxConfig
from polyrl.types import Score, Task

ENTRY = "swe_call"
_SHIM = '''import importlib
import os
import sys

sys.path.insert(0, os.getcwd())


def swe_call(target, *args):
    module, _, function = target.partition(".")
    return getattr(importlib.import_module({package!r} + "." + module), function)(*args)
'''


def is_test_path(path: str) -> bool:
    """tests/ anywhere in the path, or a file pytest would collect or configure from."""
    parts = path.split("/")
    name = parts[-1]
    return ("tests" in parts[:-1] or "test" in parts[:-1] or name == "conftest.py"
            or (name.startswith("test_") and name.endswith(".py")) or name.endswith("_test.py"))


def answer_text(response: Response) -> str:
    if isinstance(response, EpisodeOutcome):
        return response.answer or ""
    return response


class SwePatch:
    name = "swe_patch"

    def __init__(self, backend: SandboxBackend | None = None, *, workers: int | None = None,
                 allow_unsafe: bool = False, per_test_timeout_s: float = 1.0, total_timeout_s: float = 20.0,
                 memory_limit_MB: int = 512, limits: Limits | None = None) -> None:
        self._own_backend = backend is None
        self.backend = backend or SandboxPool(workers, SandboxConfig(allow_unsafe=allow_unsafe))
        self.per_test_timeout_s = per_test_timeout_s
        self.total_timeout_s = total_timeout_s
        self.memory_limit_MB = memory_limit_MB
        self.limits = limits or Limits()
        self._closed = False

    def score(self, tasks: Sequence[Task], responses: Sequence[Response]) -> list[Score]:
        if self._closed:
            raise RuntimeError("SwePatch.score after close()")
        if len(tasks) != len(responses):
            raise ValueError(f"{len(tasks)} tasks but {len(responses)} responses")
        scores: list[Score | None] = []
        jobs: dict[tuple, list[int]] = {}  # (package files, task id) -> positions: a group's copies run once
        packages: list[dict[str, str] | None] = []
        for task, response in zip(tasks, responses):
            _check_task(task)
            package, early = self._prepare(task, answer_text(response))
            scores.append(early)
            packages.append(package)
            if package is not None:
                jobs.setdefault((tuple(sorted(package.items())), task.id), []).append(len(scores) - 1)
        leaders = [positions[0] for positions in jobs.values()]
        prepared = [self._request(tasks[i], packages[i]) for i in leaders]  # type: ignore[arg-type]
        results = self.backend.run_many([request for request, _, _ in prepared])
        for positions, (request, nonce, cases), result in zip(jobs.values(), prepared, results):
            score = _judge(cases, nonce, result)
            for i in positions:
                scores[i] = score
        return scores  # type: ignore[return-value]

    def _prepare(self, task: Task, answer: str) -> tuple[dict[str, str] | None, Score | None]:
        """The patched package's files, or the Score of a patch that never reaches the sandbox."""
        diff = extract_diff(answer)
        if not diff.strip():
            return None, _zero("no_patch", "the answer holds no unified diff")
        patches, error = parse_diff(diff)
        if error is not None:
            return None, _zero("patch_failed", error)
        tests = sorted(p for p in touched_paths(patches) if is_test_path(p))
        if tests:
            return None, _zero("edits_tests", f"the patch touches test files: {', '.join(tests)}")
        files, error = apply_diff(task.data["files"], patches)
        if files is None:
            return None, _zero("patch_failed", error or "")
        prefix = task.data["package"] + "/"
        return {path[len(prefix):]: text for path, text in files.items() if path.startswith(prefix)}, None

    def _request(self, task: Task, package: dict[str, str]) -> tuple[RunRequest, str, list[dict[str, Any]]]:
        cases = ([{**c, "hidden": False} for c in task.data["visible_tests"]]
                 + [{**c, "hidden": True} for c in task.data["hidden_tests"]])
        calls = [call_literal([c["target"], *c["args"]]) for c in cases]
        code = _SHIM.format(package=task.data["package"])
        request, nonce = candidate_request(code, ENTRY, calls, self.per_test_timeout_s, self.total_timeout_s,
                                           self.memory_limit_MB, self.limits)
        files = {f"{task.data['package']}/{path}": text for path, text in package.items()}
        return replace(request, files=files), nonce, cases

    def close(self) -> None:
        if self._own_backend and not self._closed:
            self.backend.close()
        self._closed = True


def _check_task(task: Task) -> None:
    missing = [k for k in ("package", "files", "visible_tests", "hidden_tests") if k not in task.data]
    if missing:
        raise ValueError(f"task {task.id!r}: swe_patch grades swe tasks; data lacks {', '.join(missing)}")


def _zero(status: str, error: str) -> Score:
    return Score(0.0, {"status": status, "error": error, "passed": 0, "total": 0, "tests": []})


def _judge(cases: list[dict[str, Any]], nonce: str, result: Any) -> Score:
    outcomes = parse_outcomes(result, nonce, len(cases))
    verdicts = judge_tests([{"args": c["args"], "expected": c["expected"]} for c in cases], outcomes)
    tests = [{**v.to_json(), "name": c["name"], "hidden": c["hidden"]} for c, v in zip(cases, verdicts)]
    passed = sum(t["passed"] for t in tests)
    status = ("sandbox_error" if result.status == "sandbox_error" else
              "passed" if passed == len(tests) else "failed")
    details = {"status": status, "passed": passed, "total": len(tests), "tests": tests,
               "hidden_failed": sum(not t["passed"] for t in tests if t["hidden"]),
               "sandbox": {"status": result.status, "wall_time_s": round(result.wall_time_s, 4),
                           "message": result.message},
               "stderr": result.stderr[-1000:]}
    return Score(float(status == "passed"), details)
