"""One engine step on the model: scheduled batch -> packed inputs -> forward -> samples.

The model is the trainer's own Transformer; the runner only supplies a PagedAttention
backend for it, so the engine's forward pass is the trainer's forward pass. Decode
steps run instead on the fused pass (fused_decode.py: the same function in fewer,
compiled operations, tested equal to float32 rounding) when it is available; then every
decode-only step goes through it, a single step as a burst of one. Logits
are computed only at the positions that sample (the last token of each sequence whose
chunk reaches its end), and sampling is per row: each sequence brings its own
temperature, top-k, top-p, seed and top-logprob count.

A decode burst (ScheduledBatch.steps > 1) runs its passes back to back without going
back to the scheduler: slots, masks, cache write positions and sampling noise for every
pass are computed once up front as (passes, S) tensors, each pass feeds the previous
pass's samples back in, and the burst ends early once every sequence has hit a stop
token or its last kept pass. Per pass that leaves the model's operators (or the fused
pass) and the sampler; per token, no Python at all until postprocess. Where the fused
pass runs whole in C (small models) and every row samples plainly, the burst itself is
one C call (FusedDecoder.burst), and its K/V go to the pool in one more.

Out of scope: tensor parallelism, CUDA graphs, asynchronous scheduling (preparing step
t+1 while step t runs); on GPU those are the vLLM backend's job.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from polyrl.engine.runner import cpu_kernels
from polyrl.engine.runner.decode_cache import DecodeCache
from polyrl.engine.runner.fused_decode import FusedDecoder, unsupported
from polyrl.engine.runner.paged_attention import AttnGroup, KVPool, PagedAttention
from polyrl.engine.sampler import counter_uniforms, sample_batch
from polyrl.engine.scheduler import ScheduledBatch
from polyrl.engine.sequence import Sequence
from polyrl.models.transformer import Transformer

logger = logging.getLogger("polyrl.engine")
_reported: set[str] = set()


@dataclass
class StepOutput:
    """Samples of the sequences that sample this step, in batch order, a list each: one
    token, or one per pass of a decode burst (a sequence's tokens after its stop included:
    postprocess drops them)."""

    tokens: list[list[int]]
    logprobs: list[list[float]]
    top_logprobs: list[list[dict[int, float]]] | None


class ModelRunner:
    def __init__(self, model: Transformer, num_blocks: int, block_size: int, contiguous_decode: bool = True,
                 fused_decode: bool = True) -> None:
        cfg = model.cfg
        self.model = model
        self.block_size = block_size
        dtype = next(model.parameters()).dtype
        self.pool = KVPool(cfg.num_hidden_layers, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim, dtype)
        self.decode_cache = DecodeCache(self.pool) if contiguous_decode else None
        self.attention = PagedAttention(self.pool, self.decode_cache)
        self.fused, self.fused_off_reason = self._fused_decoder(fused_decode)

    def _fused_decoder(self, wanted: bool) -> tuple[FusedDecoder | None, str | None]:
        """The fused decode pass (fused_decode.py), or None and why not."""
        if not wanted:
            return None, "engine.native.fused_decode is off"
        if self.decode_cache is None:
            return None, "fused decode reads the decode cache (engine.native.contiguous_decode is off)"
        reason = unsupported(self.model)
        lib = cpu_kernels.load() if reason is None else reason
        if isinstance(lib, str):
            if lib not in _reported:  # once per process, not once per engine
                _reported.add(lib)
                logger.warning("decode runs on the model's forward pass, not the fused kernels: %s", lib)
            return None, lib
        return FusedDecoder(self.model, self.decode_cache, lib), None

    def refresh_weights(self) -> None:
        """The model's weights changed in place: rebuild what was derived from them."""
        if self.fused is not None:
            self.fused.refresh()

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> StepOutput:
        if batch.steps > 1 or (self.fused is not None and all(batch.sampling)
                                and all(n == 1 for n in batch.num_new_tokens)):
            return self._run_burst(batch)  # fused: bursts and single decode steps share one arithmetic
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

    def _run_burst(self, batch: ScheduledBatch) -> StepOutput:
        """batch.steps decode passes back to back (one for a plain decode step); see the
        module docstring."""
        seqs, K = batch.seqs, batch.steps
        bs = self.block_size
        pass_ = torch.arange(K)[:, None]  # (K, 1)
        pos = torch.tensor([s.num_computed_tokens for s in seqs])[None, :] + pass_  # (K, S) input positions
        keep = torch.tensor(batch.burst_tokens or [1] * len(seqs))  # (S,)
        cached = torch.tensor([s.num_cached_tokens for s in seqs])  # (S,)
        tables = self._tables(seqs)  # (S, nb)
        block = tables.gather(1, (pos // bs).clamp(max=tables.shape[1] - 1).T).T  # (K, S)
        # Passes a sequence does not keep write to the scratch slot, as do cached positions.
        slots = torch.where((pass_ < keep) & (pos >= cached), block * bs + pos % bs, self.pool.scratch_slot)
        fused = self.fused
        if fused is not None:  # only the rows; fresh ones filled now, as the burst writes no pool block before its end
            cache_rows, _, fill = self.decode_cache.rows_for(seqs, lookahead=K - 1)
            if fill is not None:
                for layer in range(self.pool.k.shape[0]):
                    self.decode_cache.fill_layer(layer, fill)
        else:
            groups = self._burst_groups(seqs, pos, tables)
        rows = RowSampling(seqs)
        u = rows.uniforms(K)  # (K, S)
        stop_table = _stop_table(seqs)  # (S, m)
        ids = torch.tensor([s.token_ids[s.num_computed_tokens] for s in seqs])  # (S,)
        write_pool = self.decode_cache is None  # else the rows are copied to the pool after the burst
        tops: list[Tensor] = []
        if fused is not None and fused.whole is not None and rows.plain:  # the loop below, in one C call
            tokens, logprobs, passes = fused.burst(ids, pos, cache_rows, rows.temperature, u, stop_table, keep)
        else:
            tokens = torch.empty(K, len(seqs), dtype=torch.long)
            logprobs = torch.empty(K, len(seqs))
            done = torch.zeros(len(seqs), dtype=torch.bool)
            passes = 0
            for k in range(K):
                if fused is not None:
                    logits = fused.logits(ids, pos[k], cache_rows)  # (S, V)
                else:
                    self.attention.slot_mapping = slots[k] if write_pool else None
                    self.attention.groups = [groups[k]]
                    logits = self.model.lm_head(self.model.hidden(ids[None], pos[k][None], self.attention)[0]).float()
                if fused is not None and rows.plain:
                    (ids, logprobs[k]), top = fused.sample(logits, rows.temperature, u[k]), None
                else:
                    ids, logprobs[k], top = rows.sample(logits, u[k])
                tokens[k] = ids
                if top is not None:
                    tops.append(top)
                passes = k + 1
                done |= (ids[:, None] == stop_table).any(-1) | (keep <= passes)
                if bool(done.all()):
                    break
        if not write_pool:
            self.decode_cache.write_back(cache_rows if fused is not None else groups[0].rows, pos[:passes],
                                         slots[:passes], fused.lib if fused is not None else None)
        top_lists = rows.top_dicts(torch.stack(tops)) if tops else None
        return StepOutput(tokens[:passes].T.tolist(), logprobs[:passes].T.tolist(), top_lists)

    def _burst_groups(self, seqs: list[Sequence], pos: Tensor, tables: Tensor) -> list[AttnGroup]:
        """One decode AttnGroup per pass of a burst; pos (K, S) are the input positions."""
        K = pos.shape[0]
        if self.decode_cache is None:
            L = tables.shape[1] * self.block_size
            masks = _bias(torch.arange(L)[None, None, :] <= pos[:, :, None], self.pool.k.dtype)  # (K, S, 1, 1, L)
            return [AttnGroup(masks[k], None, None, block_tables=tables) for k in range(K)]
        cache_rows, R, fill = self.decode_cache.rows_for(seqs, lookahead=K - 1)
        ctx = torch.ones(K, R, dtype=torch.long)  # rows of other sequences see their position 0
        ctx[:, cache_rows] = pos + 1
        L = int(ctx.max())
        masks = _bias(torch.arange(L)[None, None, :] < ctx[:, :, None], self.pool.k.dtype)  # (K, R, 1, 1, L)
        identity = R == len(seqs) and bool((cache_rows == torch.arange(R)).all())
        _, _, n_kv, L_cap, _ = self.decode_cache.k.shape
        heads = cache_rows[:, None] * n_kv + torch.arange(n_kv)[None, :]  # (S, n_kv)
        write = (heads[None] * L_cap + pos[:, :, None]).view(K, -1)  # (K, S * n_kv)
        return [AttnGroup(masks[k], None, None, rows=cache_rows, write_index=write[k], num_rows=R,
                          identity=identity, fill=fill if k == 0 else None) for k in range(K)]

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



class RowSampling:
    """The sampling settings of the rows that sample, as tensors, built once per step or burst."""

    def __init__(self, seqs: list[Sequence]) -> None:
        self.params = [s.params for s in seqs]
        params = self.params
        self.temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32)  # (M,)
        self.top_k = torch.tensor([p.top_k for p in params]) if any(p.top_k for p in params) else None
        self.top_p = (torch.tensor([p.top_p for p in params], dtype=torch.float32)
                      if any(p.top_p < 1 for p in params) else None)
        self.seeds = torch.tensor([s.seed for s in seqs])  # (M,)
        self.counters = torch.tensor([s.num_completion_tokens for s in seqs])  # (M,) index of the next token
        self.sampled = any(p.temperature > 0 for p in params)
        self.num_top = max(p.logprobs for p in params)
        self.plain = self.top_k is None and self.top_p is None and not self.num_top
        """No truncation and no top logprobs: what the fused sampler covers."""

    def uniforms(self, passes: int) -> Tensor:
        """(passes, M) float64: the noise of each row's next `passes` tokens (zeros if all greedy)."""
        if not self.sampled:
            return torch.zeros(passes, len(self.params), dtype=torch.float64)
        counters = self.counters[None, :] + torch.arange(passes)[:, None]  # (passes, M)
        return counter_uniforms(self.seeds[None, :].expand(passes, -1), counters)

    def sample(self, logits: Tensor, u: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """logits (M, V) -> tokens (M,), logprobs (M,), and the top logprobs (2, M, k) as
        (values, indices) when any row asked for them, else None."""
        tokens, logprobs, full = sample_batch(logits, self.temperature, self.top_k, self.top_p, u)
        if not self.num_top:
            return tokens, logprobs, None
        values, indices = full.topk(min(self.num_top, full.shape[-1]), dim=-1)  # (M, k)
        return tokens, logprobs, torch.stack([values, indices.to(values.dtype)])

    def top_dicts(self, top: Tensor) -> list[list[dict[int, float]]]:
        """top (passes, 2, M, k) -> per row, per pass {token: logprob} of its own top count."""
        values, indices = top[:, 0].tolist(), top[:, 1].long().tolist()
        return [[dict(zip(indices[k][i][:p.logprobs], values[k][i][:p.logprobs])) if p.logprobs else {}
                 for k in range(len(values))] for i, p in enumerate(self.params)]


def _stop_table(seqs: list[Sequence]) -> Tensor:
    """(S, m) stop token ids of each sequence, padded with -1 (never a token)."""
    m = max(1, max(len(s.stop_ids) for s in seqs))
    return torch.tensor([sorted(s.stop_ids) + [-1] * (m - len(s.stop_ids)) for s in seqs], dtype=torch.long)


def _bias(visible: Tensor, dtype: torch.dtype) -> Tensor:
    """(..., S, L) bool -> (..., S, 1, 1, L) additive mask in the model dtype: 0 where visible, -inf elsewhere."""
    return torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, float("-inf"))[..., None, None, :]
