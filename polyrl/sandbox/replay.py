"""Replay records: one execution as a JSON-able dict, and re-running it to compare.

`record(...)` captures what is needed to re-run and to audit an execution: the request
(code, stdin, files, limits), a hash of the code, the sandbox settings, the capped
stdout/stderr with their hashes, the exit status or signal, resource use, and, when a
grader supplies them, the per-test verdicts and the name of a `rejudge` function
("module:function") with the data it needs to recompute verdicts from a new result.
`replay(rec)` re-runs the request (on the backend named by the settings, or the one given),
recomputes verdicts through `rejudge` when the record has one, and reports whether the
verdict reproduces and, where not, what differs.

The sandbox knows nothing of grading: `rejudge` is imported by name, lazily, so records
from any grader replay through the same function. A rejudge function has the signature
`rejudge(data: dict, result: RunResult, backend: SandboxBackend) -> list[dict]`, each dict
carrying at least "name" and "passed".

Not covered: byte-identical stdout (timings, addresses and randomness differ between
runs; only status, exit code, signal and verdicts are compared), and the environment
outside the sandbox settings (kernel, interpreter build; the record notes the python path).
"""

from __future__ import annotations

import hashlib
import importlib
import platform
from dataclasses import dataclass, field
from typing import Any, Callable

from polyrl.sandbox.pool import SandboxBackend, SandboxPool
from polyrl.sandbox.types import RunRequest, RunResult, SandboxConfig

RECORD_VERSION = 1


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode(errors="surrogatepass")).hexdigest()


def record(
    request: RunRequest, result: RunResult, settings: dict[str, Any], *, verdicts: list[dict[str, Any]] | None = None,
    rejudge: str | None = None, rejudge_data: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A JSON-able record of one execution. `settings` names the backend: {"backend":
    "local", "config": SandboxConfig.to_json()} or {"backend": "http", "url": ...}."""
    return {
        "version": RECORD_VERSION,
        "code_sha256": _sha256(request.code),
        "stdin_sha256": _sha256(request.stdin),
        "request": request.to_json(),
        "settings": {**settings, "host": platform.node(), "kernel": platform.release()},
        "result": result.to_json(),
        "stdout_sha256": _sha256(result.stdout),
        "stderr_sha256": _sha256(result.stderr),
        "verdicts": verdicts,
        "rejudge": rejudge,
        "rejudge_data": rejudge_data,
    }


@dataclass
class ReplayResult:
    reproduced: bool
    """Status, exit code, signal and (when recorded) every verdict match."""
    differences: list[str] = field(default_factory=list)
    result: RunResult | None = None
    verdicts: list[dict[str, Any]] | None = None


def backend_for(settings: dict[str, Any]) -> SandboxBackend:
    if settings.get("backend") == "http":
        from polyrl.sandbox.http import HttpSandbox

        return HttpSandbox(settings["url"])
    return SandboxPool(workers=1, config=SandboxConfig.from_json(settings.get("config", {})))


def _resolve(name: str) -> Callable[[dict[str, Any], RunResult, SandboxBackend], list[dict[str, Any]]]:
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)


def replay(rec: dict[str, Any], backend: SandboxBackend | None = None) -> ReplayResult:
    """Re-run a record and compare. Raises ValueError for a record this version cannot read."""
    if rec.get("version") != RECORD_VERSION:
        raise ValueError(f"replay record version {rec.get('version')!r} is not {RECORD_VERSION}")
    own = backend is None
    backend = backend or backend_for(rec["settings"])
    try:
        request = RunRequest.from_json(rec["request"])
        result = backend.run(request)
        old = RunResult.from_json(rec["result"])
        differences = [
            f"{name}: recorded {getattr(old, name)!r}, now {getattr(result, name)!r}"
            for name in ("status", "exit_code", "signal") if getattr(old, name) != getattr(result, name)
        ]
        verdicts = None
        if rec.get("rejudge"):
            verdicts = _resolve(rec["rejudge"])(rec["rejudge_data"], result, backend)
            differences += _verdict_differences(rec.get("verdicts") or [], verdicts)
        return ReplayResult(not differences, differences, result, verdicts)
    finally:
        if own:
            backend.close()


def _verdict_differences(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[str]:
    if len(old) != len(new):
        return [f"verdicts: recorded {len(old)} tests, now {len(new)}"]
    return [
        f"{a['name']}: recorded {'pass' if a['passed'] else 'fail'} ({a.get('status')}), "
        f"now {'pass' if b['passed'] else 'fail'} ({b.get('status')})"
        for a, b in zip(old, new) if a["passed"] != b["passed"]
    ]
