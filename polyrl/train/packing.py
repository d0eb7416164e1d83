"""How a minibatch goes through the model: shared prefixes once, rows in length-sorted pieces.

A GRPO group's G samples all start with the same prompt, and an agent group's episodes
with the same system prompt and task. The padded layout (batch.py) runs the forward and
backward pass over that prompt G times and pads every row to the longest one in the
batch, agent episodes included. Here a minibatch is split into `Piece`s:

- rows of one group share the longest prefix they have in common, up to the first
  position whose logits the loss needs; the prefix runs once (one row per group), its
  keys and values are recorded per layer, and each row runs only its own tokens, with
  its queries attending to the prefix's keys (`PrefixAttention`). Gradients flow back
  into the prefix pass through those keys and values, so loss and gradients are the
  padded layout's, up to float rounding (tests/test_packing.py);
- groups go into pieces sorted by length, cut where the padding saved outweighs the
  fixed cost of one more pass, each piece at most `token_budget` padded tokens (prefix
  rows included); so short rows are not padded to the longest episode, and the
  activations held for the backward pass stay bounded;
- rows with no token in the loss (mask all zero: masked overlong samples) are left out.

The loss over pieces is a sum divided by the minibatch's token count (loss.py's
`count`), so one optimizer step sees the same loss as one pass over the whole minibatch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from polyrl.models.attention import CausalAttention
from polyrl.train.batch import TrainBatch


@dataclass
class Piece:
    """Some rows of a minibatch, each as its own tokens after its group's shared prefix."""

    rows: Tensor         # (b,) row indices into the minibatch
    start: Tensor        # (b,) length of the row's shared prefix (0: none); its tokens begin there
    valid: Tensor        # (b, S) bool, True on the row's tokens (False on padding)
    prefix_ids: Tensor   # (g, P) the shared prefixes, right-padded; g = 0 when no row has one
    prefix_of: Tensor    # (b,) index of the row's prefix in prefix_ids (0 where start is 0)

    def take(self, x: Tensor) -> Tensor:
        """A (B, T) minibatch tensor at this piece's positions, (b, S); 0 on padding."""
        cols = (self.start[:, None] + torch.arange(self.valid.shape[1])).clamp(max=x.shape[1] - 1)
        return torch.where(self.valid, x[self.rows[:, None], cols], torch.zeros((), dtype=x.dtype))

    def put(self, out: Tensor, values: Tensor) -> None:
        """Write (b, S) values into the (B, T) tensor out at this piece's positions."""
        cols = self.start[:, None] + torch.arange(self.valid.shape[1])
        b, t = self.valid.nonzero(as_tuple=True)
        out[self.rows[b], cols[b, t]] = values[b, t]

    @property
    def tokens(self) -> int:
        """Padded token positions the forward pass computes (prefix rows included)."""
        return self.valid.numel() + self.prefix_ids.numel()


PASS_COST_TOKENS = 256
"""The fixed cost of one more forward/backward pass, in padded tokens: `plan` cuts pieces
where the padding saved is worth more (bench/update.py --pass-costs sweeps it)."""


def plan(batch: TrainBatch, token_budget: int | None, share_prefix: bool = True) -> list[Piece]:
    """The pieces of a minibatch (see the module docstring); every row with a counted token
    is in exactly one piece. token_budget None: a single piece, every row padded to the
    longest (with share_prefix False, the padded layout of batch.py)."""
    units = []  # (prefix length, row indices): a group's rows that share its prefix
    for g in batch.groups.unique().tolist():
        rows = [int(r) for r in (batch.groups == g).nonzero().flatten() if batch.mask[r].any()]
        if rows:
            prefix = _shared_prefix(batch, rows) if share_prefix else 0
            units += _split(prefix, rows, batch.lengths, token_budget) if token_budget else [(prefix, rows)]
    if not units:
        return []  # no counted token (every row masked, or a rank's share of no rows)
    units.sort(key=lambda u: -max(int(batch.lengths[r]) - u[0] for r in u[1]))  # longest rows first
    cuts = _cuts(units, batch.lengths, token_budget) if token_budget else [0, len(units)]
    return [_piece(batch, units[i:j]) for i, j in zip(cuts, cuts[1:])]


def _cuts(units: list[tuple[int, list[int]]], lengths: Tensor, token_budget: int) -> list[int]:
    """Piece boundaries 0 = c_0 < c_1 < ... = len(units) over the sorted units with the least
    padded tokens plus PASS_COST_TOKENS per piece, no piece over token_budget unless it is a
    single unit (dynamic programming; a piece's cost only grows as it takes in more units)."""
    n_rows = [len(rs) for _, rs in units]
    width = [max(int(lengths[r]) - p for r in rs) for p, rs in units]
    best, back = [0.0] + [float("inf")] * len(units), [0] * (len(units) + 1)
    for j in range(1, len(units) + 1):
        rows = w = prefixes = longest = 0
        for i in range(j - 1, -1, -1):  # the piece units[i:j]
            rows, w = rows + n_rows[i], max(w, width[i])
            prefixes, longest = prefixes + (units[i][0] > 0), max(longest, units[i][0])
            tokens = rows * w + prefixes * longest
            if tokens > token_budget and i < j - 1:
                break
            if best[i] + tokens + PASS_COST_TOKENS < best[j]:
                best[j], back[j] = best[i] + tokens + PASS_COST_TOKENS, i
    cuts = [len(units)]
    while cuts[-1] > 0:
        cuts.append(back[cuts[-1]])
    return cuts[::-1]


def _shared_prefix(batch: TrainBatch, rows: list[int]) -> int:
    """How many leading tokens all rows have in common, stopping before the first position
    whose logits any row's loss needs; 0 for a single row."""
    if len(rows) < 2:
        return 0
    needed = min(int(batch.mask[r].nonzero()[0]) for r in rows)  # logits at t score token t + 1
    ids = batch.input_ids[rows, :needed]
    same = (ids == ids[:1]).all(0)
    return int(same.long().cumprod(0).sum())


def _split(prefix: int, rows: list[int], lengths: Tensor, token_budget: int) -> list[tuple[int, list[int]]]:
    """A group as units of at most token_budget padded tokens (each with its own prefix copy)."""
    units, current, width = [], [], 0
    for r in rows:
        wider = max(width, int(lengths[r]) - prefix)
        if current and (len(current) + 1) * wider + prefix > token_budget:
            units.append((prefix, current))
            current, wider = [], int(lengths[r]) - prefix
        current.append(r)
        width = wider
    return units + [(prefix, current)]


def _piece(batch: TrainBatch, units: list[tuple[int, list[int]]]) -> Piece:
    rows, start, prefix_of, prefixes = [], [], [], []
    for p, rs in units:
        if p > 0:
            prefixes.append(batch.input_ids[rs[0], :p])
        rows += rs
        start += [p] * len(rs)
        prefix_of += [len(prefixes) - 1 if p > 0 else 0] * len(rs)
    rows_t, start_t = torch.tensor(rows), torch.tensor(start)
    own = batch.lengths[rows_t] - start_t  # (b,) tokens of each row after its prefix
    valid = torch.arange(int(own.max()))[None, :] < own[:, None]
    prefix_ids = torch.zeros(len(prefixes), max((len(x) for x in prefixes), default=0), dtype=torch.long)
    for i, x in enumerate(prefixes):
        prefix_ids[i, :len(x)] = x
    return Piece(rows_t, start_t, valid, prefix_ids, torch.tensor(prefix_of))


def piece_logits(model, piece: Piece, input_ids: Tensor) -> Tensor:
    """Logits (b, S, V) of the piece's rows at their own positions; input_ids = piece.take(ids),
    on the model's device (the piece itself stays on the host)."""
    positions = (piece.start[:, None] + torch.arange(input_ids.shape[1])).to(input_ids.device)
    if piece.prefix_ids.shape[0] == 0:
        return model(input_ids, positions)  # right-padded rows from position 0: plain causal
    prefix = PrefixAttention(piece.prefix_of, piece.start)
    model.hidden(piece.prefix_ids.to(input_ids.device), attention=prefix.recorder())
    return model(input_ids, positions, prefix)


class PrefixAttention:
    """Rows that continue shared prefixes: each query sees its prefix's first `start` keys and
    its own row causally. The prefixes' keys and values are recorded by `recorder()` during
    the prefix pass (which attends causally within each prefix)."""

    def __init__(self, prefix_of: Tensor, start: Tensor) -> None:
        self.prefix_of, self.start = prefix_of, start
        self.kv: dict[int, tuple[Tensor, Tensor]] = {}
        self.mask: Tensor | None = None

    def recorder(self) -> "_Recorder":
        return _Recorder(self.kv)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        pk, pv = self.kv[layer]  # (g, n_kv, P, hd)
        of = self.prefix_of.to(q.device)
        k = torch.cat((pk[of], k), dim=2)  # (b, n_kv, P + S, hd)
        v = torch.cat((pv[of], v), dim=2)
        if self.mask is None:
            P, S = pk.shape[2], q.shape[2]
            seen = torch.arange(P, device=q.device)[None, :] < self.start.to(q.device)[:, None]  # (b, P)
            causal = torch.ones(S, S, dtype=torch.bool, device=q.device).tril()
            self.mask = torch.cat((seen[:, None, :].expand(-1, S, -1), causal.expand(len(seen), S, S)), dim=2)[:, None]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, enable_gqa=True)


class _Recorder(CausalAttention):
    """Causal attention over the prefixes that keeps each layer's keys and values."""

    def __init__(self, kv: dict[int, tuple[Tensor, Tensor]]) -> None:
        super().__init__()
        self.kv = kv

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        self.kv[layer] = (k, v)
        return super().attend(layer, q, k, v)
