"""Settings of speculative decoding: `engine.native.speculative` in a run file.

Out of scope: how proposals are made or verified (the other modules of this package).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SpeculativeConfig(BaseModel):
    """Speculative decoding in the paged engine (polyrl/engine/speculative/). Lossless: greedy
    output equals the plain engine's token for token, sampled output is distributed as the
    target's (rejection sampling); it changes speed only."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)

    method: Literal["none", "ngram", "draft"] = "none"
    """"none": plain decoding; "ngram": prompt lookup (the next tokens after the latest earlier
    occurrence of the sequence's last n tokens, in its own prompt and output); "draft": a smaller
    model with the same tokenizer proposes (draft_model)."""
    num_speculative_tokens: int = Field(4, gt=0, le=64)
    """k: most tokens proposed per sequence per step (the target verifies k + 1 positions at once)."""
    prompt_lookup_max: int = Field(4, gt=0, le=64)
    """ngram: the longest suffix matched (tried first)."""
    prompt_lookup_min: int = Field(2, gt=0, le=64)
    """ngram: the shortest suffix matched (tried last); at most prompt_lookup_max."""
    draft_model: str | None = None
    """draft: the draft model, `builtin:tiny-draft` or a Hugging Face directory whose tokenizer is
    the target's (same vocabulary size); required when method is "draft"."""
    max_batch_size: int = Field(4, gt=0, le=2**20)
    """Speculate only in steps with at most this many decoding sequences: with more, a decode pass
    is no longer bound by reading the weights, and verifying rejected drafts costs real compute."""
    min_acceptance_rate: float = Field(0.2, ge=0.0, le=1.0)
    """A sequence stops speculating (and decodes plainly) once at least 4 of its verify steps
    have accepted fewer than this share of its drafted tokens; 0 = never."""

    @model_validator(mode="after")
    def _check(self) -> "SpeculativeConfig":
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min ({self.prompt_lookup_min}) must be <= prompt_lookup_max "
                             f"({self.prompt_lookup_max})")
        if self.method == "draft" and not self.draft_model:
            raise ValueError("speculative.method 'draft' needs speculative.draft_model (builtin:tiny-draft or a "
                             "Hugging Face directory with the target's tokenizer)")
        return self

    @property
    def enabled(self) -> bool:
        return self.method != "none"
