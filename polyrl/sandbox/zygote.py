"""start="fork": a zygote per worker slot, and the host's side of talking to it.

A `Zygote` is one long-lived bubblewrap (bwrap.zygote_argv) whose pid 1 is
zygote_main.py, started as the slot's uid with the slot's process budget. It serves one
request at a time: every execution is forked into namespaces, a tmpfs and rlimits of its
own and drops every capability (see zygote_main.py for what is fresh per execution and
why no request's data reaches a later one). What an execution saves against start="spawn"
is the start of bubblewrap and of an interpreter, and the pre-imports (`preload`): most
of what a short test run costs; and a host process holding gigabytes (the trainer) forks
only when a zygote starts, not per execution.

The host enforces its own deadline on top of the zygote's (the request's wall clock plus
a margin): a zygote that stops answering is killed and restarted, and the request comes
back as "sandbox_error". So does a zygote that died; the next request starts a new one.

Not covered: sharing one zygote between threads (the pool gives each slot's zygote to one
thread at a time), and hosts where bubblewrap cannot keep capabilities inside its user
namespace (then `SandboxPool` fails its probe and says to use start="spawn").
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import select
import subprocess
import time
from pathlib import Path

from polyrl.sandbox.bwrap import zygote_argv
from polyrl.sandbox.process import Outcome
from polyrl.sandbox.runner import encode, result_of
from polyrl.sandbox.types import RunRequest, RunResult, SandboxConfig

ZYGOTE_SOURCE = Path(__file__).with_name("zygote_main.py").read_text()
MARGIN_S = 10.0
"""Beyond the request's wall clock, how long the host waits for the zygote's answer (the
zygote itself allows 5 s for a killed namespace to come down)."""
MAX_PROCESSES = 1024
"""The slot uid's process budget for everything in its zygote; a request's own limit is lower."""
_MAX_OPEN_FILES = 4096
_SETUP_ERROR = (126, b"polyrl-zygote: ")
"""An execution that failed before its program started (zygote_main.SETUP_PREFIX)."""
_CHUNK = 1 << 16
_PUBLIC: dict[str, str] = {}
"""sha256 -> text of the programs registered with `public_program`."""


def public_program(source: str) -> str:
    """Register `source` as a public program (a grader's own harness, never request data)
    and return it. A zygote keeps such a program compiled after its first run, so later runs
    skip sending and parsing it. Only register text that any execution may see: it stays
    in the memory every later execution inherits."""
    _PUBLIC[hashlib.sha256(source.encode(errors="surrogatepass")).hexdigest()] = source
    return source


class Zygote:
    def __init__(self, bwrap: str, config: SandboxConfig, uid: int | None):
        self.bwrap, self.config, self.uid = bwrap, config, uid
        self.proc: subprocess.Popen | None = None
        self._kept: set[str] = set()
        """Public programs this zygote process keeps (it forgets them when it restarts)."""

    def run(self, request: RunRequest) -> RunResult:
        """One request; the zygote is (re)started first when it is not running."""
        start = time.monotonic()
        if self.proc is None or self.proc.poll() is not None:
            failure = self._start()
            if failure:
                return RunResult("sandbox_error", message=failure, wall_time_s=time.monotonic() - start)
        assert self.proc is not None
        program = hashlib.sha256(encode(request.code)).hexdigest()
        public = program if program in _PUBLIC else None
        data = _encode_request(request, public, send_code=public not in self._kept)
        reply = self._exchange(data, start + request.run_timeout + MARGIN_S)
        if public is not None and not isinstance(reply, str):
            self._kept.add(public)
        wall = time.monotonic() - start
        if isinstance(reply, str):
            self.close()
            return RunResult("sandbox_error", message=reply, wall_time_s=wall)
        done, stdout, stderr = reply
        reason = done["reason"].partition(":")[0]
        outcome = Outcome(reason, done.get("wait_status"), stdout, stderr, done.get("stdout_truncated", False),
                          done.get("stderr_truncated", False), wall, done.get("cpu_s", 0.0), done.get("max_rss_kb", 0),
                          done.get("message", ""))
        return result_of(outcome, request, _SETUP_ERROR)

    def close(self) -> None:
        """Stop the zygote: closing its requests pipe ends pid 1, and with it the sandbox."""
        proc, self.proc = self.proc, None
        self._kept.clear()
        if proc is None:
            return
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    # ------------------------------------------------------------------ internals

    def _start(self) -> str | None:
        """Start bubblewrap and the zygote; a message when that fails.

        bubblewrap's --die-with-parent follows the starting *thread*: a zygote started from
        a thread that then ends is killed, and the next request starts another."""
        self._kept.clear()
        fd = os.memfd_create("polyrl-zygote")
        try:
            os.write(fd, ZYGOTE_SOURCE.encode())
            os.lseek(fd, 0, os.SEEK_SET)
            user = {"user": self.uid, "group": self.uid, "extra_groups": []} if self.uid is not None else {}
            self.proc = subprocess.Popen(
                zygote_argv(self.bwrap, self.config, fd), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, env={"PATH": "/usr/bin:/bin"}, cwd="/", pass_fds=(fd,),
                preexec_fn=_zygote_limits, **user,
            )
        except (OSError, subprocess.SubprocessError) as err:
            self.proc = None
            return f"could not start the sandbox zygote: {err}"
        finally:
            os.close(fd)
        assert self.proc.stdin and self.proc.stdout
        os.set_blocking(self.proc.stdin.fileno(), False)
        return None

    def _exchange(self, data: bytes, deadline: float) -> tuple[dict, bytes, bytes] | str:
        """Write one request and read frames until its result; a message on failure."""
        assert self.proc and self.proc.stdin and self.proc.stdout
        write_fd, read_fd = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        pending, buffer = memoryview(data), bytearray()
        streams = {b"O": bytearray(), b"E": bytearray()}
        poller = select.poll()
        poller.register(read_fd, select.POLLIN)
        poller.register(write_fd, select.POLLOUT)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "the sandbox zygote stopped answering; it was killed and will be restarted"
            for fd, _ in poller.poll(remaining * 1000):
                if fd == write_fd:
                    try:
                        pending = pending[os.write(write_fd, pending[:_CHUNK]):]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:
                        return f"the sandbox zygote died: {self._stderr()}"
                    if not pending:
                        poller.unregister(write_fd)
                    continue
                chunk = os.read(read_fd, _CHUNK)
                if not chunk:
                    return f"the sandbox zygote died: {self._stderr()}"
                buffer += chunk
                while len(buffer) >= 9 and len(buffer) >= 9 + int(buffer[1:9]):
                    tag, size = bytes(buffer[:1]), int(buffer[1:9])
                    body = bytes(buffer[9:9 + size])
                    del buffer[:9 + size]
                    if tag == b"R":
                        if pending:
                            return "the sandbox zygote answered before reading the whole request"
                        return json.loads(body), bytes(streams[b"O"]), bytes(streams[b"E"])
                    streams[tag] += body

    def _stderr(self) -> str:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        text = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
        return text.strip()[-500:] or f"exit status {self.proc.returncode}"


def _zygote_limits() -> None:  # in the child between fork and exec, after the uid drop
    resource.setrlimit(resource.RLIMIT_NPROC, (MAX_PROCESSES, MAX_PROCESSES))
    resource.setrlimit(resource.RLIMIT_NOFILE, (_MAX_OPEN_FILES, _MAX_OPEN_FILES))


def _encode_request(request: RunRequest, program: str | None, send_code: bool) -> bytes:
    """The request in zygote_main.py's framing; rlimits for the execution, not the zygote.
    `program` names a public program, whose text goes along only when `send_code`."""
    limits = request.limits
    code = encode(request.code) if send_code or program is None else b""
    files = [(name, encode(data)) for name, data in request.files.items()]
    stdin = encode(request.stdin)
    rlimits = [
        (resource.RLIMIT_AS, request.memory_limit_MB << 20),
        (resource.RLIMIT_CPU, request.cpu_time_s),
        # The zygote and the execution's waiting parent count against the slot uid too.
        (resource.RLIMIT_NPROC, min(limits.processes + 2, MAX_PROCESSES)),
        (resource.RLIMIT_FSIZE, limits.file_size_MB << 20),
        (resource.RLIMIT_NOFILE, min(limits.open_files, _MAX_OPEN_FILES)),
    ]
    header = json.dumps({
        "language": request.language, "code": len(code), "files": [[name, len(body)] for name, body in files],
        "stdin": len(stdin), "timeout": request.run_timeout, "stdout_max": limits.stdout_max_bytes,
        "stderr_max": limits.stderr_max_bytes, "rlimits": rlimits, "tmp_bytes": limits.tmp_size_MB << 20,
        **({"program": program, "cache": send_code} if program is not None else {}),
    }).encode()
    return b"".join([b"%08d\n" % len(header), header, code, *(body for _, body in files), stdin])
