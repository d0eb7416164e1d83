"""Next-token sampling: temperature, top-k, top-p, and the logprob of the chosen token.

The logprob we report is log softmax(logits / temperature) at the sampled token, taken
BEFORE top-k/top-p truncation: that is the quantity the trainer recomputes from the
same weights, so engine and trainer logprobs agree (tested). Greedy (temperature 0)
reports the untempered log softmax.
"""

from __future__ import annotations

import torch


def sample_next(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (B, V) float32 -> (tokens (B,), logprobs (B,))."""
    if temperature == 0:
        logprobs = torch.log_softmax(logits, dim=-1)
        tokens = logits.argmax(dim=-1)
        return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)
    logprobs = torch.log_softmax(logits / temperature, dim=-1)  # (B, V)
    filtered = logprobs
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(filtered, top_k, dim=-1).values[:, -1:]  # (B, 1)
        filtered = filtered.masked_fill(filtered < kth, float("-inf"))
    if top_p < 1.0:
        sorted_lp, order = filtered.sort(dim=-1, descending=True)
        cum = sorted_lp.exp().cumsum(dim=-1)
        drop_sorted = (cum - sorted_lp.exp()) >= top_p  # mass before this token already reaches top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        filtered = filtered.masked_fill(drop, float("-inf"))
    probs = torch.softmax(filtered, dim=-1)
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)
