"""Runs INSIDE the sandbox as pid 1 of a long-lived bubblewrap: the zygote of start="fork".

Standard library only, Python 3.10+: this file's text is the program zygote.py starts. It
never runs request code itself. For every request it forks an execution cell:

    zygote (pid 1, CAP_SYS_ADMIN + CAP_SETPCAP inside bubblewrap's user namespace only)
      └─ C0: unshare(mount, pid, net, ipc, uts, cgroup); waits for C, reports its status
           └─ C: pid 1 of the new pid namespace; mounts a fresh tmpfs on /tmp, writes the
                 request's files, drops every capability (bounding set, then capset to
                 zero, then no_new_privs), closes every descriptor but 0/1/2, sets the
                 rlimits, and runs the program (Python: compiled and executed in this
                 already-started interpreter, as `python /tmp/main.py` would; bash: exec).

When C dies, the kernel kills everything left in its pid namespace, so nothing of one
execution survives into the next: no process, no file (the tmpfs goes with the mount
namespace), no socket (the network namespace goes too). The zygote kills C on the wall
clock or an output cap (through a pidfd), relays stdin and output, and reports.

Secrets. Requests pass through this process: a judge's check with its expected values,
a candidate's nonce. Every payload byte (code, files, stdin, output) moves through two
fixed bytearrays, zeroed after each request, and never becomes a Python object here, so
a cell forked later (a copy of this process's memory) finds nothing of earlier requests.
Each cell is forked before its request arrives. The one exception is a program the host
marks public (its own grading harness, say): its text is kept and compiled here once, so
cells forked afterwards run it without parsing it again (`_programs`).

Protocol on fds 0 (requests) and 1 (replies), both pipes to the host:
- request: "%08d\\n" header length, a JSON header {language, code, files: [[name, size]],
  stdin, timeout, stdout_max, stderr_max, rlimits: [[resource, value]], tmp_bytes, and
  for a public program: program (its sha256) and cache (true when its text follows, to
  keep)}, then the code bytes (none for a public program already kept), each file's
  bytes and the stdin bytes.
- reply: frames b"O" | b"E" | b"R", "%08d" length, data: stdout and stderr chunks, then
  one R frame, a JSON result {reason, wait_status, cpu_s, max_rss_kb, message}.
"""

import ctypes
import json
import os
import resource
import select
import sys
import time

_CLONE = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x20000000 | 0x40000000  # NS CGROUP UTS IPC PID NET
_MS_NOSUID, _MS_NODEV, _MS_REC, _MS_PRIVATE = 2, 4, 0x4000, 1 << 18
_PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS = 4, 24, 38
_CAP_SYS_ADMIN, _CAP_SETPCAP = 21, 8
_SETUP_FAILED = 126
SETUP_PREFIX = "polyrl-zygote: "
"""Stderr prefix of a cell that failed before the program started (exit code 126)."""

_libc = ctypes.CDLL(None, use_errno=True)
_CHUNK = 1 << 16
_in_buf, _out_buf = bytearray(_CHUNK), bytearray(_CHUNK)
_in_view, _out_view = memoryview(_in_buf), memoryview(_out_buf)
_programs = {}
"""sha256 -> (text, compiled code) of the public programs the host asked to keep."""


def _check(result, what):
    if result != 0:
        raise OSError(ctypes.get_errno(), what + ": " + os.strerror(ctypes.get_errno()))


def _read_exact(fd, size):
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise EOFError("input ended")
        data += chunk
    return data


def _read_line(fd):
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            raise EOFError("input ended")
        data += chunk
    return data


def _write_all(fd, data):
    data = memoryview(data)
    while data:
        data = data[os.write(fd, data):]


def _relay(src, size, dst):
    """Move `size` bytes from src to dst (None: discard) through _in_buf; False if dst broke."""
    ok = True
    while size:
        n = os.readv(src, [_in_view[:min(size, _CHUNK)]])
        if not n:
            raise EOFError("input ended")
        size -= n
        if ok and dst is not None:
            try:
                _write_all(dst, _in_view[:n])
            except BrokenPipeError:
                ok = False
    return ok


# ------------------------------------------------------------------------------ the cell C


def _drop_capabilities():
    for cap in (_CAP_SYS_ADMIN, _CAP_SETPCAP):  # SETPCAP last: dropping needs it
        _check(_libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), "drop bounding capability")
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    _check(_libc.capset(header, (ctypes.c_uint32 * 6)()), "capset")
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def _setup(job_r, in_r, out_w, err_w):
    job = json.loads(_read_line(job_r))
    data = "size=%d,mode=1777" % job["tmp_bytes"]
    _check(_libc.mount(b"tmpfs", b"/tmp", b"tmpfs", _MS_NOSUID | _MS_NODEV, data.encode()), "mount /tmp")
    os.chdir("/tmp")
    kept = _programs.get(job.get("program"))
    code = kept[0] if kept else _read_exact(job_r, job["code"])
    for name, size in job["files"]:
        if "/" in name:
            os.makedirs(name.rsplit("/", 1)[0], exist_ok=True)
        with open(name, "wb") as f:
            f.write(_read_exact(job_r, size))
    main = "/tmp/main.py" if job["language"] == "python" else "/tmp/main.sh"
    with open(main, "wb") as f:
        f.write(code)
    os.close(job_r)
    for fd, target in ((in_r, 0), (out_w, 1), (err_w, 2)):
        os.dup2(fd, target)
    os.closerange(3, 1 << 16)
    os.setsid()
    _drop_capabilities()
    for which, value in job["rlimits"]:
        resource.setrlimit(which, (value, value))
    return job["language"], main, kept[1] if kept else code


def _exit_status(err):
    code = err.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    try:
        print(code, file=sys.stderr)
    except BaseException:
        pass
    return 1


def _run_python(path, code):
    """What `python -S -s -P path` does after start-up, in this interpreter. `code` is the
    program's bytes, or its code object when it is a kept public program."""
    import builtins

    module = type(sys)("__main__")
    module.__file__, module.__builtins__, module.__spec__, module.__loader__ = path, builtins, None, None
    sys.modules["__main__"] = module
    sys.argv[:] = [path]
    status = 0
    try:
        exec(code if type(code) is not bytes else compile(code, path, "exec"), module.__dict__)
    except SystemExit as err:
        status = _exit_status(err)
    except BaseException as err:
        tb = err.__traceback__.tb_next if err.__traceback__ is not None else None  # hide this frame
        sys.excepthook(type(err), err.with_traceback(tb), tb)
        status = 1
    try:
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()
        import atexit

        atexit._run_exitfuncs()
    except SystemExit as err:
        status = _exit_status(err)
    except BaseException as err:
        sys.excepthook(type(err), err, err.__traceback__)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        status = 120
    os._exit(status)


def _cell(job_r, in_r, out_w, err_w):
    """Runs in C; never returns."""
    try:
        language, path, code = _setup(job_r, in_r, out_w, err_w)
    except BaseException as err:
        try:
            os.write(err_w if err_w > 2 else 2, (SETUP_PREFIX + "cell setup failed: %r\n" % (err,)).encode())
        finally:
            os._exit(_SETUP_FAILED)
    if language == "bash":
        os.execv("/bin/bash", ["/bin/bash", path])
    _run_python(path, code)


# ------------------------------------------------------------------------------ the zygote


class _Cell:
    """A forked C0 (and its C) waiting for its request."""

    def __init__(self):
        job_r, self.job_w = os.pipe()
        in_r, self.in_w = os.pipe()
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        self.report_r, report_w = os.pipe()
        self.programs = set(_programs)
        self.c0 = os.fork()
        if self.c0 == 0:
            try:
                for fd in (self.job_w, self.in_w, self.out_r, self.err_r, self.report_r, 0, 1):
                    os.close(fd)
                _check(_libc.unshare(_CLONE), "unshare")
                _check(_libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "make mounts private")
                pid = os.fork()
                if pid == 0:
                    os.close(report_w)
                    _cell(job_r, in_r, out_w, err_w)
                for fd in (job_r, in_r, out_w, err_w):
                    os.close(fd)
                _write_all(report_w, b"pid %d\n" % pid)
                _, status, usage = os.wait4(pid, 0)
                _write_all(report_w, b"exit %d %r %d\n" % (status, usage.ru_utime + usage.ru_stime, usage.ru_maxrss))
            except BaseException as err:
                _write_all(report_w, b"fail %s\n" % repr(err).encode())
            finally:
                os._exit(0)
        for fd in (job_r, in_r, out_w, err_w, report_w):
            os.close(fd)
        line = _read_line(self.report_r).decode().split(" ", 1)
        if line[0] != "pid":
            raise OSError("execution cell failed: " + line[-1].strip())
        self.pidfd = os.pidfd_open(int(line[1]))

    def kill(self):
        try:
            import signal

            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close(self):
        for fd in (self.job_w, self.in_w, self.out_r, self.err_r, self.report_r, self.pidfd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        os.waitpid(self.c0, 0)


def _frame(tag, data):
    _write_all(1, tag + b"%08d" % len(data))
    _write_all(1, data)


def _serve(cell, header):
    """One request on a prepared cell; returns the result dict."""
    program = header.get("program")
    if header.get("cache"):  # a public program's text: kept, and compiled once, here
        text = _read_exact(0, header["code"])
        try:
            _programs[program] = (text, compile(text, "/tmp/main.py", "exec"))
        except (SyntaxError, ValueError):
            _programs[program] = (text, text)  # each run then fails to compile, as it would anyway
    inherited = program in cell.programs
    job = json.dumps({"language": header["language"], "code": header["code"], "files": header["files"],
                      "rlimits": header["rlimits"], "tmp_bytes": header["tmp_bytes"],
                      "program": program if inherited else None}).encode() + b"\n"
    try:
        _write_all(cell.job_w, job)
        if program is not None and not inherited:
            _write_all(cell.job_w, _programs[program][0])
        ok = True
    except BrokenPipeError:
        ok = False
    code_size = 0 if program is not None else header["code"]
    for size in [code_size] + [size for _, size in header["files"]]:
        ok = _relay(0, size, cell.job_w if ok else None) and ok
    os.close(cell.job_w)
    cell.job_w = None

    deadline = time.monotonic() + header["timeout"]
    caps = {cell.out_r: [b"O", header["stdout_max"], 0], cell.err_r: [b"E", header["stderr_max"], 0]}
    stdin_left, pending, reason, report = header["stdin"], _in_view[:0], "exited", None
    poller = select.poll()
    for fd in (cell.out_r, cell.err_r, cell.report_r):
        poller.register(fd, select.POLLIN)
    if stdin_left:
        os.set_blocking(cell.in_w, False)
        poller.register(cell.in_w, select.POLLOUT)
    else:
        os.close(cell.in_w)
        cell.in_w = None
    open_fds = {cell.out_r, cell.err_r, cell.report_r}
    killed = False
    while open_fds:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if killed:
                break  # the namespace did not come down in time; the host restarts us
            if report is None:
                reason = "timeout"
            cell.kill()
            killed, deadline = True, time.monotonic() + 5.0  # the kernel tears the namespace down
            continue
        for fd, _ in poller.poll(max(remaining, 0) * 1000):
            if fd == cell.in_w:
                try:
                    if not pending:
                        n = os.readv(0, [_in_view[:min(stdin_left, _CHUNK)]])
                        if not n:
                            raise EOFError("input ended")
                        stdin_left -= n
                        pending = _in_view[:n]
                    pending = pending[os.write(cell.in_w, pending):]
                except BlockingIOError:
                    pass
                except BrokenPipeError:  # the program closed its stdin: drain ours
                    _relay(0, stdin_left, None)
                    stdin_left, pending = 0, _in_view[:0]
                if not stdin_left and not pending:
                    poller.unregister(cell.in_w)
                    os.close(cell.in_w)
                    cell.in_w = None
                continue
            if fd == cell.report_r:
                line = os.read(fd, 4096)
                if not line:
                    poller.unregister(fd)
                    open_fds.discard(fd)
                else:
                    report = (report or b"") + line
                continue
            n = os.readv(fd, [_out_view])
            if not n:
                poller.unregister(fd)
                open_fds.discard(fd)
                continue
            cap = caps[fd]
            room = cap[1] - cap[2]
            if room > 0:
                _frame(cap[0], _out_view[:min(n, room)])
            cap[2] += n
            if n > room and reason == "exited":
                reason = "output_limit:" + ("stdout" if cap[0] == b"O" else "stderr")
                cell.kill()
                killed, deadline = True, min(deadline, time.monotonic() + 5.0)
    if cell.in_w is not None or stdin_left:
        _relay(0, stdin_left, None)
    result = {"reason": reason, "wait_status": None, "cpu_s": 0.0, "max_rss_kb": 0, "message": "",
              "stdout_truncated": caps[cell.out_r][2] > header["stdout_max"],
              "stderr_truncated": caps[cell.err_r][2] > header["stderr_max"]}
    words = (report or b"").decode().split()
    if len(words) >= 4 and words[0] == "exit":
        result.update(wait_status=int(words[1]), cpu_s=float(words[2]), max_rss_kb=int(words[3]))
    else:
        result.update(reason="spawn_error", message="the execution cell ended without a status")
    if not ok and result["reason"] == "exited":
        result["message"] = "the execution cell closed its job pipe early"
    return result


def main():
    _libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    for name in sys.argv[1:]:  # pre-imports: paid once here instead of in every execution
        try:
            __import__(name)
        except ImportError:
            pass
    # The first compile in a process sets up the parser: do it once, here, not in every execution.
    compile("def f(x):\n    return [y for y in x if y]\n", "<warm-up>", "exec")
    import gc

    gc.freeze()  # the collector never walks (and so never copies on write) what cells inherit
    cell = _Cell()
    while True:
        try:
            header = json.loads(_read_exact(0, int(_read_line(0))))
        except (EOFError, ValueError):
            os._exit(0)  # the host closed the pipe: the whole sandbox goes with pid 1
        try:
            result = _serve(cell, header)
        except BaseException as err:  # mid-request, the framing is lost: end; the host restarts us
            os.write(2, ("zygote: %r\n" % (err,)).encode())
            os._exit(1)
        cell.close()
        _in_buf[:] = bytes(_CHUNK)  # nothing of this request reaches the next cell
        _out_buf[:] = bytes(_CHUNK)
        _frame(b"R", json.dumps(result).encode())
        cell = _Cell()


if __name__ == "__main__":
    main()
