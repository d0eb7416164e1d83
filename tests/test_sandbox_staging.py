"""Packages a sandbox binds are staged where the slot uid can read them (polyrl/sandbox/staging.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from polyrl.sandbox.staging import reachable_by_others, readable


@pytest.fixture
def base() -> Iterator[Path]:
    """A world-searchable directory (pytest's own base sits under a private one)."""
    path = Path(tempfile.mkdtemp(dir="/tmp" if os.path.isdir("/tmp") else None))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _package(root: Path) -> Path:
    pkg = root / "private" / "mypkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("X = 1\n")
    (pkg / "sub" / "mod.py").write_text("Y = 2\n")
    (pkg / "sub" / "mod.py").chmod(0o600)
    return pkg


def test_a_package_under_a_private_directory_is_not_reachable(base: Path) -> None:
    pkg = _package(base)
    os.chmod(pkg.parent, 0o755)
    assert reachable_by_others(str(pkg))
    os.chmod(pkg.parent, 0o700)
    assert not reachable_by_others(str(pkg))


@pytest.mark.skipif(os.geteuid() != 0, reason="staging applies when root drops to a slot uid")
def test_an_unreachable_package_is_copied_once_with_its_name_and_readable_files(base: Path) -> None:
    pkg = _package(base)
    os.chmod(pkg.parent, 0o700)
    copy = readable(str(pkg))
    assert copy != str(pkg) and Path(copy).name == "mypkg" and readable(str(pkg)) == copy
    assert reachable_by_others(copy) and reachable_by_others(os.path.join(copy, "sub", "mod.py"))
    assert Path(copy, "sub", "mod.py").read_text() == "Y = 2\n"
    os.chmod(pkg.parent, 0o755)
    other = _package(base / "open")
    for d in (base / "open", other.parent):
        os.chmod(d, 0o755)
    assert readable(str(other)) == str(other)
