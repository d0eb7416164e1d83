"""The bubblewrap command line: every namespace unshared, a read-only system, private /tmp.

With start="spawn", one run is one `bwrap` process (`bwrap_argv`): `--unshare-all` (user,
pid, network, ipc, uts, cgroup namespaces, and a new mount namespace), so the only
network is an unconfigured loopback;
`--ro-bind` of /usr (plus the merged-/usr symlinks) and nothing else of the host, on a
root that is remounted read-only; no way to make further user namespaces
(`--disable-userns`); a size-capped tmpfs at /tmp as the working directory
(the only writable place); a cleared environment; a new session
(no TIOCSTI into the caller's terminal); `--die-with-parent`; and `--as-pid-1`, so the
program is the pid namespace's init: when it exits or is killed, the kernel kills every
process left in the namespace, and bubblewrap reaps it (no zombie for the host's init).
The uid drop and rlimits are applied by runner.py before bubblewrap starts. With
start="fork" (the default), one long-lived bubblewrap per worker slot (`zygote_argv`)
forks every execution into namespaces of its own (zygote_main.py).

Not covered: seccomp (bubblewrap applies none unless given a compiled filter; the host
kernel is shared, so a kernel exploit escapes), cgroup limits, GPUs, and hosts where
unprivileged user namespaces are disabled (the probe reports it as SandboxUnavailable).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

from polyrl.sandbox.types import MAIN_FILES, RunRequest, SandboxConfig

WORKDIR = "/tmp"
INSTALL_HINT = (
    "install it with `apt-get install -y bubblewrap` (Debian/Ubuntu), `dnf install bubblewrap` "
    "(Fedora) or `apk add bubblewrap` (Alpine)"
)


class BubblewrapMissing(RuntimeError):
    """bwrap is not installed: a setup problem, reported before anything runs."""


class SandboxUnavailable(RuntimeError):
    """bwrap is installed but cannot create a sandbox on this host."""


def find_bwrap(config: SandboxConfig) -> str | None:
    return shutil.which(config.bwrap)


def require_bwrap(config: SandboxConfig) -> str:
    path = find_bwrap(config)
    if path is None:
        raise BubblewrapMissing(
            f"bubblewrap ({config.bwrap!r}) was not found on PATH; {INSTALL_HINT}. "
            "To run untrusted code WITHOUT isolation instead, pass allow_unsafe=True (not recommended)."
        )
    return path


@functools.cache
def _system_links(binds: tuple[str, ...]) -> tuple[str, ...]:
    """Arguments for /bin, /sbin, /lib, /lib64, /lib32: symlinks on merged-/usr hosts."""
    args: list[str] = []
    for path in ("/bin", "/sbin", "/lib", "/lib64", "/lib32"):
        if any(path == b or path.startswith(b + "/") for b in binds):
            continue
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return tuple(args)


def sandbox_env(workdir: str) -> dict[str, str]:
    """The whole environment a program sees (PYTHONHASHSEED fixed so runs replay)."""
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "PYTHONHASHSEED": "0"}


def program_argv(config: SandboxConfig, request: RunRequest, workdir: str) -> list[str]:
    """The interpreter and the program file (MAIN_FILES[language], written next to `files`)."""
    main = f"{workdir}/{MAIN_FILES[request.language]}"
    if request.language == "python":
        return [config.python, *config.python_flags, main]
    return ["/bin/bash", main]


def _namespaces_and_system(bwrap: str, config: SandboxConfig) -> list[str]:
    """The part both ways of starting share: namespaces, environment, the read-only system."""
    # --disable-userns (it needs --unshare-user spelled out): nothing inside may make
    # another user namespace, and without one no other namespace (they need CAP_SYS_ADMIN).
    argv = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--as-pid-1", "--clearenv"]
    for key, value in sandbox_env(WORKDIR).items():
        argv += ["--setenv", key, value]
    for path in config.ro_binds:
        argv += ["--ro-bind", path, path]
    argv += _system_links(config.ro_binds)
    if config.proc:
        argv += ["--proc", "/proc"]
    if config.dev:
        argv += ["--dev", "/dev"]
    return argv


def bwrap_argv(bwrap: str, config: SandboxConfig, request: RunRequest, file_fds: list[tuple[int, str]]) -> list[str]:
    """start="spawn": one bubblewrap for one request. `file_fds` are (readable fd, path
    relative to /tmp) pairs."""
    argv = _namespaces_and_system(bwrap, config)
    argv += ["--size", str(request.limits.tmp_size_MB << 20), "--tmpfs", WORKDIR]
    made: set[str] = set()
    for fd, name in file_fds:
        parts = name.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            folder = "/".join(parts[:i])
            if folder not in made:
                made.add(folder)
                argv += ["--dir", f"{WORKDIR}/{folder}"]
        argv += ["--file", str(fd), f"{WORKDIR}/{name}"]
    argv += ["--remount-ro", "/", "--chdir", WORKDIR, "--", *program_argv(config, request, WORKDIR)]
    return argv


ZYGOTE_PATH = "/.polyrl/zygote.py"


def zygote_argv(bwrap: str, config: SandboxConfig, source_fd: int) -> list[str]:
    """start="fork": the long-lived bubblewrap whose pid 1 is zygote_main.py.

    The zygote keeps CAP_SYS_ADMIN and CAP_SETPCAP there (never
    on the host) to give each execution its own namespaces and tmpfs, and each execution
    drops both before its program starts. /tmp is an empty directory of the read-only
    root: each execution mounts its own tmpfs over it.
    """
    argv = _namespaces_and_system(bwrap, config)
    argv += ["--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP",
             "--dir", WORKDIR, "--dir", ZYGOTE_PATH.rsplit("/", 1)[0], "--file", str(source_fd), ZYGOTE_PATH,
             "--remount-ro", "/", "--chdir", "/", "--", config.python, *config.python_flags, ZYGOTE_PATH,
             *config.preload]
    return argv


@functools.cache
def probe(bwrap: str, config: SandboxConfig) -> None:
    """Fail early, with the reason, when bubblewrap cannot build a sandbox here."""
    argv = [bwrap, "--unshare-all", "--die-with-parent", "--as-pid-1"]
    for path in config.ro_binds:
        argv += ["--ro-bind", path, path]
    argv += [*_system_links(config.ro_binds), "--", config.python, "-S", "-c", "pass"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=30, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SandboxUnavailable(f"bubblewrap at {bwrap} could not run: {err}") from err
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip()
        raise SandboxUnavailable(
            f"bubblewrap at {bwrap} cannot create a sandbox running {config.python}: {detail or done.returncode}. "
            "Unprivileged user namespaces may be disabled (sysctl kernel.unprivileged_userns_clone=1, "
            "or user.max_user_namespaces > 0), or the interpreter is not under ro_binds."
        )
