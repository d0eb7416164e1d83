"""Start one child process, feed its stdin, read capped output, enforce the wall clock.

The child is started with a dropped uid and rlimits (set between fork and exec), its
stdout and stderr are read incrementally with poll(2), and it is killed (by the caller's
`kill`, which knows how to take down the whole tree) when the deadline passes or an
output cap is reached; reading stops at the cap. Resource usage comes from wait4(2) of
the reaped child, which includes every descendant it reaped.

Not covered: what the command is (see runner.py), cgroups (no per-tree memory or pid
accounting beyond rlimits), and parents that hold gigabytes: dropping the uid and setting
rlimits forces fork() instead of vfork(), whose cost grows with the parent's page tables.
"""

from __future__ import annotations

import os
import resource
import select
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable, Literal

Reason = Literal["exited", "timeout", "output_limit", "spawn_error"]
_CHUNK = 1 << 16
_EXIT_GRACE_S = 0.2
"""After the child exits, how long to keep reading pipes an escaped descendant holds."""


@dataclass(frozen=True)
class Spawn:
    argv: list[str]
    env: dict[str, str]
    stdin: bytes
    timeout_s: float
    stdout_max: int
    stderr_max: int
    rlimits: tuple[tuple[int, int], ...] = ()
    """(resource.RLIMIT_*, value): soft = hard = value."""
    uid: int | None = None
    """Run as this uid and gid with no supplementary groups (needs root)."""
    cwd: str | None = None
    pass_fds: tuple[int, ...] = ()
    new_session: bool = False


@dataclass
class Outcome:
    reason: Reason
    wait_status: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    wall_time_s: float = 0.0
    cpu_time_s: float = 0.0
    max_rss_kb: int = 0
    message: str = ""


@dataclass
class _Stream:
    cap: int
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    truncated: bool = False

    def add(self, data: bytes) -> bool:
        """Keep data up to the cap; True once the cap is exceeded."""
        room = self.cap - self.size
        if len(data) > room:
            data, self.truncated = data[:room], True
        self.chunks.append(data)
        self.size += len(data)
        return self.truncated


def _limit_setter(rlimits: tuple[tuple[int, int], ...]) -> Callable[[], None] | None:
    if not rlimits:
        return None

    def set_limits() -> None:  # runs in the child between fork and exec, after the uid drop
        for which, value in rlimits:
            resource.setrlimit(which, (value, value))

    return set_limits


def execute(spawn: Spawn, kill: Callable[[subprocess.Popen], None]) -> Outcome:
    """Run `spawn` to completion, deadline or cap; `kill(proc)` must end its whole tree."""
    start = time.monotonic()
    user = {"user": spawn.uid, "group": spawn.uid, "extra_groups": []} if spawn.uid is not None else {}
    try:
        proc = subprocess.Popen(
            spawn.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=spawn.env, cwd=spawn.cwd, pass_fds=spawn.pass_fds, start_new_session=spawn.new_session,
            preexec_fn=_limit_setter(spawn.rlimits), **user,
        )
    except (OSError, subprocess.SubprocessError) as err:
        return Outcome("spawn_error", message=f"could not start {spawn.argv[0]}: {err}")
    try:
        reason, out, err = _drive(proc, spawn, start + spawn.timeout_s, kill)
    except BaseException:
        kill(proc)  # never leave a sandbox behind, whatever went wrong here
        os.wait4(proc.pid, 0)
        proc.returncode = -1
        raise
    finally:
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # so Popen never waits on it again
    return Outcome(
        reason=reason, wait_status=status, stdout=b"".join(out.chunks), stderr=b"".join(err.chunks),
        stdout_truncated=out.truncated, stderr_truncated=err.truncated, wall_time_s=time.monotonic() - start,
        cpu_time_s=usage.ru_utime + usage.ru_stime, max_rss_kb=usage.ru_maxrss,
    )


def _drive(
    proc: subprocess.Popen, spawn: Spawn, deadline: float, kill: Callable[[subprocess.Popen], None]
) -> tuple[Reason, _Stream, _Stream]:
    assert proc.stdin and proc.stdout and proc.stderr
    streams = {proc.stdout.fileno(): _Stream(spawn.stdout_max), proc.stderr.fileno(): _Stream(spawn.stderr_max)}
    out, err = streams.values()
    pending = memoryview(spawn.stdin)
    stdin_fd = proc.stdin.fileno()
    os.set_blocking(stdin_fd, False)
    pidfd = os.pidfd_open(proc.pid)
    poller = select.poll()
    for fd in streams:
        poller.register(fd, select.POLLIN)
    poller.register(pidfd, select.POLLIN)
    if pending:
        poller.register(stdin_fd, select.POLLOUT)
    else:
        proc.stdin.close()
    exited = False
    try:
        while streams or not exited:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                kill(proc)
                return ("exited" if exited else "timeout"), out, err
            for fd, _ in poller.poll(remaining * 1000):
                if fd == pidfd:
                    exited = True
                    poller.unregister(pidfd)
                    deadline = min(deadline, time.monotonic() + _EXIT_GRACE_S)
                elif fd == stdin_fd:
                    try:
                        pending = pending[os.write(stdin_fd, pending[:_CHUNK]) :]
                    except BrokenPipeError:
                        pending = pending[:0]
                    if not pending:
                        poller.unregister(stdin_fd)
                        proc.stdin.close()
                elif fd in streams:
                    data = os.read(fd, _CHUNK)
                    if not data:
                        poller.unregister(fd)
                        del streams[fd]
                    elif streams[fd].add(data):
                        kill(proc)
                        return "output_limit", out, err
        return "exited", out, err
    finally:
        os.close(pidfd)


def kill_group(proc: subprocess.Popen) -> None:
    """Kill the child's process group (it was started in a new session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def children_of(pid: int) -> list[int]:
    """Pids whose parent is `pid`, from /proc (this kernel may lack /proc/PID/task/*/children)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and _parent_of(int(name)) == pid:
            found.append(int(name))
    return found


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rpartition(b")")[2].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def kill_child_then_parent(proc: subprocess.Popen) -> None:
    """Kill the children of `proc` (bubblewrap's sandbox init), then `proc` if it lingers.

    Killing the init first lets bubblewrap reap it (no zombie left to the host's init,
    whose slow reaping would keep counting against the slot uid's RLIMIT_NPROC). A pidfd
    opened before re-checking the parent guards against a recycled pid.
    """
    for child in children_of(proc.pid):
        try:
            pidfd = os.pidfd_open(child)
        except ProcessLookupError:
            continue
        try:
            if _parent_of(child) == proc.pid:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        finally:
            os.close(pidfd)
    if not _exits_within(proc.pid, 1.0):
        proc.kill()


def _exits_within(pid: int, seconds: float) -> bool:
    """Wait for `pid` to exit without reaping it (the caller's wait4 collects its rusage)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        return bool(poller.poll(seconds * 1000))
    finally:
        os.close(pidfd)
