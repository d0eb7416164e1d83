"""Typed settings of the paged engine, validated with errors that name the field.

Out of scope: the run file (polyrl/config.py's EngineConfig carries these through as
`engine.native`), device placement, vLLM's own settings (vllm_backend.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PagedConfig:
    block_size: int = 16
    """Tokens per KV block: the unit of allocation and of prefix sharing."""
    num_blocks: int | None = None
    """Blocks in the KV pool; None sizes the pool from kv_cache_mb."""
    kv_cache_mb: int = 1024
    """Memory for K and V of all layers when num_blocks is None (pages are touched only as used)."""
    max_num_seqs: int = 256
    """Most sequences running at once (a step's batch size limit)."""
    max_num_batched_tokens: int = 4096
    """Token budget of one step: decodes (1 each) plus prefill chunks."""
    enable_prefix_caching: bool = True
    """Share full KV blocks between requests with equal prefixes (GRPO groups, agent turns)."""
    contiguous_decode: bool = True
    """Keep decoding sequences' K/V also in contiguous rows (runner/decode_cache.py), so decode
    attention reads them in place instead of gathering blocks every step; costs that memory twice."""

    packed_linear: bool = True
    """Run large linear layers on oneDNN-packed weight copies (CPU, float32; runner/packed_linear.py)."""
    fused_decode: bool = True
    """Run decode steps through fused CPU kernels (runner/fused_decode.py, compiled on first
    use with the system C compiler); without a compiler, or for a model they do not cover,
    the engine says why once and keeps to the model's own forward pass."""
    decode_burst: int = 8
    """Most forward passes run back to back, without rescheduling, while every running sequence
    decodes and none waits (scheduler.py); 1 = reschedule after every token."""

    def __post_init__(self) -> None:
        for name in ("block_size", "kv_cache_mb", "max_num_seqs", "max_num_batched_tokens", "decode_burst"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"engine.native.{name}: got {value!r}; must be a positive integer")
        if self.num_blocks is not None and (not isinstance(self.num_blocks, int) or self.num_blocks <= 0):
            raise ValueError(f"engine.native.num_blocks: got {self.num_blocks!r}; must be a positive integer "
                             "or null (size the pool from kv_cache_mb)")

    def blocks_for(self, bytes_per_token: int) -> int:
        """Pool size in blocks for a model whose K/V take bytes_per_token (all layers)."""
        if self.num_blocks is not None:
            return self.num_blocks
        return max(1, self.kv_cache_mb * 2**20 // (bytes_per_token * self.block_size))
