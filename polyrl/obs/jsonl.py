"""Append-only JSONL logs that an interruption cannot break: a run's metrics, trajectories,
flags and executions.

    append_lines(path, [json.dumps(rec), ...])   # all or nothing: a failed write is cut back off
    for rec in iter_jsonl(path, notes): ...       # skips a torn last line, and says so in notes
    drop_lines(path, step)                        # a resume: records of steps >= step go

The one fault a kill can leave is a last line without its newline (the process died inside a
write). Readers skip it and say so; the next append, or a rollback, cuts it off first, so it is
never glued to the line after it. A write that fails (a full disk: OSError ENOSPC) or is
interrupted is cut back to the file's size before it, so the file never ends torn because of us.

Out of scope: power loss (no fsync: the page cache outlives a killed process, not a dead
machine), several writers appending to one file (the run directory's lock keeps one), and
lines written by anything but these functions.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

_BLOCK = 65536


@dataclass
class Dropped:
    """What `drop_lines` removed from one file."""

    records: int = 0
    """Records of the steps rolled back."""
    torn_bytes: int = 0
    """Bytes of a torn last line (a write cut short by a kill)."""
    corrupt_lines: list[int] = field(default_factory=list)
    """1-based numbers of complete lines that were not JSON (written by something else)."""

    @property
    def dropped(self) -> int:
        return self.records

    def notes(self, name: str) -> list[str]:
        """What happened, in words, for a log; nothing when nothing was found wrong."""
        out = []
        if self.torn_bytes:
            out.append(f"{name}: dropped a torn last line ({self.torn_bytes} bytes; a write was interrupted)")
        if self.corrupt_lines:
            shown = ", ".join(map(str, self.corrupt_lines[:5])) + (", ..." if len(self.corrupt_lines) > 5 else "")
            out.append(f"{name}: dropped {len(self.corrupt_lines)} unreadable line(s) (line {shown})")
        return out


def append_lines(path: str | Path, lines: Sequence[str]) -> None:
    """Append `lines` (each without its newline) as one write. When the write fails or is
    interrupted, the file is cut back to its size before, and the error goes on up."""
    if not lines:
        return
    data = "".join(line + "\n" for line in lines).encode("utf-8", errors="surrogatepass")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            os.close(fd)
            fd = -1
            cut_torn_tail(path)
            fd = os.open(path, os.O_RDWR | os.O_APPEND)
            size = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except BaseException:
            os.ftruncate(fd, size)
            raise
    finally:
        if fd >= 0:
            os.close(fd)


def cut_torn_tail(path: str | Path) -> int:
    """Cut a last line that lacks its newline off `path`; returns the bytes cut (0: none)."""
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        keep, end = 0, size
        while end > 0:  # back to the last newline, a block at a time
            start = max(0, end - _BLOCK)
            f.seek(start)
            newline = f.read(end - start).rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            end = start
        f.truncate(keep)
        return size - keep


def last_line(path: str | Path) -> bytes | None:
    """The last complete, non-blank line of `path` (without its newline), or None."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        start = size
        while True:
            start = max(0, start - _BLOCK)
            f.seek(start)
            tail = f.read(size - start)
            pieces = tail[: tail.rfind(b"\n") + 1].split(b"\n")  # a torn tail is no line
            filled = [i for i, piece in enumerate(pieces) if piece.strip()]
            if filled and (filled[-1] > 0 or start == 0):  # after a newline: the whole line
                return pieces[filled[-1]]
            if start == 0:
                return None


def iter_jsonl(path: str | Path, notes: list[str] | None = None) -> Iterator[dict[str, Any]]:
    """The records of a JSONL log, in order. A torn last line is skipped (and said in `notes`);
    a complete line that is not JSON is a ValueError naming the file and the line."""
    path = Path(path)
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except (ValueError, RecursionError):
                if not raw.endswith(b"\n"):
                    if notes is not None:
                        notes.append(f"{path.name}: skipped a torn last line (line {number}, {len(raw)} bytes; "
                                     "a write was interrupted)")
                    return
                raise ValueError(f"{path}:{number}: not a JSON line; the file is corrupt") from None
            yield record


def drop_lines(path: str | Path, step: int) -> Dropped:
    """Roll a log back to `step`: remove its records of steps >= `step`, a torn last line and
    any unreadable line. Records without an integer "step" stay. When all that goes is a tail
    the file is cut short; otherwise it is rewritten (a temporary file renamed over it)."""
    path = Path(path)
    out = Dropped()
    if not path.exists():
        return out
    out.torn_bytes = cut_torn_tail(path)
    offset, first_gone, kept = 0, None, []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            start, offset = offset, offset + len(raw)
            gone = False
            if raw.strip():
                try:
                    record = json.loads(raw)
                except (ValueError, RecursionError):
                    out.corrupt_lines.append(number)
                    gone = True
                else:
                    gone = isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] >= step
                    out.records += gone
            if gone:
                first_gone = start if first_gone is None else first_gone
            elif first_gone is not None:
                kept.append(raw)
    if first_gone is None:
        return out
    if not kept:
        with open(path, "rb+") as f:
            f.truncate(first_gone)
        return out
    with open(path, "rb") as f:
        head = f.read(first_gone)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(head + b"".join(kept))
    os.replace(tmp, path)
    return out
