"""int8 linear layers for the engine's fast tier (NativeEngineConfig.quantization = "int8").

Every float32 `nn.Linear` of the engine's model copy (the tied lm_head included) becomes an
`Int8Linear`: the very same weight Parameter (state_dict names and `update_weights` are
unchanged) plus an int8 copy with one scale per output channel (symmetric, max |w| / 127,
values in [-127, 127]), which `repack()` re-quantizes after the weights change, as
PackedLinear's repack does for the float engine. The model's forward (prefill chunks) then
runs on the int8 copies, and the fused decode pass (fused_decode.py) quantizes its own fused
copies of small products and calls the same kernel, inside its whole-pass C loop too.

The products run in cpu_kernels.c's `q8_matmul`, with one of two schemes fixed when the
engine is built (`int8_scheme`):

- "w8a8" where the CPU has AVX-512 VNNI: activations are quantized per token (dynamic, max
  |x| / 127) and multiplied in int8 with VPDPBUSD, whose int32 sums cannot saturate;
- "w8" (weight-only) elsewhere: activations stay float32 and the int8 weights are widened
  in registers. This avoids the u8 x s8 -> int16 pair sums of pre-VNNI AVX2/AVX-512
  (VPMADDUBSW), which saturate at 255 * 127 * 2 > 32767;
- where the kernels do not build (no C compiler), "w8" through torch: slow, but the same
  function, so an int8 engine runs everywhere.

Why our own kernel (measured before choosing, on this AMD EPYC with AVX-512 VNNI, two
shared cores, load average 0.7: the five products of one layer of bench/engine.py's 88M
model plus its head, milliseconds, median of 7; bench/int8.py gives the engine-level figures):

| rows | float32 oneDNN (2 thr) | q8 w8a8 (1) | torch.ao fbgemm (2) | torch._int_mm (2) | q8 w8 (1) |
|---|---|---|---|---|---|
| 1 | 2.86 | 0.61 | 0.58 | 2.01 | 0.96 |
| 8 | 2.91 | 1.19 | 0.78 | 2.10 | 4.00 |
| 64 | 11.9 | 7.03 | 3.90 | 5.01 | 30.1 |

At batch 1, where decode time goes, q8_matmul on one thread matches fbgemm on two and is
4.7x the float product; fbgemm wins at 8+ rows by using both threads (per thread the two
are about even). We keep q8_matmul for every row count: it runs inside the fused decode's
whole-pass C loop (no dispatch per product), scales activations per token (fbgemm per
tensor), and torch.ao.quantization is deprecated and warns on import (research/
fast_tier.md section 2); `torch._int_mm` pays for quantizing in torch operators. The
weight-only fallback (w8, forced here for the measurement) is 3x float32 at batch 1 but
slower from 8 rows on: its float FMAs do 16 products where VPDPBUSD does 64.

The int8 KV cache is a separate setting (kv_cache_dtype, kv_int8.py): it sizes the pool, not
these weights, and either may be on without the other.

Out of scope: int8 embeddings (the lookup stays float32), outlier handling
(LLM.int8, SmoothQuant), GPUs (the vLLM backend), autograd (the engine runs under
inference mode).
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn as nn
from torch import Tensor

from polyrl.engine.runner import cpu_kernels

MAX_IN_FEATURES = 65536
"""int32 sums of u8 x s8 products stay exact while 255 * 127 * in_features < 2**31."""


class Q8Weight(ctypes.Structure):
    """cpu_kernels.c's struct q8_weight."""

    _fields_ = [("w", ctypes.c_void_p), ("scale", ctypes.c_void_p), ("colsum", ctypes.c_void_p),
                ("N", ctypes.c_int64), ("K", ctypes.c_int64), ("Kp", ctypes.c_int64), ("vnni", ctypes.c_int64)]


def int8_scheme() -> tuple[ctypes.CDLL | None, str]:
    """The kernels (None: torch) and the scheme this machine runs: "w8a8" (AVX-512 VNNI) or "w8"."""
    lib = cpu_kernels.load()
    if isinstance(lib, str):
        return None, "w8"
    return lib, "w8a8" if lib.q8_vnni() else "w8"


def quantize_weight(w: Tensor) -> tuple[Tensor, Tensor]:
    """w (N, K) float -> q (N, K) int8 in [-127, 127], scale (N,) float32, w ~ q * scale[:, None]."""
    w = w.detach().float()
    amax = w.abs().amax(dim=1)  # (N,)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


class Int8Weight:
    """One weight (N, K), quantized per output channel and packed for q8_matmul."""

    def __init__(self, w: Tensor, lib: ctypes.CDLL | None, scheme: str) -> None:
        assert scheme in ("w8a8", "w8") and (lib is not None or scheme == "w8")
        N, K = w.shape
        if K > MAX_IN_FEATURES:
            raise ValueError(f"int8 linear layers take at most {MAX_IN_FEATURES} input features, not {K}")
        self.lib, self.scheme, self.N, self.K = lib, scheme, N, K
        q, self.scale = quantize_weight(w)
        self.colsum = q.sum(dim=1, dtype=torch.int32)  # (N,)
        self.q = q  # (N, K): torch's path and tests read it
        if lib is None:
            return
        Np, Kp = -(-N // 16) * 16, (-(-K // 4) * 4 if scheme == "w8a8" else K)
        padded = q.new_zeros(Np, Kp)
        padded[:N, :K] = q
        if scheme == "w8a8":  # (Np/16, Kp/4, 16, 4): 16 outputs x 4 inputs per 64 bytes
            self.packed = padded.view(Np // 16, 16, Kp // 4, 4).permute(0, 2, 1, 3).contiguous()
        else:  # (Np/16, Kp, 16): 16 outputs per input
            self.packed = padded.view(Np // 16, 16, Kp).permute(0, 2, 1).contiguous()
        self.Kp = Kp
        self.struct = Q8Weight(self.packed.data_ptr(), self.scale.data_ptr(), self.colsum.data_ptr(), N, K, Kp,
                               int(scheme == "w8a8"))
        """What C reads; its addresses stay valid while this object lives."""

    def matmul(self, x: Tensor, out: Tensor | None = None, bias: Tensor | None = None,
               accumulate: bool = False) -> Tensor:
        """x (S, K) float32 -> x @ W^T (+ bias), (S, N), written to `out` (contiguous (S, N));
        accumulate=True adds it to what `out` holds (the residual)."""
        S = x.shape[0]
        assert x.dim() == 2 and x.shape[1] == self.K and x.dtype == torch.float32
        if out is None:
            assert not accumulate
            out = torch.empty(S, self.N)
        assert out.shape == (S, self.N) and out.is_contiguous() and out.dtype == torch.float32
        if self.lib is None:  # torch, weight-only
            y = torch.mm(x, self.q.t().float()).mul_(self.scale)
            if bias is not None:
                y.add_(bias)
            return out.add_(y) if accumulate else out.copy_(y)
        x = x.contiguous()  # named: C reads it
        if bias is not None:
            bias = bias.detach().contiguous()
        xq = torch.empty(S * self.Kp if self.scheme == "w8a8" else 0, dtype=torch.uint8)
        xs = torch.empty(S)
        rc = self.lib.q8_matmul(ctypes.byref(self.struct), x.data_ptr(), S, bias.data_ptr() if bias is not None else 0,
                                out.data_ptr(), 1.0 if accumulate else 0.0, xq.data_ptr(), xs.data_ptr())
        assert rc == 0, "a VNNI-packed weight in a kernel build without VNNI"
        return out


class Int8Linear(nn.Module):
    """An nn.Linear whose product runs on an int8 copy of its weight (see the module docstring)."""

    def __init__(self, linear: nn.Linear, lib: ctypes.CDLL | None, scheme: str) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the same Parameter: updates in place reach it
        self.bias = linear.bias
        self.lib, self.scheme = lib, scheme
        self.repack()

    @torch.no_grad()
    def repack(self) -> None:
        """Re-quantize the current weight (after every weight update)."""
        self.q = Int8Weight(self.weight, self.lib, self.scheme)

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        y = self.q.matmul(x.reshape(-1, self.in_features).float(), bias=self.bias)  # (rows, out)
        return y.view(*lead, self.out_features).to(x.dtype)


def quantize_linears(model: nn.Module, scheme: str | None = None) -> list[Int8Linear]:
    """Swap every nn.Linear of `model` for an Int8Linear, in place; returns them (call
    repack() on each after a weight update). scheme None: this machine's (int8_scheme);
    "w8" forces weight-only (tests run both schemes on one machine)."""
    p = next(model.parameters())
    if p.device.type != "cpu" or p.dtype != torch.float32:
        raise ValueError(f"quantization='int8' needs a float32 model on CPU, not {p.dtype} on {p.device.type}")
    lib, best = int8_scheme()
    scheme = scheme or best
    if scheme not in ("w8a8", "w8") or (scheme == "w8a8" and best != "w8a8"):
        raise ValueError(f"int8 scheme {scheme!r} does not run here (this machine: {best!r})")
    targets = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if type(child) is nn.Linear]
    out = []
    for parent, name, child in targets:
        setattr(parent, name, Int8Linear(child, lib, scheme))
        out.append(getattr(parent, name))
    return out
