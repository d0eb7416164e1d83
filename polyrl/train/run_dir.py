"""The run directory: what a run leaves behind, and how a stopped run picks up again.

    run_dir/
      config.yaml          resolved run file (every field)
      metrics.jsonl        one line per step: per-domain reward, KL, entropy, length, ...
      trajectories.jsonl   every sample: prompt, completion, token ids, logprobs, reward
                           with its details, weight version (enough to re-score it)
      executions.jsonl     every code execution, replayable (`polyrl replay RUN_DIR ID`);
                           blobs/ holds the program text they share; executions-N.jsonl
                           the same from reward actor N of a pool (cluster.reward_replicas)
      flags.jsonl          suspicious reward patterns (train/monitor.py); a quarantine
                           list that rl_tasks[].quarantine can name (domains/quarantine.py)
      obs.sqlite           every model call of training and evaluation (x.phase), agent tool
                           calls and budget events (`polyrl obs RUN_DIR`)
      eval/before.json     held-out evaluation of the base model
      eval/after.json      ... and of the trained one
      state/state.pt       latest training state: policy, optimizer, step, curriculum, clock
      checkpoints/step-N/  Hugging Face model directories; final/ at the end
      lock                 held (flock) by the one process writing the run; holds its pid

The state is written after each step's lines (atomically, via rename). On resume, lines
of steps at or past the saved step are dropped, so a run killed mid-step loses at most
that step and never double-counts it. The side logs go back with them: execution records
and observability rows carry the step in flight when they were written (`set_step`, which
`save_state` and `load_state` call; the logs from `execution_log()` and `obs_store()` follow
it), and `rollback_to` removes those of the repeated steps.

What can go wrong, and what happens:
- a second writer: `open`/`create`/`load_state` take the lock; a second process gets a
  RunDirError naming the first one's pid;
- a kill mid-write: at most a torn last line, which readers skip and `rollback_to` and the
  next append cut off, saying so (polyrl/obs/jsonl.py);
- a full disk: the failed append is cut back off and DiskFull is raised; the state still names
  the last whole step, so `polyrl train --resume` continues once space is freed;
- a corrupt state.pt, a path that is a file, a run directory already holding a run: RunDirError,
  one line saying what to do.

Out of scope: power loss (nothing is fsynced), and runs sharing a directory across machines
(flock is local to one machine on most network filesystems).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any, Iterator

import torch

from polyrl.obs.jsonl import append_lines, drop_lines, iter_jsonl
from polyrl.obs.store import ObsStore, delete_from_step, store_path
from polyrl.sandbox.execution_log import ExecutionLog, log_files

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


class RunDirError(Exception):
    """A run directory that cannot be used as asked; the message is one line saying what to do.
    `exit_code` is what the command line exits with (2: a user's mistake)."""

    exit_code = 2


class RunExists(RunDirError, FileExistsError):
    """A new run into a directory that already holds one."""


class DiskFull(RunDirError):
    """A write failed for want of space. Nothing was half-written: the run stopped after its last
    whole step, and `polyrl train --resume` continues it once space is freed."""

    exit_code = 1


def is_disk_full(err: BaseException) -> bool:
    """Does `err` say the disk (or the user's quota) is full? OSError, SQLite's and torch's own words."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(err)
    if isinstance(err, sqlite3.Error):
        return "disk is full" in text
    return isinstance(err, RuntimeError) and ("No space left" in text or "file write failed" in text)


_HELD: dict[str, list[Any]] = {}
"""Run directories this process holds the lock of: resolved path -> [lock file, RunDirs holding it]."""


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.notes: list[str] = []
        """What opening, rolling back or reading the run found and mended, in words (torn lines)."""
        self._lock_file: Any = None
        self._step = 0
        self._execution_log: ExecutionLog | None = None
        self._obs: ObsStore | None = None

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def trajectories(self) -> Path:
        return self.path / "trajectories.jsonl"

    @property
    def flags(self) -> Path:
        return self.path / "flags.jsonl"

    @property
    def executions(self) -> Path:
        return self.path / "executions.jsonl"

    @property
    def state(self) -> Path:
        return self.path / "state" / "state.pt"

    def eval_file(self, name: str) -> Path:
        return self.path / "eval" / f"{name}.json"

    # ------------------------------------------------------------------------ opening and the lock

    def open(self, resume: bool, config_yaml: str | None = None) -> dict[str, Any] | None:
        """Take the run directory for writing. A new run (resume=False) is created from
        `config_yaml` and None returned; a resumed one returns its saved state, with every log
        rolled back to the state's step (what was mended is in `notes`). RunDirError when the
        directory is in use, holds a run (new) or none (resume), is a file, or its state is corrupt."""
        if not resume:
            assert config_yaml is not None, "a new run needs its config"
            self.create(config_yaml)
            return None
        state = self.load_state()
        if state is None:
            raise RunDirError(f"{self.path} holds no resumable run (no {self.state.relative_to(self.path)}); "
                              "start it without --resume")
        self.rollback_to(state["step"])
        return state

    def lock(self) -> None:
        """Hold the run directory's lock until close() (or this object or the process ends);
        RunDirError when another process holds it. Creates the directory. Within one process the
        lock is shared by every RunDir of the directory (a run stopped by an exception and resumed
        in the same process, as tests do, must not lock itself out)."""
        if self._lock_file is not None:
            return
        if self.path.exists() and not self.path.is_dir():
            raise RunDirError(f"run directory {self.path} is a file, not a directory; choose another run directory")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            key = str(self.path.resolve())
            if key in _HELD:
                _HELD[key][1] += 1
                self._lock_file = key
                return
            fh = open(self.path / "lock", "a+")
        except OSError as err:
            raise RunDirError(f"cannot create run directory {self.path}: {err.strerror or err}") from None
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            fh.close()
            raise RunDirError(f"{self.path} is in use by another run (pid {holder}); wait for it to end, "
                              "or choose another run directory") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        _HELD[key] = [fh, 1]
        self._lock_file = key

    def close(self) -> None:
        """Release the lock (the logs from execution_log() and obs_store() are their openers' to close)."""
        key, self._lock_file = getattr(self, "_lock_file", None), None
        if key is not None and _HELD is not None and key in _HELD:
            _HELD[key][1] -= 1
            if _HELD[key][1] == 0:
                _HELD.pop(key)[0].close()  # closing the file releases the flock

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def create(self, config_yaml: str) -> None:
        """A new run: lock, refuse a directory holding a run, and start every log empty (a run
        killed before its first step left nothing worth keeping)."""
        self.lock()
        if self.state.exists():
            self.close()
            raise RunExists(f"{self.path} already holds a run; continue it with "
                            f"`polyrl train --resume {self.path}` or choose another run_dir")
        for stale in (self.flags, *log_files(self.executions), self.eval_file("before")):
            stale.unlink(missing_ok=True)
        delete_from_step(store_path(self.path), None)  # emptied, not deleted: a store may be open on it
        self._write_atomically(self.config, config_yaml.encode())
        for f in (self.metrics, self.trajectories):
            self._write_atomically(f, b"")
        self.set_step(0)

    def finished(self) -> bool:
        """Did the run reach its end? train() writes eval/after.json and then checkpoints/final last."""
        final = self.checkpoint_dir("final")
        return (self.eval_file("after").exists() and (final / "config.json").exists()
                and any(final.glob("*.safetensors")))

    # ------------------------------------------------------------------------ the step and the side logs

    def set_step(self, step: int) -> None:
        """The training step in flight: records written from now on carry it, and a resume at or
        before it removes them. save_state(step=N) sets N (the next step), load_state the saved one."""
        self._step = step
        if self._execution_log is not None:
            self._execution_log.step = step
        if self._obs is not None:
            self._obs.train_step = step

    def execution_log(self) -> ExecutionLog:
        """The run's execution log, its records tagged with the step in flight."""
        if self._execution_log is None:
            self._execution_log = ExecutionLog(self.executions)
            self._execution_log.step = self._step
        return self._execution_log

    def obs_store(self) -> ObsStore:
        """The run's observability store, its rows tagged with the step in flight and flushed by
        save_state before the state names the step done; the caller closes it."""
        self._obs = ObsStore.in_run_dir(self.path)
        self._obs.train_step = self._step
        return self._obs

    # ------------------------------------------------------------------------ writing

    def append(self, file: Path, records: list[dict[str, Any]]) -> None:
        """Append records as lines, all or none: DiskFull (nothing written) when the disk is full."""
        lines = [json.dumps(r, separators=(",", ":")) for r in records]
        try:
            append_lines(file, lines)
        except OSError as err:
            if is_disk_full(err):
                raise DiskFull(self._full(file)) from None
            raise

    def write_json(self, file: Path, data: Any) -> None:
        file.parent.mkdir(parents=True, exist_ok=True)
        self._write_atomically(file, json.dumps(data, indent=2).encode())

    def _write_atomically(self, file: Path, data: bytes) -> None:
        tmp = file.with_name(file.name + ".tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, file)
        except OSError as err:
            tmp.unlink(missing_ok=True)
            if is_disk_full(err):
                raise DiskFull(self._full(file)) from None
            raise

    def _full(self, file: Path) -> str:
        return (f"disk full writing {file}: the run stopped after its last whole step ({self._step}); free some "
                f"space and continue it with `polyrl train --resume {self.path}`")

    def read_json(self, file: Path) -> Any:
        return json.loads(file.read_text()) if file.exists() else None

    def save_state(self, state: dict[str, Any]) -> None:
        """Write the training state atomically; state["step"] (the next step) is from then on the
        step in flight. The observability rows of the finished step are committed first."""
        tmp = self.state.with_suffix(".tmp")
        try:
            if self._obs is not None:
                self._obs.flush()
            self.state.parent.mkdir(parents=True, exist_ok=True)
            torch.save(state, tmp)
            os.replace(tmp, self.state)
        except (OSError, RuntimeError, sqlite3.Error) as err:
            tmp.unlink(missing_ok=True)
            if is_disk_full(err):
                raise DiskFull(self._full(self.state)) from None
            raise
        self.set_step(state["step"])

    def load_state(self) -> dict[str, Any] | None:
        """The saved training state (None when there is none), with the lock taken; RunDirError
        when the file cannot be read or is not a polyrl state."""
        if not self.state.exists():
            return None
        self.lock()
        try:
            state = torch.load(self.state, map_location="cpu", weights_only=False)
        except Exception as err:  # noqa: BLE001 -- torch raises many kinds for a damaged file
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise RunDirError(f"{self.state} is corrupt ({type(err).__name__}: {first[:120]}); the run cannot "
                              f"resume from it; its checkpoints are in {self.path / 'checkpoints'}") from None
        if not (isinstance(state, dict) and isinstance(state.get("step"), int) and "policy" in state):
            raise RunDirError(f"{self.state} is not a polyrl training state (no step and policy); "
                              "the run cannot resume from it")
        self.set_step(state["step"])
        return state

    # ------------------------------------------------------------------------ resuming and reading

    def rollback_to(self, step: int) -> list[str]:
        """Make the run look as it did when `step` began: the records of steps >= step go from
        metrics, trajectories, flags, executions and the observability store, and torn or
        unreadable lines with them. Returns (and adds to `notes`) what it found in words."""
        notes = []
        for file in (self.metrics, self.trajectories, self.flags):
            notes += drop_lines(file, step).notes(file.name)
        log = self._execution_log
        for file in dict.fromkeys([self.executions, *log_files(self.executions)]):  # a reward pool's logs too
            mine = log is not None and file == self.executions
            dropped = log.drop_from_step(step) if mine else drop_lines(file, step)
            notes += dropped.notes(file.name)
            if dropped.records:
                notes.append(f"{file.name}: removed {dropped.records} record(s) of steps >= {step}")
        gone = delete_from_step(store_path(self.path), step)
        if gone:
            notes.append(f"{store_path(self.path).name}: removed {gone} record(s) of steps >= {step}")
        self.set_step(step)
        self.notes += notes
        return notes

    def records(self, file: Path) -> Iterator[dict[str, Any]]:
        """The records of one of the run's JSONL logs; a torn last line is skipped and said in `notes`."""
        if file.exists():
            yield from iter_jsonl(file, self.notes)

    def checkpoint_dir(self, name: str) -> Path:
        return self.path / "checkpoints" / name

    def copy_tokenizer(self, model_dir: Path, target: Path) -> None:
        for name in TOKENIZER_FILES:
            if (model_dir / name).exists():
                shutil.copy(model_dir / name, target / name)
