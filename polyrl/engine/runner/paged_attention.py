"""The paged KV pool, and the AttentionBackend that attends over block tables.

The runner packs a step's new tokens into one row, (1, N): a decode contributes one
token, a prefill chunk many. For each layer the backend

1. writes the new K/V into the pool at `slot_mapping` (scratch slot for positions
   whose K/V is already cached in a shared block), before any attention reads, so a
   sequence may attend to blocks another sequence fills in the same step;
2. per group of sequences, gathers their blocks into contiguous keys
   (S, n_kv, L, hd) with one index_select, regroups their queries as (S, nh, T, hd),
   and runs SDPA with a (S, 1, T, L) mask (key position <= query position, key
   position < context length);
3. scatters the outputs back to packed order.

Decodes (T = 1) and prefill chunks (T > 1) form separate groups so that one long
prompt does not pad every decode to its length. A step of only decodes needs no
query regrouping at all. Decodes read their keys from the decode cache's contiguous
rows when the runner keeps one (decode_cache.py), else from the pool's blocks;
`decode_groups` builds either.

The pool is float here (the model's dtype); kv_int8.py's Int8KVPool stores int8 with
scales behind the same four methods (`write`, `write_layers`, `gather`, `zero_up_to`), so
attention and the decode cache never ask which one they have.

Out of scope: custom kernels (flash/paged attention on GPU are vLLM's business),
sliding windows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence as Seq

import torch
import torch.nn.functional as F
from torch import Tensor

from polyrl.engine.sequence import Sequence


class KVPool:
    """Preallocated K and V for every layer: (layers, num_blocks + 1, block_size, n_kv, hd).

    Block `num_blocks` is the scratch block: writes that must not land in a shared
    block go there and are never read.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype) -> None:
        shape = (num_layers, num_blocks + 1, block_size, num_kv_heads, head_dim)
        # torch.empty: pages cost memory only once touched. Blocks are zeroed when first
        # handed out (`zero_up_to`): attention reads the unused tail of a sequence's last
        # block under a mask, and 0 * NaN from never-written memory would still be NaN.
        self.k = torch.empty(shape, dtype=dtype)
        self.v = torch.empty(shape, dtype=dtype)
        self.k[:, num_blocks].zero_()
        self.v[:, num_blocks].zero_()
        self.dtype = dtype
        """The dtype attention computes in (and reads back)."""
        self.block_size = block_size
        self.scratch_slot = num_blocks * block_size
        self.zeroed = 0

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """K and V of one token in every layer: what NativeEngineConfig.kv_cache_mb is divided by."""
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()

    def write(self, layer: int, slots: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k, v (N, n_kv, hd) into `layer` at pool slots (N,); returns them as a read would see them."""
        n_kv, hd = k.shape[1:]
        self.k[layer].view(-1, n_kv, hd).index_copy_(0, slots, k)
        self.v[layer].view(-1, n_kv, hd).index_copy_(0, slots, v)
        return k, v

    def write_layers(self, slots: Tensor, k: Tensor, v: Tensor) -> None:
        """k, v (layers, M, n_kv, hd) into every layer at pool slots (M,)."""
        layers, _, n_kv, hd = k.shape
        self.k.view(layers, -1, n_kv, hd).index_copy_(1, slots, k)
        self.v.view(layers, -1, n_kv, hd).index_copy_(1, slots, v)

    def gather(self, layer: int, blocks: Tensor) -> tuple[Tensor, Tensor]:
        """Blocks (B,) of `layer`: K and V (B, block_size, n_kv, hd) in self.dtype."""
        return self.k[layer].index_select(0, blocks), self.v[layer].index_select(0, blocks)

    def zero_up_to(self, num_blocks: int) -> None:
        """Make sure blocks [0, num_blocks) hold finite values."""
        if num_blocks > self.zeroed:
            self.k[:, self.zeroed:num_blocks].zero_()
            self.v[:, self.zeroed:num_blocks].zero_()
            self.zeroed = num_blocks

    @property
    def bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


@dataclass
class AttnGroup:
    """Sequences attended in one SDPA call, padded to T queries and L keys each.

    Either keys come from the pool through `block_tables`, or (decodes with a
    DecodeCache) from rows `rows` of the decode cache, which the step's new K/V are
    written to (at `write_index`); SDPA then runs over the first `num_rows` rows
    (rows of other sequences attend to their position 0 and are dropped)."""

    mask: Tensor  # (S, 1, T, L) bool; decodes: (S or num_rows, 1, 1, L) float, 0 or -inf
    q_index: Tensor | None  # (S * T,) packed token of each padded query; None: all N tokens in order, T = 1
    out_rows: Tensor | None  # (R,) packed token index of each real query (None with q_index None)
    out_sel: Tensor | None = None  # (R,) real queries among the S * T padded ones; None: all
    block_tables: Tensor | None = None  # (S, nb) long; L = nb * block_size
    rows: Tensor | None = None  # (S,) decode-cache row of each sequence
    write_index: Tensor | None = None  # (S * n_kv,) flat (row, head, position) of each new key in the cache
    num_rows: int = 0
    identity: bool = False  # rows == arange(S) and num_rows == S
    fill: object | None = None  # decode_cache.PendingFill: fresh rows to fill from the pool, per layer


class PagedAttention:
    """AttentionBackend over a KVPool; the runner sets slot_mapping and groups each step."""

    def __init__(self, pool: KVPool, decode_cache=None) -> None:
        self.pool = pool
        self.decode_cache = decode_cache  # DecodeCache | None
        self.slot_mapping: Tensor = torch.zeros(0, dtype=torch.long)  # (N,)
        """Pool slot of each new token (the scratch slot where the block is shared and cached)."""
        self.groups: list[AttnGroup] = []

    def decode_groups(self, seqs: Seq[Sequence], pos: Tensor, q_index: Tensor | None = None) -> list[AttnGroup]:
        """One decode group per pass of K passes over `seqs`, whose input positions are pos
        (K, S): over the decode cache's rows when there is one, else over the pool's blocks.
        q_index (S,): the packed token of each sequence in a step that also runs prefill
        chunks (then out_rows too); None: the step's tokens are these sequences, in order."""
        K = pos.shape[0]
        if self.decode_cache is not None:
            rows = self.decode_cache.decode_rows(seqs, pos)
            return [rows.group(k, q_index) for k in range(K)]
        tables = block_tables(seqs)  # (S, nb)
        L = tables.shape[1] * self.pool.block_size
        masks = additive_mask(torch.arange(L) <= pos[:, :, None], self.pool.dtype)  # (K, S, 1, 1, L)
        return [AttnGroup(masks[k], q_index, q_index, block_tables=tables) for k in range(K)]

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        # q: (1, nh, N, hd); k, v: (1, n_kv, N, hd), the step's new tokens packed in one row.
        _, nh, N, hd = q.shape
        n_kv = k.shape[1]
        bs = self.pool.block_size
        # The new K/V as the pool gives them back (int8: dequantized), so the decode cache's
        # rows always hold what the pool would: same outputs with or without them.
        kf, vf = self.pool.write(layer, self.slot_mapping, k[0].transpose(0, 1), v[0].transpose(0, 1))  # (N, n_kv, hd)
        qf = q[0].transpose(0, 1)  # (N, nh, hd)
        out = None
        for g in self.groups:
            if g.rows is not None:
                y = self._attend_rows(layer, g, qf, kf, vf)  # (S, nh, hd)
            else:
                S, nb = g.block_tables.shape
                T = g.mask.shape[2]
                flat = g.block_tables.view(-1)
                k_blocks, v_blocks = self.pool.gather(layer, flat)  # (S * nb, bs, n_kv, hd)
                keys = k_blocks.view(S, nb * bs, n_kv, hd).transpose(1, 2)  # (S, n_kv, L, hd)
                values = v_blocks.view(S, nb * bs, n_kv, hd).transpose(1, 2)
                qg = qf if g.q_index is None else qf.index_select(0, g.q_index)
                if T == 1 and g.mask.dtype != torch.bool:
                    y = decode_attention(qg, keys, values, g.mask)  # (S, nh, hd)
                else:
                    qg = qg.view(S, T, nh, hd).transpose(1, 2)  # (S, nh, T, hd)
                    y = F.scaled_dot_product_attention(qg, keys, values, attn_mask=g.mask, enable_gqa=True)
                    y = y.transpose(1, 2).reshape(S * T, nh, hd)
                if g.out_sel is not None:
                    y = y.index_select(0, g.out_sel)
            if g.q_index is None:  # the group is every token, in order
                return y.transpose(0, 1)[None]  # (1, nh, N, hd)
            if out is None:
                out = qf.new_empty(N, nh, hd)
            out.index_copy_(0, g.out_rows, y)
        assert out is not None, "a step with no attention groups"
        return out.transpose(0, 1)[None]  # (1, nh, N, hd)

    def _attend_rows(self, layer: int, g: AttnGroup, qf: Tensor, kf: Tensor, vf: Tensor) -> Tensor:
        """Decodes over decode-cache rows: (S, nh, hd) outputs in group order."""
        if g.fill is not None:  # after this layer's pool writes: shared blocks filled this step
            self.decode_cache.fill_layer(layer, g.fill)
        kd, vd = self.decode_cache.k[layer], self.decode_cache.v[layer]  # (rows, n_kv, L, hd)
        if g.q_index is not None:
            qf, kf, vf = qf.index_select(0, g.q_index), kf.index_select(0, g.q_index), vf.index_select(0, g.q_index)
        # New keys/values (S, n_kv, hd) into their rows at their positions (flat row index).
        kd.view(-1, kd.shape[-1]).index_copy_(0, g.write_index, kf.reshape(-1, kf.shape[-1]))
        vd.view(-1, vd.shape[-1]).index_copy_(0, g.write_index, vf.reshape(-1, vf.shape[-1]))
        R, L = g.num_rows, g.mask.shape[-1]
        S, nh, hd = qf.shape
        qr = qf if g.identity else qf.new_zeros(R, nh, hd).index_copy_(0, g.rows, qf)  # (R, nh, hd)
        y = decode_attention(qr, kd[:R, :, :L], vd[:R, :, :L], g.mask)  # (R, nh, hd)
        return y if g.identity else y.index_select(0, g.rows)


def decode_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> Tensor:
    """One query per sequence: q (S, nh, hd), k, v (S, n_kv, L, hd), bias (S, 1, 1, L)
    additive (0 or -inf) -> (S, nh, hd).

    The nh / n_kv query heads that share a kv head are that head's queries (S * n_kv,
    rep, hd): no GQA expansion. Two batched products and a softmax, not SDPA: CPU SDPA's
    flash kernel tiles for long query blocks, and with one query per sequence its
    per-(batch, head) set-up outweighs these three calls.
    """
    S, nh, hd = q.shape
    _, n_kv, L, _ = k.shape
    rep = nh // n_kv
    scores = torch.baddbmm(bias.expand(S, n_kv, rep, L).reshape(S * n_kv, rep, L), q.reshape(S * n_kv, rep, hd),
                           k.reshape(S * n_kv, L, hd).transpose(1, 2), alpha=hd ** -0.5)  # (S * n_kv, rep, L)
    y = torch.bmm(scores.softmax(-1), v.reshape(S * n_kv, L, hd))  # (S * n_kv, rep, hd)
    return y.view(S, nh, hd)


def block_tables(seqs: Seq[Sequence]) -> Tensor:
    """(S, nb) long: each sequence's block table, padded with block 0 (masked off) to the longest."""
    nb = max(len(s.block_table) for s in seqs)
    return torch.tensor([s.block_table + [0] * (nb - len(s.block_table)) for s in seqs], dtype=torch.long)


def additive_mask(visible: Tensor, dtype: torch.dtype) -> Tensor:
    """(..., S, L) bool -> (..., S, 1, 1, L) additive mask in the model dtype: 0 where visible, -inf elsewhere."""
    return torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, float("-inf"))[..., None, None, :]
