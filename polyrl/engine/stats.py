"""Engine counters: what the KV cache and the scheduler did, for the run's metrics.

Counters are cumulative and only ever grow; `counter_delta` turns two snapshots into
the figures of one interval (a training step's rollout), with the derived rates.

Out of scope: timing (the trainer times its stages), per-request latency histograms.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
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
    spec_drafts: int = 0
    """Speculative decoding: (sequence, verify step) pairs with at least one draft token."""
    spec_draft_tokens: int = 0
    """Draft tokens verified."""
    spec_accepted_tokens: int = 0
    """Draft tokens the verifier kept (acceptance rate = this / spec_draft_tokens; mean
    acceptance length, bonus token included = 1 + this / spec_drafts)."""
    spec_accepted_by_position: list[int] = field(default_factory=list)
    """Drafts whose j-th token (j = 0, 1, ..) was kept; in snapshots as spec_accepted_at_{j+1}."""

    def snapshot(self) -> dict[str, int]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "spec_accepted_by_position"}
        out.update({f"spec_accepted_at_{j + 1}": n for j, n in enumerate(self.spec_accepted_by_position)})
        return out


def counter_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Counters of the interval between two snapshots, plus prefix_hit_rate (cached share of
    prefill tokens) and batch_occupancy (mean sequences per step), and with speculative
    decoding spec_acceptance_rate and spec_mean_acceptance_length. {} if either is empty."""
    if not before or not after:
        return {}
    return _with_rates({k: after[k] - before.get(k, 0) for k in after})


_RATES = ("prefix_hit_rate", "batch_occupancy", "spec_acceptance_rate", "spec_mean_acceptance_length")


def sum_deltas(deltas: list[dict[str, Any]]) -> dict[str, Any]:
    """The counters of several engines over one interval (a rollout pool's), rates recomputed
    from the sums. {} if any is empty."""
    if not deltas or any(not d for d in deltas):
        return {}
    total: dict[str, Any] = {}
    for d in deltas:
        for k, v in d.items():
            if k not in _RATES:
                total[k] = total.get(k, 0) + v
    return _with_rates(total)


def _with_rates(d: dict[str, Any]) -> dict[str, Any]:
    prefill = d["prefill_tokens_computed"] + d["prefill_tokens_cached"]
    d["prefix_hit_rate"] = round(d["prefill_tokens_cached"] / prefill, 4) if prefill else 0.0
    d["batch_occupancy"] = round(d["scheduled_seqs"] / d["steps"], 2) if d["steps"] else 0.0
    if d.get("spec_drafts"):
        d["spec_acceptance_rate"] = round(d["spec_accepted_tokens"] / d["spec_draft_tokens"], 4)
        d["spec_mean_acceptance_length"] = round(1 + d["spec_accepted_tokens"] / d["spec_drafts"], 3)
    return d


def engine_counters(engine: Any) -> dict[str, int]:
    """Snapshot of an engine's counters; {} for an engine that keeps none."""
    counters = getattr(engine, "counters", None)
    return counters.snapshot() if counters is not None else {}
