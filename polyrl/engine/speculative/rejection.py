"""The speculative verifier: which drafted tokens to keep, and the target's token after them.

A pure function over tensors (no engine state), vectorised over sequences:

- greedy rows (temperature 0): accept draft j while it equals the argmax of the target's
  logits at position j; the next token is the argmax at the first mismatch (or after the
  last draft: the bonus token). The output is the plain engine's, token for token.
- sampled rows: accept draft x_j with probability min(1, p_j(x_j) / q_j(x_j)); at the first
  rejection sample from norm(max(0, p_j - q_j)) and stop; when every draft passes, sample a
  bonus token from p_k (Leviathan et al. 2023; Chen et al. 2023). p is the target's
  distribution and q the proposer's, both as the sampler processes them (temperature, then
  top-k/top-p truncation: sampler.processed_probs), so a draft outside the target's
  nucleus has p = 0 and is always rejected. A deterministic proposer (n-gram lookup, a
  greedy draft) has one-hot q: accept with probability p(x), else sample p with x removed.
  Each emitted token is then distributed exactly as the target would sample it.

Logprobs are the target's, as the plain sampler reports them: log softmax(logits / T) at
the emitted token, before truncation (untempered for greedy rows).

Out of scope: where the noise comes from (verify_step.py draws it per sequence and token
index), typical acceptance and other lossy verifiers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from polyrl.engine.sampler import inverse_cdf, processed_probs


@dataclass(frozen=True)
class Verdict:
    tokens: Tensor  # (S, K + 1) long: row s emits tokens[s, :num_emitted[s]]
    num_emitted: Tensor  # (S,) long: accepted drafts + 1
    logprobs: Tensor  # (S, K + 1): the target's logprob of each emitted token
    full_logprobs: Tensor  # (S, K + 1, V): the target's logprobs at each position (top logprobs)

    @property
    def num_accepted(self) -> Tensor:
        return self.num_emitted - 1


def verify(logits: Tensor, drafts: Tensor, num_drafts: Tensor, draft_probs: Tensor | None, temperature: Tensor,
           top_k: Tensor | None, top_p: Tensor | None, u_accept: Tensor, u_sample: Tensor) -> Verdict:
    """logits (S, K + 1, V) float32: the target's logits at [last token, d1 .. dK] (rows past a
    sequence's own drafts are padding, never read);
    drafts (S, K) long, padded with anything; num_drafts (S,) long, 0 .. K;
    draft_probs (S, K, V): the proposer's processed distribution q at each draft, or None when
    every proposal is deterministic (one-hot q);
    temperature (S,), top_k (S,) long or None, top_p (S,) or None: as sampler.sample_batch;
    u_accept (S, K) and u_sample (S, K + 1) float64 in [0, 1): independent noise for the accept
    tests and for the token sampled after them (the plain sampler's noise for that token index
    makes a sequence without drafts sample exactly as without speculation)."""
    S, K1, V = logits.shape
    K = K1 - 1
    assert drafts.shape == (S, K) and u_accept.shape == (S, K) and u_sample.shape == (S, K1)
    rows = torch.arange(S)
    rep = lambda x: None if x is None else x.repeat_interleave(K1)  # noqa: E731  (S,) -> (S * K1,)
    logprobs, probs = processed_probs(logits.reshape(S * K1, V), rep(temperature), rep(top_k), rep(top_p))
    logprobs, probs = logprobs.view(S, K1, V), probs.view(S, K1, V)
    greedy = temperature == 0  # (S,)
    argmax = logits.argmax(dim=-1)  # (S, K1)
    d = drafts.clamp(0, V - 1)  # (S, K)
    valid = torch.arange(K)[None, :] < num_drafts[:, None]  # (S, K)

    p = probs / probs.sum(-1, keepdim=True).clamp_min(1e-30)  # (S, K1, V) normalised target distribution
    p_d = p[:, :K].gather(-1, d[..., None]).squeeze(-1).double()  # (S, K)
    q_d = (torch.ones_like(p_d) if draft_probs is None
           else draft_probs.gather(-1, d[..., None]).squeeze(-1).double())  # (S, K)
    accept = torch.where(greedy[:, None], d == argmax[:, :K], u_accept * q_d < p_d) & valid  # u < p/q
    n_acc = accept.long().cumprod(dim=1).sum(dim=1)  # (S,) drafts kept
    rejected = n_acc < num_drafts  # (S,)

    # The token after the kept drafts: from the residual where a draft was rejected, else
    # (bonus) from p itself, in the plain sampler's un-normalised form (same sample, same noise).
    last = n_acc.clamp(max=max(K - 1, 0))
    base = probs[rows, n_acc]  # (S, V)
    if K and bool(rejected.any()):
        q_at = (torch.zeros(S, V).scatter_(-1, d[rows, last][:, None], 1.0) if draft_probs is None
                else draft_probs[rows, last])  # (S, V)
        residual = (p[rows, n_acc] - q_at).clamp_min(0.0)
        # p == q exactly leaves no residual mass, but then a rejection has probability 0.
        residual = torch.where((residual.sum(-1) > 0)[:, None], residual, base)
        base = torch.where(rejected[:, None], residual, base)
    final = inverse_cdf(base, u_sample[rows, n_acc])  # (S,)
    final = torch.where(greedy, argmax[rows, n_acc], final)

    tokens = torch.cat([d, torch.zeros(S, 1, dtype=torch.long)], dim=1)  # (S, K1)
    tokens[rows, n_acc] = final
    emitted_lp = logprobs.gather(-1, tokens[..., None]).squeeze(-1)  # (S, K1)
    return Verdict(tokens, n_acc + 1, emitted_lp, logprobs)
