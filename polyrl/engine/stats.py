"""Engine counters: what the KV cache and the scheduler did, for the run's metrics.

Counters are cumulative and only ever grow; `counter_delta` turns two snapshots into
the figures of one interval (a training step's rollout), with the derived rates.

Out of scope: timing (the trainer times its stages), per-request latency histograms.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class EngineCounters:
    requests: int = 0
    """Sequences added (a GRPO group of G counts G)."""
    steps: int = 0
    """Engine steps (one forward pass each)."""
    prefill_tokens_computed: int = 0
    """Prompt (and recomputed) tokens run through the model."""
    prefill_tokens_cached: int = 0
    """Prompt tokens served from the prefix cache instead."""
    decode_tokens: int = 0
    """Tokens computed one per sequence per step after the first sampled token."""
    scheduled_seqs: int = 0
    """Sum over steps of the sequences in the step (batch occupancy = this / steps)."""
    scheduled_tokens: int = 0
    """Sum over steps of the tokens in the step."""
    preemptions: int = 0
    """Sequences whose KV was dropped for lack of blocks (recomputed later)."""

    def snapshot(self) -> dict[str, int]:
        return asdict(self)


def counter_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Counters of the interval between two snapshots, plus prefix_hit_rate (cached share of
    prefill tokens) and batch_occupancy (mean sequences per step). {} if either is empty."""
    if not before or not after:
        return {}
    d = {k: after[k] - before.get(k, 0) for k in after}
    prefill = d["prefill_tokens_computed"] + d["prefill_tokens_cached"]
    d["prefix_hit_rate"] = round(d["prefill_tokens_cached"] / prefill, 4) if prefill else 0.0
    d["batch_occupancy"] = round(d["scheduled_seqs"] / d["steps"], 2) if d["steps"] else 0.0
    return d


def engine_counters(engine: Any) -> dict[str, int]:
    """Snapshot of an engine's counters; {} for an engine that keeps none."""
    counters = getattr(engine, "counters", None)
    return counters.snapshot() if counters is not None else {}
