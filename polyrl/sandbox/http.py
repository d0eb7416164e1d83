"""A SandboxBackend that posts to a SandboxFusion-compatible `/run_code` service.

Requests map one to one onto SandboxFusion's `/run_code` body (code, language, stdin,
run_timeout, memory_limit_MB, files as base64); the reply's run_result becomes a
RunResult. Transport failures are results with status "sandbox_error", never exceptions.
`run_many` posts from a few threads at once (the service does the queueing).

Not covered: our extra Limits (processes, file size, tmpfs size: the service applies its
own; output caps are applied here, after the fact), authentication, retries, and
SandboxFusion's compile step and fetch_files.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from polyrl.sandbox.types import RunRequest, RunResult


class HttpSandbox:
    def __init__(self, url: str, concurrency: int = 8, timeout_margin_s: float = 30.0):
        self.url = url.rstrip("/") + ("" if url.rstrip("/").endswith("/run_code") else "/run_code")
        self.concurrency = concurrency
        self.timeout_margin_s = timeout_margin_s

    def run(self, request: RunRequest) -> RunResult:
        files = {name: base64.b64encode(data if isinstance(data, bytes) else data.encode()).decode()
                 for name, data in request.files.items()}
        body = {"code": request.code, "language": request.language, "stdin": request.stdin,
                "run_timeout": request.run_timeout, "memory_limit_MB": request.memory_limit_MB, "files": files}
        post = urllib.request.Request(self.url, data=json.dumps(body).encode(),
                                      headers={"Content-Type": "application/json"}, method="POST")
        start = time.monotonic()
        try:
            with urllib.request.urlopen(post, timeout=request.run_timeout + self.timeout_margin_s) as reply:
                data = json.loads(reply.read())
        except (urllib.error.URLError, OSError, ValueError) as err:
            elapsed = time.monotonic() - start
            return RunResult("sandbox_error", message=f"POST {self.url} failed: {err}", wall_time_s=elapsed)
        return from_sandboxfusion(data, request, time.monotonic() - start)

    def run_many(self, requests: Sequence[RunRequest]) -> list[RunResult]:
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(self.run, requests))

    def close(self) -> None:
        pass


def from_sandboxfusion(data: dict[str, Any], request: RunRequest, wall_time_s: float) -> RunResult:
    """RunResult from a `/run_code` reply body."""
    run = data.get("run_result") or {}
    limits = request.limits
    stdout, stderr = run.get("stdout") or "", run.get("stderr") or ""
    result = RunResult(
        "ok", exit_code=run.get("return_code"), stdout=stdout[: limits.stdout_max_bytes],
        stderr=stderr[: limits.stderr_max_bytes], stdout_truncated=len(stdout) > limits.stdout_max_bytes,
        stderr_truncated=len(stderr) > limits.stderr_max_bytes,
        wall_time_s=float(run.get("execution_time") or wall_time_s), message=data.get("message") or "",
    )
    if data.get("status") == "SandboxError" or not run:
        result.status = "sandbox_error"
    elif run.get("status") == "TimeLimitExceeded":
        result.status = "timeout"
    elif result.stdout_truncated or result.stderr_truncated:
        result.status = "output_limit"
    elif result.exit_code != 0:
        result.status = "error"
    return result
