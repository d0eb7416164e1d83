"""Where polyrl keeps what it builds once and reuses: built-in models, compiled kernels.

    <cache>/tiny-<hash>/          the built-in tiny policy (polyrl/builtin/tiny.py)
    <cache>/tiny-rm-<hash>/       a built-in tiny reward model (polyrl/builtin/tiny_rm.py)
    <cache>/kernels/*.so          the engine's fused CPU kernels (polyrl/engine/runner/cpu_kernels.py)

<cache> is $POLYRL_CACHE, else $XDG_CACHE_HOME/polyrl, else ~/.cache/polyrl. An entry's
name carries a hash of everything that shaped it, so a changed recipe builds a new entry
and never reads a stale one.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from typing import Callable


def cache_dir() -> Path:
    root = os.environ.get("POLYRL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "polyrl")
    return Path(root)


def build_once(target: Path, marker: str, build: Callable[[Path], None]) -> Path:
    """`target`, built first by `build(tmp_dir)` unless `target/marker` exists.

    One process builds while concurrent callers wait on a file lock beside it; the build
    goes to a temporary directory that replaces `target` only when complete, so a crash
    mid-build leaves no half-written entry behind."""
    if (target / marker).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / marker).exists():
            return target
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        build(tmp)
        os.replace(tmp, target)
    return target
