"""Per-request state of the paged engine: tokens, KV bookkeeping, sampled logprobs.

A Sequence is one sample of one prompt (a GRPO group of G is G sequences with the same
prompt). Its tokens are the prompt followed by what was sampled so far; the KV of the
first `num_computed_tokens` of them sits in the blocks of `block_table`, in position
order. A sequence samples its next token in the step that computes its last known token.

Preemption by recompute drops the block table and resets `num_computed_tokens` to 0;
the sampled tokens stay, so the sequence resumes where it was (its prompt for the
recompute is prompt + sampled tokens, mostly served back from the prefix cache).

Speculative decoding never puts unverified tokens in `token_ids`: a verify step's drafts
live in the ScheduledBatch, and only the tokens the verifier keeps are appended.

Out of scope: beam search, parallel sampling that forks one sequence's blocks after
prefill (G samples share their prompt through the prefix cache instead), swapping KV
to host memory.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from polyrl.engine.base import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    seq_id: int
    token_ids: list[int]
    """Prompt followed by the sampled tokens."""
    num_prompt_tokens: int
    params: SamplingParams
    seed: int
    """Per-sequence sampling seed: the u(0,1) of token k is a hash of (seed, k), so a
    sample does not depend on batch composition, prefix hits or preemption."""
    stop_ids: frozenset[int]
    """Token ids that end the sequence (the tokenizer's end-of-turn ids plus the params')."""
    prompt_index: int = 0
    """Caller's tag, copied to Completion.prompt_index."""
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    """Chain hash of each full block of block_table registered so far (shared or computed)."""
    num_computed_tokens: int = 0
    """Tokens whose K/V is in the blocks (after the last executed step)."""
    num_cached_tokens: int = 0
    """Tokens served from the prefix cache at the latest admission (not recomputed)."""
    prompt_cached_tokens: int = 0
    """Prompt tokens served from the prefix cache at the first admission (Completion.num_cached_tokens)."""
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] | None = None
    finish_reason: str | None = None
    weight_version: int | None = None
    """Weight version that sampled the first completion token (the oldest, if an update
    landed while the sequence was in flight)."""
    token_versions: list[int] = field(default_factory=list)
    """Weight version that sampled each completion token."""
    admissions: int = 0
    """Times the sequence got blocks (1 + preemptions): a decode-cache row is per admission."""
    cache_epoch: int = 0
    """Prefix-cache epoch at admission: blocks computed under older weights are never shared."""
    spec_steps: int = 0
    """Speculative verify steps in which this sequence had drafts (speculative/speculator.py)."""
    spec_drafted: int = 0
    """Draft tokens proposed for this sequence and verified."""
    spec_accepted: int = 0
    """Of those, the ones the verifier kept."""

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def block_tokens(self, i: int, block_size: int) -> tuple[int, ...]:
        """Token ids of the i-th block (full or partial)."""
        return tuple(self.token_ids[i * block_size:(i + 1) * block_size])

    def append_token(self, token: int, logprob: float, top: dict[int, float] | None, version: int) -> None:
        if self.weight_version is None:
            self.weight_version = version
        self.token_versions.append(version)
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        if top is not None:
            if self.top_logprobs is None:
                self.top_logprobs = []
            self.top_logprobs.append(top)

    def stop_reason(self) -> str | None:
        """"stop" after a stop token, "length" at max_tokens, else None (stop strings are
        checked by the engine, which holds the tokenizer)."""
        if self.num_completion_tokens == 0:
            return None
        if self.token_ids[-1] in self.stop_ids:
            return "stop"
        if self.num_completion_tokens >= self.params.max_tokens:
            return "length"
        return None
