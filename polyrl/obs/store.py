"""ObsStore: observability records in SQLite, `RUN_DIR/obs.sqlite`.

One table, one row per record. The figures `polyrl obs` prints are plain SQL over the
columns below; every attribute, OTel name as key, is kept as JSON in `attributes`.

    records(id, kind, name, trace_id, task_id, step, start_time, duration_s,
            model, input_tokens, cached_tokens, output_tokens, ttft_s, finish_reason,
            tool_name, error_type, attributes, train_step, phase)

`step` is the step within an agent episode; `train_step` the training step in flight when
the record was written (set `store.train_step`; the run directory does), so a resumed run
deletes the records of the step it repeats (`delete_from_step`). A store killed
mid-commit is rolled back by SQLite itself when next opened for writing; `read_records`
opens it for writing when it can, so a hot journal never stops a reader. `phase` is the
record's `x.phase` attribute: "train" (training rollouts), "eval" (held-out and suite
evaluation), NULL for records written outside either (`polyrl agent`); readers filter on it.

Writes are buffered and committed every `flush_every` records and on close; the store
is safe to share between threads (one connection, one lock). Readers open the file
with `read_records` or plain sqlite3.

Out of scope: concurrent writers in several processes (give each process its own
file, or export through OpenTelemetry), retention and compaction.
"""

from __future__ import annotations

import json
import os
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
    attributes TEXT NOT NULL,
    train_step INTEGER,
    phase TEXT
);
CREATE INDEX IF NOT EXISTS records_kind ON records (kind);
CREATE INDEX IF NOT EXISTS records_trace ON records (trace_id);
"""
_COLUMNS = ("kind", "name", "trace_id", "task_id", "step", "start_time", "duration_s", "model", "input_tokens",
            "cached_tokens", "output_tokens", "ttft_s", "finish_reason", "tool_name", "error_type", "attributes",
            "train_step", "phase")


class ObsStoreError(Exception):
    """An observability store that cannot be read: not SQLite, or damaged beyond SQLite's own recovery."""


def store_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / FILENAME


def _row(rec: ObsRecord, train_step: int | None) -> tuple[Any, ...]:
    a = rec.attributes
    finish = a.get(R.FINISH_REASONS)
    return (rec.kind, rec.name, rec.trace_id, rec.task_id, rec.step, rec.start_time, rec.duration_s,
            a.get("gen_ai.response.model") or a.get("gen_ai.request.model"), a.get(R.INPUT_TOKENS),
            a.get(R.CACHE_READ_TOKENS), a.get(R.OUTPUT_TOKENS), a.get(R.TTFT),
            finish[0] if isinstance(finish, list) and finish else None, a.get(R.TOOL_NAME), a.get(R.ERROR_TYPE),
            json.dumps(a, default=str), train_step, a.get(R.PHASE))


class ObsStore:
    """A Recorder writing to SQLite; use as a context manager or call close()."""

    def __init__(self, path: str | Path, flush_every: int = 200):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False)
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(records)")}
        for name, kind in (("train_step", "INTEGER"), ("phase", "TEXT")):  # a store from before them
            if name not in columns:
                self._db.execute(f"ALTER TABLE records ADD COLUMN {name} {kind}")
        self._db.commit()
        self._lock = threading.Lock()
        self._buffer: list[tuple[Any, ...]] = []
        self.flush_every = flush_every
        self.train_step: int | None = None
        """Training step written into each record from now on (None: not written)."""

    @classmethod
    def in_run_dir(cls, run_dir: str | Path) -> "ObsStore":
        return cls(store_path(run_dir))

    def record(self, rec: ObsRecord) -> None:
        with self._lock:
            self._buffer.append(_row(rec, self.train_step))
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


def _connect(path: str | Path) -> tuple[sqlite3.Connection, Path, str]:
    """A connection to the store at `path` (a file or a run directory), and the SQL of a
    record's phase ('' for none; a store from before the column has none)."""
    path = Path(path)
    if path.is_dir():
        path = store_path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no observability store (runs write {FILENAME} in their run directory)")
    # read-write when allowed: SQLite then rolls back what a killed writer left half-committed
    mode = "rw" if os.access(path, os.W_OK) and os.access(path.parent, os.W_OK) else "ro"
    try:
        db = sqlite3.connect(f"file:{path}?mode={mode}", uri=True)
    except sqlite3.Error as err:
        raise ObsStoreError(f"{path}: cannot open the observability store: {err}") from None
    try:
        columns = {row[1] for row in db.execute("PRAGMA table_info(records)")}
    except sqlite3.Error as err:
        db.close()
        raise ObsStoreError(f"{path}: not a readable observability store ({err})") from None
    return db, path, "COALESCE(phase, '')" if "phase" in columns else "''"


def read_records(path: str | Path, kind: str | None = None, phase: str | None = None) -> Iterator[ObsRecord]:
    """Records of the store at `path` (a file or a run directory), in insertion order; `kind`
    and `phase` ("train", "eval"; "" for records without one) filter them, None takes all.
    ObsStoreError when the file is not a readable store."""
    db, path, phase_sql = _connect(path)
    try:
        where, params = [], []
        if kind:
            where.append("kind = ?")
            params.append(kind)
        if phase is not None:
            where.append(f"{phase_sql} = ?")
            params.append(phase)
        query = ("SELECT kind, name, trace_id, task_id, step, start_time, duration_s, attributes FROM records"
                 + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id")
        try:
            rows = db.execute(query, params).fetchall()
        except sqlite3.Error as err:
            raise ObsStoreError(f"{path}: not a readable observability store ({err})") from None
        for k, name, trace_id, task_id, step, start, duration, attrs in rows:
            try:
                attributes = json.loads(attrs)
            except ValueError:
                raise ObsStoreError(f"{path}: a record's attributes are not JSON; the store is damaged") from None
            yield ObsRecord(k, name, trace_id, attributes, task_id, step, start, duration)
    finally:
        db.close()


def read_phases(path: str | Path) -> list[str]:
    """The phases the store's records carry, "train" and "eval" first ("" for records without one)."""
    db, path, phase_sql = _connect(path)
    try:
        found = {row[0] for row in db.execute(f"SELECT DISTINCT {phase_sql} FROM records")}
    except sqlite3.Error as err:
        raise ObsStoreError(f"{path}: not a readable observability store ({err})") from None
    finally:
        db.close()
    order = {"train": 0, "eval": 1}
    return sorted(found, key=lambda p: (order.get(p, 2), p))


def delete_from_step(path: str | Path, step: int | None) -> int:
    """Delete the records of training steps >= `step` (a resumed run repeats them) from the store
    at `path`, if there is one; records without a training step stay. step=None deletes every
    record (a new run). Returns how many went."""
    path = Path(path)
    if not path.exists():
        return 0
    db = sqlite3.connect(path)
    try:
        columns = {row[1] for row in db.execute("PRAGMA table_info(records)")}
        if not columns or (step is not None and "train_step" not in columns):
            return 0
        if step is None:
            gone = db.execute("DELETE FROM records").rowcount
        else:
            gone = db.execute("DELETE FROM records WHERE train_step >= ?", (step,)).rowcount
        db.commit()
        return gone
    except sqlite3.Error as err:
        raise ObsStoreError(f"{path}: cannot roll the observability store back to step {step}: {err}") from None
    finally:
        db.close()
