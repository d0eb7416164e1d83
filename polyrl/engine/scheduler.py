"""Continuous batching: which sequences run in the next step, and how many tokens each.

Every step has a token budget (`max_num_batched_tokens`) and a seat limit
(`max_num_seqs`). Running sequences go first, oldest first: one token each when
decoding, or the next chunk of a prompt that did not fit one step (chunked prefill).
The rest of the budget admits waiting sequences in arrival order, each with its
prefix-cache hits skipped. Requests join and leave between steps.

When a running sequence needs a block and none is free, the most recently admitted
running sequence is preempted by recompute: its blocks are released (they stay in the
prefix cache until reused) and it goes back to the head of the waiting queue with its
sampled tokens. A sequence alone in the pool that still cannot grow ends with
finish_reason "length": the engine never runs out of memory and never stalls.

Decode bursts. When every scheduled sequence decodes and nobody waits, rescheduling
between tokens would only repeat the same decision, so the step becomes a burst of up
to `decode_burst` forward passes run back to back (the runner feeds each pass the
previous pass's samples). Blocks for the passes a sequence may keep (its max_tokens
left) are allocated up front, halving the burst until they fit; postprocess appends the
tokens one by one with the usual stop checks and drops what a sequence sampled after
it stopped. A request added meanwhile waits for the end of the burst.

Speculative steps. With a speculator (engine.native.speculative), a decode-only step
first asks it for drafts (speculative/speculator.py); if any sequence has one, the step
becomes a single verify pass instead of a burst: each drafted sequence runs
[last token, d1..dk] (num_new_tokens 1 + k), with blocks allocated for the lookahead
(a sequence whose lookahead does not fit the free blocks drops its draft; speculation
never preempts). postprocess appends the tokens the verifier kept, one by one with the
usual stop checks, and advances num_computed_tokens over them only: the rejected
positions' slots are overwritten by the next pass, and only blocks full of computed
tokens are ever hashed into the prefix cache.

Out of scope: priorities, fairness between callers, swapping KV to host memory.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from polyrl.engine.block_manager import BlockManager
from polyrl.engine.sequence import Sequence, SequenceStatus
from polyrl.engine.stats import EngineCounters

if TYPE_CHECKING:
    from polyrl.engine.speculative.proposers import Draft
    from polyrl.engine.speculative.speculator import Speculator


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    """Query tokens of each sequence this step: positions num_computed .. num_computed + n."""
    sampling: list[bool] = field(default_factory=list)
    """Does the sequence sample a token after this step (its chunk reaches its last token)?"""
    steps: int = 1
    """Forward passes to run back to back: > 1 is a decode burst (every sequence decodes,
    one token per pass, each pass's input being the previous pass's sample)."""
    burst_tokens: list[int] = field(default_factory=list)
    """In a burst: per sequence, the passes whose samples it may keep (at most `steps`,
    at most its max_tokens left); its KV slots are allocated for exactly these."""
    drafts: list[Draft] | None = None
    """A speculative verify step: per sequence, the draft tokens it verifies after its last
    token (possibly none); num_new_tokens counts them. None: not a verify step."""

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def decode_only(self) -> bool:
        """Every sequence runs one token and samples after it (a burst always does)."""
        return all(n == 1 for n in self.num_new_tokens) and all(self.sampling)

    def samples(self, i: int) -> bool:
        return self.sampling[i]


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 counters: EngineCounters, stop_text: Callable[[Sequence], bool] | None = None,
                 decode_burst: int = 1, speculator: Speculator | None = None) -> None:
        assert decode_burst >= 1
        self.block_manager = block_manager
        self.speculator = speculator
        self.decode_burst = decode_burst
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.counters = counters
        self.stop_text = stop_text
        """Engine hook: has the sequence's text reached one of its stop strings?"""
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.finished: list[Sequence] = []
        """Sequences finished since the last pop_finished()."""

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def pop_finished(self) -> list[Sequence]:
        done, self.finished = self.finished, []
        return done

    def schedule(self) -> ScheduledBatch:
        bm, bs = self.block_manager, self.block_manager.block_size
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        preempted = False

        # 1. Running sequences, oldest first.
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(len(seq.token_ids) - seq.num_computed_tokens, budget)
            assert n > 0, "a running sequence has nothing to compute"
            while len(seq.block_table) * bs < seq.num_computed_tokens + n and not bm.can_append(
                    seq, seq.num_computed_tokens + n):
                room = (len(seq.block_table) + bm.num_free_blocks) * bs - seq.num_computed_tokens
                if room > 0:  # a shorter prefill chunk fits
                    n = room
                    break
                victim = self.running[-1]
                if victim is not seq:
                    self._preempt(victim)
                    preempted = True
                    continue
                if batch.seqs:  # others in this step will free blocks when they finish
                    self._preempt(seq)
                    preempted = True
                else:  # alone in the pool and still cannot grow: truncate, never OOM
                    self._finish(seq, "length")
                n = 0
                break
            if n == 0:
                continue  # seq left self.running; index i now holds the next one
            if len(seq.block_table) * bs < seq.num_computed_tokens + n:
                bm.append_blocks(seq, seq.num_computed_tokens + n)
            self._schedule(batch, seq, n)
            budget -= n
            i += 1

        # 2. Waiting sequences, in arrival order (none after a preemption: the pool is full).
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not preempted:
            seq = self.waiting[0]
            hits, hashes = bm.match_prefix(seq)
            cached = len(hits) * bs
            start = min(cached, len(seq) - 1)  # the last token is always run: its logits are needed
            n = min(len(seq) - start, budget)
            if not bm.can_allocate(hits, start + n):
                break
            self.waiting.popleft()
            bm.allocate(seq, hits, hashes, start + n)
            seq.num_computed_tokens, seq.num_cached_tokens = start, cached
            if seq.admissions <= 1:  # (allocate counted this admission)
                seq.prompt_cached_tokens = start
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self.counters.prefill_tokens_cached += start
            self._schedule(batch, seq, n)
            budget -= n

        if (batch.seqs and not self.waiting and not preempted
                and batch.num_tokens == len(batch.seqs) and all(batch.sampling)):
            if not (self.speculator is not None and self._plan_speculation(batch)) and self.decode_burst > 1:
                self._plan_burst(batch)
        if batch.seqs:
            self.counters.steps += 1
            self.counters.scheduled_seqs += len(batch.seqs)
            self.counters.scheduled_tokens += batch.num_tokens
        return batch

    def _plan_burst(self, batch: ScheduledBatch) -> None:
        """Turn a decode-only step into a burst of passes, as long as blocks allow."""
        bm = self.block_manager
        left = [seq.params.max_tokens - seq.num_completion_tokens for seq in batch.seqs]
        steps = min(self.decode_burst, max(left))
        while steps > 1:
            keep = [min(steps, n) for n in left]
            need = sum(max(0, bm.blocks_for(s.num_computed_tokens + k) - len(s.block_table))
                       for s, k in zip(batch.seqs, keep))
            if need <= bm.num_free_blocks:
                for s, k in zip(batch.seqs, keep):
                    bm.append_blocks(s, s.num_computed_tokens + k)
                batch.steps, batch.burst_tokens = steps, keep
                return
            steps //= 2

    def _plan_speculation(self, batch: ScheduledBatch) -> bool:
        """Turn a decode-only step into a verify step if the speculator drafts for anyone."""
        assert self.speculator is not None
        drafts = self.speculator.propose(batch.seqs)
        if drafts is None:
            return False
        bm = self.block_manager
        budget = self.max_num_batched_tokens - batch.num_tokens
        kept: list[Draft] = []
        for i, (seq, draft) in enumerate(zip(batch.seqs, drafts)):
            draft = draft.cut(budget)
            end = seq.num_computed_tokens + 1 + len(draft)  # KV positions after the pass
            if len(draft) and not bm.can_append(seq, end):
                draft = draft.cut(0)
            if len(draft):
                bm.append_blocks(seq, end)
                batch.num_new_tokens[i] += len(draft)
                budget -= len(draft)
            kept.append(draft)
        if not any(len(d) for d in kept):
            return False
        batch.drafts = kept
        return True

    def _schedule(self, batch: ScheduledBatch, seq: Sequence, n: int) -> None:
        end, total = seq.num_computed_tokens + n, len(seq.token_ids)
        if n == 1 and end == total and total > seq.num_prompt_tokens:
            self.counters.decode_tokens += 1
        else:
            self.counters.prefill_tokens_computed += n
        # Offer blocks this step completes to sequences scheduled after this one.
        if end // self.block_manager.block_size > len(seq.block_hashes):
            self.block_manager.register_full_blocks(seq, end)
        batch.seqs.append(seq)
        batch.num_new_tokens.append(n)
        batch.sampling.append(end == total)

    def postprocess(self, batch: ScheduledBatch, tokens: list[list[int]], logprobs: list[list[float]],
                    top: list[list[dict[int, float]]] | None, version: int) -> None:
        """Advance computed counts; append the sampled tokens (per sampling sequence, in batch
        order, one list each: one token, or a burst's passes) and finish sequences that stop.
        A sequence that stops inside a burst drops the tokens it sampled after stopping."""
        k = 0
        extra = 0  # tokens kept from a burst's passes (or a verify step's drafts) after the first
        for i, (seq, n, samples) in enumerate(zip(batch.seqs, batch.num_new_tokens, batch.sampling)):
            if not samples:
                seq.num_computed_tokens += n
                continue
            drafted = len(batch.drafts[i]) if batch.drafts is not None else 0
            if drafted and self.speculator is not None:
                self.speculator.record(seq, drafted, len(tokens[k]) - 1)
            reason = None
            for j, token in enumerate(tokens[k]):
                seq.num_computed_tokens += n - drafted if j == 0 else 1  # of the drafts, only those kept
                seq.append_token(token, logprobs[k][j], top[k][j] if top is not None else None, version)
                extra += j > 0
                reason = seq.stop_reason()
                if reason is None and seq.params.stop and self.stop_text is not None and self.stop_text(seq):
                    reason = "stop"
                if reason is not None:
                    break
            k += 1
            if batch.steps > 1 or drafted:  # offer the blocks the burst filled (an agent's next turn reuses them)
                self.block_manager.register_full_blocks(seq, seq.num_computed_tokens)
            if reason is not None:
                self._finish(seq, reason)
        assert k == len(tokens)
        if batch.drafts is not None:
            self.counters.decode_tokens += extra
        if batch.steps > 1:
            self.counters.steps += max(len(t) for t in tokens) - 1
            self.counters.decode_tokens += extra
            self.counters.scheduled_seqs += extra
            self.counters.scheduled_tokens += extra

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.finish_reason = reason
        seq.status = SequenceStatus.FINISHED
        self.block_manager.deallocate(seq)
        self.running.remove(seq)
        self.finished.append(seq)

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.deallocate(seq)
        self.running.remove(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.counters.preemptions += 1

    def abort(self, seq: Sequence) -> bool:
        """Drop an unfinished sequence (its caller went away): blocks freed, never reported
        as finished. False when it is not queued or running here."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.running:
            self.block_manager.deallocate(seq)
            self.running.remove(seq)
        else:
            return False
        seq.finish_reason, seq.status = "abort", SequenceStatus.FINISHED
        return True

    def preempt_all(self) -> None:
        """Recompute every running sequence from scratch (after a weight update)."""
        for seq in reversed(list(self.running)):
            self._preempt(seq)
