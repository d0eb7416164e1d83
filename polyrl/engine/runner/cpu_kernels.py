"""Build and load cpu_kernels.c: the fused decode kernels, compiled on first use.

The source is compiled with the system C compiler ($CC, else `cc`) for this machine's
CPU (-march=native) into the polyrl cache (POLYRL_CACHE, as for the tiny models). The
file is named by a hash of the source, the flags, the compiler's version and the CPU's
feature flags, so a cache shared between machines never runs code built for another
CPU. Loading is through ctypes: no Python headers and no PyTorch headers, so the build
is one short compiler call.

The flags allow what the kernels need to vectorise and nothing that changes results:
-fno-math-errno / -fno-trapping-math let comparisons and sqrt become vector
instructions. No -ffast-math: nothing is reassociated beyond the marked `omp simd`
reductions. -fopenmp lets the per-row kernels split their rows over torch's own OpenMP
threads (the library's libgomp.so.1 is the one torch has loaded; cpu_kernels.c says
why); where that build fails (a compiler without OpenMP) the kernels are built with
-fopenmp-simd alone and run on one thread, with the same results.

The whole-pass kernel (decode_pass) does its matrix products with the BLAS `sgemm_`
that torch's own library exports (MKL in the x86 wheels): `blas_sgemm()` finds it and
checks it on one product, or says why not, and the pass then keeps its layer loop in
Python.

`load()` returns the library, or a reason why not (no compiler, a failed build, a
platform without ELF shared objects); the engine then keeps to the model's own forward
pass (fused_decode.py). Nothing here raises for a missing compiler.

Out of scope: Windows and macOS toolchains (they get the reason and the fallback),
prebuilt wheels.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("cpu_kernels.c")
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fPIC", "-shared", "-std=c99"]
OPENMP = ["-fopenmp"], ["-fopenmp-simd"]
"""Tried in order: threaded kernels, then (no OpenMP in this compiler) one thread."""

_ptr = ctypes.c_void_p  # every pointer (float, double, int64) travels as an address: tensor.data_ptr()
_i64 = ctypes.c_int64
SIGNATURES = {
    "rms_norm": [_ptr, _ptr, _ptr, _i64, _i64, ctypes.c_float],
    "silu_mul": [_ptr, _ptr, _i64, _i64, _i64],
    "rope_attend": [_ptr, _i64, _i64, _i64, _i64, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _i64, _ptr,
                    ctypes.c_float, _ptr, _i64, _i64],
    "sample_rows": [_ptr, _i64, _i64, _ptr, _ptr, _ptr, _ptr, _ptr, _i64],
    "cache_to_pool": [_ptr, _ptr, _i64, _i64, _i64, _i64, _i64, _ptr, _i64, _ptr, _ptr, _i64, _ptr, _ptr, _i64],
    "decode_pass": [_ptr],
    "decode_burst": [_ptr, _i64, _ptr, _ptr, _ptr, _ptr, _i64, _ptr, _ptr, _ptr, _ptr, _ptr],
    "q8_vnni": [],
    "q8_matmul": [_ptr, _ptr, _i64, _ptr, _ptr, ctypes.c_float, _ptr, _ptr],
}
RETURNS = {"decode_burst": _i64, "cache_to_pool": _i64, "q8_vnni": ctypes.c_int, "q8_matmul": ctypes.c_int}


class DecodeLayer(ctypes.Structure):
    """cpu_kernels.c's struct decode_layer: one layer's weight addresses (0 for no bias)."""

    _fields_ = [(name, _ptr) for name in ("norm1", "wqkv", "bqkv", "wo", "bo", "norm2", "wgu", "bgu", "wdown",
                                          "bdown", "qqkv", "qo", "qgu", "qdown")]


class DecodeArgs(ctypes.Structure):
    """cpu_kernels.c's struct decode_args: everything one whole decode pass reads and writes."""

    _fields_ = ([("sgemm", _ptr), ("layers", _ptr)]
                + [(name, _i64) for name in ("n_layers", "S", "D", "nh", "nkv", "hd", "inter", "V", "L",
                                             "layer_stride")]
                + [("eps", ctypes.c_float), ("scale", ctypes.c_float)]
                + [(name, _ptr) for name in ("embed", "ids", "pos", "rows", "cos_t", "sin_t", "kc", "vc",
                                             "final_norm", "whead", "bhead", "logits", "x", "h", "qkv", "attn",
                                             "gu", "act", "scores", "qhead", "xq", "xs")]
                + [("kv_q8", _i64), ("threads", _i64)])

_loaded: ctypes.CDLL | str | None = None


def load() -> ctypes.CDLL | str:
    """The compiled kernels (built once per machine and source), or why they are unavailable."""
    global _loaded
    if _loaded is None:
        _loaded = _build_and_load()
    return _loaded


def _build_and_load() -> ctypes.CDLL | str:
    if platform.system() != "Linux":
        return f"fused CPU kernels are built on Linux only (this is {platform.system()})"
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        return f"no C compiler ({cc!r} not found; install gcc or set CC)"
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return f"C compiler {cc!r} does not run: {e}"
    import torch  # noqa: F401  (loaded first: its libgomp.so.1 is the one the threaded build links to)

    failures = []
    for openmp in OPENMP:
        built = _build(cc, version, FLAGS + openmp)
        if isinstance(built, str):
            failures.append(built)
            continue
        try:
            lib = ctypes.CDLL(str(built))
        except OSError as e:
            failures.append(f"loading {built} failed: {e}")
            continue
        for name, argtypes in SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, RETURNS.get(name)
        lib.threaded = openmp == OPENMP[0]
        """Whether the per-row kernels may use several threads (else they run on one)."""
        return lib
    return "; ".join(failures)


def _build(cc: str, version: str, flags: list[str]) -> Path | str:
    """The library built with `flags` (from the cache when built before), or why not."""
    key = hashlib.sha256("\0".join([SOURCE.read_text(), " ".join(flags), version, _cpu_flags()]).encode())
    from polyrl.cache import cache_dir

    target = cache_dir() / "kernels" / f"cpu_kernels-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        try:
            done = subprocess.run([cc, *flags, str(SOURCE), "-o", str(out), "-lm"], capture_output=True,
                                  text=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as e:
            return f"building {SOURCE.name} failed: {e}"
        if done.returncode != 0:
            return f"building {SOURCE.name} with {cc} {' '.join(flags)} failed: {done.stderr.strip()[-500:]}"
        os.replace(out, target)  # atomic: concurrent builders each land a whole file
    return target


_sgemm: int | str | None = None


def blas_sgemm() -> int | str:
    """The address of the BLAS `sgemm_` (Fortran interface) inside this torch build, checked
    on one small product against torch.mm; or why it cannot be used (a torch built without
    MKL exports none). decode_pass calls it for its matrix products."""
    global _sgemm
    if _sgemm is None:
        _sgemm = _find_sgemm()
    return _sgemm


def _find_sgemm() -> int | str:
    import torch

    lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        fn = ctypes.CDLL(str(lib)).sgemm_  # already loaded by torch: this only looks the symbol up
    except (OSError, AttributeError) as e:
        return f"no BLAS sgemm_ in {lib.name}: {e}"
    fn.restype = None
    a, b = torch.randn(3, 5), torch.randn(5, 4)  # row-major a @ b, computed as (b^T a^T) column-major
    c = torch.empty(3, 4)
    m, n, k = ctypes.c_int(4), ctypes.c_int(3), ctypes.c_int(5)
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    ref = ctypes.byref
    fn(b"N", b"N", ref(m), ref(n), ref(k), ref(one), _ptr(b.data_ptr()), ref(m), _ptr(a.data_ptr()), ref(k),
       ref(zero), _ptr(c.data_ptr()), ref(m))
    if not torch.allclose(c, a @ b, atol=1e-5):
        return f"{lib.name}'s sgemm_ does not compute a float32 product with 32-bit sizes"
    return ctypes.cast(fn, _ptr).value


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()
