"""Unified diffs over a repository held as text: make one, read one, apply one.

A repository here is a `dict[path, text]` (the swe domain keeps its working copies in
memory). `make_diff(old, new)` writes what `diff -u` / `git diff` write; `apply_diff`
applies such a diff and returns the new files or the reason it does not apply, as a
value (a model's patch failing to apply is an outcome, not an error).

Reading is lenient where a model's intent is clear: `diff --git`, `index` and mode lines
are skipped, `a/` and `b/` prefixes dropped, hunk line counts ignored (a hunk runs to the
next `@@`, `---` or `diff` line), an empty line inside a hunk is a blank context line, a
``` fence around the diff is removed. Applying is strict on content: every context and
removed line must match the file exactly (trailing whitespace aside), at the hunk's line
or the nearest place where it does.

Out of scope: binary patches, renames and copies (`rename from`), fuzz beyond line offsets.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

_HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_FENCE = re.compile(r"^```[\w-]*\n(.*?)^```", re.S | re.M)


@dataclass
class Hunk:
    old_start: int
    lines: list[str] = field(default_factory=list)
    """body lines, each starting with " ", "-" or "+" (no newline)"""

    @property
    def old(self) -> list[str]:
        return [line[1:] for line in self.lines if line[0] in " -"]

    @property
    def new(self) -> list[str]:
        return [line[1:] for line in self.lines if line[0] in " +"]


@dataclass
class FilePatch:
    old_path: str | None
    """None: the file is created (--- /dev/null)"""
    new_path: str | None
    """None: the file is deleted (+++ /dev/null)"""
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""


def make_diff(old: dict[str, str], new: dict[str, str]) -> str:
    """The unified diff from repository `old` to `new`, files in path order."""
    parts = []
    for path in sorted(set(old) | set(new)):
        a, b = old.get(path), new.get(path)
        if a == b:
            continue
        lines = difflib.unified_diff((a or "").splitlines(keepends=True), (b or "").splitlines(keepends=True),
                                     "/dev/null" if a is None else f"a/{path}",
                                     "/dev/null" if b is None else f"b/{path}")
        for line in lines:
            parts.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(parts)


def extract_diff(text: str) -> str:
    """The diff in a model's answer: the first fenced block holding one, else the text from
    its first `---`/`diff` line on (prose before a diff is common)."""
    for block in _FENCE.findall(text):
        if "@@" in block or "+++ " in block:
            return block
    match = re.search(r"^(diff --git |--- )", text, re.M)
    return text[match.start():] if match else ""


def parse_diff(text: str) -> tuple[list[FilePatch], str | None]:
    """The file patches of a unified diff, or ([], why it cannot be read)."""
    patches: list[FilePatch] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            patches.append(FilePatch(_path(line[4:]), _path(lines[i + 1][4:])))
            i += 2
            continue
        match = _HUNK.match(line)
        if match:
            if not patches:
                return [], f"line {i + 1}: a hunk before any '--- a/path' / '+++ b/path' header"
            hunk = Hunk(int(match.group(1)))
            i += 1
            while i < len(lines) and not _ends_hunk(lines, i):
                body = lines[i]
                if body.startswith("\\"):  # "\ No newline at end of file"
                    i += 1
                    continue
                hunk.lines.append(body if body else " ")
                i += 1
            while hunk.lines and hunk.lines[-1] == " " and (i >= len(lines) or not lines[i - 1]):
                hunk.lines.pop()  # blank lines after the last hunk are not context
            if not hunk.lines:
                return [], f"an empty hunk in {patches[-1].path}"
            patches[-1].hunks.append(hunk)
            continue
        i += 1  # diff --git, index, mode lines and prose between files
    if not patches:
        return [], "no '--- a/path' / '+++ b/path' file header found"
    for patch in patches:
        if not patch.hunks and patch.new_path is not None:
            return [], f"{patch.path}: a file header without hunks"
        for path in (patch.old_path, patch.new_path):
            if path is not None and not safe_path(path):
                return [], f"{path!r} is not a relative path inside the repository"
    return patches, None


def _ends_hunk(lines: list[str], i: int) -> bool:
    line = lines[i]
    if line.startswith("@@") or line.startswith("diff "):
        return True
    if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
        return True
    return bool(line) and line[0] not in " -+\\"


def _path(raw: str) -> str | None:
    path = raw.split("\t")[0].strip()
    if path == "/dev/null":
        return None
    return path[2:] if path.startswith(("a/", "b/")) else path


def safe_path(path: str) -> bool:
    parts = path.split("/")
    return bool(path) and not path.startswith("/") and ".." not in parts and "" not in parts


def touched_paths(patches: list[FilePatch]) -> set[str]:
    return {p for patch in patches for p in (patch.old_path, patch.new_path) if p is not None}


def apply_diff(files: dict[str, str], patches: list[FilePatch]) -> tuple[dict[str, str] | None, str | None]:
    """(the patched repository, None) or (None, why a patch does not apply)."""
    out = dict(files)
    for patch in patches:
        if patch.old_path is None:
            if patch.new_path in out:
                return None, f"{patch.new_path} already exists (the patch creates it)"
            text = "\n".join(line for h in patch.hunks for line in h.new)
            out[patch.path] = text + "\n" if text else ""
            continue
        if patch.old_path not in out:
            return None, f"{patch.old_path} does not exist"
        old_text = out.pop(patch.old_path)
        if patch.new_path is None:
            continue
        lines = old_text.splitlines()
        shift = 0
        for k, hunk in enumerate(patch.hunks, start=1):
            at = _locate(lines, hunk.old, hunk.old_start - 1 + shift)
            if at is None:
                return None, (f"hunk {k} of {patch.path} does not apply: its context and removed lines "
                              "are not in the file")
            lines[at:at + len(hunk.old)] = hunk.new
            shift += len(hunk.new) - len(hunk.old)
        out[patch.new_path] = "\n".join(lines) + "\n" if lines else ""
    return out, None


def _locate(lines: list[str], block: list[str], expected: int) -> int | None:
    """Where `block` occurs in `lines`, nearest to `expected` (0-based); None when nowhere."""
    if not block:
        return min(max(expected + 1, 0), len(lines))  # a pure insertion after line `expected`
    want = [b.rstrip() for b in block]
    spots = [i for i in range(len(lines) - len(block) + 1)
             if [line.rstrip() for line in lines[i:i + len(block)]] == want]
    return min(spots, key=lambda i: abs(i - expected)) if spots else None
