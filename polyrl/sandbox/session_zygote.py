"""Runs INSIDE the sandbox (`python -m polyrl.sandbox.session_zygote MODULE...`): the zygote of
sessions started with start="fork".

It imports MODULE... once, then forks a session per request, so a session skips the
start of bubblewrap and of an interpreter and those imports (session.py). Its fd 0 is a
Unix socket to the host; each request is one message with three descriptors attached
(the session's stdin, stdout and stderr):

    {"main": "module:function", "rlimits": [[resource, value]], "tmp_bytes": N, "isolate": bool, "cwd": dir}
        -> {"pid": P}      the session runs function() with those descriptors as 0, 1, 2
        -> {"error": "..."}
    {"kill": P}          -> {"killed": P}

isolate=true (under bubblewrap, where this process holds CAP_SYS_ADMIN and CAP_SETPCAP of
bubblewrap's user namespace, never the host's) gives each session fresh mount, pid,
network, ipc, uts and cgroup namespaces, as zygote_main.py gives each execution: it is pid
1 of its own pid namespace (killing it kills everything it started), mounts its own tmpfs
at /tmp, and drops every capability before `main` runs. isolate=false (a plain process)
only makes it a session leader (the host kills its process group). Either way the rlimits
are set last. No session's data passes through this process: it only holds descriptors.

When the host closes the socket this process exits, and under bubblewrap (pid 1) every
session goes with it.
"""

import json
import os
import signal
import socket
import sys

_KILL_WAIT_S = 10.0
"""How long a kill waits for an isolated session's namespace to be gone (see _wait_gone)."""
_FORK_RETRY_S = 10.0
"""How long a session start waits for the process budget to come back (see _spawn_retrying)."""
_cells = {}
"""pid of a session -> (pid of the process to reap: its outer one when isolated, pidfd, isolated)."""


def _reap(*_):
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _forget(pid)


def _forget(outer_pid):
    """Drop the session whose outer process `outer_pid` was reaped."""
    for session, (outer, pidfd, _isolated) in list(_cells.items()):
        if outer == outer_pid:
            os.close(pidfd)
            del _cells[session]


def _session(request, fds):
    """In the forked child: become the session and run its main; never returns."""
    import resource

    from polyrl.sandbox import zygote_main as z

    status = 0
    try:
        if request["isolate"]:
            z._check(z._libc.mount(b"tmpfs", b"/tmp", b"tmpfs", z._MS_NOSUID | z._MS_NODEV,
                                   b"size=%d,mode=1777" % request["tmp_bytes"]), "mount /tmp")
        os.chdir(request["cwd"])
        for fd, target in zip(fds, (0, 1, 2)):
            os.dup2(fd, target)
        os.closerange(3, 1 << 16)
        os.setsid()
        if request["isolate"]:
            z._drop_capabilities()
        for which, value in request["rlimits"]:
            resource.setrlimit(which, (value, value))
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        module, _, function = request["main"].partition(":")
        main = getattr(sys.modules.get(module) or __import__(module, fromlist=["_"]), function)
        main()
    except SystemExit as err:
        status = err.code if isinstance(err.code, int) else 1
    except BaseException as err:  # noqa: BLE001 -- reported on the session's stderr
        try:
            os.write(2, ("polyrl-session: %s: %s\n" % (type(err).__name__, err)).encode())
        finally:
            status = 1
    os._exit(status)


def _wait_gone(outer):
    """Wait (at most _KILL_WAIT_S) until the outer process of a killed isolated session has
    exited: it waits for the namespace's pid 1, whose exit waits until the kernel has killed
    and reaped every process of the namespace. So the killed session's processes are gone
    (and their share of the process budget back) before the next session is forked."""
    import time

    deadline = time.monotonic() + _KILL_WAIT_S
    while time.monotonic() < deadline:
        try:
            pid, _status = os.waitpid(outer, os.WNOHANG)
        except ChildProcessError:  # reaped already (by _reap)
            return
        if pid == outer:
            _forget(outer)
            return
        time.sleep(0.01)


def _spawn_retrying(request, fds):
    """_spawn, retried while fork fails with EAGAIN: the processes of a session just killed
    (a fork bomb's thousand) hold the sessions' shared RLIMIT_NPROC budget until the kernel
    has reaped them, which takes a fraction of a second; the next episode's session waits
    for that instead of failing."""
    import time

    deadline = time.monotonic() + _FORK_RETRY_S
    while True:
        try:
            return _spawn(request, fds)
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _spawn(request, fds):
    """Fork the session; (pid to kill it by, pid to reap). BlockingIOError when a fork
    finds the process budget spent."""
    if not request["isolate"]:
        pid = os.fork()
        if pid == 0:
            _session(request, fds)
        return pid, pid
    from polyrl.sandbox import zygote_main as z

    report_r, report_w = os.pipe()
    outer = os.fork()
    if outer == 0:
        try:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.close(report_r)
            z._check(z._libc.unshare(z._CLONE), "unshare")
            z._check(z._libc.mount(None, b"/", None, z._MS_REC | z._MS_PRIVATE, None), "make mounts private")
            pid = os.fork()
            if pid == 0:
                os.close(report_w)
                _session(request, fds)
            for fd in fds:
                os.close(fd)
            z._write_all(report_w, b"%d\n" % pid)
            os.close(report_w)
            os.waitpid(pid, 0)
        except BaseException as err:  # noqa: BLE001
            try:
                z._write_all(report_w, b"fail %r\n" % (err,))
            except BaseException:
                pass
        finally:
            os._exit(0)
    os.close(report_w)
    line = z._read_line(report_r).decode().strip()
    os.close(report_r)
    if line.startswith("fail BlockingIOError"):
        raise BlockingIOError("session setup failed: " + line)
    if not line.isdigit():
        raise OSError("session setup failed: " + line)
    return int(line), outer


def main():
    for name in sys.argv[1:]:  # paid once here instead of in every session
        __import__(name)
    import gc

    gc.freeze()  # the collector never walks (and so never copies on write) what sessions inherit
    signal.signal(signal.SIGCHLD, _reap)
    control = socket.socket(fileno=os.dup(0))
    null_r, null_w = os.pipe()
    os.close(null_w)
    os.dup2(null_r, 0)
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(control, 1 << 16, 3)
        except InterruptedError:
            continue
        if not data:
            os._exit(0)
        request = json.loads(data)
        try:
            if "kill" in request:
                entry = _cells.get(request["kill"])
                if entry is not None:
                    try:
                        if entry[2]:  # pid 1 of its namespace: everything in it dies too
                            signal.pidfd_send_signal(entry[1], signal.SIGKILL)
                            _wait_gone(entry[0])
                        else:  # a session leader: its process group
                            os.killpg(request["kill"], signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                reply = {"killed": request["kill"]}
            else:
                pid, outer = _spawn_retrying(request, fds)
                _cells[pid] = (outer, os.pidfd_open(pid), request["isolate"])
                reply = {"pid": pid}
        except BaseException as err:  # noqa: BLE001 -- the host reads it
            reply = {"error": "%s: %s" % (type(err).__name__, err)}
        finally:
            for fd in fds:
                os.close(fd)
        control.sendall(json.dumps(reply).encode())


if __name__ == "__main__":
    main()
