"""The paged engine: paged KV cache, prefix caching, continuous batching, on the trainer's model.

An engine step is four calls: schedule (scheduler.py: who runs, how many tokens) ->
run (runner/: one forward pass over the packed tokens, attention over block tables,
per-row sampling; decode-only steps on the decode backend chosen when the engine is
built) -> postprocess (append tokens, finish sequences, free blocks) -> collect the
finished. `generate` adds a batch of requests and steps until they are
done; `add_request` / `step` serve callers that want requests to join and leave
between steps (an asynchronous rollout pipeline, a server). While every running
sequence decodes and none waits, one step is a decode burst of up to
`NativeEngineConfig.decode_burst` forward passes (scheduler.py), so a step may add several
tokens to each sequence.

Weight updates (`update_weights`) copy new tensors into the model in place and set
`weight_version`. A `generate` call runs entirely on one version. Requests in flight
through the step API when an update lands see, by `in_flight`:

- "keep" (default): they keep their KV (computed under the older weights) and sample
  their next tokens from the new ones; each token's logprob is the one it was sampled
  with, and Completion.weight_version is the version that sampled the first token
  (the oldest), so the trainer never underestimates staleness;
- "recompute": every running request is preempted and its KV is recomputed under the
  new weights at its next step (its sampled tokens stay).

Either way the prefix cache starts a new epoch: no block computed under old weights is
shared with a request admitted after the update.

Sampling is seeded per sequence (sample j of prompt i of a call with seed s uses the
stream of `request_seed(s, i * n + j)`), so a seeded call returns the same tokens
whatever else is in the batch, whether its prompt came from the cache, and across
preemption.

A server streams a request's tokens as steps produce them (`partial`) and drops the
requests of clients that went away (`abort`).

Speculative decoding (engine.native.speculative: n-gram prompt lookup or a draft model)
turns decode-only steps into verify passes; lossless (speculative/).

With engine.native.kv_cache_dtype "int8" the pool stores K and V as int8 with a scale per
(position, kv head), so the same kv_cache_mb holds 1.9-3.9x the tokens; attention reads them
dequantized (runner/kv_int8.py).

Out of scope: KV quantization other than that int8 pool (fp8, 4-bit, per-channel key scales),
multi-device execution (the vLLM backend serves GPUs).
"""

from __future__ import annotations

import itertools
from typing import Literal, Mapping, Sequence as Seq

import torch

from polyrl.engine.base import SamplingParams, check_prompts, copy_weights_
from polyrl.engine.block_manager import BlockManager
from polyrl.engine.config import NativeEngineConfig
from polyrl.engine.runner.model_runner import POOLS, ModelRunner
from polyrl.engine.runner.int8_linear import Int8Linear, quantize_linears
from polyrl.engine.runner.packed_linear import PackedLinear, pack_linears
from polyrl.engine.sampler import request_seed
from polyrl.engine.scheduler import Scheduler
from polyrl.engine.sequence import Sequence
from polyrl.engine.speculative.speculator import build_speculator
from polyrl.engine.stats import EngineCounters
from polyrl.engine.text import hits_stop_string, visible_text
from polyrl.models.tokenizer import Tokenizer
from polyrl.models.transformer import Transformer
from polyrl.types import Completion


class PagedEngine:
    """Engine over an in-process Transformer it owns (new weights come through update_weights)."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, config: NativeEngineConfig | None = None,
                 weight_version: int = 0, *, decode: Literal["auto", "forward"] = "auto", decode_cache: bool = True,
                 packed_linear: bool = True, draft_model: Transformer | None = None) -> None:
        """config: the run file's engine.native (its `paged` and `workers` are the factory's).
        decode, decode_cache (runner/model_runner.py) and packed_linear=False (the model's
        nn.Linear layers as they are) are the variants that equivalence tests and benchmarks
        compare with the default, which takes the fastest path that runs here.
        draft_model: the draft of config.speculative.method "draft", already built (else its
        draft_model path is loaded)."""
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.config = config or NativeEngineConfig()
        self.weight_version = weight_version
        cfg = model.cfg
        per_token = POOLS[self.config.kv_cache_dtype].bytes_per_token(
            cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, next(model.parameters()).dtype)
        self.num_blocks = self.config.blocks_for(per_token)
        self.counters = EngineCounters()
        self.block_manager = BlockManager(self.num_blocks, self.config.block_size, self.config.enable_prefix_caching)
        self.speculator = build_speculator(self.config.speculative, model, self.counters, draft_model)
        self.scheduler = Scheduler(self.block_manager, self.config.max_num_seqs, self.config.max_num_batched_tokens,
                                   self.counters, stop_text=self._hits_stop_string,
                                   decode_burst=self.config.decode_burst, speculator=self.speculator)
        if self.config.quantization == "int8":  # the int8 layers replace the packed float ones
            self.packed: list[PackedLinear | Int8Linear] = list(quantize_linears(self.model))
        else:
            self.packed = list(pack_linears(self.model)) if packed_linear else []
        self.runner = ModelRunner(model, self.num_blocks, self.config.block_size, decode, decode_cache,
                                  self.config.kv_cache_dtype)
        self._eos = frozenset(tokenizer.stop_token_ids())
        self._ids = itertools.count()
        self._live: dict[int, Sequence] = {}
        """Requests added and not yet reported finished (partial(), abort())."""

    # ---- the step API ------------------------------------------------------------------------

    def add_request(self, prompt_ids: Seq[int], sampling: SamplingParams, seed: int | None = None,
                    prompt_index: int = 0) -> int:
        """Queue one sequence; returns its id (step() reports it back with its Completion)."""
        self.check_prompt(prompt_ids)
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)))
        stop = frozenset(sampling.stop_token_ids) | (frozenset() if sampling.ignore_eos else self._eos)
        seq = Sequence(next(self._ids), list(prompt_ids), len(prompt_ids), sampling, seed, stop, prompt_index)
        self.scheduler.add(seq)
        self._live[seq.seq_id] = seq
        self.counters.requests += 1
        return seq.seq_id

    def check_prompt(self, prompt_ids: Seq[int]) -> None:
        """Raise ValueError for a prompt this engine can never serve (empty, or past the KV pool)."""
        check_prompts([prompt_ids])
        capacity = self.num_blocks * self.config.block_size
        if len(prompt_ids) + 1 > capacity:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens does not fit the KV pool of {capacity} tokens; "
                             "raise engine.native.kv_cache_mb or num_blocks")

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[tuple[int, Completion]]:
        """schedule -> run -> postprocess -> collect finished: (request id, Completion) pairs."""
        batch = self.scheduler.schedule()
        if batch.seqs:
            self.runner.pool.zero_up_to(self.block_manager.high_water)
            out = self.runner.run(batch)
            self.scheduler.postprocess(batch, out.tokens, out.logprobs, out.top_logprobs, self.weight_version)
        done = self.scheduler.pop_finished()
        if self.speculator is not None and done:
            self.speculator.release([seq.seq_id for seq in done])
        for seq in done:
            self._live.pop(seq.seq_id, None)
        return [(seq.seq_id, self._completion(seq)) for seq in done]

    def partial(self, seq_id: int) -> tuple[list[int], list[float]]:
        """The tokens (and their logprobs) a queued or running request has sampled so far:
        what a server streams between steps. Empty once it finished or was aborted."""
        seq = self._live.get(seq_id)
        return (seq.completion_token_ids, list(seq.logprobs)) if seq is not None else ([], [])

    def abort(self, seq_id: int) -> bool:
        """Drop an unfinished request (a client went away); its blocks go back to the pool and
        step() never reports it. False when it is unknown or already finished."""
        seq = self._live.pop(seq_id, None)
        if seq is None or not self.scheduler.abort(seq):
            return False
        if self.speculator is not None:
            self.speculator.release([seq_id])  # its draft model's KV too
        return True

    # ---- the Engine interface ----------------------------------------------------------------

    def generate(self, prompts: Seq[Seq[int]], n: int, sampling: SamplingParams) -> list[Completion]:
        """n completions per prompt, grouped: result[i*n + j] is sample j of prompt i."""
        check_prompts(prompts, n)
        base = sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**62, (1,)))
        return self.run_requests([(prompt, request_seed(base, i * n + j), i)
                                  for i, prompt in enumerate(prompts) for j in range(n)], sampling)

    def run_requests(self, requests: Seq[tuple[Seq[int], int, int]], sampling: SamplingParams) -> list[Completion]:
        """(prompt, seed, prompt index) requests run to completion: their completions, in order.
        All or nothing: a prompt this engine cannot serve raises before any request is queued."""
        for prompt, _, _ in requests:
            self.check_prompt(prompt)
        order = {self.add_request(prompt, sampling, seed=seed, prompt_index=i): k
                 for k, (prompt, seed, i) in enumerate(requests)}
        results: list[Completion | None] = [None] * len(order)
        remaining = len(order)
        while remaining:
            for rid, completion in self.step():
                if rid in order:
                    results[order[rid]] = completion
                    remaining -= 1
            assert remaining == 0 or self.has_unfinished(), "engine stalled with requests outstanding"
        return results  # type: ignore[return-value]

    @torch.no_grad()
    def update_weights(self, weights: Mapping[str, torch.Tensor], version: int,
                       in_flight: Literal["keep", "recompute"] = "keep") -> None:
        """Copy `weights` (state_dict names) into the model in place; see the module
        docstring for what requests in flight see."""
        if in_flight not in ("keep", "recompute"):
            raise ValueError(f"in_flight: got {in_flight!r}; must be 'keep' or 'recompute'")
        copy_weights_(self.model, weights)
        self.refresh_weights(version)
        if in_flight == "recompute":
            self.scheduler.preempt_all()

    def close(self) -> None:
        """Nothing to stop in process; the pool's memory goes with the engine."""

    def refresh_weights(self, version: int) -> None:
        """The model's tensors changed in place (update_weights, or a parent process writing
        shared weights; parallel.py): repack (int8: re-quantize), take the version, stop sharing older KV."""
        for linear in self.packed:
            linear.repack()
        self.runner.refresh_weights()
        self.weight_version = version
        self.block_manager.reset_cache()

    # ---- helpers -----------------------------------------------------------------------------

    def _hits_stop_string(self, seq: Sequence) -> bool:
        return hits_stop_string(self.tokenizer, seq.completion_token_ids, seq.params.stop)

    def _completion(self, seq: Sequence) -> Completion:
        tokens = seq.completion_token_ids
        return Completion(
            prompt_index=seq.prompt_index,
            text=visible_text(self.tokenizer, tokens, seq.finish_reason or "length", seq.stop_ids, seq.params.stop),
            token_ids=tokens,
            logprobs=seq.logprobs,
            finish_reason=seq.finish_reason or "length",
            weight_version=seq.weight_version if seq.weight_version is not None else self.weight_version,
            top_logprobs=seq.top_logprobs,
            num_cached_tokens=seq.prompt_cached_tokens,
            # per token only when an update landed mid-request (otherwise weight_version says it)
            token_versions=list(seq.token_versions) if len(set(seq.token_versions)) > 1 else None,
        )
