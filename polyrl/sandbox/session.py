"""A long-lived program in a sandbox of its own, spoken to one line at a time.

Where `run` starts a sandbox per program and waits for it to end, a `Session` keeps one
program running and exchanges request and reply lines with it: the program keeps its
state between requests (an agent episode's tool world, say), and each exchange has its
own wall clock and reply cap. The isolation is the sandbox package's own, chosen the
same way (`SandboxConfig`):

- isolation="bwrap": the namespaces and read-only system of bwrap.py (`--as-pid-1`, so
  killing the program ends everything it started), a size-capped tmpfs at /tmp as the
  working directory, the slot uid and rlimits of runner.py. The directories and files in
  `packages` are bound read-only under /.polyrl/lib, the program's PYTHONPATH: nothing
  else of the host is visible.
- bwrap missing with allow_unsafe=True, or isolation="none": a plain subprocess in a new
  session with the same rlimits, a temporary working directory, and `packages`' parent
  directories on PYTHONPATH (a warning is logged once per process).

Streams: requests go to the program's stdin, replies come back on its stdout, one line
each. Its stderr is drained during every exchange; at most `stderr_max` bytes of it are
kept (for the message when the program dies), and more than `stderr_flood` bytes within
one exchange kill it ("output_limit"). Between exchanges nothing reads stderr: a program
that writes much there while idle blocks until the next exchange.

An exchange past its deadline, a reply past its cap, or a flood of stderr kills the
program and the session is over (`alive` is False): a session never restarts by itself,
because its state would be lost without the caller knowing. `close` ends it on purpose
(closing stdin, then killing what is left) and is safe to call twice; a session that is
garbage-collected or alive at interpreter exit is closed too.

bubblewrap's --die-with-parent follows the thread that started the session: a session
started from a thread that ends dies with it (its next exchange reports "died").

Not covered: more than one exchange at a time, reading files back out, cgroup limits,
and restarting (the caller decides what a dead session means).
"""

from __future__ import annotations

import logging
import os
import resource
import select
import shutil
import subprocess
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

from polyrl.sandbox.bwrap import WORKDIR, _namespaces_and_system, find_bwrap, require_bwrap
from polyrl.sandbox.process import _exits_within, kill_child_then_parent, kill_group
from polyrl.sandbox.runner import MAX_SLOTS, _own_process_count, slot_uid
from polyrl.sandbox.types import Limits, SandboxConfig

logger = logging.getLogger("polyrl.sandbox")
LIB = "/.polyrl/lib"
"""Where `packages` appear inside the sandbox (the program's PYTHONPATH)."""
SESSION_SLOT = MAX_SLOTS - 1
"""Sessions run as the uid of the last worker slot: their RLIMIT_NPROC budget is shared by
every session of this process and kept apart from the pool's first workers."""
_CHUNK = 1 << 16
_CLOSE_WAIT_S = 1.0
_warned_unsafe = False

Status = Literal["ok", "timeout", "output_limit", "died"]


@dataclass
class Reply:
    status: Status
    line: bytes = b""
    """The reply without its newline ("ok" only)."""
    message: str = ""
    """Why, when the status is not "ok"."""
    stderr_bytes: int = 0
    """Bytes the program wrote to stderr during the exchange."""


class Session:
    """One program under `config` and `limits`, started by `start`, spoken to by `exchange`."""

    def __init__(self, argv: Sequence[str], config: SandboxConfig, packages: Sequence[str] = (),
                 memory_MB: int = 512, limits: Limits = Limits(), stderr_max: int = 4096,
                 stderr_flood: int = 1 << 20, env: dict[str, str] | None = None):
        """`argv` runs inside (argv[0] "python" means config.python with its flags); `packages`
        are host paths of package directories or module files the program may import."""
        self.config, self.limits, self.memory_MB = config, limits, memory_MB
        self.stderr_max, self.stderr_flood = stderr_max, stderr_flood
        self.packages = [str(Path(p).resolve()) for p in packages]
        self.env = dict(env or {})
        self._argv = list(argv)
        self.isolated = config.isolation == "bwrap" and find_bwrap(config) is not None
        if config.isolation == "bwrap" and not self.isolated and not config.allow_unsafe:
            require_bwrap(config)  # BubblewrapMissing now, before anything runs
        self.proc: subprocess.Popen | None = None
        self.stderr_tail = bytearray()
        self._workdir: str | None = None
        self._finalizer: weakref.finalize | None = None
        self.ended = ""
        """Why the session is over ("" while it can still be started or is running)."""

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # ------------------------------------------------------------------ lifetime

    def start(self) -> str | None:
        """Start the program; a message when that fails (the session is then over)."""
        assert self.proc is None and not self.ended, "a session starts once"
        try:
            argv, env, cwd, new_session = self._bwrap() if self.isolated else self._plain()
            uid = slot_uid(self.config, SESSION_SLOT) if self.isolated else None
            user = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
            nproc = self.limits.processes + (0 if uid is not None or os.geteuid() == 0
                                             else _own_process_count(os.getuid()))
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
                start_new_session=new_session, preexec_fn=_limit_setter(self._rlimits(nproc)), **user)
        except (OSError, subprocess.SubprocessError) as err:
            self.ended = f"could not start: {err}"
            self._remove_workdir()
            return self.ended
        self._finalizer = weakref.finalize(self, _stop, self.proc, self.isolated, self._workdir)
        assert self.proc.stdin is not None
        os.set_blocking(self.proc.stdin.fileno(), False)
        return None

    def close(self) -> None:
        """End the program (EOF on its stdin, then SIGKILL after a grace period)."""
        if self._finalizer is not None:
            self._finalizer()
        elif self.proc is None:
            self._remove_workdir()
        self.ended = self.ended or "closed"

    def kill(self, why: str) -> None:
        """End the program now, and remember why."""
        if self.proc is not None and self.proc.poll() is None:
            (kill_child_then_parent if self.isolated else kill_group)(self.proc)
        self.ended = self.ended or why
        self.close()

    # ------------------------------------------------------------------ exchanges

    def exchange(self, line: bytes, timeout_s: float, reply_max: int) -> Reply:
        """Send `line` (no newline in it), read one reply line. A deadline, a reply longer
        than `reply_max` bytes, a stderr flood or the program's death ends the session."""
        assert b"\n" not in line
        if not self.alive:
            return Reply("died", message=self._death())
        assert self.proc and self.proc.stdin and self.proc.stdout and self.proc.stderr
        deadline = time.monotonic() + timeout_s
        pending = memoryview(line + b"\n")
        write_fd, out_fd, err_fd = self.proc.stdin.fileno(), self.proc.stdout.fileno(), self.proc.stderr.fileno()
        poller = select.poll()
        poller.register(out_fd, select.POLLIN)
        poller.register(err_fd, select.POLLIN)
        poller.register(write_fd, select.POLLOUT)
        reply, stderr_bytes = bytearray(), 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill(f"no reply within {timeout_s:g}s; the program was killed")
                return Reply("timeout", message=self.ended, stderr_bytes=stderr_bytes)
            for fd, _ in poller.poll(remaining * 1000):
                if fd == write_fd:
                    try:
                        pending = pending[os.write(write_fd, pending[:_CHUNK]):]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:
                        return Reply("died", message=self._death(), stderr_bytes=stderr_bytes)
                    if not pending:
                        poller.unregister(write_fd)
                    continue
                chunk = os.read(fd, _CHUNK)
                if fd == err_fd:
                    if not chunk:
                        poller.unregister(err_fd)
                        continue
                    stderr_bytes += len(chunk)
                    self.stderr_tail = (self.stderr_tail + chunk)[-self.stderr_max:]
                    if stderr_bytes > self.stderr_flood:
                        self.kill(f"more than {self.stderr_flood} bytes on stderr in one exchange; "
                                  "the program was killed")
                        return Reply("output_limit", message=self.ended, stderr_bytes=stderr_bytes)
                    continue
                if not chunk:
                    return Reply("died", message=self._death(), stderr_bytes=stderr_bytes)
                end = chunk.find(b"\n")
                reply += chunk if end < 0 else chunk[:end]
                if len(reply) > reply_max:
                    self.kill(f"a reply passed {reply_max} bytes; the program was killed")
                    return Reply("output_limit", message=self.ended, stderr_bytes=stderr_bytes)
                if end >= 0:
                    if pending or end + 1 < len(chunk):
                        self.kill("the program answered out of turn; it was killed")
                        return Reply("died", message=self.ended, stderr_bytes=stderr_bytes)
                    return Reply("ok", bytes(reply), stderr_bytes=stderr_bytes)

    # ------------------------------------------------------------------ internals

    def _program(self) -> list[str]:
        if self._argv and self._argv[0] == "python":
            return [self.config.python, *self.config.python_flags, *self._argv[1:]]
        return list(self._argv)

    def _bwrap(self) -> tuple[list[str], dict[str, str], str, bool]:
        argv = _namespaces_and_system(require_bwrap(self.config), self.config)
        argv += ["--size", str(self.limits.tmp_size_MB << 20), "--tmpfs", WORKDIR]
        for path in self.packages:
            argv += ["--ro-bind", path, f"{LIB}/{Path(path).name}"]
        for key, value in {"PYTHONPATH": LIB, **self.env}.items():
            argv += ["--setenv", key, value]
        argv += ["--remount-ro", "/", "--chdir", WORKDIR, "--", *self._program()]
        return argv, {"PATH": "/usr/bin:/bin"}, "/", False

    def _plain(self) -> tuple[list[str], dict[str, str], str, bool]:
        global _warned_unsafe
        if not _warned_unsafe:
            why = "isolation='none'" if self.config.isolation == "none" else "bubblewrap is not installed"
            logger.warning("UNSAFE: sessions run WITHOUT isolation (%s); they can read, write and reach the host",
                           why)
            _warned_unsafe = True
        self._workdir = tempfile.mkdtemp(prefix="polyrl-session-")
        parents = list(dict.fromkeys(str(Path(p).parent) for p in self.packages))
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": self._workdir, "PYTHONHASHSEED": "0",
               "PYTHONPATH": os.pathsep.join(parents), **self.env}
        return self._program(), env, self._workdir, True

    def _rlimits(self, nproc: int) -> tuple[tuple[int, int], ...]:
        limits = [
            (resource.RLIMIT_AS, self.memory_MB << 20),
            (resource.RLIMIT_NPROC, nproc),
            (resource.RLIMIT_FSIZE, self.limits.file_size_MB << 20),
            (resource.RLIMIT_NOFILE, max(self.limits.open_files, 16 + len(self.packages))),
        ]
        if self.limits.cpu_time_s is not None:
            limits.append((resource.RLIMIT_CPU, self.limits.cpu_time_s))
        return tuple(limits)

    def _death(self) -> str:
        if self.ended:
            return self.ended
        assert self.proc is not None
        try:
            self.proc.wait(timeout=_CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
        tail = bytes(self.stderr_tail)
        if self.proc.stderr is not None and self.proc.returncode is not None:
            os.set_blocking(self.proc.stderr.fileno(), False)
            try:
                tail = (tail + (self.proc.stderr.read() or b""))[-self.stderr_max:]
            except OSError:
                pass
        status = self.proc.returncode
        detail = tail.decode(errors="replace").strip()[-500:]
        self.kill(f"the program ended (exit status {status})" + (f": {detail}" if detail else ""))
        return self.ended

    def _remove_workdir(self) -> None:
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _limit_setter(rlimits: tuple[tuple[int, int], ...]):
    def set_limits() -> None:  # in the child between fork and exec, after the uid drop
        for which, value in rlimits:
            resource.setrlimit(which, (value, value))

    return set_limits


def _stop(proc: subprocess.Popen, isolated: bool, workdir: str | None) -> None:
    """End `proc` and reap it: EOF on stdin first (a well-behaved program exits), then SIGKILL."""
    try:
        if proc.stdin is not None and not proc.stdin.closed:
            try:
                proc.stdin.close()
            except OSError:
                pass
        if isolated:  # pid 1 of its namespace: when it exits, everything it started dies
            if not _exits_within(proc.pid, _CLOSE_WAIT_S):
                kill_child_then_parent(proc)
        else:  # its process group may outlive it: kill the group before reaping the leader
            _exits_within(proc.pid, _CLOSE_WAIT_S)
            kill_group(proc)
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
