"""What goes into a sandbox run and what comes out: plain values.

`RunRequest` follows SandboxFusion's `/run_code` request (code, language, stdin,
run_timeout, memory_limit_MB, files) and adds the `Limits` SandboxFusion leaves to its
deployment. `RunResult` says what happened; a misbehaving program is a status, never an
exception. `SandboxConfig` is how the host isolates (bubblewrap, uids, binds).

Not covered: compile steps (SandboxFusion's compile_timeout), fetch_files (reading files
back out of the sandbox), and languages other than Python and bash.
"""

from __future__ import annotations

import base64
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, Mapping

Status = Literal["ok", "error", "timeout", "killed", "output_limit", "sandbox_error"]
MAIN_FILES = {"python": "main.py", "bash": "main.sh"}
"""Language -> the file the program's code is written to, in the working directory."""


@dataclass(frozen=True)
class Limits:
    """Per-run resource limits beyond SandboxFusion's run_timeout and memory_limit_MB."""

    cpu_time_s: int | None = None
    """RLIMIT_CPU per process; None = run_timeout rounded up, plus 1."""
    processes: int = 64
    """RLIMIT_NPROC for the run's uid (one uid per worker slot, so runs never share it)."""
    file_size_MB: int = 16
    """RLIMIT_FSIZE: the largest file the program may write."""
    open_files: int = 64
    """RLIMIT_NOFILE."""
    tmp_size_MB: int = 64
    """Size of the private tmpfs at /tmp (the only writable place; it lives in RAM)."""
    stdout_max_bytes: int = 1 << 20
    """Past this many bytes of stdout the run is killed with status "output_limit"."""
    stderr_max_bytes: int = 64 << 10
    """Past this many bytes of stderr the run is killed with status "output_limit"."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and value <= 0:
                raise ValueError(f"Limits.{f.name} must be positive, got {value!r}")


@dataclass(frozen=True)
class RunRequest:
    """One program to run. `files` are written under the working directory (/tmp)."""

    code: str
    language: str = "python"
    stdin: str = ""
    run_timeout: float = 10.0
    """Wall-clock seconds; past it the whole process tree is killed (status "timeout")."""
    memory_limit_MB: int = 512
    """RLIMIT_AS (address space) per process."""
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        if self.language not in MAIN_FILES:
            raise ValueError(f"RunRequest.language {self.language!r} is not supported; use one of {list(MAIN_FILES)}")
        if not self.run_timeout > 0:
            raise ValueError(f"RunRequest.run_timeout must be positive, got {self.run_timeout!r}")
        if self.memory_limit_MB < 32:
            raise ValueError(f"RunRequest.memory_limit_MB must be at least 32, got {self.memory_limit_MB!r}")
        for name in self.files:
            parts = name.split("/")
            if name.startswith("/") or ".." in parts or "" in parts or name in MAIN_FILES.values():
                raise ValueError(f"RunRequest.files: {name!r} must be a relative path without '..', not a main file")

    @property
    def cpu_time_s(self) -> int:
        return self.limits.cpu_time_s or int(self.run_timeout + 0.999) + 1

    def to_json(self) -> dict[str, Any]:
        """JSON-able dict; bytes file contents become {"base64": ...}."""
        files = {name: ({"base64": base64.b64encode(data).decode()} if isinstance(data, bytes) else data)
                 for name, data in self.files.items()}
        return {**asdict(self), "files": files, "limits": asdict(self.limits)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunRequest:
        files = {name: (base64.b64decode(body["base64"]) if isinstance(body, dict) else body)
                 for name, body in data.get("files", {}).items()}
        return cls(**{**data, "files": files, "limits": Limits(**data.get("limits", {}))})


@dataclass
class RunResult:
    """What happened. `exit_code` is the program's; `signal` is set when a signal ended it."""

    status: Status
    exit_code: int | None = None
    signal: int | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    wall_time_s: float = 0.0
    cpu_time_s: float = 0.0
    """User + system time of the whole process tree (from the reaped child's rusage)."""
    max_rss_kb: int = 0
    message: str = ""
    """Why, for "timeout", "killed", "output_limit" and "sandbox_error"."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunResult:
        return cls(**data)


@dataclass(frozen=True)
class SandboxConfig:
    """How the host isolates runs. The defaults are the hardened ones."""

    isolation: Literal["bwrap", "none"] = "bwrap"
    """"none" runs plain subprocesses (rlimits only): needs allow_unsafe=True."""
    start: Literal["fork", "spawn"] = "fork"
    """How a SandboxPool starts each execution under bubblewrap. "fork": from a zygote, a
    long-lived interpreter per worker slot inside its own bubblewrap that never runs
    request code; each execution is forked into fresh mount, pid, network, ipc, uts and
    cgroup namespaces with a fresh tmpfs and no capabilities (zygote_main.py). "spawn": a
    new bubblewrap and interpreter per execution (slower: every execution pays both start-ups)."""
    preload: tuple[str, ...] = ("typing", "collections", "re", "math", "itertools", "functools", "heapq",
                                "bisect", "string", "select", "time")
    """Modules the zygote imports once so executions need not (start="fork" only). Only
    modules without per-process state: `random` reseeds after fork, but keep it out anyway."""
    allow_unsafe: bool = False
    """Permit running without isolation ("none", or "bwrap" when bwrap is missing);
    every such run logs a warning."""
    bwrap: str = "bwrap"
    """bubblewrap executable (looked up on PATH)."""
    python: str = "/usr/bin/python3"
    """Interpreter inside the sandbox; must live under one of ro_binds."""
    python_flags: tuple[str, ...] = ("-S", "-s", "-P")
    """No site-packages, no user site, no script dir on sys.path: faster and hermetic."""
    ro_binds: tuple[str, ...] = ("/usr",)
    """Host paths bound read-only; merged-/usr symlinks (/bin, /lib, /lib64) follow."""
    proc: bool = False
    """Mount a /proc of the sandbox's pid namespace (off: less to read, faster start)."""
    dev: bool = False
    """Mount a minimal /dev (null, zero, random, urandom, tty, shm)."""
    uid_base: int | None = None
    """Worker slot k runs as uid uid_base + k; None = a block derived from this pid, so
    pools in different processes do not share RLIMIT_NPROC budgets."""

    def __post_init__(self) -> None:
        if self.isolation not in ("bwrap", "none"):
            raise ValueError(f"SandboxConfig.isolation must be 'bwrap' or 'none', got {self.isolation!r}")
        if self.start not in ("fork", "spawn"):
            raise ValueError(f"SandboxConfig.start must be 'fork' or 'spawn', got {self.start!r}")
        if self.isolation == "none" and not self.allow_unsafe:
            raise ValueError("SandboxConfig.isolation='none' runs untrusted code without isolation; "
                             "pass allow_unsafe=True to accept that")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SandboxConfig:
        tuples = {k: tuple(v) for k, v in data.items() if k in ("python_flags", "ro_binds", "preload")}
        return cls(**{**data, **tuples})
