"""unit_test_pass: the fraction of a task's tests a code completion genuinely passes.

Task shapes (the code lines of polyrl/domains/pack.py), both with `data["entry_point"]`:
- `data["tests"] = [{"args": [...], "expected": ...}]`: one call per test; the return
  value, brought to JSON shape (tuples as lists), must equal `expected`.
- `data["test"]`: a HumanEval `check(candidate)` source, `prompt` the signature and
  docstring; each assert statement that calls the candidate is judged (check_plan.py),
  and the check is one test, as HumanEval defines it: the reward is 1 when every assert
  passes, else 0 (`check_credit="all"`). `check_credit="per_assert"` gives the fraction
  of asserts instead, a denser signal that a body doing nothing partly collects where
  None is genuinely right (`candidate([]) == None`, `not candidate("<")`): 8 of the 164
  HumanEval checks have such asserts.

The completion becomes a program (code_extract.py: fenced block, whole function, or body
after the prompt) that runs in a fresh sandbox per completion (code_harness.py,
harness_main.py): only the calls' arguments go in; return values come back as plain data
on nonce-tagged lines and are compared here. Per-call timeouts; a call that exits, crashes,
hangs or returns a non-data object fails that test only. Exploits that score 0 (exit
tricks, always-equal objects, patched builtins or test frameworks, fake output, reading
expected values) are tests/test_sandbox_exploits.py.

Batches: checks are planned once per task (cached), then every distinct program runs at
once on the backend's workers (copies of one program, common within a GRPO group, run
once and share the result and the execution record), then the few checks that need it
are replayed. A Score's details:
status ("passed", "failed", "load_error", "sandbox_error", "task_error"), passed, total,
tests (per-test name/passed/status/detail), program form, a sandbox summary, the stderr
tail, and with record=True a replay record (polyrl.sandbox.replay) under "replay", or with
`log` (an ExecutionLog) the id the record was stored under, as "execution".

Not covered: stdin/stdout-style problems (a program reading input and printing answers),
classes as entry points beyond calling them, floating-point tolerance for args/expected
tests (HumanEval checks carry their own), and languages other than Python.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

from polyrl.rewards.check_plan import (
    CheckPlan, PlanError, Verdict, judge, judge_module, judge_request, read_plan, read_report, replay_extra,
)
from polyrl.rewards.code_extract import Program, build_program
from polyrl.rewards.code_harness import CallOutcome, call_literal, candidate_request, parse_outcomes
from polyrl.sandbox.execution_log import ExecutionLog
from polyrl.sandbox.pool import SandboxBackend, SandboxPool
from polyrl.sandbox.replay import record
from polyrl.sandbox.types import Limits, RunRequest, RunResult, SandboxConfig
from polyrl.types import Score, Task

logger = logging.getLogger("polyrl.rewards.unit_test_pass")
_JUDGE_TIMEOUT_S = 30.0


@dataclass
class _Check:
    """A task's check, planned once: the rewritten module and its plan, or why not."""

    module: str = ""
    plan: CheckPlan | None = None
    error: str | None = None


@dataclass
class _Job:
    task: Task
    program: Program
    entry: str
    tests: list[dict[str, Any]] | None = None
    check_key: str | None = None
    check: _Check | None = None
    request: RunRequest | None = None
    nonce: str = ""
    result: RunResult | None = None
    outcomes: list[CallOutcome] = field(default_factory=list)
    replayed: dict[str, bool] | None = None
    judge_error: str | None = None

    @property
    def calls(self) -> list[str]:
        if self.tests is not None:
            return [call_literal(t["args"]) for t in self.tests]
        assert self.check is not None and self.check.plan is not None
        return self.check.plan.calls


class UnitTestPass:
    name = "unit_test_pass"

    def __init__(
        self, backend: SandboxBackend | None = None, *, workers: int | None = None, allow_unsafe: bool = False,
        per_test_timeout_s: float = 3.0, total_timeout_s: float = 30.0, memory_limit_MB: int = 512,
        limits: Limits | None = None, record: bool = False, check_credit: str = "all",
        log: ExecutionLog | None = None,
    ):
        if check_credit not in ("all", "per_assert"):
            raise ValueError(f"check_credit must be 'all' or 'per_assert', got {check_credit!r}")
        self.check_credit = check_credit
        self._own_backend = backend is None
        self.backend = backend or SandboxPool(workers, SandboxConfig(allow_unsafe=allow_unsafe))
        self.per_test_timeout_s = per_test_timeout_s
        self.total_timeout_s = total_timeout_s
        self.memory_limit_MB = memory_limit_MB
        self.limits = limits or Limits()
        self.record = record
        self.log = log
        self._checks: dict[str, _Check] = {}
        self._closed = False

    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[Score]:
        if self._closed:
            raise RuntimeError("UnitTestPass.score after close()")
        if len(tasks) != len(completions):
            raise ValueError(f"{len(tasks)} tasks but {len(completions)} completions")
        jobs = [self._job(task, completion) for task, completion in zip(tasks, completions)]
        self._plan_checks([j for j in jobs if j.check_key is not None])
        runnable = [j for j in jobs if j.check is None or j.check.error is None]
        # A GRPO group often samples the same program several times: run each distinct
        # (program, calls) once and give every copy its result.
        leaders: dict[tuple, _Job] = {}
        for job in runnable:
            leader = leaders.setdefault((job.program.code, job.entry, tuple(job.calls)), job)
            if leader is job:
                job.request, job.nonce = candidate_request(
                    job.program.code, job.entry, job.calls, self.per_test_timeout_s, self.total_timeout_s,
                    self.memory_limit_MB, self.limits)
        unique = list(leaders.values())
        for job, result in zip(unique, self.backend.run_many([j.request for j in unique])):
            job.result = result
            job.outcomes = parse_outcomes(result, job.nonce, len(job.calls))
        for job in runnable:
            leader = leaders[(job.program.code, job.entry, tuple(job.calls))]
            job.request, job.nonce, job.result, job.outcomes = leader.request, leader.nonce, leader.result, leader.outcomes
        self._replay([j for j in runnable if j.check and j.check.plan and j.check.plan.complex_executions])
        logged: dict[tuple, str] = {}
        return [self._score(job, logged) for job in jobs]

    def plan(self, tasks: Sequence[Task]) -> list[CheckPlan | None]:
        """Plan the checks of `tasks` now (cached for later scores); None for args/expected
        tasks and for checks that cannot be used (their scores say why)."""
        jobs = [self._job(task, "") for task in tasks]
        self._plan_checks([j for j in jobs if j.check_key is not None])
        return [j.check.plan if j.check else None for j in jobs]

    def close(self) -> None:
        if self._own_backend and not self._closed:
            self.backend.close()
        self._closed = True

    # ------------------------------------------------------------------ preparation

    def _job(self, task: Task, completion: str) -> _Job:
        entry = task.data.get("entry_point")
        if not isinstance(entry, str) or not entry.isidentifier():
            raise ValueError(f"task {task.id!r}: unit_test_pass needs data['entry_point'], a function name")
        job = _Job(task, build_program(task.prompt, completion, entry), entry)
        if "tests" in task.data:
            tests = task.data["tests"]
            if not isinstance(tests, list) or not tests or not all(
                    isinstance(t, dict) and isinstance(t.get("args"), list) and "expected" in t for t in tests):
                raise ValueError(f"task {task.id!r}: data['tests'] must be a non-empty list of "
                                 '{"args": [...], "expected": ...}')
            try:
                [call_literal(t["args"]) for t in tests]
            except TypeError as err:
                raise ValueError(f"task {task.id!r}: test arguments must be JSON data: {err}") from None
            job.tests = tests
        elif isinstance(task.data.get("test"), str):
            key = "\0".join((task.prompt, task.data["test"], entry))
            job.check_key = hashlib.sha256(key.encode(errors="surrogatepass")).hexdigest()
        else:
            raise ValueError(f"task {task.id!r}: unit_test_pass needs data['tests'] (args/expected) "
                             "or data['test'] (a check(candidate) source)")
        return job

    def _plan_checks(self, jobs: list[_Job]) -> None:
        todo: dict[str, _Job] = {}
        for job in jobs:
            if job.check_key not in self._checks:
                todo.setdefault(job.check_key, job)  # type: ignore[arg-type]
        planned: list[tuple[str, RunRequest, str]] = []
        for key, job in todo.items():
            try:
                module = judge_module(job.task.data["test"], job.entry)
            except PlanError as err:
                self._checks[key] = _Check(error=str(err))
                continue
            self._checks[key] = _Check(module=module)
            request, nonce = judge_request("plan", job.task.prompt, module, job.entry, {}, _JUDGE_TIMEOUT_S,
                                           self.memory_limit_MB)
            planned.append((key, request, nonce))
        results = self.backend.run_many([request for _, request, _ in planned])
        for (key, _, nonce), result in zip(planned, results):
            check = self._checks[key]
            try:
                check.plan = read_plan(result, nonce)
                if all(record["kind"] == "const" for record in check.plan.asserts):
                    raise PlanError("no assert in the check calls the candidate")
            except PlanError as err:
                check.error = str(err)
                if result.status not in ("ok", "error"):
                    del self._checks[key]  # an infrastructure failure: plan again next time
            if check.error:
                logger.warning("unit_test_pass: task check %s cannot be used: %s", key[:12], check.error)
        for job in jobs:
            failed = _Check(error="the check's plan run failed")
            job.check = self._checks.get(job.check_key, failed)  # type: ignore[arg-type]

    def _replay(self, jobs: list[_Job]) -> None:
        prepared = []
        for job in jobs:
            assert job.check and job.check.plan
            prepared.append(judge_request("replay", job.task.prompt, job.check.module, job.entry,
                                          replay_extra(job.check.plan, job.outcomes), _JUDGE_TIMEOUT_S,
                                          self.memory_limit_MB))
        results = self.backend.run_many([request for request, _ in prepared])
        for job, (_, nonce), result in zip(jobs, prepared, results):
            job.replayed, job.judge_error = read_replay(result, nonce)

    # ------------------------------------------------------------------ judging

    def _score(self, job: _Job, logged: dict[tuple, str]) -> Score:
        """The job's Score; `logged` maps (execution, task) to the id already stored for it."""
        if job.check is not None and job.check.error is not None:
            return Score(0.0, {"status": "task_error", "error": job.check.error, "passed": 0, "total": 0, "tests": []})
        assert job.result is not None and job.request is not None
        if job.tests is not None:
            verdicts = judge_tests(job.tests, job.outcomes)
        else:
            assert job.check and job.check.plan
            verdicts = judge(job.check.plan, job.outcomes, job.replayed)
        passed = sum(v.passed for v in verdicts)
        if not verdicts:
            value = 0.0
        elif job.tests is None and self.check_credit == "all":
            value = float(passed == len(verdicts))
        else:
            value = passed / len(verdicts)
        load_failed = bool(job.outcomes) and all(o.status in ("load_error", "load_timeout") for o in job.outcomes)
        status = ("sandbox_error" if job.result.status == "sandbox_error" else "load_error" if load_failed
                  else "passed" if passed == len(verdicts) else "failed")
        result = job.result
        details: dict[str, Any] = {
            "status": status, "passed": passed, "total": len(verdicts), "tests": [v.to_json() for v in verdicts],
            "credit": "tests" if job.tests is not None else self.check_credit,
            "program": job.program.form, "fenced": job.program.fenced,
            "sandbox": {"status": result.status, "exit_code": result.exit_code, "signal": result.signal,
                        "wall_time_s": round(result.wall_time_s, 4), "cpu_time_s": round(result.cpu_time_s, 4),
                        "max_rss_kb": result.max_rss_kb, "message": result.message},
            "stderr": result.stderr[-1000:],
        }
        if load_failed:
            details["error"] = job.outcomes[0].detail
        if job.judge_error:
            details["judge_error"] = job.judge_error
        if self.record or self.log is not None:
            rec = record(job.request, result, _settings(self.backend), verdicts=details["tests"],
                         rejudge=f"{__name__}:rejudge", rejudge_data=self._rejudge_data(job))
            if self.log is not None:
                key = (id(job.result), job.check_key or json.dumps(job.tests))
                if key not in logged:
                    logged[key] = self.log.add(rec, task_id=job.task.id)
                details["execution"] = logged[key]
            else:
                details["replay"] = rec
        return Score(value, details)

    def _rejudge_data(self, job: _Job) -> dict[str, Any]:
        data: dict[str, Any] = {"nonce": job.nonce, "calls": len(job.calls), "memory_limit_MB": self.memory_limit_MB}
        if job.tests is not None:
            return {**data, "tests": job.tests}
        assert job.check and job.check.plan
        plan = job.check.plan
        return {**data, "prompt": job.task.prompt, "module": job.check.module, "entry": job.entry,
                "plan": {"calls": plan.calls, "asserts": plan.asserts}}


def read_replay(result: RunResult, nonce: str) -> tuple[dict[str, bool], str | None]:
    """The replay's verdicts for complex executions, and what went wrong if anything."""
    try:
        report = read_report(result, nonce)
    except PlanError as err:
        return {}, str(err)
    error = report["error"] or ("the check's calls diverged from its plan" if report.get("diverged") else None)
    return report["verdicts"], error


def judge_tests(tests: list[dict[str, Any]], outcomes: list[CallOutcome]) -> list[Verdict]:
    verdicts = []
    for i, (test, outcome) in enumerate(zip(tests, outcomes)):
        if outcome.status != "ok":
            verdicts.append(Verdict(f"test {i}", False, outcome.status, outcome.detail))
            continue
        got, expected = _json_shape(outcome.value), _json_shape(test["expected"])
        passed = got is not _NOT_JSON and got == expected
        detail = "" if passed else f"got {outcome.detail}, expected {json.dumps(test['expected'])[:120]}"
        verdicts.append(Verdict(f"test {i}", passed, "passed" if passed else "wrong", detail))
    return verdicts


_NOT_JSON = object()


def _json_shape(value: Any) -> Any:
    """The value as JSON would carry it (tuples become lists), or _NOT_JSON (sets, bytes)."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return _NOT_JSON


def _settings(backend: SandboxBackend) -> dict[str, Any]:
    if isinstance(backend, SandboxPool):
        return {"backend": "local", "config": backend.config.to_json()}
    url = getattr(backend, "url", None)
    return {"backend": "http", "url": url} if url else {"backend": type(backend).__name__}


def rejudge(data: dict[str, Any], result: RunResult, backend: SandboxBackend) -> list[dict[str, Any]]:
    """Verdicts for a re-run candidate execution (the replay hook named in records)."""
    outcomes = parse_outcomes(result, data["nonce"], data["calls"])
    if "tests" in data:
        return [v.to_json() for v in judge_tests(data["tests"], outcomes)]
    plan = CheckPlan(**data["plan"])
    replayed = None
    if plan.complex_executions:
        request, nonce = judge_request("replay", data["prompt"], data["module"], data["entry"],
                                       replay_extra(plan, outcomes), _JUDGE_TIMEOUT_S, data["memory_limit_MB"])
        replayed, _ = read_replay(backend.run(request), nonce)
    return [v.to_json() for v in judge(plan, outcomes, replayed)]
