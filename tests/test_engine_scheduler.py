"""Block manager and scheduler invariants, without a model: budgets, seats, block
coverage, ref counts, prefix hits, LRU reuse, cache epochs, never stalling."""

import random

import pytest

from polyrl.engine.base import SamplingParams
from polyrl.engine.block_manager import BlockManager
from polyrl.engine.config import NativeEngineConfig
from polyrl.engine.scheduler import Scheduler
from polyrl.engine.sequence import Sequence
from polyrl.engine.stats import EngineCounters, counter_delta

EOS = 0


def seq(i: int, tokens: list[int], max_tokens: int = 8) -> Sequence:
    return Sequence(i, list(tokens), len(tokens), SamplingParams(max_tokens=max_tokens), seed=i,
                    stop_ids=frozenset({EOS}))


def fake_tokens(batch, rng: random.Random) -> list[list[int]]:
    """Per sampling sequence, one token per pass (a burst has batch.steps): EOS now and
    then, else a token from 1..9."""
    return [[EOS if rng.random() < 0.05 else rng.randint(1, 9) for _ in range(batch.steps)]
            for i in range(len(batch)) if batch.samples(i)]


def zeros_like(tokens: list[list[int]]) -> list[list[float]]:
    return [[0.0] * len(t) for t in tokens]


@pytest.mark.parametrize("num_blocks,budget,seats,caching,burst", [
    (8, 16, 4, True, 1), (10, 5, 8, True, 1), (64, 64, 64, False, 1), (12, 9, 3, False, 1), (30, 40, 16, True, 1),
    (8, 16, 4, True, 4), (12, 9, 3, False, 8), (30, 40, 16, True, 8)])
def test_scheduler_invariants_under_random_load(num_blocks, budget, seats, caching, burst):
    rng = random.Random(num_blocks * 1000 + budget)
    bs = 4
    bm = BlockManager(num_blocks, bs, caching)
    counters = EngineCounters()
    sched = Scheduler(bm, seats, budget, counters, decode_burst=burst)
    bursts = 0
    shared = [rng.randint(1, 9) for _ in range(9)]
    pending = [seq(i, (shared if i % 2 else [])[: rng.randint(0, 9)] + [rng.randint(1, 9) for _ in range(rng.randint(1, 10))],
                   max_tokens=rng.randint(1, 10)) for i in range(30)]
    finished = []
    for step in range(2000):
        if pending and rng.random() < 0.5:
            sched.add(pending.pop())
        batch = sched.schedule()
        assert batch.num_tokens <= budget and len(batch) <= seats and len(sched.running) <= seats
        assert len({s.seq_id for s in batch.seqs}) == len(batch)
        for s, n in zip(batch.seqs, batch.num_new_tokens):
            assert n >= 1 and s.num_computed_tokens + n <= len(s)
            assert len(s.block_table) * bs >= s.num_computed_tokens + n  # blocks cover what is written
            assert s.num_cached_tokens % bs == 0
        if batch.steps > 1:  # a burst: decodes only, nobody waiting, blocks for every kept pass
            bursts += 1
            assert batch.steps <= burst and not sched.waiting and batch.num_tokens == len(batch)
            for s, keep in zip(batch.seqs, batch.burst_tokens):
                assert 1 <= keep <= min(batch.steps, s.params.max_tokens - s.num_completion_tokens)
                assert len(s.block_table) * bs >= s.num_computed_tokens + keep
        tokens = fake_tokens(batch, rng)
        sched.postprocess(batch, tokens, zeros_like(tokens), None, version=0)
        bm.check_invariants(sched.running)
        finished += sched.pop_finished()
        if not pending and not sched.has_unfinished():
            break
        assert batch.seqs or not sched.running, "stalled with running sequences"
    assert len(finished) == 30 and not sched.has_unfinished()
    assert (bursts > 0) == (burst > 1)
    for s in finished:
        assert s.finish_reason in ("stop", "length") and not s.block_table
        assert 1 <= s.num_completion_tokens <= s.params.max_tokens
    bm.check_invariants([])
    assert bm.num_free_blocks == num_blocks
    d = counter_delta(EngineCounters().snapshot(), counters.snapshot())
    assert d["decode_tokens"] + d["prefill_tokens_computed"] == d["scheduled_tokens"]


def test_prefix_hits_share_blocks_and_ref_counts():
    bm = BlockManager(16, 4)
    a, b = seq(0, list(range(1, 11))), seq(1, list(range(1, 11)))  # 10 tokens: 2 full blocks + 2
    hits, hashes = bm.match_prefix(a)
    assert hits == []
    bm.allocate(a, hits, hashes, 10)
    bm.register_full_blocks(a, 10)
    hits, hashes = bm.match_prefix(b)
    assert hits == a.block_table[:2] and hashes == a.block_hashes
    bm.allocate(b, hits, hashes, 10)
    assert [bm.blocks[i].ref_count for i in a.block_table] == [2, 2, 1]
    assert b.block_table[2] != a.block_table[2]  # partial tail blocks are private
    bm.check_invariants([a, b])
    bm.deallocate(a)
    bm.deallocate(b)
    bm.check_invariants([])
    # Freed blocks keep their prefix: a third sequence with the same start hits them.
    c = seq(2, list(range(1, 9)) + [42])
    assert bm.match_prefix(c)[0] == hits


def test_prefix_hit_requires_equal_chain_and_tokens():
    bm = BlockManager(8, 2)
    a = seq(0, [1, 2, 3, 4])
    bm.allocate(a, [], [], 4)
    bm.register_full_blocks(a, 4)
    assert len(bm.match_prefix(seq(1, [1, 2, 3, 4, 5]))[0]) == 2
    assert bm.match_prefix(seq(2, [9, 9, 3, 4]))[0] == []  # same second block, different prefix
    # A forged hash entry pointing at a block with other tokens is not a hit.
    h = bm.chain_hash(None, (7, 7))
    bm.hash_to_block[h] = a.block_table[0]
    assert bm.match_prefix(seq(3, [7, 7]))[0] == []


def test_lru_reuse_prefers_unhashed_blocks_then_oldest():
    bm = BlockManager(4, 2)
    a = seq(0, [1, 2, 3])  # one full block (hashed) + a partial one
    bm.allocate(a, [], [], 3)
    bm.register_full_blocks(a, 3)
    full, partial = a.block_table
    bm.deallocate(a)
    assert next(iter(bm.free)) == partial  # nothing to share: reused first
    b = seq(1, [5, 6, 7, 8, 9, 10])
    bm.allocate(b, [], [], 6)  # takes the partial block and the two untouched ones
    assert full not in b.block_table and bm.match_prefix(seq(2, [1, 2]))[0] == [full]
    c = seq(3, [11, 12])
    bm.allocate(c, [], [], 2)  # only the cached block is left: it is evicted
    assert c.block_table == [full] and bm.match_prefix(seq(4, [1, 2]))[0] == []


def test_cache_epoch_after_weight_update():
    bm = BlockManager(8, 2)
    a = seq(0, [1, 2, 3, 4, 5])
    bm.allocate(a, [], [], 5)
    bm.register_full_blocks(a, 4)
    bm.reset_cache()
    assert bm.match_prefix(seq(1, [1, 2, 3, 4]))[0] == []
    a.token_ids += [6]
    bm.register_full_blocks(a, 6)  # computed partly under old weights: never offered
    assert bm.match_prefix(seq(2, [1, 2, 3, 4, 5, 6]))[0] == []
    bm.check_invariants([a])


def test_preemption_when_blocks_run_out_then_everyone_finishes():
    bm = BlockManager(6, 2)
    counters = EngineCounters()
    sched = Scheduler(bm, 8, 64, counters)
    seqs = [seq(i, [i + 1] * 3, max_tokens=6) for i in range(3)]  # 3 x (3 + 6) tokens > 12 slots
    for s in seqs:
        sched.add(s)
    rng = random.Random(0)
    while sched.has_unfinished():
        batch = sched.schedule()
        tokens = [[rng.randint(1, 9)] for i in range(len(batch)) if batch.samples(i)]
        sched.postprocess(batch, tokens, zeros_like(tokens), None, 0)
        bm.check_invariants(sched.running)
    assert counters.preemptions > 0
    assert all(s.finish_reason == "length" and s.num_completion_tokens == 6 for s in seqs)


def test_native_engine_config_errors_name_the_field():
    from polyrl.config import ConfigError, load_config_text

    for field, value in (("block_size", 0), ("num_blocks", -3)):
        with pytest.raises(ValueError, match=field) as raised:
            NativeEngineConfig(**{field: value})
        assert raised.value.errors()[0]["loc"] == (field,)
        # In a run file the error names the file, the line and engine.native's field.
        text = f"rl_tasks:\n  - {{domain: math, weight: 1}}\nengine:\n  native:\n    {field}: {value}\n"
        with pytest.raises(ConfigError, match=rf"run.yaml:5: engine\.native\.{field}: got {value}"):
            load_config_text(text, source="run.yaml")
    assert NativeEngineConfig(kv_cache_mb=1).blocks_for(1024) == 64
