"""Packages a sandbox binds, made readable by the slot uid it runs as.

Run as root, a session's bubblewrap starts as a slot uid (runner.slot_uid) and bind-mounts
the session's packages itself, so that uid must be able to reach them. A checkout under a
private directory (/root, or `mktemp -d`, both mode 0700) is out of its reach: bubblewrap
then fails before the program starts. Such a package is copied once per process into a
world-readable directory under the system's temporary directory, removed at exit; a package
the slot uid can already reach is bound where it is.
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path

_lock = threading.Lock()
_copies: dict[str, str] = {}
_root: str | None = None


def reachable_by_others(path: str) -> bool:
    """Whether a uid with no relation to the owner can read `path`: every directory above it
    searchable by others, and `path` itself readable (and searchable when a directory)."""
    p = Path(path)
    for parent in p.parents:
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
    mode = os.stat(p).st_mode
    need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
    return mode & need == need


def readable(path: str) -> str:
    """`path`, or a copy of it the slot uid can read (same base name: the sandbox imports it
    by that name)."""
    if os.geteuid() != 0 or reachable_by_others(path):
        return path
    with _lock:
        if path not in _copies:
            _copies[path] = _copy(path)
        return _copies[path]


def _copy(path: str) -> str:
    global _root
    if _root is None:
        _root = tempfile.mkdtemp(prefix="polyrl-packages-")
        os.chmod(_root, 0o755)
        atexit.register(shutil.rmtree, _root, True)
    home = tempfile.mkdtemp(dir=_root)
    os.chmod(home, 0o755)
    target = os.path.join(home, Path(path).name)
    if os.path.isdir(path):
        shutil.copytree(path, target)
    else:
        shutil.copy2(path, target)
    for parent, dirs, files in os.walk(target):
        os.chmod(parent, 0o755)
        for name in files:
            os.chmod(os.path.join(parent, name), 0o644)
    return target
