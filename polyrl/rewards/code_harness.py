"""Host side of the candidate harness: build the sandbox request, read back call outcomes.

A job is a program (the candidate's code), an entry point and a list of calls, each the
literal text of an (args, kwargs) pair; harness_main.py runs them inside the sandbox and
prints one nonce-tagged line per call. Only arguments go in; expected values stay here.

Values travel as Python literal text, not JSON: JSON cannot tell a tuple from a list, a
set from a list, or carry NaN and complex numbers, and `assert candidate(x) == (1, 2)`
must see the difference. The sandbox side writes `repr` of plain data (exact builtin
types, checked by plain_values.check_plain, the one function both sides run); this side
parses with `parse_literal`, an `ast` walk that accepts only literal nodes (plus `inf`,
`nan`, `set()` and `frozenset(...)`), so whatever comes back is plain data and no object
of the candidate's making (an always-equal `__eq__`, an int subclass) ever reaches a
comparison. Lines without this run's nonce are ignored.

Not covered: the judging itself (unit_test_pass.py, check_plan.py).
"""

from __future__ import annotations

import ast
import math
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from polyrl.rewards.plain_values import SCALARS, to_literal
from polyrl.sandbox.types import Limits, RunRequest, RunResult
from polyrl.sandbox.zygote import public_program

_HERE = Path(__file__).parent
PLAIN_VALUES_SOURCE = (_HERE / "plain_values.py").read_text()


def sandbox_program(filename: str) -> str:
    """The sandbox program of `filename` (a file beside this one): its docstring, then
    plain_values.py's text, then the rest of the file, so that both sides check plain data
    with the same code. Registered as a public program (the zygote keeps it compiled)."""
    text = (_HERE / filename).read_text()
    docstring = ast.parse(text).body[0]
    assert isinstance(docstring, ast.Expr) and isinstance(docstring.value, ast.Constant), filename
    lines = text.splitlines(keepends=True)
    head, rest = "".join(lines[:docstring.end_lineno]), "".join(lines[docstring.end_lineno:])
    return public_program(head + "\n" + PLAIN_VALUES_SOURCE + rest)


HARNESS_SOURCE = sandbox_program("harness_main.py")
_ESCAPED = re.compile(r"\\(.)")
_UNESCAPE = {"n": "\n", "r": "\r", "\\": "\\"}


@dataclass(frozen=True)
class CallOutcome:
    """What one call did: status "ok" with `value`, or why not.

    Statuses: ok, exception, unserializable (returned something other than plain data),
    timeout (past the per-call limit), crashed (the worker died: exit, signal), load_error
    and load_timeout (the code itself failed), garbled or unparsable (malformed reply),
    missing (the sandbox ended before reporting it: see the run's status).
    """

    status: str
    value: Any = None
    detail: str = ""


def call_literal(args: Sequence[Any], kwargs: Mapping[str, Any] | None = None) -> str:
    return to_literal((tuple(args), dict(kwargs or {})))


def parse_literal(text: str) -> Any:
    """Plain data from literal text, or ValueError. Never evaluates code."""
    try:
        return _convert(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, RecursionError, MemoryError, TypeError) as err:
        raise ValueError(f"not a plain literal: {err}") from None


def _convert(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant) and type(node.value) in SCALARS:
        return node.value
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = [_convert(item) for item in node.elts]
        return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict) and all(key is not None for key in node.keys):
        return {_convert(key): _convert(item) for key, item in zip(node.keys, node.values)}  # type: ignore[arg-type]
    if isinstance(node, ast.Name) and node.id in ("inf", "nan"):
        return math.inf if node.id == "inf" else math.nan
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _convert(node.operand)
        if type(operand) in (int, float, complex):
            return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):  # complex: (1+2j)
        left, right = _convert(node.left), _convert(node.right)
        if type(left) in (int, float) and type(right) is complex and right.real == 0:
            return left + right if isinstance(node.op, ast.Add) else left - right
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("set", "frozenset")
            and not node.keywords and len(node.args) <= 1):
        return {"set": set, "frozenset": frozenset}[node.func.id](_convert(node.args[0]) if node.args else ())
    raise ValueError(f"not a plain literal: {ast.dump(node)[:80]}")


def candidate_request(
    code: str, entry: str, calls: Sequence[str], call_timeout_s: float, total_timeout_s: float,
    memory_limit_MB: int, limits: Limits,
) -> tuple[RunRequest, str]:
    """The sandbox request that runs `calls` against `entry` in `code`, and its nonce."""
    nonce = secrets.token_hex(16)
    job = repr({"code": code, "entry": entry, "calls": list(calls), "call_timeout": call_timeout_s,
                "load_timeout": call_timeout_s, "max_reply": limits.stdout_max_bytes // 2}).encode()
    stdin = f"{len(job):015d}\n{job.decode()}{nonce}\n"
    run_timeout = min(total_timeout_s, call_timeout_s * (len(calls) + 1) + 2.0)
    request = RunRequest(code=HARNESS_SOURCE, stdin=stdin, run_timeout=run_timeout,
                         memory_limit_MB=memory_limit_MB, limits=limits)
    return request, nonce


def parse_outcomes(result: RunResult, nonce: str, count: int) -> list[CallOutcome]:
    """One outcome per call, in call order, from the nonce-tagged lines of stdout."""
    outcomes: list[CallOutcome | None] = [None] * count
    for line in result.stdout.splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 3 or parts[0] != nonce or not parts[1].isdigit():
            continue
        index, status, payload = int(parts[1]), parts[2], parts[3] if len(parts) == 4 else ""
        if index >= count or outcomes[index] is not None:
            continue
        if status == "ok":
            try:
                outcomes[index] = CallOutcome("ok", parse_literal(payload), payload[:200])
            except ValueError as err:
                outcomes[index] = CallOutcome("unparsable", detail=str(err)[:200])
        else:
            detail = _ESCAPED.sub(lambda m: _UNESCAPE.get(m.group(1), m.group(0)), payload)
            outcomes[index] = CallOutcome(status, detail=detail[:500])
    missing = CallOutcome("missing", detail=f"sandbox ended ({result.status}) before this call reported")
    return [outcome or missing for outcome in outcomes]
