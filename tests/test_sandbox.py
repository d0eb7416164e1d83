"""The sandbox: statuses, limits, isolation, the missing-bwrap error, the unsafe opt-in,
the worker pool, the HTTP backend and replay records."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Iterator

import pytest

from polyrl.sandbox import (
    BubblewrapMissing, Limits, RunRequest, RunResult, SandboxConfig, SandboxPool, record, replay, run,
)
from polyrl.sandbox.http import HttpSandbox

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing: apt-get install -y bubblewrap")
UNSAFE = SandboxConfig(isolation="none", allow_unsafe=True)


@pytest.fixture(scope="module", params=["fork", "spawn"])
def pool(request: pytest.FixtureRequest) -> Iterator[SandboxPool]:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap missing: apt-get install -y bubblewrap")
    with SandboxPool(workers=2, config=SandboxConfig(start=request.param)) as p:
        yield p


def py(code: str, **kw: object) -> RunRequest:
    return RunRequest(code=code, run_timeout=kw.pop("run_timeout", 5.0), **kw)  # type: ignore[arg-type]


# ----------------------------------------------------------------------- statuses


def test_ok_run_reports_output_and_usage(pool: SandboxPool) -> None:
    result = pool.run(py("import os, sys\nprint(sys.stdin.read().upper(), os.getuid(), os.getpid())",
                         stdin="hello"))
    assert result.status == "ok" and result.exit_code == 0 and result.signal is None
    word, uid, pid = result.stdout.split()
    assert word == "HELLO" and pid == "1"  # the program is its pid namespace's init
    assert int(uid) != 0 or os.geteuid() != 0
    assert result.wall_time_s > 0 and result.cpu_time_s > 0 and result.max_rss_kb > 1000


def test_files_are_written_under_the_working_directory(pool: SandboxPool) -> None:
    files = {"data/in.txt": "text", "blob.bin": b"\x00\x01"}
    result = pool.run(py("import os\nprint(open('data/in.txt').read(), len(open('blob.bin','rb').read()), os.getcwd())",
                         files=files))
    assert result.stdout.split() == ["text", "2", "/tmp"]


@pytest.mark.parametrize("code, status, exit_code", [
    ("raise SystemExit(3)", "error", 3),
    ("1/0", "error", 1),
    ("import sys; sys.exit(0)", "ok", 0),
])
def test_exit_codes(pool: SandboxPool, code: str, status: str, exit_code: int) -> None:
    result = pool.run(py(code))
    assert (result.status, result.exit_code) == (status, exit_code)


def test_wall_clock_kills_the_whole_tree(pool: SandboxPool) -> None:
    start = time.monotonic()
    code = "import os, time\nfor _ in range(3):\n    if os.fork() == 0: os.setsid()\ntime.sleep(60)"
    result = pool.run(py(code, run_timeout=1.0))
    assert result.status == "timeout" and "killed" in result.message
    assert time.monotonic() - start < 4


def test_cpu_limit_kills_busy_loops(pool: SandboxPool) -> None:
    result = pool.run(py("while True: pass", run_timeout=10, limits=Limits(cpu_time_s=1)))
    assert result.status == "killed" and result.signal in (9, 24)  # SIGKILL or SIGXCPU
    assert result.wall_time_s < 9  # the CPU limit fired, not the wall clock


def test_memory_limit(pool: SandboxPool) -> None:
    result = pool.run(py("x = bytearray(1 << 30)", memory_limit_MB=256))
    assert result.status == "error" and "MemoryError" in result.stderr


@pytest.mark.parametrize("stream, cap", [("stdout", "stdout_max_bytes"), ("stderr", "stderr_max_bytes")])
def test_output_caps_stop_reading_and_kill(pool: SandboxPool, stream: str, cap: str) -> None:
    code = f"import sys\nwhile True: sys.{stream}.write('x' * 4096)"
    result = pool.run(py(code, limits=Limits(**{cap: 10_000})))
    assert result.status == "output_limit" and stream in result.message
    assert len(getattr(result, stream)) == 10_000 and getattr(result, f"{stream}_truncated")


def test_file_size_and_tmpfs_limits(pool: SandboxPool) -> None:
    big_file = pool.run(py("open('f', 'wb').write(b'x' * (3 << 20))", limits=Limits(file_size_MB=1)))
    assert big_file.status == "error" and "File too large" in big_file.stderr
    code = "for i in range(10): open(f'f{i}', 'wb').write(b'x' * (1 << 20))"
    full_disk = pool.run(py(code, limits=Limits(tmp_size_MB=4, file_size_MB=2)))
    assert full_disk.status == "error" and "No space left" in full_disk.stderr


def test_process_and_open_file_limits(pool: SandboxPool) -> None:
    forks = pool.run(py("import os\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            import time; "
                        "time.sleep(30)\n        n += 1\nexcept OSError:\n    print(n)", limits=Limits(processes=10)))
    assert forks.status == "ok" and int(forks.stdout) < 10
    files = pool.run(py("fs = []\ntry:\n    while True: fs.append(open('/tmp/x', 'w'))\nexcept OSError as e:\n    print(len(fs))",
                        limits=Limits(open_files=20)))
    assert files.status == "ok" and int(files.stdout) < 20


def test_read_only_system_private_tmp_cleared_environment(pool: SandboxPool) -> None:
    code = (
        "import os\n"
        "for path in ('/usr/evil', '/evil', '/bin/evil'):\n"
        "    try:\n        open(path, 'w')\n        print('WROTE', path)\n    except OSError as e:\n        print(e.errno)\n"
        "print(sorted(os.environ))\nprint(sorted(os.listdir('/')))"
    )
    lines = pool.run(py(code)).stdout.splitlines()
    assert not any(line.startswith("WROTE") for line in lines)
    assert set(eval(lines[3])) <= {"HOME", "LANG", "PATH", "PWD", "PYTHONHASHSEED", "LC_CTYPE"}
    assert "'home'" not in lines[4] and "'root'" not in lines[4] and "'work'" not in lines[4]


def test_no_network_even_to_the_host_loopback(pool: SandboxPool) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.5)
    port = server.getsockname()[1]
    code = f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n    print('CONNECTED')\n" \
           "except OSError as e:\n    print('refused', e.errno)"
    result = pool.run(py(code))
    with pytest.raises(socket.timeout):
        server.accept()
    server.close()
    assert result.stdout.startswith("refused")


def test_sandbox_error_is_a_value() -> None:
    result = run(py("print(1)"), SandboxConfig(python="/nonexistent/python3"))
    assert result.status == "sandbox_error" and "bwrap" in result.message


def test_pool_keeps_order_and_gives_each_slot_its_own_uid(pool: SandboxPool) -> None:
    results = pool.run_many([py(f"import os, time\ntime.sleep(0.05)\nprint({i}, os.getuid())") for i in range(6)])
    assert [int(r.stdout.split()[0]) for r in results] == list(range(6))
    if os.geteuid() == 0:
        assert len({r.stdout.split()[1] for r in results}) == 2


# ---------------------------------------------------------------- setup errors, unsafe


def test_missing_bwrap_refuses_with_install_hint() -> None:
    config = SandboxConfig(bwrap="no-such-bwrap-binary")
    with pytest.raises(BubblewrapMissing, match="apt-get install -y bubblewrap"):
        run(py("print(1)"), config)
    with pytest.raises(BubblewrapMissing, match="allow_unsafe=True"):
        SandboxPool(workers=1, config=config)


def test_unsafe_needs_opt_in_and_warns_on_every_run(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValueError, match="allow_unsafe=True"):
        SandboxConfig(isolation="none")
    with caplog.at_level(logging.WARNING, logger="polyrl.sandbox"):
        assert run(py("print(2)"), UNSAFE).stdout == "2\n"
        missing = SandboxConfig(bwrap="no-such-bwrap-binary", allow_unsafe=True)
        assert run(py("print(3)"), missing).stdout == "3\n"
    unsafe = [r for r in caplog.records if "UNSAFE" in r.getMessage()]
    assert len(unsafe) == 2 and "not installed" in unsafe[1].getMessage()


def test_unsafe_runs_still_time_out() -> None:
    result = run(py("import time; time.sleep(30)", run_timeout=0.5), UNSAFE)
    assert result.status == "timeout"


def test_request_validation() -> None:
    with pytest.raises(ValueError, match="language"):
        RunRequest(code="", language="cobol")
    with pytest.raises(ValueError, match="relative path"):
        RunRequest(code="", files={"../escape": "x"})
    with pytest.raises(ValueError, match="run_timeout"):
        RunRequest(code="", run_timeout=0)


# ------------------------------------------------------------------- http and replay


class _FakeSandboxFusion(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        reply = {"status": "Success", "message": "", "run_result": {
            "status": "Finished", "execution_time": 0.01, "return_code": 0, "stdout": body["code"][::-1], "stderr": ""}}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_http_backend_speaks_run_code_and_fails_as_values() -> None:
    server = HTTPServer(("127.0.0.1", 0), _FakeSandboxFusion)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        backend = HttpSandbox(f"http://127.0.0.1:{server.server_port}")
        results = backend.run_many([py("abc"), py("xyz")])
        assert [(r.status, r.stdout) for r in results] == [("ok", "cba"), ("ok", "zyx")]
    finally:
        server.shutdown()
        server.server_close()
    dead = HttpSandbox(f"http://127.0.0.1:{server.server_port}").run(py("abc"))
    assert dead.status == "sandbox_error" and "failed" in dead.message


def test_replay_reproduces_and_reports_differences(pool: SandboxPool) -> None:
    request = py("import sys\nprint(sum(map(int, sys.stdin.read().split())))\nsys.exit(4)", stdin="1 2 3")
    result = pool.run(request)
    rec = json.loads(json.dumps(record(request, result, {"backend": "local", "config": pool.config.to_json()})))
    assert rec["code_sha256"] and rec["result"]["stdout"] == "6\n"
    again = replay(rec, pool)
    assert again.reproduced and again.result is not None and again.result.exit_code == 4
    rec["result"]["exit_code"] = 0
    changed = replay(rec)
    assert not changed.reproduced and changed.differences == ["exit_code: recorded 0, now 4"]


def test_values_round_trip_through_json() -> None:
    request = RunRequest(code="x", files={"a": b"\xff", "b": "t"}, limits=Limits(processes=3))
    assert RunRequest.from_json(json.loads(json.dumps(request.to_json()))) == request
    result = RunResult("killed", signal=9, stdout="o")
    assert RunResult.from_json(result.to_json()) == result
    assert SandboxConfig.from_json(json.loads(json.dumps(UNSAFE.to_json()))) == UNSAFE
