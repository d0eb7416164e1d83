"""Runs INSIDE the sandbox: call a candidate function on given arguments, report values.

Standard library only, no site-packages, Python 3.9+: the sandbox program is this
file with plain_values.py's text after this docstring (code_harness.sandbox_program), so
`check_plain` and `LITERAL_NAMES` below come from there, the same code the host runs.
code_harness.py builds the request. This program never judges: it sends back return
values, and the host compares them with expected values it never sent in.

stdin: a 16-byte header "%015d\\n" giving the job's length in bytes, the job (a Python
literal dict: code, entry, calls, call_timeout, load_timeout, max_reply; each call is the
literal text of an (args, kwargs) pair), then the nonce up to end of input.

Processes (this program is pid 1 of the sandbox's pid namespace under bubblewrap):
- The parent P reads exactly the job, forks the worker W, and only then reads the nonce,
  draining stdin; W waits for P's go-ahead, so when candidate code starts the nonce is in
  no candidate process's memory and in no pipe. P never runs candidate code.
- W closes stdin, points fd 1 at stderr (the candidate's prints land in stderr) and
  closes every descriptor but stderr and its result pipe; with no /proc in the sandbox,
  no candidate process can reach the sandbox's stdout at all. W executes the candidate
  code, then per call evaluates the arguments afresh, calls the entry point and writes
  "ok<TAB>literal", "exc<TAB>message" or "bad<TAB>why" (not plain data: exact int,
  float, complex, bool, str, bytes, None, or list/tuple/set/frozenset/dict of those, no
  subclasses; or a literal longer than max_reply).
- P writes "<nonce> <index> <status> <payload>" per call to stdout. A call that outlives
  call_timeout, a reply past max_reply, or a W that dies (os._exit, a signal, a fork
  bomb's fallout) costs that call: P kills every other process in the namespace
  (kill(-1) from init; the worker's process group when not init), reaps them, and forks
  a fresh W for the next call.

Why this holds: the sandbox sends back values, never verdicts, so the most a candidate
could gain by forging a reply is to claim a return value, which it could have returned.
The nonce keeps the candidate's own output and stale or guessed lines out of the host's
parse. Not covered: a candidate that ptraces P (same uid; no seccomp filter here) could
make P report values of its choosing or slip past per-call timeouts, still bounded by the
run's wall clock; workers restarted after a failed call are forked after the nonce was
read (they still have no way to stdout); with SandboxConfig(proc=True), or without
isolation, /proc/1/fd/1 is a way to stdout. Threads a candidate leaves running keep
running between calls of the same worker.
"""

import posix as os  # the C module under os: importing os itself is paid on every run
import select
import sys
import time

_SIGKILL = 9  # importing signal (and with it enum) would be paid on every run


def _one_line(text):
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def _write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]


def _read_exact(fd, size):
    chunks = []
    while size:
        chunk = os.read(fd, size)
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _read_to_end(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


# ------------------------------------------------------------------------------ worker


def _worker(job, start, result_fd, go_fd):
    """Runs in the forked child W; never returns."""
    os.setpgid(0, 0)
    os.dup2(2, 1)
    os.closerange(0, 1)  # stdin (already closed in the parent after the first worker)
    low = 3
    for fd in sorted(fd for fd in (go_fd, result_fd) if fd is not None):
        os.closerange(low, fd)  # the go pipe's write end too: P's death must read as EOF
        low = fd + 1
    os.closerange(low, 65536)
    if go_fd is not None:
        if _read_exact(go_fd, 1) != b"g":
            os._exit(1)  # the parent died before the go-ahead
        os.close(go_fd)
    require_plain = check_plain  # noqa: F821 -- from plain_values.py
    write, literal, line, max_reply = _write_all, repr, _one_line, job["max_reply"]
    namespace = {"__name__": "__candidate__", "__builtins__": __builtins__}
    try:
        exec(compile(job["code"], "<candidate>", "exec"), namespace)
        function = namespace[job["entry"]]
        if not callable(function):
            raise TypeError(job["entry"] + " is not callable")
    except BaseException as err:  # SystemExit and KeyboardInterrupt included: the candidate raised them
        _flush()
        write(result_fd, ("err\t" + line(_describe(err)) + "\n").encode("utf-8", "backslashreplace"))
        os._exit(0)
    write(result_fd, b"loaded\t\n")
    for text in job["calls"][start:]:
        args, kwargs = eval(text, dict(LITERAL_NAMES))  # noqa: F821 -- from plain_values.py
        try:
            value = function(*args, **kwargs)
        except BaseException as err:
            reply = "exc\t" + line(_describe(err))
        else:
            try:
                require_plain(value)
                reply = "ok\t" + literal(value)
                if len(reply) > max_reply:
                    reply = "bad\treply of %d characters, over %d" % (len(reply), max_reply)
            except (TypeError, ValueError, RecursionError) as err:
                reply = "bad\t" + line(_describe(err))
        _flush()
        write(result_fd, (reply + "\n").encode("utf-8", "backslashreplace"))
    os._exit(0)


def _flush():
    """Push the candidate's buffered prints to stderr before the worker may be killed."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass


def _describe(err):
    try:
        return (type(err).__name__ + ": " + str(err))[:500]
    except BaseException:
        return type(err).__name__


# ------------------------------------------------------------------------------ parent


class _Worker:
    def __init__(self, job, start, go_fd=None):
        read_fd, write_fd = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.close(read_fd)
                _worker(job, start, write_fd, go_fd)
            finally:
                os._exit(1)  # never fall back into the parent's code
        os.close(write_fd)
        self.fd = read_fd
        self.pidfd = os.pidfd_open(self.pid)
        self.buffer = b""
        self.poller = select.poll()
        self.poller.register(self.fd, select.POLLIN)
        self.poller.register(self.pidfd, select.POLLIN)
        self.dead = False
        self.max_line = job["max_reply"] + 4096

    def next_line(self, deadline):
        """("line", text), or ("timeout" | "died" | "oversize", "") when no line came."""
        while b"\n" not in self.buffer:
            if self.dead:
                return "died", ""
            if len(self.buffer) > self.max_line:
                return "oversize", ""
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout", ""
            for fd, _ in self.poller.poll(remaining * 1000):
                if fd == self.pidfd:
                    self.dead = True  # drain what it wrote before dying
                    os.set_blocking(self.fd, False)
                try:
                    data = os.read(self.fd, 65536)
                except BlockingIOError:
                    data = b""
                if data:
                    self.buffer += data
                elif fd == self.fd:
                    self.poller.unregister(self.fd)
                    self.dead = True
        line, _, self.buffer = self.buffer.partition(b"\n")
        return "line", line.decode("utf-8", "replace")

    def stop(self):
        """Kill the worker and everything it started; reap them all."""
        if os.getpid() == 1:
            try:
                os.kill(-1, _SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.pid, _SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        _reap(self.pid)
        os.close(self.fd)
        os.close(self.pidfd)


def _reap(pid):
    if os.getpid() != 1:
        os.waitpid(pid, 0)
        return
    while True:  # as init, every orphan of the namespace is ours to reap
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def main():
    header = _read_exact(0, 16)
    job = eval(_read_exact(0, int(header)).decode(), {"__builtins__": {}})
    calls, call_timeout, load_timeout = job["calls"], job["call_timeout"], job["load_timeout"]
    go_read, go_write = os.pipe()
    worker = _Worker(job, 0, go_read)
    os.close(go_read)
    nonce = _read_to_end(0).decode().strip()
    os.close(0)
    _write_all(go_write, b"g")
    os.close(go_write)

    def report(index, status, payload=""):
        _write_all(1, ("%s %d %s %s\n" % (nonce, index, status, payload)).encode())

    index = 0
    while index < len(calls):
        event, line = worker.next_line(time.monotonic() + load_timeout)
        if event != "line" or not line.startswith("loaded\t"):
            status = "load_timeout" if event == "timeout" else "load_error"
            reason = line.partition("\t")[2] if event == "line" else "" if event == "timeout" else "worker " + event
            for rest in range(index, len(calls)):
                report(rest, status, reason)
            break
        while index < len(calls):
            event, line = worker.next_line(time.monotonic() + call_timeout)
            if event != "line":
                report(index, {"timeout": "timeout", "died": "crashed"}.get(event, "unserializable"),
                       "reply over %d bytes" % job["max_reply"] if event == "oversize" else "")
                index += 1
                break
            kind, _, payload = line.partition("\t")
            report(index, {"ok": "ok", "exc": "exception", "bad": "unserializable"}.get(kind, "garbled"), payload)
            index += 1
        if index < len(calls):
            worker.stop()
            worker = _Worker(job, index)
    if os.getpid() != 1:
        worker.stop()  # as the namespace's init, exiting takes every process in it along
    os._exit(0)


if __name__ == "__main__":
    main()
