"""Context parallelism: one long sequence's forward split over the P ranks of a process group.

Layout: contiguous shards. The sequence (length T) is padded at the end to a multiple of P
and rank r holds tokens [r·S, (r+1)·S), S = T_padded / P (`SequenceShard`). Padding at the
end is exact: under causal attention no real token sees a later one, and the caller's loss
mask leaves the pad tokens out. Each rank embeds its own tokens, rotates them with RoPE at
their global positions (`SequenceShard.positions`, passed to `Transformer.hidden`), and
runs every layer on its S tokens only; only attention needs other ranks' tokens.

Attention (`GatheredKVAttention`): an all-gather of keys and values (one collective per
layer, K and V stacked), as in Llama 3's context parallelism. Rank r keeps the first r+1
shards (the causal prefix its queries can see) and attends with a mask built from global
positions. The gather is differentiable: its backward is a reduce-scatter, so the gradient
of each rank's K/V is the sum of what every rank's queries sent back to it.

Why all-gather and contiguous shards, not a ring or zig-zag:
- Exactness first: the ranks' attention is the one-process softmax over the same keys, with
  no online-softmax rescaling to get right in the backward pass.
- Memory: activations are 1/P per rank except keys and values: rank r holds (r+1)·S
  positions of K and V per layer for the backward (the last rank the full T). With GQA these
  are small (2·n_kv·hd per token per layer, against the hidden states and MLP activations).
  A ring would hold S of them, at the price of P steps of blockwise attention per layer.
- Balance: rank r does (r+1)/P of the last rank's attention work (the mask does not let a
  dense kernel skip blocks anyway on CPU). Zig-zag (rank r holds chunks r and 2P-1-r)
  balances causal work for a kernel that skips masked blocks (flash varlen on GPU);
  `positions` and the mask are the only places that would change.

Out of scope: packed rows (document masks across shards), padding masks other than the end,
dynamic NTK RoPE left unpinned (`Rotary.per_call`: its base would differ per rank), KV caches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class SequenceShard:
    """Which part of a length-`length` sequence rank `rank` of `world_size` holds."""

    rank: int
    world_size: int
    length: int
    """T, the real (unpadded) sequence length"""

    def __post_init__(self) -> None:
        assert 0 <= self.rank < self.world_size and self.length > 0, self

    @property
    def size(self) -> int:
        """S: tokens per rank, the padded length divided by P."""
        return -(-self.length // self.world_size)

    @property
    def padded(self) -> int:
        """P·S: the length after padding the end to a multiple of P."""
        return self.size * self.world_size

    @property
    def start(self) -> int:
        return self.rank * self.size

    def positions(self, batch: int = 1, device: torch.device | str = "cpu") -> Tensor:
        """(batch, S) global positions of this rank's tokens (pad tokens continue past T)."""
        return torch.arange(self.start, self.start + self.size, device=device).expand(batch, self.size)

    def take(self, x: Tensor, pad: float | int = 0, dim: int = 1) -> Tensor:
        """This rank's slice along `dim` of a full-length (T) tensor, padded at the end with `pad`."""
        assert x.shape[dim] == self.length, (x.shape, dim, self.length)
        if self.padded > self.length:
            shape = list(x.shape)
            shape[dim] = self.padded - self.length
            x = torch.cat((x, x.new_full(shape, pad)), dim=dim)
        return x.narrow(dim, self.start, self.size)


class _GatherPrefix(torch.autograd.Function):
    """x (..., S, hd) on every rank -> the first `keep` ranks' x concatenated (..., keep·S, hd).
    Backward: each rank's gradient for its own shard, summed over ranks (a reduce-scatter)."""

    @staticmethod
    def forward(ctx, x: Tensor, keep: int, group: dist.ProcessGroup | None) -> Tensor:
        world = dist.get_world_size(group)
        ctx.keep, ctx.group, ctx.world = keep, group, world
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts[:keep], dim=-2)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        chunks = [c.contiguous() for c in grad.chunk(ctx.keep, dim=-2)]
        chunks += [torch.zeros_like(chunks[0]) for _ in range(ctx.world - ctx.keep)]  # ranks past the prefix
        mine = torch.empty_like(chunks[0])
        dist.reduce_scatter(mine, chunks, group=ctx.group)
        return mine, None, None


def gather_prefix(x: Tensor, keep: int, group: dist.ProcessGroup | None = None) -> Tensor:
    """Differentiable all-gather along dim -2 keeping ranks 0..keep-1 (see _GatherPrefix)."""
    return _GatherPrefix.apply(x, keep, group)


class GatheredKVAttention:
    """AttentionBackend for one rank of a context-parallel forward (see the module docstring).

    Every rank of `group` must run the same layers in the same order: each `attend` is a
    collective."""

    def __init__(self, shard: SequenceShard, group: dist.ProcessGroup | None = None) -> None:
        assert dist.get_world_size(group) == shard.world_size and dist.get_rank(group) == shard.rank
        self.shard, self.group = shard, group
        keys = shard.start + shard.size  # the causal prefix this rank's queries see
        q_pos = torch.arange(shard.start, keys)[:, None]  # (S, 1)
        self.mask = torch.arange(keys)[None, :] <= q_pos  # (S, keys)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        # q (B, nh, S, hd); k, v (B, nkv, S, hd): this rank's tokens, RoPE at global positions
        kv = gather_prefix(torch.stack((k, v)), self.shard.rank + 1, self.group)  # (2, B, nkv, keys, hd)
        if self.mask.device != q.device:
            self.mask = self.mask.to(q.device)
        return F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=self.mask, enable_gqa=True)


def sharded_hidden(model, input_ids: Tensor, shard: SequenceShard, group: dist.ProcessGroup | None = None) -> Tensor:
    """Final-normed hidden states (B, S, D) of this rank's tokens; input_ids (B, S) = shard.take(ids).

    model is a `Transformer`; a collective over `group` (one all-gather per layer)."""
    if model.rope.per_call:
        raise ValueError("context parallelism needs a RoPE table fixed per model: dynamic NTK with "
                         "dynamic_length None would take a different base on each rank")
    B = input_ids.shape[0]
    positions = shard.positions(B, input_ids.device)
    return model.hidden(input_ids, positions, GatheredKVAttention(shard, group))
