"""One engine step on the model: scheduled batch -> packed inputs -> forward -> samples.

The model is the trainer's own Transformer; the runner only supplies a PagedAttention
backend for it, so the engine's forward pass is the trainer's forward pass. Logits
are computed only at the positions that sample (the last token of each sequence whose
chunk reaches its end), and sampling is per row: each sequence brings its own
temperature, top-k, top-p, seed and top-logprob count.

Out of scope: tensor parallelism, CUDA graphs, asynchronous scheduling (preparing step
t+1 while step t runs); on GPU those are the vLLM backend's job.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from polyrl.engine.runner.decode_cache import DecodeCache
from polyrl.engine.runner.paged_attention import AttnGroup, KVPool, PagedAttention
from polyrl.engine.sampler import counter_uniforms, sample_batch
from polyrl.engine.scheduler import ScheduledBatch
from polyrl.engine.sequence import Sequence
from polyrl.models.transformer import Transformer


@dataclass
class StepOutput:
    """Samples of the sequences that sample this step, in batch order."""

    tokens: list[int]
    logprobs: list[float]
    top_logprobs: list[dict[int, float]] | None


class ModelRunner:
    def __init__(self, model: Transformer, num_blocks: int, block_size: int, contiguous_decode: bool = True) -> None:
        cfg = model.cfg
        self.model = model
        self.block_size = block_size
        dtype = next(model.parameters()).dtype
        self.pool = KVPool(cfg.num_hidden_layers, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim, dtype)
        self.decode_cache = DecodeCache(self.pool) if contiguous_decode else None
        self.attention = PagedAttention(self.pool, self.decode_cache)

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> StepOutput:
        ids, positions, slots, sample_rows = self._pack(batch)
        self.attention.slot_mapping = slots
        self.attention.groups = self._groups(batch)
        hidden = self.model.hidden(ids[None], positions[None], self.attention)[0]  # (N, D)
        if sample_rows is not None and len(sample_rows) == 0:  # only prefill chunks this step
            return StepOutput([], [], None)
        if sample_rows is not None:
            hidden = hidden.index_select(0, sample_rows)  # (M, D)
        logits = self.model.lm_head(hidden).float()  # (M, V)
        return self._sample(logits, [s for s, f in zip(batch.seqs, batch.sampling) if f])

    def _pack(self, batch: ScheduledBatch) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """Token ids (N,), positions (N,), KV slots (N,), and the packed rows that sample
        (M,) or None when every token samples."""
        bs, scratch = self.block_size, self.pool.scratch_slot
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        sample_rows: list[int] = []
        all_sample = True
        for seq, n, samples in zip(batch.seqs, batch.num_new_tokens, batch.sampling):
            c, table = seq.num_computed_tokens, seq.block_table
            if n == 1:
                ids.append(seq.token_ids[c])
                positions.append(c)
                slots.append(scratch if c < seq.num_cached_tokens else table[c // bs] * bs + c % bs)
            else:
                all_sample = False
                ids += seq.token_ids[c:c + n]
                positions += range(c, c + n)
                slots += [scratch if p < seq.num_cached_tokens else table[p // bs] * bs + p % bs
                          for p in range(c, c + n)]
            if samples:
                sample_rows.append(len(ids) - 1)
            else:
                all_sample = False
        rows = None if all_sample else torch.tensor(sample_rows, dtype=torch.long)
        return (torch.tensor(ids, dtype=torch.long), torch.tensor(positions, dtype=torch.long),
                torch.tensor(slots, dtype=torch.long), rows)

    def _groups(self, batch: ScheduledBatch) -> list[AttnGroup]:
        decode = [i for i, n in enumerate(batch.num_new_tokens) if n == 1]
        prefill = [i for i, n in enumerate(batch.num_new_tokens) if n > 1]
        groups = []
        if decode:
            groups.append(self._decode_group(batch, decode, in_order=not prefill))
        if prefill:
            groups.append(self._prefill_group(batch, prefill))
        return groups

    def _tables(self, seqs: list[Sequence]) -> Tensor:
        nb = max(len(s.block_table) for s in seqs)
        return torch.tensor([s.block_table + [0] * (nb - len(s.block_table)) for s in seqs], dtype=torch.long)

    def _decode_group(self, batch: ScheduledBatch, rows: list[int], in_order: bool) -> AttnGroup:
        seqs = [batch.seqs[i] for i in rows]
        pos = torch.tensor([s.num_computed_tokens for s in seqs])  # (S,) position of the new token
        if in_order:
            q_index = out_rows = None
        else:
            offsets = self._offsets(batch)
            q_index = out_rows = torch.tensor([offsets[i] for i in rows], dtype=torch.long)
        if self.decode_cache is not None:
            cache_rows, R, fill = self.decode_cache.rows_for(seqs)
            ctx = torch.ones(R, dtype=torch.long)  # rows of other sequences see their position 0
            ctx[cache_rows] = pos + 1
            L = int(ctx.max())
            mask = _bias(torch.arange(L)[None, :] < ctx[:, None], self.pool.k.dtype)  # (R, 1, 1, L)
            identity = R == len(seqs) and bool((cache_rows == torch.arange(R)).all())
            _, _, n_kv, L_cap, _ = self.decode_cache.k.shape
            heads = cache_rows[:, None] * n_kv + torch.arange(n_kv)[None, :]  # (S, n_kv)
            write_index = (heads * L_cap + pos[:, None]).view(-1)  # (S * n_kv,)
            return AttnGroup(mask, q_index, out_rows, rows=cache_rows, write_index=write_index, num_rows=R,
                             identity=identity, fill=fill)
        tables = self._tables(seqs)  # (S, nb)
        L = tables.shape[1] * self.block_size
        mask = _bias(torch.arange(L)[None, :] <= pos[:, None], self.pool.k.dtype)  # (S, 1, 1, L)
        return AttnGroup(mask, q_index, out_rows, block_tables=tables)

    def _prefill_group(self, batch: ScheduledBatch, rows: list[int]) -> AttnGroup:
        seqs = [batch.seqs[i] for i in rows]
        ns = torch.tensor([batch.num_new_tokens[i] for i in rows])  # (S,)
        offsets = self._offsets(batch)
        start = torch.tensor([offsets[i] for i in rows])  # (S,) first packed token
        computed = torch.tensor([s.num_computed_tokens for s in seqs])  # (S,)
        T = int(ns.max())
        t = torch.arange(T)[None, :]  # (1, T)
        real = t < ns[:, None]  # (S, T)
        t_clamped = torch.minimum(t, ns[:, None] - 1)  # padded queries repeat the last real one
        q_index = (start[:, None] + t_clamped).view(-1)  # (S*T,)
        qpos = computed[:, None] + t_clamped  # (S, T) absolute query positions
        tables = self._tables(seqs)
        L = tables.shape[1] * self.block_size
        mask = (torch.arange(L)[None, None, :] <= qpos[:, :, None])[:, None]  # (S, 1, T, L)
        out_sel = real.view(-1).nonzero().squeeze(-1)
        return AttnGroup(mask, q_index, q_index.index_select(0, out_sel), out_sel=out_sel, block_tables=tables)

    @staticmethod
    def _offsets(batch: ScheduledBatch) -> list[int]:
        offsets, total = [], 0
        for n in batch.num_new_tokens:
            offsets.append(total)
            total += n
        return offsets

    def _sample(self, logits: Tensor, seqs: list[Sequence]) -> StepOutput:
        params = [s.params for s in seqs]
        temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32)
        top_k = torch.tensor([p.top_k for p in params]) if any(p.top_k for p in params) else None
        top_p = (torch.tensor([p.top_p for p in params], dtype=torch.float32)
                 if any(p.top_p < 1 for p in params) else None)
        u = None
        if any(p.temperature > 0 for p in params):
            u = counter_uniforms(torch.tensor([s.seed for s in seqs]),
                                 torch.tensor([s.num_completion_tokens for s in seqs]))
        else:
            u = torch.zeros(len(seqs), dtype=torch.float64)
        tokens, logprobs, full = sample_batch(logits, temperature, top_k, top_p, u)
        top = None
        k = max(p.logprobs for p in params)
        if k:
            values, indices = full.topk(min(k, full.shape[-1]), dim=-1)  # (M, k)
            top = [dict(zip(ix[:p.logprobs], vs[:p.logprobs])) if p.logprobs else {}
                   for ix, vs, p in zip(indices.tolist(), values.tolist(), params)]
        return StepOutput(tokens.tolist(), logprobs.tolist(), top)


def _bias(visible: Tensor, dtype: torch.dtype) -> Tensor:
    """(S, L) bool -> (S, 1, 1, L) additive mask in the model dtype: 0 where visible, -inf elsewhere."""
    return torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, float("-inf"))[:, None, None, :]
