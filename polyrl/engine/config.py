"""Typed settings of the native engine: `engine.native` in a run file.

One class serves both the run file (polyrl/config.py's EngineConfig holds it, and its
loader turns a bad value into an error naming file, line and field) and the engines,
which take it as it is. Unknown keys are errors, as everywhere in the run file.

Out of scope: how a decode step runs (the engine picks the fused kernels where they build,
else the model's own forward: runner/decode_backend.py; that is no setting), device
placement, vLLM's own settings (vllm_backend.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from polyrl.engine.speculative.config import SpeculativeConfig


class NativeEngineConfig(BaseModel):
    """The native rollout engine: the paged engine (paged.py), in worker processes when
    workers > 1 (parallel.py), or the dense reference engine (dense.py)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)

    paged: bool = True
    """true: the paged engine (prefix cache, continuous batching); false: the dense reference engine."""
    workers: int = Field(1, gt=0, le=1024)
    """Paged engines in worker processes sharing the weights, each with its share of the torch threads
    (parallel.py); on a CPU, small models generate faster split by requests than by threads."""
    block_size: int = Field(16, gt=0, le=4096)
    """Tokens per KV block: the unit of allocation and of prefix sharing (at most 4,096)."""
    num_blocks: int | None = Field(None, gt=0, le=2**24)
    """Blocks in the KV pool (at most 2**24); null sizes the pool from kv_cache_mb."""
    kv_cache_mb: int = Field(1024, gt=0, le=2**20)
    """Memory for K and V of all layers when num_blocks is null (pages are touched only as used;
    at most 2**20 MB = 1 TiB)."""
    max_num_seqs: int = Field(256, gt=0, le=2**20)
    """Most sequences running at once (a step's batch size limit; at most 2**20)."""
    max_num_batched_tokens: int = Field(4096, gt=0, le=2**24)
    """Token budget of one step: decodes (1 each) plus prefill chunks (at most 2**24)."""
    enable_prefix_caching: bool = True
    """Share full KV blocks between requests with equal prefixes (a GRPO group's prompt, agent turns)."""
    decode_burst: int = Field(8, gt=0, le=4096)
    """Most decode passes run back to back, without rescheduling, while every running sequence
    decodes and none waits (scheduler.py); 1 = reschedule after every token."""
    quantization: Literal["none", "int8"] = "none"
    """"int8": every linear layer on an int8 copy of its weight, one scale per output channel, with
    int8 activations (per token) where the CPU has AVX-512 VNNI, else float activations
    (runner/int8_linear.py); re-quantized after each weight update. Paged engine, float32 CPU
    models only. "none": float32 weights as they are."""
    kv_cache_dtype: Literal["auto", "int8"] = "auto"
    """"int8": the KV pool stores K and V as int8 with one bfloat16 scale per (position, kv head),
    so kv_cache_mb holds (4 * head_dim) / (head_dim + 2) times the tokens of a float32 cache (3.8x
    at head_dim 32); attention reads them dequantized, so outputs move slightly
    (runner/kv_int8.py). Paged engine only. "auto": K and V in the model's float dtype."""
    speculative: SpeculativeConfig = Field(default_factory=SpeculativeConfig)
    """Speculative decoding (n-gram prompt lookup or a draft model), lossless; off by default
    (polyrl/engine/speculative/config.py)."""

    @model_validator(mode="after")
    def _int8_needs_paged(self) -> "NativeEngineConfig":
        if self.quantization == "int8" and not self.paged:
            raise ValueError("quantization 'int8' runs on the paged engine: set paged: true, or quantization: none")
        if self.kv_cache_dtype == "int8" and not self.paged:
            raise ValueError("kv_cache_dtype 'int8' is a paged KV pool: set paged: true, or kv_cache_dtype: auto")
        return self

    def blocks_for(self, bytes_per_token: int) -> int:
        """Pool size in blocks for a model whose K/V take bytes_per_token (all layers)."""
        if self.num_blocks is not None:
            return self.num_blocks
        return max(1, self.kv_cache_mb * 2**20 // (bytes_per_token * self.block_size))
