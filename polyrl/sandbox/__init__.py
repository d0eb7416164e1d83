"""Isolated execution: run a program under limits and say what happened.

    from polyrl.sandbox import RunRequest, SandboxPool
    with SandboxPool(workers=2) as pool:
        result = pool.run(RunRequest(code="print(1)"))   # RunResult(status="ok", stdout="1\\n", ...)

The sandbox knows nothing of tasks or grading (that is polyrl.rewards).
"""

from polyrl.sandbox.bwrap import BubblewrapMissing, SandboxUnavailable
from polyrl.sandbox.pool import SandboxBackend, SandboxPool
from polyrl.sandbox.replay import ReplayResult, record, replay
from polyrl.sandbox.runner import run
from polyrl.sandbox.types import Limits, RunRequest, RunResult, SandboxConfig

__all__ = [
    "BubblewrapMissing", "Limits", "ReplayResult", "RunRequest", "RunResult", "SandboxBackend", "SandboxConfig",
    "SandboxPool", "SandboxUnavailable", "record", "replay", "run",
]
