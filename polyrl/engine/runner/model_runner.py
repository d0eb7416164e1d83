"""One engine step on the model: scheduled batch -> packed inputs -> forward -> samples.

The model is the trainer's own Transformer; the runner only supplies a PagedAttention
backend for it, so the engine's forward pass is the trainer's forward pass. A step that
runs prefill chunks (alone or beside decodes) is one forward pass over the packed tokens;
logits are computed only at the positions that sample (the last token of each sequence
whose chunk reaches its end), and sampling is per row: each sequence brings its own
temperature, top-k, top-p, seed and top-logprob count (row_sampling.py).

A decode-only step goes to the runner's decode backend (decode_backend.py), chosen once
when the runner is built: the fused pass where it runs, else the model's forward. The
step is a burst of ScheduledBatch.steps passes (one for a plain decode step) whose slots,
positions and sampling noise are computed here once, as (passes, S) tensors; the backend
runs the passes back to back without going back to the scheduler.

A speculative verify step (ScheduledBatch.drafts) runs the same packed forward with
logits at every drafted position: speculative/verify_step.py.

Out of scope: tensor parallelism, CUDA graphs, asynchronous scheduling (preparing step
t+1 while step t runs); on GPU those are the vLLM backend's job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from polyrl.engine.runner.decode_backend import DecodeBackend, DecodeBurst, choose_decode_backend
from polyrl.engine.runner.decode_cache import DecodeCache
from polyrl.engine.runner.kv_int8 import Int8KVPool
from polyrl.engine.runner.paged_attention import AttnGroup, KVPool, PagedAttention, block_tables
from polyrl.engine.runner.row_sampling import RowSampling, stop_table
from polyrl.engine.scheduler import ScheduledBatch
from polyrl.engine.sequence import Sequence
from polyrl.models.transformer import Transformer


@dataclass
class StepOutput:
    """Samples of the sequences that sample this step, in batch order, a list each: one
    token, or one per pass of a decode burst (a sequence's tokens after its stop included:
    postprocess drops them)."""

    tokens: list[list[int]]
    logprobs: list[list[float]]
    top_logprobs: list[list[dict[int, float]]] | None


POOLS: dict[str, type[KVPool] | type[Int8KVPool]] = {"auto": KVPool, "int8": Int8KVPool}
"""The KV pool of each NativeEngineConfig.kv_cache_dtype ("auto": the model's float dtype)."""


class ModelRunner:
    def __init__(self, model: Transformer, num_blocks: int, block_size: int,
                 decode: Literal["auto", "forward"] = "auto", decode_cache: bool = True,
                 kv_cache_dtype: Literal["auto", "int8"] = "auto") -> None:
        """decode="forward" runs decode steps on the model's forward even where the fused pass
        could, and decode_cache=False keeps no decode cache (decodes then gather the pool's
        blocks, on the model's forward): variants for equivalence tests and benchmarks."""
        cfg = model.cfg
        self.model = model
        self.block_size = block_size
        dtype = next(model.parameters()).dtype
        self.pool = POOLS[kv_cache_dtype](cfg.num_hidden_layers, num_blocks, block_size, cfg.num_key_value_heads,
                                          cfg.head_dim, dtype)
        self.decode_cache = DecodeCache(self.pool) if decode_cache else None
        self.attention = PagedAttention(self.pool, self.decode_cache)
        self.decode_backend: DecodeBackend = choose_decode_backend(model, self.attention, forward=decode == "forward")

    def refresh_weights(self) -> None:
        """The model's weights changed in place: rebuild what was derived from them."""
        self.decode_backend.refresh()

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> StepOutput:
        if batch.drafts is not None:  # a speculative verify step
            from polyrl.engine.speculative.verify_step import verify_pass

            return StepOutput(*verify_pass(self, batch))
        if batch.decode_only:
            return self._decode(batch)
        ids, positions, slots, sample_rows = self._pack(batch)
        self.attention.slot_mapping = slots
        self.attention.groups = self._groups(batch)
        hidden = self.model.hidden(ids[None], positions[None], self.attention)[0]  # (N, D)
        if sample_rows is not None and len(sample_rows) == 0:  # only prefill chunks this step
            return StepOutput([], [], None)
        if sample_rows is not None:
            hidden = hidden.index_select(0, sample_rows)  # (M, D)
        logits = self.model.lm_head(hidden).float()  # (M, V)
        rows = RowSampling([s for s, f in zip(batch.seqs, batch.sampling) if f])
        tokens, logprobs, top = rows.sample(logits, rows.uniforms(1)[0])
        return StepOutput([[t] for t in tokens.tolist()], [[lp] for lp in logprobs.tolist()],
                          rows.top_dicts(top[None]) if top is not None else None)

    def _decode(self, batch: ScheduledBatch) -> StepOutput:
        """batch.steps decode passes back to back on the decode backend."""
        seqs, K = batch.seqs, batch.steps
        keep = batch.burst_tokens or [1] * len(seqs)
        first = [s.num_computed_tokens for s in seqs]
        pos = torch.tensor(first) + torch.arange(K)[:, None]  # (K, S) input positions
        slots = torch.tensor(burst_slots(seqs, K, keep, self.block_size, self.pool.scratch_slot))  # (K, S)
        sampling = RowSampling(seqs)
        ids = torch.tensor([s.token_ids[p] for s, p in zip(seqs, first)])  # (S,)
        burst = DecodeBurst(seqs, ids, pos, slots, torch.tensor(keep), stop_table(seqs), sampling,
                            sampling.uniforms(K))
        tokens, logprobs, top = self.decode_backend.run(burst)
        return StepOutput(tokens.T.tolist(), logprobs.T.tolist(), sampling.top_dicts(top) if top is not None else None)

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

    def _decode_group(self, batch: ScheduledBatch, rows: list[int], in_order: bool) -> AttnGroup:
        """The one-token sequences of a step that may also run prefill chunks."""
        seqs = [batch.seqs[i] for i in rows]
        pos = torch.tensor([s.num_computed_tokens for s in seqs])  # (S,) position of the new token
        q_index = None
        if not in_order:
            offsets = self._offsets(batch)
            q_index = torch.tensor([offsets[i] for i in rows], dtype=torch.long)
        return self.attention.decode_groups(seqs, pos[None], q_index)[0]

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
        tables = block_tables(seqs)
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


def burst_slots(seqs: list[Sequence], passes: int, keep: list[int], block_size: int, scratch: int) -> list[list[int]]:
    """(passes, S): the pool slot each pass of a decode burst writes its K/V to; the scratch
    slot for the passes a sequence does not keep and for positions already cached. Plain
    Python: at every batch size measured (1 to 256 rows) it beat the same in tensor ops,
    which need the block tables as a padded tensor first."""
    return [[s.block_table[p // block_size] * block_size + p % block_size if k < n and p >= s.num_cached_tokens
             else scratch
             for s, n in zip(seqs, keep) for p in (s.num_computed_tokens + k,)] for k in range(passes)]
