"""HumanEval-style `check(candidate)` without letting the candidate near the check.

The design, in three sandbox-isolated steps, none of which runs check code on the host:

1. `judge_module` (host, `ast` only): every `assert` in the check becomes a call to
   `__polyrl_assert__(line, kind, calls, test, expected)`. `calls` evaluates the assert's
   direct candidate calls (not those inside lambdas or comprehensions, or nested in
   another call's arguments: those stay dynamic), `test` is the condition with those
   calls replaced by their values, and `kind` says how the host can judge it alone:
   `candidate(x) == E` is "eq", `candidate(x) is True/False/None` is "is",
   `candidate(x)` is "truthy", `not candidate(x)` is "falsy", anything else "complex".
2. A plan run (judge_main.py, no candidate code; cached per task): the check runs against
   a recording proxy; it yields every call's arguments and, for "eq", the expected value.
3. The candidate run (harness_main.py) evaluates exactly those calls and returns values;
   the host judges "eq", "is", "truthy" and "falsy" by comparing plain data. Only if some
   execution is "complex" (e.g. `abs(candidate(x) - 0.5) < 1e-6`, or a loop that feeds
   `poly(coeffs, candidate(coeffs))`) does a replay run evaluate the check again with the
   candidate's values (plain data, re-serialized here) in place of the calls.

So the check's source and expected values never enter the candidate's sandbox, the
check never runs next to candidate code, and nothing the candidate returns is an object of
its making. A test is one assert statement (all of its executions must pass); asserts
that involve no candidate call ("const", e.g. `assert True`) are excluded, so a `pass`
body scores 0 except on asserts that None genuinely satisfies (`not candidate(x)`). A test
source with top-level asserts instead of a `check` (MBPP style) is treated as its body.

Not covered (a plan error, or a failed test, as noted): checks whose control flow
outside asserts depends on a candidate's return value (plan error); a candidate call whose
arguments depend on another call's result or are not plain data (plan error); a call an
assert guards (`x and candidate(1 / x)`: an assert's direct calls are evaluated eagerly,
so a guard that protects the arguments does not; plan error); calls inside
an assert's comprehension that come after an operation on a candidate value (not recorded:
the replay diverges and the test fails); checks that are not deterministic under a fixed
random seed (replay divergence fails the tests it reaches).
"""

from __future__ import annotations

import ast
import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from polyrl.rewards.code_harness import CallOutcome, parse_literal, sandbox_program
from polyrl.rewards.plain_values import to_literal
from polyrl.sandbox.types import Limits, RunRequest, RunResult

JUDGE_SOURCE = sandbox_program("judge_main.py")
_HOOK, _VALUES = "__polyrl_assert__", "__polyrl_values__"


class PlanError(ValueError):
    """The task's check cannot be split: a task problem, reported as such."""


@dataclass
class CheckPlan:
    calls: list[str]
    """Literal text of each candidate call's (args, kwargs), in call order."""
    asserts: list[dict[str, Any]]
    """One record per assert execution: line, kind, calls (indices), expected/value."""

    @property
    def complex_executions(self) -> list[int]:
        return [k for k, record in enumerate(self.asserts) if record["kind"] == "complex"]


@dataclass
class Verdict:
    """One test: an assert statement, or one args/expected pair."""

    name: str
    passed: bool
    status: str
    """"passed", "wrong", or the failing call's status (exception, timeout, ...)."""
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "status": self.status, "detail": self.detail}


class _Rewrite(ast.NodeTransformer):
    def __init__(self, names: set[str]):
        self.names = names

    def visit_Assert(self, node: ast.Assert) -> ast.stmt:
        calls: list[ast.expr] = []
        test = _ExtractCalls(self.names, calls).visit(node.test)
        kind, expected = _kind(test, len(calls))
        hook = ast.Call(
            func=ast.Name(_HOOK, ast.Load()),
            args=[ast.Constant(node.lineno), ast.Constant(kind),
                  _lambda([], ast.Tuple(calls, ast.Load())), _lambda([_VALUES], test),
                  _lambda([], expected) if expected is not None else ast.Constant(None)],
            keywords=[],
        )
        return ast.copy_location(ast.Expr(hook), node)


class _ExtractCalls(ast.NodeTransformer):
    """Replace direct candidate calls with __polyrl_values__[i]; leave scoped ones alone."""

    def __init__(self, names: set[str], calls: list[ast.expr]):
        self.names, self.calls = names, calls

    def visit_Call(self, node: ast.Call) -> ast.expr:
        inputs = [*node.args, *(k.value for k in node.keywords)]
        if isinstance(node.func, ast.Name) and node.func.id in self.names and not _mentions(inputs, self.names):
            self.calls.append(node)
            index = ast.Constant(len(self.calls) - 1)
            return ast.Subscript(ast.Name(_VALUES, ast.Load()), index, ast.Load())
        return self.generic_visit(node)

    def visit_Lambda(self, node: ast.Lambda) -> ast.expr:
        return node

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_Lambda  # type: ignore[assignment]


def _mentions(trees: list[ast.expr], names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for tree in trees for n in ast.walk(tree))


def _lambda(params: list[str], body: ast.expr) -> ast.Lambda:
    args = ast.arguments(posonlyargs=[], args=[ast.arg(p) for p in params], kwonlyargs=[], kw_defaults=[], defaults=[])
    return ast.Lambda(args, body)


def _is_value(node: ast.expr, index: int = 0) -> bool:
    return (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == _VALUES
            and isinstance(node.slice, ast.Constant) and node.slice.value == index)


def _kind(test: ast.expr, n_calls: int) -> tuple[str, ast.expr | None]:
    """How the host can judge this condition alone, and the expected side for "eq"."""
    if n_calls != 1:
        return "complex", None
    if _is_value(test):
        return "truthy", None
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and _is_value(test.operand):
        return "falsy", None
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if isinstance(op, ast.Eq) and _is_value(left) != _is_value(right):
            other = right if _is_value(left) else left
            if not any(isinstance(n, ast.Name) and n.id == _VALUES for n in ast.walk(other)):
                return "eq", other
        singleton = isinstance(right, ast.Constant) and any(right.value is v for v in (True, False, None))
        if isinstance(op, ast.Is) and _is_value(left) and singleton:
            return f"is {right.value}", None  # type: ignore[attr-defined]
    return "complex", None


def judge_module(test_source: str, entry_point: str) -> str:
    """The check module with its asserts rewritten (see the module docstring).

    A test without a `check` function but with top-level asserts (MBPP style, calling the
    entry point by name) becomes the body of one; top-level `check(...)` calls are dropped.
    """
    try:
        tree = ast.parse(test_source)
    except SyntaxError as err:
        raise PlanError(f"the task's test does not parse: {err}") from None
    tree.body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
                                              and isinstance(n.value.func, ast.Name) and n.value.func.id == "check")]
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if not checks and any(isinstance(n, ast.Assert) for n in tree.body):
        tree.body = [ast.parse("def check(candidate):\n    pass").body[0]]
        tree.body[0].body = ast.parse(test_source).body  # type: ignore[attr-defined]
        checks = tree.body  # type: ignore[assignment]
    if not checks or not checks[0].args.args:
        raise PlanError("the task's test defines no check(candidate) function and has no top-level asserts")
    names = {checks[0].args.args[0].arg, entry_point}
    checks[0].body = [_Rewrite(names).visit(stmt) for stmt in checks[0].body]
    return ast.unparse(ast.fix_missing_locations(tree))


def judge_request(mode: str, prompt: str, module: str, entry: str, extra: dict[str, Any], timeout_s: float,
                  memory_limit_MB: int) -> tuple[RunRequest, str]:
    nonce = secrets.token_hex(16)
    data = {"nonce": nonce, "mode": mode, "prompt": prompt, "module": module, "entry": entry, **extra}
    limits = Limits(stdout_max_bytes=8 << 20)
    return RunRequest(code=JUDGE_SOURCE, stdin=json.dumps(data), run_timeout=timeout_s,
                      memory_limit_MB=memory_limit_MB, limits=limits), nonce


def replay_extra(plan: CheckPlan, outcomes: list[CallOutcome]) -> dict[str, Any]:
    """Replay input: the plan's calls, the candidate's values (None where a call failed)."""
    values = [to_literal(o.value) if o.status == "ok" else None for o in outcomes]
    return {"calls": plan.calls, "values": values, "complex": plan.complex_executions}


def read_report(result: RunResult, nonce: str) -> dict[str, Any]:
    """The judge's JSON report, or PlanError saying why there is none."""
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(nonce + " "):
            return json.loads(line[len(nonce) + 1 :])
    tail = (result.stderr or result.message)[-300:]
    raise PlanError(f"the check's judge run ended ({result.status}) without a report: {tail}")


def read_plan(result: RunResult, nonce: str) -> CheckPlan:
    report = read_report(result, nonce)
    if report["error"]:
        raise PlanError(f"the check cannot be planned: {report['error']}")
    return CheckPlan(calls=report["calls"], asserts=report["asserts"])


@dataclass
class _Line:
    passed: bool = True
    status: str = "passed"
    detail: str = ""
    executions: int = 0
    failures: list[str] = field(default_factory=list)


def judge(plan: CheckPlan, outcomes: list[CallOutcome], replayed: dict[str, bool] | None) -> list[Verdict]:
    """Verdicts per assert line; `replayed` holds the replay's verdicts for complex executions."""
    lines: dict[int, _Line] = {}
    for k, record in enumerate(plan.asserts):
        if record["kind"] == "const":
            continue
        line = lines.setdefault(record["line"], _Line())
        line.executions += 1
        status, detail = _execution(record, [outcomes[i] for i in record["calls"]], (replayed or {}).get(str(k)))
        if status != "passed" and line.passed:
            line.passed, line.status, line.detail = False, status, detail
    return [Verdict(f"line {n}", v.passed, v.status, v.detail + (f" ({v.executions} runs)" if v.executions > 1 else ""))
            for n, v in sorted(lines.items())]


def _execution(record: dict[str, Any], outcomes: list[CallOutcome], replayed: bool | None) -> tuple[str, str]:
    failed = next((o for o in outcomes if o.status != "ok"), None)
    if record["kind"] == "complex":
        if replayed:
            return "passed", ""
        return (failed.status, failed.detail) if failed else ("wrong", "condition false")
    if failed:
        return failed.status, failed.detail
    got = outcomes[0].value
    kind = record["kind"]
    if kind == "eq":
        expected = parse_literal(record["expected"])
        ok = got == expected
        return ("passed", "") if ok else ("wrong", f"got {_short(got)}, expected {_short(expected)}")
    if kind in ("truthy", "falsy"):
        ok = bool(got) == (kind == "truthy")
    else:
        ok = got is {"is True": True, "is False": False, "is None": None}[kind]
    return ("passed", "") if ok else ("wrong", f"got {_short(got)}, expected {kind}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
