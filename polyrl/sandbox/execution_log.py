"""A run's execution log: every replay record (replay.py) kept on disk under an id.

    log = ExecutionLog(run_dir / "executions.jsonl")
    eid = log.add(record(...), task_id="code-train-1-ab12")   # "x000042"
    replay(log.get(eid))

One JSON line per execution: {"id", "task_id", ...the record}. The program text that
repeats in every record (the grading harness) is stored once under blobs/ next to the
log, by its sha256, and put back by `get`. Stored stdout and stderr are cut to
`keep_output` characters each (the hashes of the whole streams stay in the record;
replay compares statuses and verdicts, not bytes). Ids go on from the last record in the
file, read at the first `add`, so a log reopened (or rolled back) after a resume goes on
numbering where it stopped. `add` may be called from threads.

Interruptions: every record carries `step`, the training step in flight when it was
written (set `log.step`; the run directory does, train/run_dir.py), so a resumed run drops
the records of the step it repeats (`drop_from_step`). A line torn by a kill mid-write is
only ever the last one: readers skip it (`notes` says so) and the first `add` cuts it off
before appending; a failed write (a full disk) is cut back off (polyrl/obs/jsonl.py).

Several writers (a pool of reward actors, cluster.reward_replicas) each keep a log of their
own beside the first (`shard_log`): writer i > 0 writes executions-i.jsonl with ids "xi-000042",
so ids stay unique across the run and `log_files` / `file_of` find a record's file from its id.

Out of scope: rotation and compression (a 1,000-step quickstart writes tens of MB), and
an index: `get` scans the file.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any, Iterator

from polyrl.obs.jsonl import Dropped, append_lines, cut_torn_tail, drop_lines, iter_jsonl, last_line

_BLOB_MIN = 2048
"""Program texts at least this long go to blobs/, stored once however many records name them
(a grader's harness is long and the same in every record; candidates are short)."""


def shard_log(path: Path, shard: int) -> tuple[Path, str]:
    """The file and id prefix of writer `shard`'s log beside the run's first log `path`."""
    if shard == 0:
        return path, "x"
    return path.with_name(f"{path.stem}-{shard}{path.suffix}"), f"x{shard}-"


def log_files(path: Path) -> list[Path]:
    """The run's first log `path` and every other writer's beside it (those that exist)."""
    shards = {p: p.stem[len(path.stem) + 1:] for p in path.parent.glob(f"{path.stem}-*{path.suffix}")}
    others = sorted((p for p, n in shards.items() if n.isdigit()), key=lambda p: int(shards[p]))
    return ([path] if path.exists() else []) + others


def file_of(path: Path, eid: str) -> tuple[Path, str]:
    """The file and prefix holding execution `eid` ("x000042": `path`; "x2-000042": writer 2's)."""
    head, sep, _ = eid.partition("-")
    if sep and head[1:].isdigit():
        return shard_log(path, int(head[1:]))
    return path, "x"


class ExecutionLog:
    def __init__(self, path: str | Path, keep_output: int = 4096, prefix: str = "x"):
        self.path = Path(path)
        self.prefix = prefix
        """What every id of this log starts with ("x"; "x2-" for a pool's writer 2: shard_log)."""
        self.blobs = self.path.parent / "blobs"
        self.keep_output = keep_output
        self._lock = threading.Lock()
        self._count: int | None = None
        """Next id's number; read from the file at the first add (after any rollback)."""
        self._known: set[str] = {p.stem for p in self.blobs.glob("*.txt")} if self.blobs.exists() else set()
        self.step: int | None = None
        """Training step written into each record (None: not written)."""
        self.notes: list[str] = []
        """What readers skipped: a torn last line (an interrupted write), in words."""

    def add(self, rec: dict[str, Any], **meta: Any) -> str:
        """Store one record (with extra fields such as task_id); returns its id."""
        rec = {k: v for k, v in rec.items() if k != "id"}  # (a record read back with `get` carries its old id)
        rec["request"], rec["result"] = dict(rec["request"]), dict(rec["result"])
        code = rec["request"]["code"]
        if len(code) >= _BLOB_MIN:
            rec["request"]["code"], rec["code_blob"] = "", self._blob(code)
        for stream in ("stdout", "stderr"):
            text = rec["result"][stream]
            if len(text) > self.keep_output:
                rec["result"][stream] = text[: self.keep_output]
                rec["output_cut_at"] = self.keep_output
        if self.step is not None and "step" not in meta:
            meta["step"] = self.step
        with self._lock:
            if self._count is None:
                self._count = self._next_number()
            eid = f"{self.prefix}{self._count:06d}"
            append_lines(self.path, [json.dumps({"id": eid, **meta, **rec}, separators=(",", ":"))])
            self._count += 1
        return eid

    def get(self, eid: str) -> dict[str, Any]:
        """The record stored under `eid`, ready for replay(); KeyError when there is none."""
        for rec in self:
            if rec["id"] == eid:
                return rec
        raise KeyError(eid)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if not self.path.exists():
            return
        for rec in iter_jsonl(self.path, self.notes):
            yield self._restore(rec)

    def drop_from_step(self, step: int) -> Dropped:
        """Remove the records of steps >= `step` (a resumed run repeats them) and a torn last
        line. Records without a step are kept."""
        with self._lock:
            self._count = None
            return drop_lines(self.path, step)

    def _next_number(self) -> int:
        """1 + the number of the last record's id (0 for an empty log); cuts off a torn tail."""
        if not self.path.exists():
            return 0
        cut_torn_tail(self.path)
        last = last_line(self.path)
        if last is None:
            return 0
        try:
            eid = json.loads(last).get("id", "")
        except (ValueError, AttributeError):
            eid = ""
        number = eid[len(self.prefix):] if isinstance(eid, str) and eid.startswith(self.prefix) else ""
        return int(number) + 1 if number.isdigit() else sum(1 for _ in open(self.path, "rb"))

    def _blob(self, text: str) -> str:
        sha = hashlib.sha256(text.encode(errors="surrogatepass")).hexdigest()
        with self._lock:
            if sha not in self._known:
                self.blobs.mkdir(parents=True, exist_ok=True)
                (self.blobs / f"{sha}.txt").write_text(text, encoding="utf-8", errors="surrogatepass")
                self._known.add(sha)
        return sha

    def _restore(self, rec: dict[str, Any]) -> dict[str, Any]:
        sha = rec.pop("code_blob", None)
        if sha is not None:
            rec["request"]["code"] = (self.blobs / f"{sha}.txt").read_text(encoding="utf-8", errors="surrogatepass")
        return rec

