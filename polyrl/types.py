"""What passes between the stages: tasks, scores, completions.

Plain dataclasses with no behaviour beyond (de)serialisation, so every stage can be
tested alone and records can cross process boundaries as JSON.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Task:
    """One prompt of one domain, with whatever its verifier needs to grade it."""

    id: str
    domain: str
    prompt: str
    answer: str | None = None
    """Gold answer (math): a string math-verify can parse, e.g. "12", "\\frac{1}{2}"."""
    verifier: str | None = None
    """Overrides the domain's default verifier when set."""
    split: str = "train"
    difficulty: int = 0
    data: dict[str, Any] = field(default_factory=dict)
    """Domain-specific fields of a pack line (entry_point, tests, test, reference, ...)."""
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Score:
    """A verifier's verdict: a reward (0..1 unless the verifier says otherwise) and why."""

    value: float
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Completion:
    """One sampled continuation of one prompt, as an Engine returns it."""

    prompt_index: int
    """Index into the prompts passed to Engine.generate."""
    text: str
    token_ids: list[int]
    logprobs: list[float]
    """log p(token) under the sampling distribution's temperature, before top-k/top-p."""
    finish_reason: str
    """"stop" (EOS, stop token or stop string) or "length" (max_tokens reached)."""
    weight_version: int
    """Version of the weights that produced every token of this completion (the oldest one
    if a weight update landed while the request was in flight; see engine/paged.py)."""
    top_logprobs: list[dict[int, float]] | None = None
    """Per position, token id -> logprob of the most likely tokens, when SamplingParams.logprobs > 0."""
    num_cached_tokens: int = 0
    """Prompt tokens served from a prefix cache instead of computed (0 for engines without one)."""
    token_versions: list[int] | None = None
    """Weight version that sampled each token, when an update may have landed while the
    request was in flight (the paged engine's step API); None: every token is weight_version's."""

    def versions(self) -> list[int]:
        """The weight version of every sampled token."""
        return list(self.token_versions) if self.token_versions is not None else [self.weight_version] * len(self.token_ids)
