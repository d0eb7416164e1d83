"""ObsStore: observability records in SQLite, `RUN_DIR/obs.sqlite`.

One table, one row per record. The figures `polyrl obs` prints are plain SQL over the
columns below; every attribute, OTel name as key, is kept as JSON in `attributes`.

    records(id, kind, name, trace_id, task_id, step, start_time, duration_s,
            model, input_tokens, cached_tokens, output_tokens, ttft_s, finish_reason,
            tool_name, error_type, attributes)

Writes are buffered and committed every `flush_every` records and on close; the store
is safe to share between threads (one connection, one lock). Readers open the file
with `read_records` or plain sqlite3.

Out of scope: concurrent writers in several processes (give each process its own
file, or export through OpenTelemetry), retention and compaction.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any, Iterator

from polyrl.obs import records as R
from polyrl.obs.records import ObsRecord

FILENAME = "obs.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    trace_id TEXT NOT NULL,
    task_id TEXT,
    step INTEGER,
    start_time REAL,
    duration_s REAL,
    model TEXT,
    input_tokens INTEGER,
    cached_tokens INTEGER,
    output_tokens INTEGER,
    ttft_s REAL,
    finish_reason TEXT,
    tool_name TEXT,
    error_type TEXT,
    attributes TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS records_kind ON records (kind);
CREATE INDEX IF NOT EXISTS records_trace ON records (trace_id);
"""
_COLUMNS = ("kind", "name", "trace_id", "task_id", "step", "start_time", "duration_s", "model", "input_tokens",
            "cached_tokens", "output_tokens", "ttft_s", "finish_reason", "tool_name", "error_type", "attributes")


def store_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / FILENAME


def _row(rec: ObsRecord) -> tuple[Any, ...]:
    a = rec.attributes
    finish = a.get(R.FINISH_REASONS)
    return (rec.kind, rec.name, rec.trace_id, rec.task_id, rec.step, rec.start_time, rec.duration_s,
            a.get("gen_ai.response.model") or a.get("gen_ai.request.model"), a.get(R.INPUT_TOKENS),
            a.get(R.CACHE_READ_TOKENS), a.get(R.OUTPUT_TOKENS), a.get(R.TTFT),
            finish[0] if isinstance(finish, list) and finish else None, a.get(R.TOOL_NAME), a.get(R.ERROR_TYPE),
            json.dumps(a, default=str))


class ObsStore:
    """A Recorder writing to SQLite; use as a context manager or call close()."""

    def __init__(self, path: str | Path, flush_every: int = 200):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False)
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()
        self._buffer: list[tuple[Any, ...]] = []
        self.flush_every = flush_every

    @classmethod
    def in_run_dir(cls, run_dir: str | Path) -> "ObsStore":
        return cls(store_path(run_dir))

    def record(self, rec: ObsRecord) -> None:
        with self._lock:
            self._buffer.append(_row(rec))
            if len(self._buffer) >= self.flush_every:
                self._flush_locked()

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if self._buffer:
            placeholders = ", ".join("?" for _ in _COLUMNS)
            self._db.executemany(f"INSERT INTO records ({', '.join(_COLUMNS)}) VALUES ({placeholders})",
                                 self._buffer)
            self._db.commit()
            self._buffer.clear()

    def close(self) -> None:
        with self._lock:
            self._flush_locked()
            self._db.close()

    def __enter__(self) -> "ObsStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_records(path: str | Path, kind: str | None = None) -> Iterator[ObsRecord]:
    """Records of the store at `path` (a file or a run directory), in insertion order."""
    path = Path(path)
    if path.is_dir():
        path = store_path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no observability store (runs write {FILENAME} in their run directory)")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        query = "SELECT kind, name, trace_id, task_id, step, start_time, duration_s, attributes FROM records"
        rows = db.execute(query + (" WHERE kind = ?" if kind else "") + " ORDER BY id", (kind,) if kind else ())
        for k, name, trace_id, task_id, step, start, duration, attrs in rows:
            yield ObsRecord(k, name, trace_id, json.loads(attrs), task_id, step, start, duration)
    finally:
        db.close()
