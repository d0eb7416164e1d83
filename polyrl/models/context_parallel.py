"""Context parallelism: one long sequence's forward split over the P ranks of a process group.

Layout (`SequenceShard`, LAYOUTS). The sequence (length T) is padded at the end to a
multiple of the chunk count and cut into chunks of C tokens:
- "contiguous": P chunks, rank r holds chunk r;
- "zigzag" (head-tail): 2P chunks, rank r holds chunks r and 2P-1-r, so every rank has
  the same causal attention work (with contiguous chunks rank r has (r+1)/P of the last's).
Padding at the end is exact: under causal attention no real token sees a later one, and the
caller's loss mask leaves the pad tokens out. Each rank embeds its own tokens, rotates them
with RoPE at their global positions (`SequenceShard.positions`, passed to
`Transformer.hidden`), and runs every layer on its tokens only; only attention needs other
ranks' tokens.

Attention (`GatheredKVAttention`): an all-gather of keys and values (one collective per
layer, K and V stacked), as in Llama 3's context parallelism. A chunk's queries see every
earlier chunk in full and their own chunk causally. The gather is differentiable: its
backward is a reduce-scatter, so the gradient of each rank's K/V is the sum of what every
rank's queries sent back to it. Two kernels compute the same attention:
- "split" (CPU): per chunk, two unmasked flash-kernel calls, the earlier chunks' keys and
  its own (causal), merged by their log-sum-exps, with the exact blockwise backward
  (`_PrefixAndDiagonal`);
- "masked" (any device): one SDPA call over the gathered keys with a mask built from global
  positions. On CPU it is slower, and the (S, keys) mask costs memory.

Why all-gather, not a ring:
- Exactness first: each chunk's attention is over the same keys as one process's, with one
  merge of two blocks, not P steps of online-softmax rescaling.
- Memory: activations are 1/P per rank except keys and values kept for the backward:
  contiguous, rank r keeps (r+1)·S positions of K and V per layer (the last rank all T);
  zigzag, every rank about T (its tail chunk sees nearly all keys). With GQA these are
  small (2·n_kv·hd numbers per token per layer, against the hidden states and MLP
  activations). A ring would keep S per rank, at the price of P blockwise steps per layer
  and a ring of sends in the backward too.
- Zigzag is the default of train/context_parallel.py: the most any rank holds is the same
  as contiguous (about T keys), and the work is balanced, so no rank waits for the last.

Out of scope: packed rows (document masks across shards), padding masks other than the end,
dynamic NTK RoPE left unpinned (`Rotary.per_call`: its base would differ per rank), KV caches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor


LAYOUTS = ("contiguous", "zigzag")
"""How the sequence is dealt to the ranks: "contiguous" = rank r holds chunk r of P;
"zigzag" = rank r holds chunks r and 2P-1-r of 2P (head and tail: equal causal work)."""


@dataclass(frozen=True)
class SequenceShard:
    """Which part of a length-`length` sequence rank `rank` of `world_size` holds."""

    rank: int
    world_size: int
    length: int
    """T, the real (unpadded) sequence length"""
    layout: str = "contiguous"
    """one of LAYOUTS"""

    def __post_init__(self) -> None:
        assert 0 <= self.rank < self.world_size and self.length > 0, self
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout {self.layout!r}: must be one of {', '.join(LAYOUTS)}")

    @property
    def chunk(self) -> int:
        """C: tokens per chunk (P chunks of the padded sequence, or 2P for zigzag)."""
        chunks = self.world_size * (2 if self.layout == "zigzag" else 1)
        return -(-self.length // chunks)

    def chunk_ids(self, rank: int | None = None) -> tuple[int, ...]:
        """The chunks `rank` (default this one) holds, in its local order."""
        r = self.rank if rank is None else rank
        return (r, 2 * self.world_size - 1 - r) if self.layout == "zigzag" else (r,)

    @property
    def size(self) -> int:
        """S: tokens per rank."""
        return self.chunk * len(self.chunk_ids())

    @property
    def padded(self) -> int:
        """P·S: the length after padding the end (a multiple of the chunk count)."""
        return self.size * self.world_size

    def positions(self, batch: int = 1, device: torch.device | str = "cpu", rank: int | None = None) -> Tensor:
        """(batch, S) global positions of `rank`'s tokens (default this rank; pad tokens continue past T)."""
        C = self.chunk
        pos = torch.cat([torch.arange(c * C, (c + 1) * C, device=device) for c in self.chunk_ids(rank)])
        return pos.expand(batch, self.size)

    def take(self, x: Tensor, pad: float | int = 0, dim: int = 1) -> Tensor:
        """This rank's tokens along `dim` of a full-length (T) tensor, padded at the end with `pad`."""
        assert x.shape[dim] == self.length, (x.shape, dim, self.length)
        if self.padded > self.length:
            shape = list(x.shape)
            shape[dim] = self.padded - self.length
            x = torch.cat((x, x.new_full(shape, pad)), dim=dim)
        return torch.cat([x.narrow(dim, c * self.chunk, self.chunk) for c in self.chunk_ids()], dim=dim)


class _GatherPrefix(torch.autograd.Function):
    """x (..., S, hd) on every rank -> the first `keep` ranks' x concatenated (..., keep·S, hd).
    Backward: each rank's gradient for its own shard, summed over ranks (a reduce-scatter)."""

    @staticmethod
    def forward(ctx, x: Tensor, keep: int, group: dist.ProcessGroup | None) -> Tensor:
        world = dist.get_world_size(group)
        ctx.keep, ctx.group, ctx.world, ctx.shape = keep, group, world, x.shape
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x.contiguous(), group=group)
        if keep == 0:  # rank 0 has no earlier ranks, but joins the collective (and its backward)
            return x.new_empty(*x.shape[:-2], 0, x.shape[-1])
        return torch.cat(parts[:keep], dim=-2)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        chunks = list(grad.chunk(ctx.keep, dim=-2)) if ctx.keep else []
        chunks = [c.contiguous() for c in chunks]
        chunks += [grad.new_zeros(ctx.shape) for _ in range(ctx.world - ctx.keep)]  # ranks past the prefix
        mine = torch.empty(ctx.shape, dtype=grad.dtype, device=grad.device)
        dist.reduce_scatter(mine, chunks, group=ctx.group)
        return mine, None, None


def gather_prefix(x: Tensor, keep: int, group: dist.ProcessGroup | None = None) -> Tensor:
    """Differentiable all-gather along dim -2 keeping ranks 0..keep-1 (see _GatherPrefix)."""
    return _GatherPrefix.apply(x, keep, group)


_FLASH_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_FLASH_CPU_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


class _PrefixAndDiagonal(torch.autograd.Function):
    """Causal attention of this rank's queries over earlier ranks' keys (all visible) and its
    own (causal), as two unmasked flash-kernel calls merged by log-sum-exp: no (S, keys) mask.

    The backward is exact blockwise flash attention (as in ring attention): each block's
    gradients come from the kernel's own backward given the MERGED output and log-sum-exp,
    and dq is the sum of the two blocks'. CPU kernels (aten's private flash ops for CPU)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, k_past: Tensor, v_past: Tensor) -> Tensor:
        # q (B, nh, S, hd); k, v (B, nkv, S, hd) this rank's; k_past, v_past (B, nkv, r·S, hd)
        out, lse = _FLASH_CPU(q, k, v, 0.0, True)  # (B, nh, S, hd), (B, nh, S)
        if k_past.shape[2]:
            out_p, lse_p = _FLASH_CPU(q, k_past, v_past, 0.0, False)
            merged = torch.logaddexp(lse, lse_p)
            acc = torch.promote_types(q.dtype, torch.float32)  # bf16 outputs merge in float32
            out = (out.to(acc) * (lse - merged).exp()[..., None]
                   + out_p.to(acc) * (lse_p - merged).exp()[..., None]).to(q.dtype)
            lse = merged
        ctx.save_for_backward(q, k, v, k_past, v_past, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, ...]:
        q, k, v, k_past, v_past, out, lse = ctx.saved_tensors
        grad = grad.contiguous()
        dq, dk, dv = _FLASH_CPU_BACKWARD(grad, q, k, v, out, lse, 0.0, True)
        if not k_past.shape[2]:
            return dq, dk, dv, torch.zeros_like(k_past), torch.zeros_like(v_past)
        dq_p, dk_p, dv_p = _FLASH_CPU_BACKWARD(grad, q, k_past, v_past, out, lse, 0.0, False)
        return dq + dq_p, dk, dv, dk_p, dv_p


KERNELS = ("auto", "split", "masked")
"""GatheredKVAttention's kernels: "split" = prefix and diagonal blocks by CPU flash kernels,
merged by log-sum-exp (CPU only); "masked" = one SDPA call with an (S, keys) mask (any
device, slower and an (S, keys) mask in memory); "auto" = split on CPU, masked elsewhere."""


class GatheredKVAttention:
    """AttentionBackend for one rank of a context-parallel forward (see the module docstring).

    Every rank of `group` must run the same layers in the same order: each `attend` is a
    collective. kernel: one of KERNELS, chosen once here for `device`."""

    def __init__(self, shard: SequenceShard, group: dist.ProcessGroup | None = None,
                 device: torch.device | str = "cpu", kernel: str = "auto") -> None:
        assert dist.get_world_size(group) == shard.world_size and dist.get_rank(group) == shard.rank
        if kernel not in KERNELS:
            raise ValueError(f"kernel {kernel!r}: must be one of {', '.join(KERNELS)}")
        device = torch.device(device)
        if kernel == "auto":
            kernel = "split" if device.type == "cpu" else "masked"
        if kernel == "split" and device.type != "cpu":
            raise ValueError(f"kernel 'split' runs on CPU only, not {device}: use 'masked'")
        self.shard, self.group, self.kernel = shard, group, kernel
        P, r = shard.world_size, shard.rank
        # ranks whose keys this rank gathers: contiguous, the ones up to itself (its causal prefix)
        # or before it (split: its own keys stay local); zigzag, all (its tail chunk sees most of them)
        if shard.layout == "zigzag":
            self.keep = P
        else:
            self.keep = r + 1 if kernel == "masked" else r
        self.mask: Tensor | None = None
        if kernel == "masked":
            q_pos = shard.positions(device=device)[0]  # (S,)
            k_pos = torch.cat([shard.positions(device=device, rank=j)[0] for j in range(self.keep)])  # (keys,)
            self.mask = k_pos[None, :] <= q_pos[:, None]  # (S, keys)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        # q (B, nh, S, hd); k, v (B, nkv, S, hd): this rank's tokens, RoPE at global positions
        kv = gather_prefix(torch.stack((k, v)), self.keep, self.group)  # (2, B, nkv, keep·S, hd)
        if self.kernel == "masked":
            return F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=self.mask, enable_gqa=True)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        if self.shard.layout == "contiguous":  # kv: the earlier ranks' keys, all visible
            return _PrefixAndDiagonal.apply(q, k, v, kv[0], kv[1])
        # zigzag: gathered rank j's block is [chunk j; chunk 2P-1-j]. Chunk c's queries see
        # chunks 0..c-1 in full and their own causally; the head chunk's visible keys are a
        # prefix of the tail chunk's, so both are views of one tensor.
        C, S, (head, tail) = self.shard.chunk, self.shard.size, self.shard.chunk_ids()

        def chunk_of(c: int) -> Tensor:  # (2, B, nkv, C, hd)
            j = c if c < self.shard.world_size else 2 * self.shard.world_size - 1 - c
            offset = j * S + (0 if c < self.shard.world_size else C)
            return kv[:, :, :, offset:offset + C]

        seen = torch.cat([chunk_of(c) for c in range(tail)], dim=3)  # (2, B, nkv, tail·C, hd)
        out_head = _PrefixAndDiagonal.apply(q[:, :, :C], k[:, :, :C], v[:, :, :C],
                                            seen[0, :, :, :head * C], seen[1, :, :, :head * C])
        out_tail = _PrefixAndDiagonal.apply(q[:, :, C:], k[:, :, C:], v[:, :, C:], seen[0], seen[1])
        return torch.cat((out_head, out_tail), dim=2)


def sharded_hidden(model, input_ids: Tensor, shard: SequenceShard, group: dist.ProcessGroup | None = None,
                   kernel: str = "auto") -> Tensor:
    """Final-normed hidden states (B, S, D) of this rank's tokens; input_ids (B, S) = shard.take(ids).

    model is a `Transformer`; a collective over `group` (one all-gather per layer); kernel:
    see KERNELS."""
    if model.rope.per_call:
        raise ValueError("context parallelism needs a RoPE table fixed per model: dynamic NTK with "
                         "dynamic_length None would take a different base on each rank")
    B = input_ids.shape[0]
    positions = shard.positions(B, input_ids.device)
    return model.hidden(input_ids, positions, GatheredKVAttention(shard, group, input_ids.device, kernel))
