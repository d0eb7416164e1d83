"""Static hygiene checks: what can be told about a pack without running any verifier.

- malformed lines (`load_pack`'s errors, with their line; the rest is still audited)
- empty prompts
- duplicate tasks (the same prompt, up to case and whitespace, over the same hidden input,
  under another id): a warning when the gold agrees, a failure when it does not (at most
  one can be right). A task's hidden input is what its tools read (an agent or ops `world`,
  an swe repository's `files`): the same question about another world is another task
- train/held-out overlap: the same prompt over the same hidden input on both sides of the
  split
- code: a test or reference that does not compile (`compile` only; nothing is executed
  on the host; a text over MAX_PROGRAM_CHARS is not parsed at all and fails, so no
  pathological program can exhaust the host's parser), a check with no assert that calls
  the candidate, and contradictory
  tests (the same call expected to return two different values; for HumanEval checks
  the plan's "eq" asserts, `contradictory_plan`)

Out of scope: anything that needs a verifier or the sandbox (leaked answers and
unparsable answers are found by probes, see audit.py), and near-duplicates beyond case
and whitespace.
"""

from __future__ import annotations

import ast
import json
from typing import Sequence

from polyrl.domains.pack import PackError
from polyrl.quality.findings import TaskAudit
from polyrl.rewards.check_plan import CheckPlan
from polyrl.rewards.code_extract import build_program
from polyrl.rewards.code_harness import parse_literal
from polyrl.types import Task


def malformed_lines(errors: Sequence[PackError]) -> list[TaskAudit]:
    """One failed entry per line that did not load; `id` is None (the line is no task),
    the message names the id when the line had a readable one."""
    audits = []
    for err in errors:
        audit = TaskAudit(None, err.line)
        audit.add("malformed_line", f"line {err.line}" + (f" (id {err.id!r})" if err.id else "") + f": {err.message}")
        audits.append(audit)
    return audits


def _normal(prompt: str) -> str:
    return " ".join(prompt.lower().split())


def _key(task: Task) -> str:
    """The prompt, normalised, and the hidden input the task's tools read, if any."""
    hidden = {k: task.data[k] for k in ("world", "files") if k in task.data}
    return _normal(task.prompt) + ("\n" + json.dumps(hidden, sort_keys=True, default=str) if hidden else "")


def _gold(task: Task) -> str:
    """What a task is graded against, as one comparable string."""
    return json.dumps([task.answer, task.data.get("tests"), task.data.get("test"), task.data.get("entry_point")],
                      sort_keys=True, default=str)


def check_pack(tasks: Sequence[Task], audits: Sequence[TaskAudit], code: Sequence[bool]) -> None:
    """Add hygiene findings to `audits` (aligned with `tasks`); `code[i]` says whether
    task i is graded by unit tests."""
    first: dict[str, int] = {}
    for i, (task, audit) in enumerate(zip(tasks, audits)):
        if not task.prompt.strip():
            audit.add("empty_prompt", "the prompt is empty: the policy is asked nothing")
        else:
            key = _key(task)
            if key in first:
                j = first[key]
                where = f"{tasks[j].id!r}" + (f" (line {audits[j].line})" if audits[j].line is not None else "")
                if tasks[j].split != task.split:
                    audit.add("split_overlap", f"same prompt as {where}, which is in the {tasks[j].split} split: "
                                               "held-out scores would measure memorisation")
                elif _gold(tasks[j]) != _gold(task):
                    audit.add("duplicate", f"same prompt as {where} but graded differently: at most one can be right")
                else:
                    audit.add("duplicate", f"duplicate of {where}: it gets twice the training weight", "warn")
            else:
                first[key] = i
        if code[i]:
            _check_code(task, audit)


MAX_PROGRAM_CHARS = 200_000
"""Longest test, reference or prompt of a code task that the audit parses on the host (HumanEval's
longest check is a few thousand characters); a longer one is a failed task, never parsed: a
pathological text of a few megabytes makes CPython's parser build gigabytes of syntax tree."""


def _compiles(source: str, what: str) -> str | None:
    try:
        compile(source, f"<{what}>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        return f"{what} does not compile: {type(err).__name__}: {err}"
    return None


def _oversized(task: Task) -> str | None:
    for what, text in (("the test", task.data.get("test")), ("the reference", task.data.get("reference")),
                       ("the prompt", task.prompt)):
        if isinstance(text, str) and len(text) > MAX_PROGRAM_CHARS:
            return (f"{what} is {len(text):,} characters; the audit parses program text of at most "
                    f"{MAX_PROGRAM_CHARS:,} characters")
    return None


def _check_code(task: Task, audit: TaskAudit) -> None:
    entry = task.data.get("entry_point", "")
    oversized = _oversized(task)
    if oversized:
        audit.add("tests_compile", oversized)
        return
    test = task.data.get("test")
    if isinstance(test, str):
        problem = _compiles(test, "the test")
        if problem:
            audit.add("tests_compile", problem + ": every completion scores 0")
        elif not _asserts_call(test, entry):
            audit.add("empty_tests", "the check asserts nothing about the candidate: every completion scores 0")
    tests = task.data.get("tests")
    if isinstance(tests, list):
        cases = [(", ".join(json.dumps(a) for a in t.get("args") or []), json.dumps(t.get("expected"))) for t in tests]
        message = contradictory_cases(cases, entry)
        if message:
            audit.add("contradictory_tests", message)
    reference = task.data.get("reference")
    if isinstance(reference, str):
        problem = _compiles(build_program(task.prompt, reference, entry).code, "the reference (with the prompt)")
        if problem:
            audit.add("tests_compile", problem)


def _asserts_call(test: str, entry: str) -> bool:
    """Does the check assert anything, and use the candidate (its parameter or the entry
    point) anywhere? Whether an assert depends on a call through a variable
    (`r = candidate(x)` then `assert f(r)`) is left to the verifier's plan."""
    tree = ast.parse(test)
    names = {entry}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check" and node.args.args:
            names.add(node.args.args[0].arg)
    nodes = list(ast.walk(tree))
    return (any(isinstance(n, ast.Assert) for n in nodes)
            and any(isinstance(n, ast.Name) and n.id in names and isinstance(n.ctx, ast.Load) for n in nodes))


def contradictory_cases(cases: Sequence[tuple[str, str]], entry: str) -> str | None:
    """The first call expected to give two different values, as a message. Each case is
    (the call's arguments as text, the expected value as text)."""
    seen: dict[str, str] = {}
    for call, expected in cases:
        if call in seen and seen[call] != expected:
            return (f"contradictory tests: {entry}({_short(call)}) is expected to return both "
                    f"{_short(seen[call])} and {_short(expected)}: no solution passes")
        seen.setdefault(call, expected)
    return None


def contradictory_plan(plan: CheckPlan, entry: str) -> str | None:
    """contradictory_cases over a check plan's single-call "eq" asserts."""
    cases = []
    for record in plan.asserts:
        if record["kind"] == "eq" and len(record["calls"]) == 1 and "expected" in record:
            args, kwargs = parse_literal(plan.calls[record["calls"][0]])
            shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
            cases.append((", ".join(shown), record["expected"]))
    return contradictory_cases(cases, entry)


def _short(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."
