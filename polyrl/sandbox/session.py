"""A long-lived program in a sandbox of its own, spoken to one line at a time.

Where `run` starts a sandbox per program and waits for it to end, a `Session` keeps one
program (`main`, a "module:function" of Python) running and exchanges request and reply
lines with it: the program keeps its state between requests (an agent episode's tool
world, say), and each exchange has its own wall clock and reply cap. The isolation is the
sandbox package's own, chosen the same way (`SandboxConfig`):

- isolation="bwrap": the namespaces and read-only system of bwrap.py, the slot uid and
  rlimits of runner.py, a private size-capped tmpfs at /tmp as the working directory, and
  the host paths in `packages` bound read-only under /.polyrl/lib, the program's
  PYTHONPATH: nothing else of the host is visible. The program is pid 1 of its own pid
  namespace, so killing it ends everything it started.
- bwrap missing with allow_unsafe=True, or isolation="none": a plain process in a session
  of its own (its process group is killed), the same rlimits, a temporary working
  directory, and `packages`' parent directories on PYTHONPATH (a warning is logged once).

config.start picks how a session starts, as it does for SandboxPool. "fork" (the default):
from a session zygote (session_zygote.py), one per process and kind of session, started
with the first such session and kept: it has imported `preload` once, and forks each
session into fresh namespaces (bubblewrap) or a new process session (plain), so a session
starts in milliseconds. "spawn": a new bubblewrap (or process) and interpreter per session.

Streams: requests go to the program's stdin, replies come back on its stdout, one line
each. Its stderr is drained during every exchange; at most `stderr_max` bytes of it are
kept (for the message when the program dies), and more than `stderr_flood` bytes within
one exchange kill it ("output_limit"). Between exchanges nothing reads stderr: a program
that writes much there while idle blocks until the next exchange.

An exchange past its deadline, a reply past its cap, or a flood of stderr kills the
program and the session is over: a session never restarts by itself, because its state
would be lost without the caller knowing. `close` ends it on purpose and is safe to call
twice; a session that is garbage-collected or alive at interpreter exit is closed too.

bubblewrap's --die-with-parent follows the thread that started the bubblewrap: a session
(or a session zygote) started from a thread that ends dies with it; the next exchange
reports "died", and the next session starts a new zygote.

Not covered: more than one exchange at a time, reading files back out, cgroup limits.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import select
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

from polyrl.sandbox.bwrap import WORKDIR, _namespaces_and_system, find_bwrap, require_bwrap
from polyrl.sandbox.process import _exits_within, children_of, kill_child_then_parent, kill_group
from polyrl.sandbox.runner import MAX_SLOTS, _own_process_count, slot_uid
from polyrl.sandbox.staging import readable
from polyrl.sandbox.types import Limits, SandboxConfig

logger = logging.getLogger("polyrl.sandbox")
LIB = "/.polyrl/lib"
"""Where `packages` appear inside the sandbox (the program's PYTHONPATH)."""
SESSION_SLOT = MAX_SLOTS - 1
"""Sessions run as the uid of the last worker slot: their RLIMIT_NPROC budget is shared by
every session of this process and kept apart from the pool's first workers."""
ZYGOTE = "polyrl.sandbox.session_zygote"
_CHUNK = 1 << 16
_CLOSE_WAIT_S = 1.0
_ZYGOTE_TIMEOUT_S = 30.0
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

    def __init__(self, main: str, config: SandboxConfig, packages: Sequence[str] = (), preload: Sequence[str] = (),
                 memory_MB: int = 512, limits: Limits = Limits(), stderr_max: int = 4096,
                 stderr_flood: int = 1 << 20):
        """`main` ("module:function") runs inside; `packages` are host paths of package
        directories or module files it may import; `preload` are modules a session zygote
        imports once (main's module is one)."""
        self.main, self.config, self.limits, self.memory_MB = main, config, limits, memory_MB
        self.stderr_max, self.stderr_flood = stderr_max, stderr_flood
        self.packages = tuple(str(Path(p).resolve()) for p in packages)
        self.preload = tuple(dict.fromkeys([main.partition(":")[0], *preload]))
        self.isolated = config.isolation == "bwrap" and find_bwrap(config) is not None
        if config.isolation == "bwrap" and not self.isolated and not config.allow_unsafe:
            require_bwrap(config)  # BubblewrapMissing now, before anything runs
        self.stderr_tail = bytearray()
        self._program: _Child | _Forked | None = None
        self._finalizer: weakref.finalize | None = None
        self.ended = ""
        """Why the session is over ("" while it can still be started or is running)."""

    @property
    def started(self) -> bool:
        return self._program is not None

    # ------------------------------------------------------------------ lifetime

    def start(self) -> str | None:
        """Start the program; a message when that fails (the session is then over)."""
        assert self._program is None and not self.ended, "a session starts once"
        if not self.isolated:
            _warn_unsafe(self.config)
        try:
            if self.config.start == "fork":
                self._program = _zygote_for(self).spawn(self)
            else:
                self._program = _Child.start(self)
        except (OSError, subprocess.SubprocessError) as err:
            self.ended = f"could not start: {err}"
            return self.ended
        self._finalizer = weakref.finalize(self, self._program.finish)
        return None

    def close(self) -> None:
        """End the program (idempotent)."""
        if self._finalizer is not None:
            self._finalizer()
        self.ended = self.ended or "closed"

    def kill(self, why: str) -> None:
        """End the program now, and remember why."""
        if self._program is not None:
            self._program.kill()
        self.ended = self.ended or why
        self.close()

    # ------------------------------------------------------------------ exchanges

    def exchange(self, line: bytes, timeout_s: float, reply_max: int) -> Reply:
        """Send `line` (no newline in it), read one reply line. A deadline, a reply longer
        than `reply_max` bytes, a stderr flood or the program's death ends the session."""
        assert b"\n" not in line
        if self._program is None or self.ended:
            return Reply("died", message=self.ended or "not started")
        deadline = time.monotonic() + timeout_s
        pending = memoryview(line + b"\n")
        write_fd, out_fd, err_fd = self._program.fds
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

    def rlimits(self, nproc: int | None) -> list[tuple[int, int]]:
        limits = [(resource.RLIMIT_AS, self.memory_MB << 20), (resource.RLIMIT_FSIZE, self.limits.file_size_MB << 20),
                  (resource.RLIMIT_NOFILE, max(self.limits.open_files, 16 + len(self.packages)))]
        if nproc is not None:
            limits.append((resource.RLIMIT_NPROC, nproc))
        if self.limits.cpu_time_s is not None:
            limits.append((resource.RLIMIT_CPU, self.limits.cpu_time_s))
        return limits

    def _death(self) -> str:
        if self.ended:
            return self.ended
        assert self._program is not None
        err_fd = self._program.fds[2]
        os.set_blocking(err_fd, False)
        tail = bytes(self.stderr_tail)
        try:
            while chunk := os.read(err_fd, _CHUNK):
                tail = (tail + chunk)[-self.stderr_max:]
        except OSError:
            pass
        detail = tail.decode(errors="replace").strip()[-500:]
        self.kill(f"the program ended{self._program.status()}" + (f": {detail}" if detail else ""))
        return self.ended

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------- how a session is started


def _warn_unsafe(config: SandboxConfig) -> None:
    global _warned_unsafe
    if not _warned_unsafe:
        why = "isolation='none'" if config.isolation == "none" else "bubblewrap is not installed"
        logger.warning("UNSAFE: sessions run WITHOUT isolation (%s); they can read, write and reach the host", why)
        _warned_unsafe = True


def _nproc(session: Session, uid: int | None) -> int:
    """RLIMIT_NPROC: the sessions' shared budget, plus what a non-root uid already runs."""
    return session.limits.processes + (0 if uid is not None or os.geteuid() == 0
                                       else _own_process_count(os.getuid()))


def _argv_and_env(session: Session, program: list[str], caps: bool) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of a bubblewrap or plain process running `program`
    (a Python module and its arguments) with `session`'s packages importable."""
    config = session.config
    python = [config.python, *config.python_flags]
    if session.isolated:
        argv = _namespaces_and_system(require_bwrap(config), config)
        if caps:  # a zygote keeps them inside bubblewrap's user namespace, to unshare per session
            argv += ["--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP", "--dir", WORKDIR]
        else:
            argv += ["--size", str(session.limits.tmp_size_MB << 20), "--tmpfs", WORKDIR]
        for path in session.packages:
            argv += ["--ro-bind", readable(path), f"{LIB}/{Path(path).name}"]
        argv += ["--setenv", "PYTHONPATH", LIB, "--remount-ro", "/", "--chdir", WORKDIR if not caps else "/",
                 "--", *python, *program]
        return argv, {"PATH": "/usr/bin:/bin"}
    parents = list(dict.fromkeys(str(Path(p).parent) for p in session.packages))
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0", "PYTHONPATH": os.pathsep.join(parents)}
    return [*python, *program], env


class _Child:
    """A session started on its own (start="spawn"): a child process of this one."""

    def __init__(self, proc: subprocess.Popen, isolated: bool, workdir: str | None):
        assert proc.stdin and proc.stdout and proc.stderr
        self.proc, self.isolated, self.workdir = proc, isolated, workdir
        self.fds = (proc.stdin.fileno(), proc.stdout.fileno(), proc.stderr.fileno())
        os.set_blocking(self.fds[0], False)

    @classmethod
    def start(cls, session: Session) -> _Child:
        module, _, function = session.main.partition(":")
        argv, env = _argv_and_env(session, ["-c", f"from {module} import {function}; {function}()"], caps=False)
        workdir = None if session.isolated else tempfile.mkdtemp(prefix="polyrl-session-")
        uid = slot_uid(session.config, SESSION_SLOT) if session.isolated else None
        user = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
        limits = session.rlimits(_nproc(session, uid))
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env={**env, **({"HOME": workdir} if workdir else {})}, cwd=workdir or "/",
                                    start_new_session=not session.isolated, preexec_fn=_limit_setter(limits), **user)
        except BaseException:
            if workdir:
                shutil.rmtree(workdir, ignore_errors=True)
            raise
        return cls(proc, session.isolated, workdir)

    def kill(self) -> None:
        if self.proc.poll() is None:
            (kill_child_then_parent if self.isolated else kill_group)(self.proc)

    def status(self) -> str:
        try:
            self.proc.wait(timeout=_CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            return ""
        return f" (exit status {self.proc.returncode})"

    def finish(self) -> None:
        """End and reap it: EOF on stdin first (a well-behaved program exits), then SIGKILL."""
        proc = self.proc
        try:
            if proc.stdin is not None and not proc.stdin.closed:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
            if self.isolated:  # pid 1 of its namespace: when it exits, everything it started dies
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
            if self.workdir is not None:
                shutil.rmtree(self.workdir, ignore_errors=True)


class _Forked:
    """A session forked by a session zygote: not a child of this process; killed through the zygote."""

    def __init__(self, zygote: SessionZygote, pid: int, fds: tuple[int, int, int], workdir: str | None):
        self.zygote, self.pid, self.fds, self.workdir = zygote, pid, fds, workdir
        os.set_blocking(fds[0], False)
        self._done = False

    def kill(self) -> None:
        if not self._done:
            self.zygote.kill(self.pid)

    def status(self) -> str:
        return ""

    def finish(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            self.zygote.kill(self.pid)  # its state goes with the episode: no need to wait for an exit
        finally:
            for fd in self.fds:
                os.close(fd)
            if self.workdir is not None:
                shutil.rmtree(self.workdir, ignore_errors=True)


class SessionZygote:
    """A long-lived process that forks sessions (session_zygote.py), under bubblewrap or plain."""

    def __init__(self, session: Session):
        self.isolated, self.tmp_bytes = session.isolated, session.limits.tmp_size_MB << 20
        self.lock = threading.Lock()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv, env = _argv_and_env(session, ["-m", ZYGOTE, *session.preload], caps=True)
        uid = slot_uid(session.config, SESSION_SLOT) if session.isolated else None
        user = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
        limits = [(resource.RLIMIT_NPROC, _nproc(session, uid)), (resource.RLIMIT_NOFILE, 4096)]
        try:
            self.proc = subprocess.Popen(argv, stdin=theirs.fileno(), stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, env=env, cwd="/", start_new_session=True,
                                         preexec_fn=_limit_setter(limits), **user)
        finally:
            theirs.close()
        self.control = ours
        self.control.settimeout(_ZYGOTE_TIMEOUT_S)
        self._finalizer = weakref.finalize(self, _end_zygote, self.proc, self.control, self.isolated)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, session: Session) -> _Forked:
        workdir = None if self.isolated else tempfile.mkdtemp(prefix="polyrl-session-")
        pipes = [os.pipe() for _ in range(3)]
        theirs = [pipes[0][0], pipes[1][1], pipes[2][1]]
        ours = (pipes[0][1], pipes[1][0], pipes[2][0])
        request = {"main": session.main, "rlimits": session.rlimits(None), "tmp_bytes": self.tmp_bytes,
                   "isolate": self.isolated, "cwd": workdir or WORKDIR}
        try:
            answer = self._ask(request, theirs)
        except BaseException:
            for fd in ours:
                os.close(fd)
            if workdir:
                shutil.rmtree(workdir, ignore_errors=True)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        if "pid" not in answer:
            for fd in ours:
                os.close(fd)
            if workdir:
                shutil.rmtree(workdir, ignore_errors=True)
            raise OSError(f"the session zygote could not start a session: {answer.get('error')}")
        return _Forked(self, answer["pid"], ours, workdir)

    def kill(self, pid: int) -> None:
        try:
            self._ask({"kill": pid}, [])
        except OSError:
            pass  # a zygote that is gone took its sessions with it (bubblewrap) or they were killed

    def _ask(self, request: dict, fds: list[int]) -> dict:
        with self.lock:
            try:
                socket.send_fds(self.control, [json.dumps(request).encode()], fds)
                data = self.control.recv(1 << 16)
            except (OSError, socket.timeout) as err:
                self.close()
                raise OSError(f"the session zygote stopped answering: {err}") from err
        if not data:
            detail = self._stderr()
            self.close()
            raise OSError(f"the session zygote died{': ' + detail if detail else ''}")
        return json.loads(data)

    def _stderr(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read().decode(errors="replace").strip()[-500:]

    def close(self) -> None:
        self._finalizer()


_zygotes: dict[tuple, SessionZygote] = {}
_zygotes_lock = threading.Lock()


def _zygote_for(session: Session) -> SessionZygote:
    """The running zygote for sessions like `session` (started, or restarted, here)."""
    key = (session.config, session.isolated, session.packages, session.preload, session.limits.processes,
           session.limits.tmp_size_MB)
    with _zygotes_lock:
        zygote = _zygotes.get(key)
        if zygote is None or not zygote.alive:
            if zygote is not None:
                zygote.close()
            zygote = _zygotes[key] = SessionZygote(session)
        return zygote


def zygote_processes() -> set[int]:
    """Pids of this process's running session zygotes (under bubblewrap: bubblewrap and the
    zygote inside it), not of the sessions they forked."""
    with _zygotes_lock:
        found = set()
        for zygote in _zygotes.values():
            if zygote.alive:
                found.add(zygote.proc.pid)
                if zygote.isolated:
                    found.update(children_of(zygote.proc.pid))
        return found


def close_zygotes() -> None:
    """End every session zygote of this process (and, under bubblewrap, their sessions)."""
    with _zygotes_lock:
        for zygote in _zygotes.values():
            zygote.close()
        _zygotes.clear()


def _end_zygote(proc: subprocess.Popen, control: socket.socket, isolated: bool) -> None:
    control.close()  # the zygote exits on EOF; under bubblewrap its sessions go with it (pid 1)
    if not _exits_within(proc.pid, _CLOSE_WAIT_S):
        (kill_child_then_parent if isolated else kill_group)(proc)
    proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


def _limit_setter(rlimits: Sequence[tuple[int, int]]):
    def set_limits() -> None:  # in the child between fork and exec, after the uid drop
        for which, value in rlimits:
            resource.setrlimit(which, (value, value))

    return set_limits

