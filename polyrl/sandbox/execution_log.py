"""A run's execution log: every replay record (replay.py) kept on disk under an id.

    log = ExecutionLog(run_dir / "executions.jsonl")
    eid = log.add(record(...), task_id="code-train-1-ab12")   # "x000042"
    replay(log.get(eid))

One JSON line per execution: {"id", "task_id", ...the record}. The program text that
repeats in every record (the grading harness) is stored once under blobs/ next to the
log, by its sha256, and put back by `get`. Stored stdout and stderr are cut to
`keep_output` characters each (the hashes of the whole streams stay in the record;
replay compares statuses and verdicts, not bytes). Ids count lines, so a log reopened
after a resume goes on numbering where it stopped. `add` may be called from threads.

Out of scope: rotation and compression (a 1,000-step quickstart writes tens of MB), and
an index: `get` scans the file.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any, Iterator

_BLOB_MIN = 2048
"""Program texts at least this long go to blobs/, stored once however many records name them
(a grader's harness is long and the same in every record; candidates are short)."""


class ExecutionLog:
    def __init__(self, path: str | Path, keep_output: int = 4096):
        self.path = Path(path)
        self.blobs = self.path.parent / "blobs"
        self.keep_output = keep_output
        self._lock = threading.Lock()
        self._count = sum(1 for _ in open(self.path, "rb")) if self.path.exists() else 0
        self._known: set[str] = {p.stem for p in self.blobs.glob("*.txt")} if self.blobs.exists() else set()

    def add(self, rec: dict[str, Any], **meta: Any) -> str:
        """Store one record (with extra fields such as task_id); returns its id."""
        rec = {**rec, "request": dict(rec["request"]), "result": dict(rec["result"])}
        code = rec["request"]["code"]
        if len(code) >= _BLOB_MIN:
            rec["request"]["code"], rec["code_blob"] = "", self._blob(code)
        for stream in ("stdout", "stderr"):
            text = rec["result"][stream]
            if len(text) > self.keep_output:
                rec["result"][stream] = text[: self.keep_output]
                rec["output_cut_at"] = self.keep_output
        with self._lock:
            eid = f"x{self._count:06d}"
            self._count += 1
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"id": eid, **meta, **rec}, separators=(",", ":")) + "\n")
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
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield self._restore(json.loads(line))

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
