"""A contiguous copy of the decoding sequences' K/V, so decode attention needs no gather.

Gathering every decoding sequence's blocks into contiguous keys, in every layer of
every step, moves the whole context through memory once per token, as much traffic as
the attention itself. This cache keeps one row per decoding sequence,
(layers, rows, n_kv, L, hd), filled from the pool once when the sequence starts
decoding; each step then writes the new token's K/V to the row, and to the pool (the
source of truth: prefix cache, preemption) either in the same pass (the model's
forward) or at the end of a burst (`write_back`, the fused pass), and attention reads
the rows in place. `decode_rows` gives both decode paths where K passes read and write.

A row belongs to one admission of one sequence; a sequence that is not decoding in a
step (finished, preempted, or left out by the token budget) loses its row and is
refilled from the pool if it decodes again. Rows are reused lowest first and
compacted when more than half are holes.

Out of scope: bounding its memory other than by max_num_seqs (a runner built with
decode_cache=False has none, and decodes on the model's forward over the pool's
blocks), prefill chunks (they gather from the pool).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from polyrl.engine.runner.paged_attention import AttnGroup, KVPool, additive_mask
from polyrl.engine.sequence import Sequence


@dataclass(frozen=True)
class PendingFill:
    """Rows newly given to sequences, to fill from the pool: rows (F,), their block
    tables flattened (F * nb,), span = nb * block_size, length = positions copied."""

    rows: Tensor
    tables: Tensor
    span: int
    length: int


@dataclass(frozen=True)
class DecodeRows:
    """Where K decode passes of S sequences read and write the decode cache."""

    rows: Tensor  # (S,) row of each sequence
    num_rows: int  # R: attention runs over rows [0, R)
    identity: bool  # rows == arange(S) and R == S
    masks: Tensor  # (K, R, 1, 1, L) additive: at pass k, row r sees its positions < its context
    write_index: Tensor  # (K, S * n_kv) flat (row, head, position) of each pass's new keys
    fill: PendingFill | None  # fresh rows, filled from the pool in the first pass

    def group(self, k: int, q_index: Tensor | None = None) -> AttnGroup:
        """Pass k's attention group; q_index (S,) as in AttnGroup (also its out_rows)."""
        return AttnGroup(self.masks[k], q_index, q_index, rows=self.rows, write_index=self.write_index[k],
                         num_rows=self.num_rows, identity=self.identity, fill=self.fill if k == 0 else None)


class DecodeCache:
    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        layers, _, _, n_kv, hd = pool.k.shape
        # In the pool's compute dtype: rows of an int8 pool hold its dequantized values.
        self.k = torch.zeros(layers, 0, n_kv, 0, hd, dtype=pool.dtype)  # (layers, rows, n_kv, L, hd)
        self.v = torch.zeros(layers, 0, n_kv, 0, hd, dtype=pool.dtype)
        self.owner: list[tuple[int, int] | None] = []  # (seq_id, admission) of each row
        self.row_of: dict[tuple[int, int], int] = {}

    def rows_for(self, seqs: list[Sequence], lookahead: int = 0) -> tuple[Tensor, int, PendingFill | None]:
        """Rows (S,) holding the context of each decoding sequence, the number of rows in
        use R (attention runs over rows [0, R)), and the rows still to fill from the pool.
        Rows have room for `lookahead` more positions than this step writes (a decode burst).

        The fill is left to the attention backend, layer by layer, after it has written
        the step's new K/V to the pool: a sequence whose prompt shares blocks that another
        sequence computes in this same step finds them filled only then."""
        keys = [(s.seq_id, s.admissions) for s in seqs]
        live = set(keys)
        for r, key in enumerate(self.owner):  # drop rows of sequences not decoding now
            if key is not None and key not in live:
                self.owner[r] = None
                del self.row_of[key]
        while self.owner and self.owner[-1] is None:
            self.owner.pop()
        if len(self.owner) > 8 and len(self.row_of) * 2 < len(self.owner):
            self._compact()
        need = max(s.num_computed_tokens + 1 for s in seqs) + lookahead
        self._ensure(len(self.owner) + sum(k not in self.row_of for k in keys), need)
        fresh = [(s, k) for s, k in zip(seqs, keys) if k not in self.row_of]
        pending = self._assign(fresh) if fresh else None
        return torch.tensor([self.row_of[k] for k in keys], dtype=torch.long), len(self.owner), pending

    def decode_rows(self, seqs: list[Sequence], pos: Tensor) -> DecodeRows:
        """Rows, masks and write positions of K passes over `seqs`, whose input positions
        are pos (K, S) (rows_for with room for the K - 1 passes after the first)."""
        K = pos.shape[0]
        rows, R, fill = self.rows_for(seqs, lookahead=K - 1)
        ctx = torch.ones(K, R, dtype=torch.long)  # rows of other sequences see their position 0
        ctx[:, rows] = pos + 1
        L = int(ctx.max())
        masks = additive_mask(torch.arange(L)[None, None, :] < ctx[:, :, None], self.pool.dtype)  # (K, R, 1, 1, L)
        identity = R == len(seqs) and bool((rows == torch.arange(R)).all())
        _, _, n_kv, L_cap, _ = self.k.shape
        heads = rows[:, None] * n_kv + torch.arange(n_kv)[None, :]  # (S, n_kv)
        write = (heads[None] * L_cap + pos[:, :, None]).view(K, -1)  # (K, S * n_kv)
        return DecodeRows(rows, R, identity, masks, write, fill)

    def _assign(self, fresh: list[tuple[Sequence, tuple[int, int]]]) -> PendingFill:
        bs = self.pool.block_size
        rows = []
        for _, key in fresh:
            free = next((r for r, o in enumerate(self.owner) if o is None), None)
            if free is None:
                free = len(self.owner)
                self.owner.append(None)
            self.owner[free] = key
            self.row_of[key] = free
            rows.append(free)
        nb = max(len(s.block_table) for s, _ in fresh)
        tables = torch.tensor([s.block_table + [s.block_table[-1]] * (nb - len(s.block_table)) for s, _ in fresh])
        return PendingFill(torch.tensor(rows, dtype=torch.long), tables.view(-1), nb * bs,
                           min(nb * bs, self.k.shape[3]))

    def fill_layer(self, layer: int, fill: PendingFill) -> None:
        """Copy layer `layer` of the fresh rows' context from the pool into their rows."""
        for src, dst in zip(self.pool.gather(layer, fill.tables), (self.k[layer], self.v[layer])):
            _, _, n_kv, hd = src.shape
            g = src.view(len(fill.rows), fill.span, n_kv, hd)[:, :fill.length]
            dst[:, :, :fill.length].index_copy_(0, fill.rows, g.transpose(1, 2))

    def write_back(self, rows: Tensor, positions: Tensor, slots: Tensor, lib=None) -> None:
        """Copy the K/V at positions (P, S) of rows (S,) to the pool's slots (P, S), every
        layer at once: the fused pass writes a burst's new K/V to the rows only, and the pool
        once at its end. With the fused kernels' `lib` and a float32 pool, one C call does the
        copies; an int8 pool (kv_int8.py) quantizes them in its `write_layers`."""
        if (lib is not None and self.k.dtype == self.pool.k.dtype == torch.float32 and self.k.is_contiguous()
                and self.pool.k.is_contiguous()):
            rows, p, s = rows.contiguous(), positions.reshape(-1).contiguous(), slots.reshape(-1).contiguous()
            layers, R, n_kv, L, hd = self.k.shape
            bad = lib.cache_to_pool(self.k.data_ptr(), self.v.data_ptr(), layers, R, n_kv, L, hd, rows.data_ptr(),
                                    len(rows), p.data_ptr(), s.data_ptr(), len(p), self.pool.k.data_ptr(),
                                    self.pool.v.data_ptr(), self.pool.k.shape[1] * self.pool.k.shape[2])
            if bad:  # (C checks every index before it copies anything)
                i = bad - 1
                raise IndexError(f"write_back past the pool or the rows {tuple(self.k.shape)}: row "
                                 f"{int(rows[i % len(rows)])}, position {int(p[i])}, slot {int(s[i])}")
            return
        r = rows[None, :].expand_as(positions).reshape(-1)  # (P * S,)
        p = positions.reshape(-1)
        # (P * S, layers, n_kv, hd): advanced indices first -> (layers, P * S, n_kv, hd)
        k, v = self.k[:, r, :, p].transpose(0, 1), self.v[:, r, :, p].transpose(0, 1)
        self.pool.write_layers(slots.reshape(-1), k, v)

    def _ensure(self, rows: int, length: int) -> None:
        R, L = self.k.shape[1], self.k.shape[3]
        if rows <= R and length <= L:
            return
        R2, L2 = max(rows, 2 * R if rows > R else R), max(-(-length // 64) * 64, 2 * L if length > L else L)
        for name in ("k", "v"):
            old = getattr(self, name)
            layers, _, n_kv, _, hd = old.shape
            new = old.new_zeros(layers, R2, n_kv, L2, hd)
            new[:, :R, :, :L] = old
            setattr(self, name, new)

    def _compact(self) -> None:
        live = [r for r, o in enumerate(self.owner) if o is not None]
        index = torch.tensor(live, dtype=torch.long)
        for name in ("k", "v"):
            t = getattr(self, name)
            t[:, :len(live)] = t.index_select(1, index)
        self.owner = [self.owner[r] for r in live]
        self.row_of = {key: r for r, key in enumerate(self.owner)}
