"""The Engine interface: what rollout and evaluation code may ask of a generator.

Prompts go in as token ids (the caller applies the chat template), so a remote server
or vLLM can serve the same calls without re-tokenising. Weights are versioned: every
Completion carries the version that produced it, so the trainer can measure staleness
once generation runs ahead of training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

import torch

from polyrl.types import Completion


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    """0 means greedy (argmax); logprobs are then those of the untempered distribution."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 = off."""
    max_tokens: int = 64
    stop: tuple[str, ...] = ()
    """Stop strings: generation ends once the decoded text contains one; it is cut from the text."""
    stop_token_ids: tuple[int, ...] = ()
    """Extra stop tokens besides the tokenizer's end-of-turn tokens."""
    seed: int | None = None
    """Seed of this call's sampling; None draws from torch's global generator."""
    logprobs: int = 0
    """Also return the top-k logprobs of every position (Completion.top_logprobs); 0 = off."""
    ignore_eos: bool = False
    """Do not stop at the tokenizer's end-of-turn tokens (benchmarks: exactly max_tokens)."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0 or self.max_tokens <= 0:
            raise ValueError(f"top_k must be >= 0 and max_tokens > 0, got {self.top_k}, {self.max_tokens}")
        if self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0 (0 = off), got {self.logprobs}")


class Engine(Protocol):
    weight_version: int

    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams) -> list[Completion]:
        """n completions per prompt, grouped: result[i*n + j] is sample j of prompt i."""
        ...

    def update_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """Copy `weights` (state_dict names) into the engine in place and set weight_version.

        A generate call runs entirely on one version. What requests in flight between
        engine steps see (paged engine, step API) is documented in engine/paged.py.
        """
        ...

    def close(self) -> None:
        """Release worker processes and the KV cache; generating after close is an error.
        Closing twice is harmless."""
        ...


def check_prompts(prompts: Sequence[Sequence[int]], n: int = 1) -> None:
    """What every engine refuses before generating: no prompts or n < 1 (a caller's bug,
    asserted) and an empty prompt (a user's mistake, a ValueError). Engines add their own
    limits on top (the paged engine: a prompt past its KV pool)."""
    assert n >= 1 and len(prompts) > 0
    if any(len(p) == 0 for p in prompts):
        raise ValueError("empty prompt: every prompt needs at least one token")


@torch.no_grad()
def copy_weights_(model: torch.nn.Module, weights: Mapping[str, torch.Tensor]) -> None:
    """Copy `weights` (state_dict names, all of them) into `model`'s tensors in place."""
    own = model.state_dict()
    missing = set(own) - set(weights)
    if missing:
        raise KeyError(f"update_weights: missing {sorted(missing)[:5]}")
    for name, tensor in own.items():
        tensor.copy_(weights[name])
