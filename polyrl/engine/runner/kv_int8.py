"""The int8 KV pool (NativeEngineConfig.kv_cache_dtype = "int8"): K and V stored as int8.

Each (position, kv head) vector of head_dim values is quantized symmetrically on its own:
scale s = max |x| / 127, rounded to bfloat16, and q = round(x / s) clamped to [-127, 127];
it reads back as q * s. A token then costs head_dim + 2 bytes per kv head and layer, for K
and for V, instead of 4 * head_dim in float32: 3.76x the tokens at head_dim 32, 3.88x at
128 (1.88x and 1.94x against bfloat16). Why per position and not per block: a block fills
one token at a time (decodes), so a block scale would have to grow, and re-quantize the
block, whenever a larger value arrives; a per-position scale is final when written, and a
block shared through the prefix cache is never rewritten. Why bfloat16 scales: float32's
range (no underflow for tiny heads) at 2 bytes; its 8-bit mantissa only moves the grid,
since q is computed from the stored scale.

Every write quantizes (the model's forward writes a step's new K/V; the fused decode's
`write_back` the burst's), and every read dequantizes (prefill chunks' gathers, the decode
cache's fills). The invariant that keeps the engine's equivalences (prefix-cached =
uncached, speculative = greedy, preempted = not): attention always sees `fake_quant(x)`,
the value the pool gives back, including a decode's own new token in the decode cache's
float rows (paged_attention.py returns it from `write`; the fused pass rounds it the same
way in C, cpu_kernels.c's `fake_q8`). Decode attention itself stays float.

Out of scope: int8 attention arithmetic (dequantized keys are float), per-channel key
scales and 4-bit (KIVI), a full-precision recent window (it would break the invariant),
calibrated scales (fp8 in vLLM).
"""

from __future__ import annotations

import torch
from torch import Tensor

SCALE_DTYPE = torch.bfloat16


def quantize(x: Tensor) -> tuple[Tensor, Tensor]:
    """x (..., hd) float -> q (..., hd) int8, scale (...,) bfloat16, q * scale ~ x.

    |x - q * scale| <= scale / 2 (about max |x| / 254) up to the scale's rounding."""
    x = x.float()
    scale = (x.abs().amax(-1) / 127).to(SCALE_DTYPE)  # (...,)
    s = scale.float()
    s = torch.where(s > 0, s, torch.ones_like(s))  # an all-zero vector: q = 0
    q = torch.round(x / s[..., None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def dequantize(q: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """q (..., hd) int8, scale (...,) -> q * scale (..., hd) in dtype (computed in float32)."""
    return (q.float() * scale.float()[..., None]).to(dtype)


def fake_quant(x: Tensor) -> Tensor:
    """What the pool gives back for x: dequantize(quantize(x)) in x's dtype."""
    return dequantize(*quantize(x), x.dtype)


class Int8KVPool:
    """K and V of every layer as int8 (layers, num_blocks + 1, block_size, n_kv, hd) with
    bfloat16 scales (layers, num_blocks + 1, block_size, n_kv); the methods of KVPool
    (paged_attention.py), reading and writing in `dtype`, the model's."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype) -> None:
        shape = (num_layers, num_blocks + 1, block_size, num_kv_heads, head_dim)
        self.k = torch.empty(shape, dtype=torch.int8)  # untouched pages cost no memory (KVPool)
        self.v = torch.empty(shape, dtype=torch.int8)
        self.k_scale = torch.empty(shape[:-1], dtype=SCALE_DTYPE)
        self.v_scale = torch.empty(shape[:-1], dtype=SCALE_DTYPE)
        self.dtype = dtype
        self.block_size = block_size
        self.scratch_slot = num_blocks * block_size
        self.zeroed = 0
        for t in self._tensors():
            t[:, num_blocks].zero_()

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """int8 values plus one 2-byte scale per kv head, for K and V, in every layer (dtype unused)."""
        return 2 * num_layers * num_kv_heads * (head_dim + SCALE_DTYPE.itemsize)

    def _tensors(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return self.k, self.v, self.k_scale, self.v_scale

    def zero_up_to(self, num_blocks: int) -> None:
        """Make sure blocks [0, num_blocks) hold finite values (zeros: q = 0, scale = 0)."""
        if num_blocks > self.zeroed:
            for t in self._tensors():
                t[:, self.zeroed:num_blocks].zero_()
            self.zeroed = num_blocks

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._tensors())

    def write(self, layer: int, slots: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k, v (N, n_kv, hd), quantized into `layer` at slots (N,); returns what a read gives back."""
        out = []
        for x, q_pool, s_pool in ((k, self.k, self.k_scale), (v, self.v, self.v_scale)):
            q, s = quantize(x)
            n_kv, hd = x.shape[1:]
            q_pool[layer].view(-1, n_kv, hd).index_copy_(0, slots, q)
            s_pool[layer].view(-1, n_kv).index_copy_(0, slots, s)
            out.append(dequantize(q, s, x.dtype))
        return out[0], out[1]

    def write_layers(self, slots: Tensor, k: Tensor, v: Tensor) -> None:
        """k, v (layers, M, n_kv, hd), quantized into every layer at slots (M,)."""
        for x, q_pool, s_pool in ((k, self.k, self.k_scale), (v, self.v, self.v_scale)):
            q, s = quantize(x)
            layers, _, n_kv, hd = x.shape
            q_pool.view(layers, -1, n_kv, hd).index_copy_(1, slots, q)
            s_pool.view(layers, -1, n_kv).index_copy_(1, slots, s)

    def gather(self, layer: int, blocks: Tensor) -> tuple[Tensor, Tensor]:
        """Blocks (B,) of `layer`, dequantized: K and V (B, block_size, n_kv, hd) in self.dtype."""
        return (dequantize(self.k[layer].index_select(0, blocks), self.k_scale[layer].index_select(0, blocks),
                           self.dtype),
                dequantize(self.v[layer].index_select(0, blocks), self.v_scale[layer].index_select(0, blocks),
                           self.dtype))
