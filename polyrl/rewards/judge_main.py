"""Runs INSIDE a sandbox of its own: the task's check code, never the candidate's code.

Standard library only, Python 3.9+. The sandbox program is this file with
plain_values.py's text after this docstring (code_harness.sandbox_program), so
`to_literal` and `LITERAL_NAMES` below come from there, the same code the host runs.

The check module arrives rewritten by check_plan.py: every `assert` became
`__polyrl_assert__(line, kind, calls, test, expected)`, where `calls` evaluates the
assert's direct candidate calls and `test(values)` is the original condition over their
results. The candidate is this file's `candidate`
proxy; the entry point's name (HumanEval checks sometimes call it directly) is bound to
the same proxy, on top of the prompt's helpers (trusted task text: `poly`, `encode_shift`).

Two modes, each one sandbox run, with `random` seeded and PYTHONHASHSEED fixed so both
see the same calls in the same order:

- plan: the proxy records each call's arguments as literal text and returns a placeholder
  that refuses every operation. Each assert execution is recorded with its kind: "eq" (its
  expected side, evaluated here, as literal text), "is", "truthy", "falsy", "const" (no
  candidate involved: excluded from the reward) or "complex" (needs a replay).
- replay: the proxy checks each call's arguments against the plan and returns the
  candidate's value (plain data from the host) or a poisoned placeholder for a failed
  call; the "complex" executions are evaluated and their verdicts returned.

stdin: JSON {nonce, mode, prompt, module, entry, calls, values, complex}; stdout: one
line "<nonce> <json>" with {calls, asserts} or {verdicts}, and "error" when the check
could not run (a plan error is a task problem; a replay abort fails what it did not reach).
"""

import json
import random
import sys

_DUNDERS = (
    "__eq__ __ne__ __lt__ __le__ __gt__ __ge__ __hash__ __bool__ __len__ __iter__ __next__ __reversed__ "
    "__contains__ __getitem__ __setitem__ __delitem__ __call__ __getattr__ __setattr__ __str__ __repr__ "
    "__format__ __bytes__ __int__ __float__ __complex__ __index__ __round__ __trunc__ __floor__ __ceil__ "
    "__neg__ __pos__ __abs__ __invert__ __enter__ __exit__ __reduce__ __reduce_ex__ __copy__ __deepcopy__"
).split()
_BINARY = "add sub mul matmul truediv floordiv mod divmod pow lshift rshift and xor or".split()


class NeedsValue(BaseException):
    """Plan mode: an operation needed a candidate's return value."""


class CandidateFailed(BaseException):
    """Replay mode: the value comes from a call that failed, or calls diverged from the plan."""


class Unsupported(BaseException):
    """The check does something this judge cannot split (non-data arguments, ...)."""


def _opaque(name, error):
    def refuse(self, *args, **kwargs):
        raise error(name)

    methods = {dunder: refuse for dunder in _DUNDERS}
    for op in _BINARY:
        for prefix in ("__", "__r", "__i"):
            methods[prefix + op + "__"] = refuse
    return type(name, (), methods)


Pending = _opaque("Pending", NeedsValue)
Failed = _opaque("Failed", CandidateFailed)


class Judge:
    def __init__(self, data):
        self.mode = data["mode"]
        self.plan_calls = data.get("calls") or []
        self.values = data.get("values") or []
        self.complex = set(data.get("complex") or [])
        self.calls = []
        self.records = []
        self.verdicts = {}
        self.in_thunk = False
        self.free_calls = False
        self.diverged = False

    def candidate(self, *args, **kwargs):
        if not self.in_thunk:
            self.free_calls = True
        try:
            text = to_literal((args, kwargs))  # noqa: F821 -- from plain_values.py
        except (TypeError, ValueError) as err:
            raise Unsupported("a candidate call's arguments are not plain data: %s" % err) from None
        index = len(self.calls)
        self.calls.append(text)
        if self.mode == "plan":
            return Pending()
        if self.diverged or index >= len(self.plan_calls) or self.plan_calls[index] != text:
            self.diverged = True
            return Failed()
        value = self.values[index]
        return Failed() if value is None else eval(value, dict(LITERAL_NAMES))  # noqa: F821 -- from plain_values.py

    def check_assert(self, line, kind, calls, test, expected=None):
        first = len(self.calls)
        self.in_thunk = True
        try:
            values = calls()
        finally:
            self.in_thunk = False
        record = {"line": line, "kind": kind, "calls": list(range(first, len(self.calls)))}
        index = len(self.records)
        self.records.append(record)
        if self.mode == "replay":
            if index in self.complex:
                try:
                    self.verdicts[index] = bool(test(values))
                except BaseException:
                    self.verdicts[index] = False
            return
        if kind == "eq":
            try:
                record["expected"] = to_literal(expected())  # noqa: F821 -- from plain_values.py
            except (NeedsValue, TypeError, ValueError):
                record["kind"] = "complex"
        if record["kind"] != "complex":
            return
        try:
            outcome = bool(test(values))  # also records calls the condition makes itself
        except NeedsValue:
            return
        except Exception:
            outcome = False
        if not record["calls"] and len(self.calls) == first and not self.free_calls:
            record["kind"], record["value"] = "const", outcome


def main():
    data = json.loads(sys.stdin.read())
    random.seed(0)
    judge = Judge(data)
    namespace = {"__name__": "__judge__"}
    try:
        exec(compile(data["prompt"], "<prompt>", "exec"), namespace)
    except BaseException:
        pass  # a prompt that is prose, or a stub that fails, just provides no helpers
    namespace["__polyrl_assert__"] = judge.check_assert
    error = None
    try:
        exec(compile(data["module"], "<check>", "exec"), namespace)
        namespace[data["entry"]] = judge.candidate
        namespace["check"](judge.candidate)
    except NeedsValue:
        error = "the check uses a candidate's return value outside an assert"
    except BaseException as err:
        error = "%s: %s" % (type(err).__name__, str(err)[:300])
    if judge.mode == "plan":
        report = {"calls": judge.calls, "asserts": judge.records, "error": error}
    else:
        report = {"verdicts": {str(k): v for k, v in judge.verdicts.items()}, "error": error,
                  "diverged": judge.diverged}
    sys.stdout.write("\n" + data["nonce"] + " " + json.dumps(report) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
