"""start="fork": what must be fresh in every execution forked from a zygote, checked from
inside the next execution and from the host; and the zygote's own failure modes."""

from __future__ import annotations

import os
import re
import shutil
import signal
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from polyrl.sandbox import Limits, RunRequest, SandboxConfig, SandboxPool
from polyrl.sandbox import zygote as zygote_module

MARKER = f"polyrl-zygote-{uuid.uuid4().hex[:12]}"


@pytest.fixture()
def one_slot() -> Iterator[SandboxPool]:
    """One worker, so consecutive requests are forked from the same zygote."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap missing: apt-get install -y bubblewrap")
    with SandboxPool(workers=1, config=SandboxConfig(start="fork")) as pool:
        yield pool


def py(code: str, **kw: object) -> RunRequest:
    return RunRequest(code=code, run_timeout=kw.pop("run_timeout", 5.0), **kw)  # type: ignore[arg-type]


def test_nothing_of_one_execution_survives_into_the_next(one_slot: SandboxPool) -> None:
    first = one_slot.run(py(
        "import os\nopen('/tmp/left-behind', 'w').write('x')\n"
        f"if os.fork() == 0:\n    os.setsid()\n    os.execv('/bin/sleep', ['sleep-{MARKER}', '60'])\n"
        "print(os.listdir('/tmp'))"))
    assert first.status == "ok" and "left-behind" in first.stdout
    second = one_slot.run(py("import os\nprint(sorted(os.listdir('/tmp')))"))
    assert second.stdout.strip() == "['main.py']"
    host = [p for p in os.listdir("/proc") if p.isdigit() and MARKER in _cmdline(p)]
    assert host == []  # the daemon died with its execution's pid namespace


def test_executions_hold_no_capabilities_and_cannot_make_namespaces(one_slot: SandboxPool) -> None:
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "header, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()\n"
        "assert libc.capget(header, data) == 0\n"
        "print('caps', list(data))\n"
        "print('mount', libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))\n"
        "print('umount', libc.umount2(b'/tmp', 2))\n"
        "print('userns', libc.unshare(0x10000000))\n"
        "print('mountns', libc.unshare(0x00020000))\n"
    )
    lines = dict(line.split(" ", 1) for line in one_slot.run(py(code)).stdout.splitlines())
    assert lines == {"caps": "[0, 0, 0, 0, 0, 0]", "mount": "-1", "umount": "-1", "userns": "-1", "mountns": "-1"}


SCAN = """
import gc, sys
needle = "".join([{a!r}, {b!r}])  # built at run time: this program's constants hold halves
def values():
    frame, buffers = sys._getframe(), dict()
    while frame is not None:  # up into the zygote's own frames and module globals
        buffers.update((id(v), v) for k, v in frame.f_globals.items() if k in ("_in_buf", "_out_buf"))
        yield from frame.f_globals.values()
        yield from frame.f_locals.values()
        frame = frame.f_back
    for o in gc.get_objects():
        items = o.values() if isinstance(o, dict) else o if isinstance(o, (list, tuple, set, frozenset)) else ()
        yield from list(items)
    print("buffers", len(buffers), sum(sum(b) for b in buffers.values()))
hits = 0
for v in list(values()):
    if v is not needle and isinstance(v, (str, bytes, bytearray)):
        hits += needle in (v if isinstance(v, str) else v.decode("latin-1"))
print("hits", hits)
"""


def test_earlier_requests_leave_nothing_in_a_later_cells_memory(one_slot: SandboxPool) -> None:
    secret = uuid.uuid4().hex
    first = one_slot.run(py(f"# {secret} in the code\nimport sys\nprint(sys.stdin.read()[::-1])",
                            stdin=secret * 100, files={"data.txt": secret}))
    assert first.stdout.strip() == (secret * 100)[::-1]
    half = len(secret) // 2
    for needle in (secret, secret[::-1]):  # what came in, and what went out
        result = one_slot.run(py(SCAN.format(a=needle[:half], b=needle[half:])))
        assert result.status == "ok", result.stderr
        lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
        assert lines == {"buffers": "2 0", "hits": "0"}


def test_public_programs_are_kept_and_a_dead_zygote_is_restarted(one_slot: SandboxPool) -> None:
    program = zygote_module.public_program(f"import sys\nprint('{MARKER}', sys.stdin.read())\n")
    runs = [one_slot.run(py(program, stdin=str(i))).stdout for i in range(3)]  # sent once, then kept
    assert runs == [f"{MARKER} {i}\n" for i in range(3)]
    zygote = one_slot._zygotes[0]  # type: ignore[index]
    assert zygote.proc is not None and zygote._kept
    os.kill(zygote.proc.pid, signal.SIGKILL)
    zygote.proc.wait()
    assert one_slot.run(py("print(2)")).stdout == "2\n"
    assert one_slot.run(py(program, stdin="again")).stdout == f"{MARKER} again\n"


def test_a_python_traceback_starts_at_the_program(one_slot: SandboxPool) -> None:
    result = one_slot.run(py("def f():\n    1 / 0\nf()"))
    assert result.status == "error" and result.exit_code == 1
    frames = re.findall(r'File "([^"]+)"', result.stderr)
    assert frames == ["/tmp/main.py", "/tmp/main.py"] and "ZeroDivisionError" in result.stderr


def test_large_stdin_is_relayed_while_output_flows(one_slot: SandboxPool) -> None:
    data = "y" * (3 << 20)  # far past a pipe's capacity, both ways
    result = one_slot.run(py("import sys\nsys.stdout.write(sys.stdin.read())", stdin=data,
                             limits=Limits(stdout_max_bytes=4 << 20)))
    assert result.status == "ok" and len(result.stdout) == len(data)
    ignored = one_slot.run(py("print('ignored')", stdin=data))  # the rest of stdin is drained
    assert ignored.stdout == "ignored\n"
    assert one_slot.run(py("print('next')")).stdout == "next\n"


def test_bash_programs_run_in_the_same_cells(one_slot: SandboxPool) -> None:
    result = one_slot.run(RunRequest(code="echo $((6 * 7)) $$ $(pwd)", language="bash"))
    assert result.stdout.split() == ["42", "1", "/tmp"]


def test_the_setup_prefix_matches_the_zygote_source() -> None:
    source = Path(zygote_module.__file__).with_name("zygote_main.py").read_text()
    prefix = re.search(r'^SETUP_PREFIX = "([^"]+)"', source, re.M)
    assert prefix and prefix.group(1).encode() == zygote_module._SETUP_ERROR[1]


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
