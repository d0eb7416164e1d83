"""The attention hook between the model and whatever holds keys and values.

The transformer computes q, k, v (RoPE applied) and hands them to an `AttentionBackend`;
the backend decides which keys each query sees. `CausalAttention` is the cache-free
default (training, scoring, equivalence tests); KV-cache backends (dense, paged) live
in `engine/` and implement the same protocol.

`DocumentCausalAttention` serves packed rows (several sequences back to back in one
row, each attending only to itself), with positions restarting per sequence.
`SegmentedCausalAttention` does the same for rows of one shared layout without a (T, T) mask:
one causal kernel call per sequence, so a packed 8k-token row costs what its sequences cost.

Out of scope here: sliding windows, attention sinks, soft-capping.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor


class AttentionBackend(Protocol):
    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """q: (B, n_heads, T, hd) and k, v: (B, n_kv_heads, T, hd) for the NEW tokens, RoPE applied.

        Returns (B, n_heads, T, hd). A backend with a cache stores k, v for `layer` and
        attends over cached + new keys.
        """
        ...


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """(B, n_kv, T, hd) -> (B, n_kv * n_rep, T, hd): each kv head serves n_rep query heads.

    Same layout as `x.repeat_interleave(n_rep, dim=1)` (query head h uses kv head h // n_rep).
    """
    if n_rep == 1:
        return x
    B, n_kv, T, hd = x.shape
    return x[:, :, None].expand(B, n_kv, n_rep, T, hd).reshape(B, n_kv * n_rep, T, hd)


class CausalAttention:
    """Causal self-attention over just the given tokens, no cache.

    key_padding_mask: optional (B, T), True/1 = real token. Works for left- or
    right-padded batches. Every position may attend to itself, so a pad query whose
    keys are all masked gets a finite (meaningless) output instead of NaN.
    """

    def __init__(self, key_padding_mask: Tensor | None = None) -> None:
        self.key_padding_mask = None if key_padding_mask is None else key_padding_mask.bool()

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.key_padding_mask is None:  # the kernel maps query heads to kv heads: no repeated copies
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        # Repeated copies here, as the cached tiny reward models were trained (their gradients
        # would round differently with enable_gqa).
        n_rep = q.shape[1] // k.shape[1]
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, nh, T, hd)
        T = q.shape[2]
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()  # (T, T)
        eye = torch.eye(T, dtype=torch.bool, device=q.device)  # (T, T)
        mask = (causal & self.key_padding_mask[:, None, None, :]) | eye  # (B, 1, T, T)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class DocumentCausalAttention:
    """Causal attention within documents of a packed batch.

    documents: (B, T) integer document id per position (any value for padding, which
    only has to differ from its neighbours' ids to stay out of their way). A query sees
    the keys of its own document up to itself.
    """

    def __init__(self, documents: Tensor, dtype: torch.dtype | None = None) -> None:
        """`dtype`: compute attention in it whatever autocast says (float32 under a bfloat16
        autocast keeps the softmax exact; on CPU its backward is also faster in float32)."""
        T = documents.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=documents.device).tril()  # (T, T)
        same = documents[:, :, None] == documents[:, None, :]  # (B, T, T)
        self.mask = (same & causal)[:, None]  # (B, 1, T, T)
        self.dtype = dtype

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        n_rep = q.shape[1] // k.shape[1]
        if self.dtype is None:
            return F.scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), attn_mask=self.mask)
        q, k, v = q.to(self.dtype), k.to(self.dtype), v.to(self.dtype)
        with torch.autocast(q.device.type, enabled=False):
            return F.scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), attn_mask=self.mask)


class SegmentedCausalAttention:
    """Causal attention within back-to-back sequences of the given lengths, the same for every
    row: each sequence runs the causal kernel on its own slice (no (T, T) mask is built), so
    the result equals DocumentCausalAttention's with memory linear in the row's length."""

    def __init__(self, lengths: list[int]) -> None:
        if not lengths or min(lengths) < 1:
            raise ValueError(f"segment lengths must be positive, got {lengths}")
        self.lengths = list(lengths)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if q.shape[2] != sum(self.lengths):
            raise ValueError(f"{q.shape[2]} positions, segments of {sum(self.lengths)}")
        if len(self.lengths) == 1:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        parts = [F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
                 for qs, ks, vs in zip(q.split(self.lengths, 2), k.split(self.lengths, 2), v.split(self.lengths, 2))]
        return torch.cat(parts, dim=2)
