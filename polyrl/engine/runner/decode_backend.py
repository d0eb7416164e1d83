"""How the runner runs a decode step: one backend, chosen when the runner is built.

Every decode-only step is a burst of K passes (K = 1 for a plain step; scheduler.py plans
longer ones): each pass feeds every sequence's previous sample back in, and the burst ends
early once every sequence has sampled a stop token or reached its last kept pass. The
runner computes the burst's inputs once (`DecodeBurst`: positions, pool slots, noise, stop
ids as (K, S) tensors) and hands them to its backend, which returns the samples:

- `FusedDecode`: the fused pass (fused_decode.py over cpu_kernels.c) on the decode cache's
  rows. Where the whole pass runs in C (a small model with BLAS sgemm) and every row
  samples plainly, the whole burst is one C call; otherwise its passes run one by one.
  The new K/V go to the pool in one copy at the burst's end.
- `ForwardDecode`: the trainer's own forward pass over PagedAttention, on the decode
  cache's rows when the runner keeps one, else on the pool's blocks; it writes the pool
  as it goes.

`choose_decode_backend` picks the fused pass wherever it can run (float32 on CPU, a
supported model shape, a decode cache, a C compiler) and otherwise the model's forward,
saying once per process why. The two compute the same function to float32 rounding, not
bit for bit, so an engine keeps to one of them for all its decode steps; prefill chunks
always run on the model's forward (model_runner.py).

Out of scope: prefill and steps that mix decodes with prefill chunks (model_runner.py),
speculative passes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
from torch import Tensor

from polyrl.engine.runner import cpu_kernels
from polyrl.engine.runner.decode_cache import DecodeCache
from polyrl.engine.runner.fused_decode import FusedDecoder, unsupported
from polyrl.engine.runner.paged_attention import PagedAttention
from polyrl.engine.runner.row_sampling import RowSampling
from polyrl.engine.sequence import Sequence
from polyrl.models.transformer import Transformer

logger = logging.getLogger("polyrl.engine")
_reported: set[str] = set()


@dataclass(frozen=True)
class DecodeBurst:
    """The inputs of K decode passes over S sequences, computed once before the first."""

    seqs: list[Sequence]
    ids: Tensor  # (S,) long: the first pass's input tokens
    pos: Tensor  # (K, S) long: input positions
    slots: Tensor  # (K, S) long: pool slot of each pass's K/V (the scratch slot when not kept, or cached)
    keep: Tensor  # (S,) long: the passes whose samples each sequence may keep
    stop: Tensor  # (S, m) long: stop token ids, padded with -1
    sampling: RowSampling
    u: Tensor  # (K, S) float64: each pass's sampling noise


Samples = tuple[Tensor, Tensor, Tensor | None]
"""tokens (P, S) long, logprobs (P, S), top logprobs (P, 2, S, k) or None: the P <= K passes run."""


class DecodeBackend(Protocol):
    def run(self, burst: DecodeBurst) -> Samples:
        """Run the burst's passes (writing their K/V to the pool) and return their samples."""
        ...

    def refresh(self) -> None:
        """The model's weights changed in place: rebuild what was derived from them."""
        ...


def run_passes(burst: DecodeBurst, logits_of: Callable[[Tensor, int], Tensor],
               sample: Callable[[Tensor, Tensor], tuple[Tensor, Tensor, Tensor | None]]) -> Samples:
    """The burst pass by pass: logits_of(ids (S,), k) -> logits (S, V) of pass k, then
    sample(logits, u (S,)) -> tokens, logprobs, top; stops once every row is done."""
    ids = burst.ids
    tokens, logprobs, tops = [], [], []
    done = torch.zeros(len(ids), dtype=torch.bool)
    for k in range(burst.pos.shape[0]):
        ids, lp, top = sample(logits_of(ids, k), burst.u[k])
        tokens.append(ids)
        logprobs.append(lp)
        if top is not None:
            tops.append(top)
        done |= (ids[:, None] == burst.stop).any(-1) | (burst.keep <= k + 1)
        if bool(done.all()):
            break
    return torch.stack(tokens), torch.stack(logprobs), torch.stack(tops) if tops else None


class ForwardDecode:
    """Decode passes on the model's own forward over PagedAttention (see the module docstring)."""

    def __init__(self, model: Transformer, attention: PagedAttention, reason: str) -> None:
        self.model, self.attention = model, attention
        self.reason = reason
        """Why this engine does not decode on the fused pass."""

    def refresh(self) -> None:
        pass  # nothing derived from the weights: the forward reads the model's own

    def run(self, burst: DecodeBurst) -> Samples:
        groups = self.attention.decode_groups(burst.seqs, burst.pos)

        def logits_of(ids: Tensor, k: int) -> Tensor:
            # The pool is written in every pass: a fresh decode-cache row is filled from it in
            # the first pass's layers, after that layer's writes (another sequence of this step
            # may have written a block this one shares).
            self.attention.slot_mapping = burst.slots[k]
            self.attention.groups = [groups[k]]
            hidden = self.model.hidden(ids[None], burst.pos[k][None], self.attention)[0]  # (S, D)
            return self.model.lm_head(hidden).float()  # (S, V)

        return run_passes(burst, logits_of, burst.sampling.sample)


class FusedDecode:
    """Decode passes on the fused pass over the decode cache (see the module docstring)."""

    def __init__(self, decoder: FusedDecoder, cache: DecodeCache) -> None:
        self.decoder, self.cache = decoder, cache

    def refresh(self) -> None:
        self.decoder.refresh()

    def run(self, burst: DecodeBurst) -> Samples:
        fused, sampling, K = self.decoder, burst.sampling, burst.pos.shape[0]
        rows, _, fill = self.cache.rows_for(burst.seqs, lookahead=K - 1)
        if fill is not None:  # now: the burst writes no pool block before its end
            for layer in range(self.cache.k.shape[0]):
                self.cache.fill_layer(layer, fill)
        if fused.whole is not None and sampling.plain:  # run_passes below, in one C call
            tokens, logprobs, passes = fused.burst(burst.ids, burst.pos, rows, sampling.temperature, burst.u,
                                                   burst.stop, burst.keep)
            samples: Samples = (tokens[:passes], logprobs[:passes], None)
        else:
            if sampling.plain:
                def sample(logits: Tensor, u: Tensor) -> tuple[Tensor, Tensor, None]:
                    return (*fused.sample(logits, sampling.temperature, u), None)
            else:
                sample = sampling.sample
            samples = run_passes(burst, lambda ids, k: fused.logits(ids, burst.pos[k], rows), sample)
        passes = len(samples[0])
        self.cache.write_back(rows, burst.pos[:passes], burst.slots[:passes], fused.lib)
        return samples


def choose_decode_backend(model: Transformer, attention: PagedAttention, forward: bool = False) -> DecodeBackend:
    """The fused pass where it can run, else the model's forward (logged once per process
    with the reason). forward=True takes the model's forward regardless: the variant that
    equivalence tests and benchmarks compare with the default."""
    cache = attention.decode_cache
    if forward:
        return ForwardDecode(model, attention, "the model's forward pass was asked for")
    if cache is None:
        return ForwardDecode(model, attention, "the fused pass reads the decode cache, and this runner keeps none")
    lib = unsupported(model) or cpu_kernels.load()
    if isinstance(lib, str):
        if lib not in _reported:  # once per process, not once per engine
            _reported.add(lib)
            logger.warning("decode runs on the model's forward pass, not the fused kernels: %s", lib)
        return ForwardDecode(model, attention, lib)
    return FusedDecode(FusedDecoder(model, cache, lib), cache)
