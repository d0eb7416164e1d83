"""Proposers: each decoding sequence's guess of its next tokens, for the target to verify.

`Proposer.propose(seqs, budgets)` returns one `Draft` per sequence, at most budgets[i]
tokens (0: propose nothing). `NgramProposer` is prompt lookup: find the latest earlier
occurrence of the sequence's last n tokens (n from prompt_lookup_max down to
prompt_lookup_min) in its own prompt and output, and propose the tokens that followed it.
It needs no weights and proposes nothing where nothing repeats; its proposals are
deterministic (one-hot q for the verifier). The draft-model proposer is draft_model.py.

Out of scope: suffix trees or lookup across requests, tree-shaped drafts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from torch import Tensor

from polyrl.engine.sequence import Sequence


@dataclass(frozen=True)
class Draft:
    tokens: list[int]
    """Proposed next tokens (may be empty)."""
    probs: Tensor | None = None
    """(len(tokens), V): the proposer's processed distribution each token was sampled from;
    None for a deterministic proposal (one-hot q)."""

    def __len__(self) -> int:
        return len(self.tokens)

    def cut(self, n: int) -> "Draft":
        """The first n tokens."""
        if n >= len(self.tokens):
            return self
        return Draft(self.tokens[:n], None if self.probs is None else self.probs[:n])


EMPTY = Draft([])


class Proposer(Protocol):
    def propose(self, seqs: list[Sequence], budgets: list[int]) -> list[Draft]:
        """One Draft per sequence, of at most budgets[i] tokens."""
        ...

    def release(self, seq_ids: list[int]) -> None:
        """Forget per-sequence state of sequences that finished."""
        ...


def lookup(tokens: list[int], k: int, n_max: int, n_min: int) -> list[int]:
    """Up to k tokens that followed an earlier occurrence of tokens' last n tokens, for the
    largest n in [n_min, n_max] that occurs (the latest occurrence with k tokens after it,
    else the first); [] if none does."""
    if k <= 0 or len(tokens) <= n_min:
        return []
    arr = np.asarray(tokens, dtype=np.int64)
    for n in range(min(n_max, len(arr) - 1), n_min - 1, -1):
        suffix = arr[-n:]
        windows = sliding_window_view(arr[:-1], n)  # (L - n, n): every earlier n-gram, start i < L - n
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if len(hits):
            # The latest match that is followed by k tokens (in a repeating stretch the very
            # latest one sits just before the suffix, with one token after it), else the first.
            full = hits[hits + n + k <= len(arr)]
            start = int(full[-1] if len(full) else hits[0]) + n
            return arr[start:start + k].tolist()
    return []


class NgramProposer:
    """Prompt lookup over each sequence's own prompt and output (see the module docstring)."""

    def __init__(self, prompt_lookup_max: int, prompt_lookup_min: int) -> None:
        assert 0 < prompt_lookup_min <= prompt_lookup_max
        self.n_max, self.n_min = prompt_lookup_max, prompt_lookup_min

    def propose(self, seqs: list[Sequence], budgets: list[int]) -> list[Draft]:
        return [Draft(lookup(s.token_ids, k, self.n_max, self.n_min)) if k > 0 else EMPTY
                for s, k in zip(seqs, budgets)]

    def release(self, seq_ids: list[int]) -> None:
        pass  # stateless
