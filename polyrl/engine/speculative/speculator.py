"""Who speculates in a step, how many tokens each, and the acceptance counters.

The scheduler asks `Speculator.propose` for drafts when a step is decode-only (every
running sequence decodes one token and nobody waits); it gives the drafts KV slots and
the step becomes a verify pass instead of a decode burst. A sequence proposes at most
num_speculative_tokens, and at most its max_tokens left minus one (the verify pass adds
one token of the target's own). Speculation switches itself off:

- for a whole step with more than `max_batch_size` decoding sequences: at larger batches a
  decode pass is no longer bound by reading the weights, and verifying rejected drafts
  costs real compute (the step decodes plainly, in a burst);
- for a sequence whose drafts keep being rejected: once it has had 4 verify steps with
  drafts and accepted fewer than `min_acceptance_rate` of its drafted tokens, it decodes
  plainly to its end.

A step where no sequence has a draft (n-gram lookup found nothing) is a plain decode step.
`record` keeps EngineCounters' spec_* counters (drafts, drafted and accepted tokens, and
acceptances per draft position).

Out of scope: adaptive k per sequence, tree drafts.
"""

from __future__ import annotations

from polyrl.engine.sequence import Sequence
from polyrl.engine.speculative.config import SpeculativeConfig
from polyrl.engine.speculative.proposers import Draft, NgramProposer, Proposer
from polyrl.engine.stats import EngineCounters
from polyrl.models.transformer import Transformer

MIN_STEPS_BEFORE_SWITCH_OFF = 4


class Speculator:
    def __init__(self, config: SpeculativeConfig, proposer: Proposer, counters: EngineCounters) -> None:
        assert config.enabled
        self.config = config
        self.proposer = proposer
        self.counters = counters

    def active(self, seq: Sequence) -> bool:
        """Does this sequence still speculate (see the module docstring)?"""
        rate = self.config.min_acceptance_rate
        return not (seq.spec_steps >= MIN_STEPS_BEFORE_SWITCH_OFF and seq.spec_accepted < rate * seq.spec_drafted)

    def propose(self, seqs: list[Sequence]) -> list[Draft] | None:
        """Drafts of a decode-only step's sequences, or None when this step does not speculate."""
        if len(seqs) > self.config.max_batch_size:
            return None
        k = self.config.num_speculative_tokens
        budgets = [min(k, s.params.max_tokens - s.num_completion_tokens - 1) if self.active(s) else 0 for s in seqs]
        if not any(b > 0 for b in budgets):
            return None
        drafts = self.proposer.propose(seqs, budgets)
        return drafts if any(len(d) for d in drafts) else None

    def record(self, seq: Sequence, drafted: int, accepted: int) -> None:
        """A verify step kept `accepted` of the sequence's `drafted` tokens."""
        assert 0 <= accepted <= drafted
        if drafted == 0:
            return
        seq.spec_steps += 1
        seq.spec_drafted += drafted
        seq.spec_accepted += accepted
        c = self.counters
        c.spec_drafts += 1
        c.spec_draft_tokens += drafted
        c.spec_accepted_tokens += accepted
        per = c.spec_accepted_by_position
        per.extend([0] * (drafted - len(per)))
        for j in range(accepted):
            per[j] += 1

    def release(self, seq_ids: list[int]) -> None:
        self.proposer.release(seq_ids)


def build_speculator(config: SpeculativeConfig, target: Transformer, counters: EngineCounters,
                     draft_model: Transformer | None = None) -> Speculator | None:
    """The engine's speculator (None for method "none"). draft_model: an already built draft
    (tests, benchmarks); else config.draft_model is loaded."""
    if not config.enabled:
        return None
    if config.method == "ngram":
        return Speculator(config, NgramProposer(config.prompt_lookup_max, config.prompt_lookup_min), counters)
    from polyrl.engine.speculative.draft_model import DraftModelProposer, load_draft_model

    if draft_model is None:
        assert config.draft_model is not None  # the config's validator
        draft_model = load_draft_model(config.draft_model, target)
    elif draft_model.cfg.vocab_size != target.cfg.vocab_size:
        raise ValueError(f"draft model vocabulary ({draft_model.cfg.vocab_size}) is not the target's "
                         f"({target.cfg.vocab_size})")
    return Speculator(config, DraftModelProposer(draft_model), counters)
