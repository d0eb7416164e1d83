"""N trainer processes on this machine (`polyrl train --nproc N`), as torchrun --standalone starts them.

    code = run_ranks([sys.executable, "-m", "polyrl.cli", "train", ...], n=2)

Every process runs the same command with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR (127.0.0.1) and a free MASTER_PORT set, the environment torch.distributed's
`env://` rendezvous reads (train/distributed.py: init_from_env), and OMP_NUM_THREADS at
its share of the cores unless set. The processes stay in this process's group, so Ctrl-C
reaches each of them at once: rank 0 ends the run at the next step boundary and tells
the others (train/ranks.py), and this waits for them. The exit status is the first
failing rank's (rank 0's refusal of a bad run directory, say), else rank 0's. A rank that
fails ends the others (SIGTERM), and so does rank 0 ending while others still run after
GRACE_S: no rank is left waiting for a collective.

torchrun does the same for one machine and more, with restarts; this keeps polyrl's own
exit statuses and messages (torchrun answers Ctrl-C with a traceback of its own).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time

GRACE_S = 60.0
"""How long the other ranks may run on after rank 0 ended."""


def run_ranks(command: list[str], n: int, poll_s: float = 0.2) -> int:
    """`command` on n ranks, until all have ended; the first failing rank's exit status, else rank 0's."""
    port = free_port()
    threads = os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // n)))
    procs = [subprocess.Popen(command, env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(n),
                                            "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1",
                                            "MASTER_PORT": str(port), "OMP_NUM_THREADS": threads})
             for r in range(n)]
    first_failure, rank0_ended = 0, None
    while True:
        codes = [p.poll() for p in procs]  # every one: a rank that ended is only seen when polled
        first_failure = first_failure or next((c for c in codes if c not in (None, 0)), 0)
        if None not in codes:
            break
        if codes[0] is not None and rank0_ended is None:
            rank0_ended = time.monotonic()
        if first_failure or (rank0_ended is not None and time.monotonic() - rank0_ended > GRACE_S):
            for p in procs:
                if p.poll() is None:
                    p.terminate()
        try:
            time.sleep(poll_s)
        except KeyboardInterrupt:  # the ranks received it too; rank 0 decides when to end
            pass
    code = first_failure or procs[0].returncode or next((p.returncode for p in procs if p.returncode), 0)
    return code if code >= 0 else 128 - code  # killed by signal s: 128 + s, as a shell reports it


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` that nothing listens on now ("": every interface)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
