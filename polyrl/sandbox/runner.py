"""`run(RunRequest) -> RunResult`: one program, one fresh sandbox, limits, a verdict value.

Isolated runs (the default) start bubblewrap (bwrap.py) as a non-root uid (uid_base +
worker slot, so RLIMIT_NPROC, which counts per uid system-wide, is the slot's own budget)
with rlimits on address space, CPU time, processes, file size and open files. The code
and `files` go in through memfds that bubblewrap copies into the private /tmp.

`isolation="none"` (or a missing bwrap with allow_unsafe=True) runs a plain subprocess in
a temporary directory with the same rlimits and no uid drop: a warning is logged on every
such run. It is the baseline for benchmarks, not a sandbox: the program can read and write
the host, use the network, and (as root) ignore RLIMIT_NPROC.

Exit classification: code 0 is "ok"; a bwrap message on stderr with code 1 is
"sandbox_error"; codes above 128 (bubblewrap's way to report a signal) are "killed" with
`signal` = code - 128, so a program that itself exits with 137 reads as SIGKILL.

Not covered: languages beyond Python and bash, compile steps, reading files back out.
"""

from __future__ import annotations

import functools
import logging
import os
import resource
import shutil
import signal
import tempfile

from polyrl.sandbox.bwrap import bwrap_argv, program_argv, require_bwrap, sandbox_env
from polyrl.sandbox.process import Outcome, Spawn, execute, kill_child_then_parent, kill_group
from polyrl.sandbox.types import MAIN_FILES, RunRequest, RunResult, SandboxConfig

logger = logging.getLogger("polyrl.sandbox")
MAX_SLOTS = 64


def default_uid_base() -> int:
    """A block of MAX_SLOTS uids per process, away from system and login uids."""
    return 100_000 + (os.getpid() % 50_000) * MAX_SLOTS


def slot_uid(config: SandboxConfig, slot: int) -> int | None:
    """The uid worker `slot` runs as: its own when this process is root, else ours (None)."""
    if os.geteuid() != 0:
        return None
    return (config.uid_base if config.uid_base is not None else default_uid_base()) + slot


def run(request: RunRequest, config: SandboxConfig | None = None, slot: int = 0) -> RunResult:
    """Run one request in a sandbox of its own (start="spawn", whatever config.start says:
    zygotes live in a SandboxPool). Raises only for setup errors (BubblewrapMissing), never
    for the program."""
    config = config or SandboxConfig()
    assert 0 <= slot < MAX_SLOTS, slot
    if config.isolation == "bwrap":
        if config.allow_unsafe and shutil.which(config.bwrap) is None:
            return run_unsafe(request, config, why="bubblewrap is not installed")
        return _run_bwrap(request, config, require_bwrap(config), slot)
    return run_unsafe(request, config, why="isolation='none'")


def encode(text: str | bytes) -> bytes:
    """UTF-8; lone surrogates (bad model text) pass through and fail inside, as values."""
    return text if isinstance(text, bytes) else text.encode(errors="surrogatepass")


def _files(request: RunRequest) -> list[tuple[str, bytes]]:
    main = (MAIN_FILES[request.language], encode(request.code))
    return [main] + [(name, encode(data)) for name, data in request.files.items()]


def _rlimits(request: RunRequest, nproc: int, setup_fds: int) -> tuple[tuple[int, int], ...]:
    """Soft = hard limits; bubblewrap itself needs `setup_fds` descriptors while it starts."""
    return (
        (resource.RLIMIT_AS, request.memory_limit_MB << 20),
        (resource.RLIMIT_CPU, request.cpu_time_s),
        (resource.RLIMIT_NPROC, nproc),
        (resource.RLIMIT_FSIZE, request.limits.file_size_MB << 20),
        (resource.RLIMIT_NOFILE, max(request.limits.open_files, setup_fds)),
    )


@functools.cache
def _own_process_count(uid: int) -> int:
    """Processes this (non-root) uid already runs: RLIMIT_NPROC counts them too."""
    count = 0
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and os.stat(f"/proc/{name}").st_uid == uid:
                count += 1
        except OSError:
            continue
    return count


def _run_bwrap(request: RunRequest, config: SandboxConfig, bwrap: str, slot: int) -> RunResult:
    fds: list[tuple[int, str]] = []
    try:
        for name, data in _files(request):
            fd = os.memfd_create("polyrl-file")
            os.write(fd, data)
            os.lseek(fd, 0, os.SEEK_SET)
            fds.append((fd, name))
        uid = slot_uid(config, slot)
        nproc = request.limits.processes + (0 if uid is not None else _own_process_count(os.getuid()))
        spawn = Spawn(
            argv=bwrap_argv(bwrap, config, request, fds), env={"PATH": "/usr/bin:/bin"},
            stdin=encode(request.stdin), timeout_s=request.run_timeout,
            stdout_max=request.limits.stdout_max_bytes, stderr_max=request.limits.stderr_max_bytes,
            rlimits=_rlimits(request, nproc, len(fds) + 8), uid=uid, cwd="/", pass_fds=tuple(fd for fd, _ in fds),
        )
        return result_of(execute(spawn, kill_child_then_parent), request, BWRAP_SETUP_ERROR, signal_above_128=True)
    finally:
        for fd, _ in fds:
            os.close(fd)


def run_unsafe(request: RunRequest, config: SandboxConfig, why: str) -> RunResult:
    """A plain subprocess with rlimits and nothing else. Logs a warning every time."""
    logger.warning("UNSAFE: running code WITHOUT isolation (%s); it can read, write and reach the host", why)
    workdir = tempfile.mkdtemp(prefix="polyrl-unsafe-")
    try:
        for name, data in _files(request):
            path = os.path.join(workdir, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
        spawn = Spawn(
            argv=program_argv(config, request, workdir), env=sandbox_env(workdir), stdin=encode(request.stdin),
            timeout_s=request.run_timeout, stdout_max=request.limits.stdout_max_bytes,
            stderr_max=request.limits.stderr_max_bytes, rlimits=_rlimits(request, request.limits.processes, 0),
            cwd=workdir, new_session=True,
        )
        return result_of(execute(spawn, kill_group), request, None)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


BWRAP_SETUP_ERROR = (1, b"bwrap: ")
"""bubblewrap's own failures: exit code 1 and a message with this prefix."""


def result_of(outcome: Outcome, request: RunRequest, setup_error: tuple[int, bytes] | None,
              signal_above_128: bool = False) -> RunResult:
    """The RunResult of an Outcome. `setup_error` (exit code, stderr prefix) marks the
    isolation layer's own failures as "sandbox_error"; `signal_above_128` reads exit codes
    above 128 as signals (bubblewrap's --as-pid-1 reports a signal-killed program that way)."""
    result = RunResult(
        status="ok", stdout=outcome.stdout.decode(errors="replace"), stderr=outcome.stderr.decode(errors="replace"),
        stdout_truncated=outcome.stdout_truncated, stderr_truncated=outcome.stderr_truncated,
        wall_time_s=outcome.wall_time_s, cpu_time_s=outcome.cpu_time_s, max_rss_kb=outcome.max_rss_kb,
    )
    if outcome.reason == "spawn_error":
        result.status, result.message = "sandbox_error", outcome.message
        return result
    assert outcome.wait_status is not None
    code = os.waitstatus_to_exitcode(outcome.wait_status)
    if signal_above_128 and code > 128:
        result.signal = code - 128
    elif code < 0:
        result.signal = -code
    else:
        result.exit_code = code
    if outcome.reason == "timeout":
        result.status = "timeout"
        result.message = f"wall clock limit of {request.run_timeout}s reached; process tree killed"
    elif outcome.reason == "output_limit":
        which = "stdout" if outcome.stdout_truncated else "stderr"
        result.status, result.message = "output_limit", f"{which} passed its cap; process tree killed"
    elif result.signal is not None:
        result.status, result.message = "killed", f"killed by {_signal_name(result.signal)}"
    elif code == 0:
        result.status = "ok"
    elif setup_error is not None and code == setup_error[0] and outcome.stderr.startswith(setup_error[1]):
        result.status, result.message = "sandbox_error", result.stderr.splitlines()[0]
    else:
        result.status = "error"
    return result


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
