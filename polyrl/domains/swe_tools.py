"""The swe domain's tools: one working copy of a task's repository per episode.

The working copy is a `dict[path, text]` in memory, not a directory: nothing the model
writes touches the host's file system, and an episode leaves nothing to clean up. Tools:

- list_files()                          every path, with its line count
- read_file(path, start, end)           numbered lines (at most MAX_READ_LINES per call)
- search(pattern, path)                 regex (or literal, when not a valid regex) hits as path:line: text
- edit(path, start, end, text)          replace lines start..end (1-based, inclusive) with text;
                                        end = start - 1 inserts; a new path with start 1, end 0 creates it
- apply_patch(patch)                    apply a unified diff to the working copy
- diff()                                the working copy's unified diff against the task's repository:
                                        the answer to submit
- run_tests(only)                       the visible tests (tests/test_*.py as they now stand in the
                                        working copy) in a fresh sandbox run, with a timeout and an
                                        output cap; `only` keeps tests whose id contains it

A tool's failure (no such file, a bad range, a patch that does not apply) is an error
text the model reads (ToolBox turns raised errors into observations). run_tests runs the
model's code, so it runs in the sandbox (one `RunRequest`, the runner below), never here.

Out of scope: shell commands, undo, binary files.
"""

from __future__ import annotations

import re
from typing import Any

from polyrl.agent.tools import Tool, ToolBox
from polyrl.domains.swe_diff import apply_diff, make_diff, parse_diff, safe_path
from polyrl.sandbox.pool import SandboxBackend
from polyrl.sandbox.types import Limits, RunRequest
from polyrl.types import Task

MAX_READ_LINES = 200
MAX_SEARCH_HITS = 50
MAX_OUTPUT_CHARS = 4000
RUN_TIMEOUT_S = 10.0

RUNNER = '''"""Runs INSIDE the sandbox: the test functions of tests/test_*.py, in file order."""
import importlib.util
import os
import sys

sys.path.insert(0, os.getcwd())
only = sys.stdin.read().strip()
passed, failed = 0, []
for name in sorted(os.listdir("tests")) if os.path.isdir("tests") else []:
    if not (name.startswith("test_") and name.endswith(".py")):
        continue
    path = "tests/" + name
    spec = importlib.util.spec_from_file_location("tests." + name[:-3], path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except BaseException as err:
        failed.append((path, "error while importing: %s: %s" % (type(err).__name__, err)))
        continue
    for attr, fn in list(vars(module).items()):
        test_id = path + "::" + attr
        if not attr.startswith("test_") or not callable(fn) or (only and only not in test_id):
            continue
        try:
            fn()
        except BaseException as err:
            failed.append((test_id, "%s: %s" % (type(err).__name__, err)))
        else:
            passed += 1
for test_id, why in failed:
    print("FAILED %s - %s" % (test_id, why))
print("%d passed, %d failed" % (passed, len(failed)))
'''


class Workspace:
    """A task's repository as the model changes it."""

    def __init__(self, files: dict[str, str], backend: SandboxBackend, run_timeout_s: float = RUN_TIMEOUT_S) -> None:
        self.start = dict(files)
        self.files = dict(files)
        self.backend = backend
        self.run_timeout_s = run_timeout_s

    def list_files(self) -> str:
        return "\n".join(f"{path} ({len(text.splitlines())} lines)" for path, text in sorted(self.files.items()))

    def _text(self, path: str) -> str:
        if path not in self.files:
            raise ValueError(f"no file {path!r}; list_files shows the repository")
        return self.files[path]

    def read_file(self, path: str, start: int = 1, end: int = 0) -> str:
        lines = self._text(path).splitlines()
        end = len(lines) if end <= 0 else min(end, len(lines))
        start = max(start, 1)
        if start > max(end, 1):
            raise ValueError(f"{path} has {len(lines)} lines; lines {start}..{end} are empty")
        shown = range(start, min(end, start + MAX_READ_LINES - 1) + 1)
        out = [f"{k:4d}| {lines[k - 1]}" for k in shown]
        if shown and shown[-1] < end:
            out.append(f"... (lines {shown[-1] + 1}..{end} not shown; read them with start={shown[-1] + 1})")
        return "\n".join(out) or f"{path} is empty"

    def search(self, pattern: str, path: str = "") -> str:
        try:
            regex = re.compile(pattern)
        except re.error:
            regex = re.compile(re.escape(pattern))
        hits = [f"{name}:{k}: {line}" for name, text in sorted(self.files.items()) if name.startswith(path)
                for k, line in enumerate(text.splitlines(), start=1) if regex.search(line)]
        more = f"\n... ({len(hits) - MAX_SEARCH_HITS} more hits)" if len(hits) > MAX_SEARCH_HITS else ""
        return "\n".join(hits[:MAX_SEARCH_HITS]) + more if hits else f"no match for {pattern!r}"

    def edit(self, path: str, start: int, end: int, text: str) -> str:
        if not safe_path(path):
            raise ValueError(f"{path!r} is not a relative path inside the repository")
        if path not in self.files and not (start == 1 and end == 0):
            raise ValueError(f"no file {path!r}; to create it, edit with start=1, end=0")
        lines = self.files.get(path, "").splitlines()
        if not (1 <= start <= len(lines) + 1 and start - 1 <= end <= len(lines)):
            raise ValueError(f"{path} has {len(lines)} lines; need 1 <= start <= {len(lines) + 1} and "
                             f"start - 1 <= end <= {len(lines)} (end = start - 1 inserts)")
        new = text.splitlines()
        lines[start - 1:end] = new
        self.files[path] = "\n".join(lines) + "\n" if lines else ""
        return f"{path}: lines {start}..{end} replaced by {len(new)} lines; it now has {len(lines)} lines"

    def apply_patch(self, patch: str) -> str:
        patches, error = parse_diff(patch)
        if error is None:
            files, error = apply_diff(self.files, patches)
            if files is not None:
                self.files = files
                return f"patch applied to {', '.join(sorted({p.path for p in patches}))}"
        raise ValueError(f"patch not applied: {error}")

    def diff(self) -> str:
        return make_diff(self.start, self.files) or "no changes yet"

    def run_tests(self, only: str = "") -> str:
        request = RunRequest(code=RUNNER, stdin=only, files=self.files, run_timeout=self.run_timeout_s,
                             limits=Limits(stdout_max_bytes=64 << 10))
        result = self.backend.run(request)
        output = (result.stdout + ("\n" + result.stderr if result.stderr.strip() else "")).strip()
        if len(output) > MAX_OUTPUT_CHARS:
            half = MAX_OUTPUT_CHARS // 2
            output = f"{output[:half]}\n... ({len(output) - 2 * half} characters cut) ...\n{output[-half:]}"
        if result.status not in ("ok", "error"):
            output += f"\n[tests stopped: {result.status}: {result.message}]"
        return output or "no output"


def _schema(required: list[str], **props: str) -> dict[str, Any]:
    return {"type": "object", "properties": {k: {"type": v} for k, v in props.items()}, "required": required,
            "additionalProperties": False}


def workspace_toolbox(task: Task, backend: SandboxBackend) -> ToolBox:
    """The tools of one episode, over a fresh working copy of `task`'s repository."""
    if "files" not in task.data:
        raise ValueError(f"task {task.id!r} has no 'files'; swe tasks carry the repository their tools work on")
    return toolbox_over(Workspace(task.data["files"], backend))


def toolbox_over(ws: Workspace) -> ToolBox:
    """The tools over working copy `ws`."""
    return ToolBox([
        Tool("list_files", "List the repository's files.", _schema([]), ws.list_files),
        Tool("read_file", "Read a file's lines start..end (1-based; end 0 = to the end).",
             _schema(["path"], path="string", start="integer", end="integer"), ws.read_file),
        Tool("search", "Search lines matching a regular expression, optionally under a path prefix.",
             _schema(["pattern"], pattern="string", path="string"), ws.search),
        Tool("edit", "Replace lines start..end (1-based, inclusive) of a file with text; end = start - 1 inserts.",
             _schema(["path", "start", "end", "text"], path="string", start="integer", end="integer", text="string"),
             ws.edit),
        Tool("apply_patch", "Apply a unified diff to the repository.", _schema(["patch"], patch="string"),
             ws.apply_patch),
        Tool("diff", "The unified diff of your changes so far: submit it as the answer.", _schema([]), ws.diff),
        Tool("run_tests", "Run the tests (optionally only those whose id contains `only`); returns a summary.",
             _schema([], only="string"), ws.run_tests),
    ])
