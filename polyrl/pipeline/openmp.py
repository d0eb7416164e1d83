"""One OpenMP thread for a role's own thread, so that the trainer's torch kernels keep their speed.

torch runs its CPU kernels on OpenMP, and OpenMP keeps one team of threads per thread that
starts a parallel region. When a role's thread beside the trainer (stream.py) runs a torch
kernel of its own (copying a new version's weights into the engine's shared tensors,
scoring with a reward model), it gets a second team, and the process then holds more
OpenMP threads than cores. libgomp reacts to that by having its idle threads sleep almost
at once instead of spinning between parallel regions, so every small kernel of the
trainer's update then waits for a sleeping thread to wake. On the 2-core machine the
quickstart's update took 0.875 s a step with the roles in threads, 0.487 s with the role
threads held to one OpenMP thread, and 0.486 s with the roles inline in the trainer's
thread (bench/role_threads.py; BENCHMARKS.md, the pipeline).

`omp_set_num_threads` sets the calling thread's own default (an OpenMP internal control
variable per thread), so the trainer's thread keeps its own. The OpenMP runtime is the one
torch loaded (torch/lib: libgomp in the Linux wheels, libomp or libiomp5 elsewhere); where
none is found the call does nothing and says so.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

RUNTIMES = ("libgomp.so.1", "libgomp.so", "libiomp5.so", "libomp.so", "libomp.dylib", "libiomp5.dylib")


def one_thread_here() -> bool:
    """The calling thread's torch kernels run on one OpenMP thread from now on; whether
    an OpenMP runtime was found to tell."""
    import torch

    lib = _runtime()
    if lib is None:
        return False
    torch.get_num_threads()  # torch's own set-up of this thread first: it would overwrite ours later
    lib.omp_set_num_threads(1)
    return True


@functools.cache
def _runtime() -> ctypes.CDLL | None:
    """The OpenMP runtime torch loaded, or None."""
    import torch

    for name in RUNTIMES:
        path = Path(torch.__file__).parent / "lib" / name
        if path.exists():
            try:
                lib = ctypes.CDLL(str(path))
                lib.omp_set_num_threads.argtypes = [ctypes.c_int]
            except (OSError, AttributeError):
                continue
            return lib
    return None
