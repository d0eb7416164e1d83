"""Paged engine equivalence: greedy = naive full recompute (mixed lengths, prefix sharing,
chunked prefill, preemption), logprobs = trainer recompute, ref counts back to zero."""

import copy
from dataclasses import replace

import pytest
import torch

from polyrl.engine.base import SamplingParams
from polyrl.engine.config import NativeEngineConfig
from polyrl.engine.dense import DenseEngine
from polyrl.engine.paged import PagedEngine
from polyrl.engine.stats import counter_delta
from polyrl.train.batch import token_logprobs
from tests.helpers import tiny_model, tiny_tokenizer
from tests.test_engine_dense import PROMPTS, naive_greedy


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tok = tiny_tokenizer(tmp_path_factory.mktemp("tok"))
    model = tiny_model(tok.vocab_size, seed=3)
    prompts = [tok.encode(tok.chat_prompt(p)) for p in PROMPTS]
    assert len({len(p) for p in prompts}) == 3
    return tok, model, prompts


def engine(model, tok, decode="auto", decode_cache=True, **kw) -> PagedEngine:
    """A paged engine on a copy of `model`: kw are NativeEngineConfig fields; decode="forward"
    and decode_cache=False the variants of the decode path (runner/decode_backend.py)."""
    return PagedEngine(copy.deepcopy(model), tok, NativeEngineConfig(**kw), decode=decode, decode_cache=decode_cache)


def assert_all_free(eng: PagedEngine) -> None:
    bm = eng.block_manager
    bm.check_invariants([])
    assert all(b.ref_count == 0 for b in bm.blocks) and bm.num_free_blocks == bm.num_blocks
    assert not eng.has_unfinished()


CONFIGS = {
    "default": dict(block_size=4),
    "no_prefix_cache": dict(block_size=4, enable_prefix_caching=False),
    "chunked_prefill": dict(block_size=4, max_num_batched_tokens=7),
    "tiny_pool": dict(block_size=4, num_blocks=16),  # 9 sequences of up to 56 tokens: forces preemption
    "tiny_pool_chunked_uncached": dict(block_size=4, num_blocks=16, max_num_batched_tokens=8,
                                       enable_prefix_caching=False),
    "one_seat": dict(block_size=8, max_num_seqs=1),
    # The model's own forward for decodes too (the fused pass is the default where it builds).
    "unfused": dict(block_size=4, decode="forward"),
    "unfused_tiny_pool_chunked": dict(block_size=4, num_blocks=16, max_num_batched_tokens=8, decode="forward"),
    # No decode cache: decodes gather the pool's blocks (on the model's forward).
    "no_decode_cache_tiny_pool_chunked": dict(block_size=4, num_blocks=16, max_num_batched_tokens=8,
                                              decode_cache=False),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_matches_full_recompute(setup, name):
    tok, model, prompts = setup
    eng = engine(model, tok, **CONFIGS[name])
    outs = eng.generate(prompts, n=3, sampling=SamplingParams(temperature=0, max_tokens=12))
    stop = set(tok.stop_token_ids())
    for i, p in enumerate(prompts):
        expected = naive_greedy(model, p, 12, stop)
        for j in range(3):
            c = outs[i * 3 + j]
            assert c.prompt_index == i and c.token_ids == expected
            assert c.finish_reason == ("stop" if expected[-1] in stop else "length")
            assert c.weight_version == 0 and len(c.logprobs) == len(c.token_ids)
    if name.startswith("tiny_pool"):
        assert eng.counters.preemptions > 0
    if name == "chunked_prefill":
        assert eng.counters.scheduled_tokens <= 7 * eng.counters.steps
    assert_all_free(eng)


def test_paged_equals_dense_engine(setup):
    tok, model, prompts = setup
    sp = SamplingParams(temperature=0, max_tokens=10)
    dense = DenseEngine(copy.deepcopy(model), tok).generate(prompts, 2, sp)
    paged = engine(model, tok).generate(prompts, 2, sp)
    assert [c.token_ids for c in dense] == [c.token_ids for c in paged]
    for a, b in zip(dense, paged):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("decode", ["auto", "forward"])
@pytest.mark.parametrize("sampling", [dict(temperature=0.7), dict(temperature=1.3, top_k=5, top_p=0.9)])
def test_sampled_logprobs_match_trainer_recompute(setup, sampling, decode):
    tok, model, prompts = setup
    eng = engine(model, tok, block_size=4, num_blocks=20, decode=decode)  # preemption in the mix too
    outs = eng.generate(prompts, 3, SamplingParams(max_tokens=10, seed=1, **sampling))
    for c in outs:
        seq = prompts[c.prompt_index] + c.token_ids
        P = len(prompts[c.prompt_index])
        with torch.no_grad():
            logits = model(torch.tensor([seq]))
        lp = token_logprobs(logits[:, :-1], torch.tensor([seq[1:]]), sampling["temperature"])[0, P - 1:]
        torch.testing.assert_close(lp, torch.tensor(c.logprobs), rtol=1e-4, atol=1e-4)
    assert_all_free(eng)


def test_seeded_samples_do_not_depend_on_cache_batching_or_preemption(setup):
    tok, model, prompts = setup
    sp = SamplingParams(temperature=1.0, max_tokens=10, seed=5)
    runs = [engine(model, tok, **kw).generate(prompts, 3, sp) for kw in
            (dict(), dict(enable_prefix_caching=False), dict(block_size=4, num_blocks=16), dict(max_num_seqs=2))]
    tokens = [[c.token_ids for c in r] for r in runs]
    assert all(t == tokens[0] for t in tokens)
    assert len({tuple(t) for t in tokens[0]}) > 1  # samples of a group differ
    other = engine(model, tok).generate(prompts, 3, SamplingParams(temperature=1.0, max_tokens=10, seed=6))
    assert [c.token_ids for c in other] != tokens[0]


def run_requests(eng: PagedEngine, requests: list) -> list:
    """(prompt, SamplingParams, seed) requests through the step API -> Completions in order."""
    ids = {eng.add_request(p, sp, seed=seed): i for i, (p, sp, seed) in enumerate(requests)}
    out = {}
    while eng.has_unfinished():
        out.update((ids[rid], c) for rid, c in eng.step())
    return [out[i] for i in range(len(requests))]


@pytest.mark.parametrize("decode,decode_cache", [("auto", True), ("forward", True), ("forward", False)],
                         ids=["default", "forward", "forward_no_decode_cache"])
def test_decode_bursts_equal_token_by_token_steps(setup, decode, decode_cache):
    tok, model, prompts = setup
    requests = [(prompts[0], SamplingParams(temperature=0.9, max_tokens=13), 1),
                (prompts[1], SamplingParams(temperature=1.2, top_k=7, top_p=0.9, max_tokens=5, logprobs=2), 2),
                (prompts[2], SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True), 3),
                (prompts[1], SamplingParams(temperature=0, max_tokens=11, logprobs=1), 4)]
    variant = dict(decode=decode, decode_cache=decode_cache)
    first = run_requests(engine(model, tok, decode_burst=1, **variant), requests)
    # A stop token and a stop string that the token-by-token run meets mid-way.
    requests.append((prompts[2], replace(requests[2][1], stop_token_ids=(first[2].token_ids[6],)), 3))
    requests.append((prompts[2], replace(requests[2][1], stop=(first[2].text[5:7],)), 3))
    runs = {}
    for burst in (1, 3, 8):
        eng = engine(model, tok, block_size=4, decode_burst=burst, **variant)
        runs[burst] = (run_requests(eng, requests), eng.counters.snapshot())
        assert_all_free(eng)
    (one, c1), (_, c3), (_, c8) = runs[1], runs[3], runs[8]
    assert c8["steps"] == c1["steps"]  # the same passes, fewer trips through the scheduler
    for key in ("prefill_tokens_computed", "decode_tokens", "scheduled_tokens"):
        assert c1[key] == c3[key] == c8[key], key
    assert one[4].finish_reason == "stop" and one[4].token_ids[-1] == first[2].token_ids[6]
    assert one[5].finish_reason == "stop" and first[2].text[5:7] not in one[5].text
    for burst in (3, 8):
        for a, b in zip(one, runs[burst][0]):
            assert (a.token_ids, a.finish_reason, a.text) == (b.token_ids, b.finish_reason, b.text)
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=1e-5, atol=1e-5)
            assert (a.top_logprobs is None) == (b.top_logprobs is None)
            for x, y in zip(a.top_logprobs or [], b.top_logprobs or []):
                assert x.keys() == y.keys() and all(abs(x[t] - y[t]) < 1e-5 for t in x)


def test_topk1_and_tiny_top_p_are_greedy_and_top_logprobs(setup):
    tok, model, prompts = setup
    eng = engine(model, tok)
    greedy = eng.generate(prompts, 1, SamplingParams(temperature=0, max_tokens=8))
    top1 = eng.generate(prompts, 1, SamplingParams(temperature=1.0, top_k=1, max_tokens=8, seed=9))
    nucleus = eng.generate(prompts, 1, SamplingParams(temperature=1.0, top_p=1e-6, max_tokens=8, seed=9))
    assert [c.token_ids for c in greedy] == [c.token_ids for c in top1] == [c.token_ids for c in nucleus]
    assert greedy[0].top_logprobs is None
    with_top = eng.generate(prompts, 1, SamplingParams(temperature=0, max_tokens=8, logprobs=3))
    for c in with_top:
        assert len(c.top_logprobs) == len(c.token_ids)
        for t, lp, top in zip(c.token_ids, c.logprobs, c.top_logprobs):
            assert len(top) == 3 and max(top, key=top.get) == t  # greedy token is the most likely
            assert top[t] == pytest.approx(lp, abs=1e-6)


def test_grpo_group_prefills_its_prompt_once(setup):
    tok, model, prompts = setup
    bs, G = 4, 8
    eng = engine(model, tok, block_size=bs)
    eng.generate(prompts, G, SamplingParams(temperature=1.0, max_tokens=4, seed=0))
    # Sample 0 computes the prompt; the others share its full blocks and compute only the
    # partial tail block (or, for a block-aligned prompt, re-run the last token).
    expected = sum(len(p) + (G - 1) * (len(p) % bs or 1) for p in prompts)
    assert eng.counters.prefill_tokens_computed == expected
    assert eng.counters.prefill_tokens_cached == sum(G * len(p) for p in prompts) - expected
    assert_all_free(eng)


def test_next_turn_reuses_history_from_cache(setup):
    tok, model, prompts = setup
    bs = 4
    eng = engine(model, tok, block_size=bs)
    first = eng.generate([prompts[1]], 1, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    history = prompts[1] + first.token_ids
    turn2 = history + tok.encode(tok.chat_prompt("And 2 + 2?"))
    before = eng.counters.snapshot()
    second = eng.generate([turn2], 1, SamplingParams(temperature=0, max_tokens=6))[0]
    d = counter_delta(before, eng.counters.snapshot())
    # The sampled last token of turn 1 was never fed back, so its block may be partial.
    assert d["prefill_tokens_cached"] == (len(history) - 1) // bs * bs
    assert second.num_cached_tokens == d["prefill_tokens_cached"] and first.num_cached_tokens == 0
    assert 0 < d["prefix_hit_rate"] < 1
    assert second.token_ids == naive_greedy(model, turn2, 6, set(tok.stop_token_ids()))
    assert_all_free(eng)


def test_requests_join_and_leave_between_steps(setup):
    tok, model, prompts = setup
    eng = engine(model, tok, block_size=4, num_blocks=24)
    sp = SamplingParams(temperature=0, max_tokens=10)
    done = {}
    rid = {eng.add_request(prompts[0], sp, prompt_index=0): 0}
    for step in range(40):
        if step == 3:
            rid[eng.add_request(prompts[1], sp, prompt_index=1)] = 1
        if step == 5:
            rid[eng.add_request(prompts[2], sp, prompt_index=2)] = 2
        for r, c in eng.step():
            done[r] = c
        eng.block_manager.check_invariants(eng.scheduler.running)
        if len(done) == 3:
            break
    stop = set(tok.stop_token_ids())
    for r, c in done.items():
        assert c.token_ids == naive_greedy(model, prompts[rid[r]], 10, stop)
    assert_all_free(eng)


def test_update_weights_versions_and_cache_reset(setup):
    tok, model, prompts = setup
    other = tiny_model(tok.vocab_size, seed=11)
    eng = engine(model, tok, block_size=4)
    sp = SamplingParams(temperature=0, max_tokens=6)
    eng.generate(prompts[:1], 1, sp)
    eng.update_weights(other.state_dict(), version=7)
    before = eng.counters.snapshot()
    c = eng.generate(prompts[:1], 1, sp)[0]
    assert counter_delta(before, eng.counters.snapshot())["prefill_tokens_cached"] == 0  # stale prefix not served
    assert c.weight_version == 7
    assert c.token_ids == naive_greedy(other, prompts[0], 6, set(tok.stop_token_ids()))


@pytest.mark.parametrize("in_flight", ["keep", "recompute"])
def test_update_weights_with_requests_in_flight(setup, in_flight):
    tok, model, prompts = setup
    other = tiny_model(tok.vocab_size, seed=11)
    eng = engine(model, tok, block_size=4, decode_burst=1)
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    eng.add_request(prompts[1], sp)
    for _ in range(4):  # prefill + 3 decodes: 4 tokens sampled under version 0
        assert eng.step() == []
    eng.update_weights(other.state_dict(), version=1, in_flight=in_flight)
    done = []
    while eng.has_unfinished():
        done += eng.step()
    (_, c), = done
    assert c.weight_version == 0  # the version of its first token: staleness is never underestimated
    old = naive_greedy(model, prompts[1], 4, set())
    assert c.token_ids[:4] == old
    if in_flight == "recompute":  # the rest is exactly the new model continuing the same tokens
        assert c.token_ids[4:] == naive_greedy(other, prompts[1] + old, 6, set())
    assert_all_free(eng)


def test_stop_strings_stop_tokens_and_ignore_eos(setup):
    tok, model, prompts = setup
    eng = engine(model, tok)
    full = eng.generate(prompts[:1], 1, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0]
    assert len(full.token_ids) == 16 and full.finish_reason == "length"
    stop_tok = full.token_ids[2]
    cut = eng.generate(prompts[:1], 1, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True,
                                                       stop_token_ids=(stop_tok,)))[0]
    assert cut.finish_reason == "stop" and cut.token_ids == full.token_ids[:full.token_ids.index(stop_tok) + 1]
    if len(full.text) >= 3:
        stop = full.text[1:3]
        s = eng.generate(prompts[:1], 1, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, stop=(stop,)))[0]
        assert s.finish_reason == "stop" and s.text == full.text[: full.text.find(stop)]


def test_capacity_limits_are_values_or_clear_errors(setup):
    tok, model, prompts = setup
    eng = engine(model, tok, block_size=4, num_blocks=12)  # 48 token slots
    with pytest.raises(ValueError, match="does not fit the KV pool"):
        eng.add_request(list(range(1, 60)), SamplingParams())
    with pytest.raises(ValueError, match="empty prompt"):
        eng.generate([[]], 1, SamplingParams())
    with pytest.raises(ValueError, match="does not fit the KV pool"):  # all or nothing:
        eng.generate([prompts[0], list(range(1, 60))], 2, SamplingParams())
    assert not eng.has_unfinished()  # the good prompt's samples were not left queued
    # 44-token prompt + 12 tokens > 48 slots: the lone sequence ends "length", no crash.
    c = eng.generate([prompts[1]], 1, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    assert c.finish_reason == "length" and 0 < len(c.token_ids) < 12
    assert c.token_ids == naive_greedy(model, prompts[1], len(c.token_ids), set())
    assert_all_free(eng)


def test_run_file_chooses_paged_or_dense(setup, tmp_path):
    from polyrl.config import EngineConfig
    from polyrl.engine.factory import build_engine

    tok, model, _ = setup
    paged = build_engine(EngineConfig(), copy.deepcopy(model), tok, tmp_path)
    dense = build_engine(EngineConfig(native={"paged": False}), copy.deepcopy(model), tok, tmp_path)
    assert isinstance(paged, PagedEngine) and isinstance(dense, DenseEngine)
    with pytest.raises(ValueError, match="engine.backend"):
        build_engine(type("S", (), {"backend": "dense"})(), copy.deepcopy(model), tok, tmp_path)


def test_packed_linear_layers_equal_the_plain_ones_and_follow_weight_updates(setup):
    from polyrl.engine.runner.packed_linear import PackedLinear, pack_linears, packed_linear_works

    if not packed_linear_works():
        pytest.skip("this torch build has no oneDNN packed linear")
    tok, model, prompts = setup
    eng = engine(model, tok, block_size=4)
    eng.packed = pack_linears(eng.model, min_elements=0)  # every layer, however small
    assert eng.packed and all(isinstance(m, PackedLinear) for m in eng.packed)
    assert set(eng.model.state_dict()) == set(model.state_dict())  # same names: update_weights still fits
    sp = SamplingParams(temperature=0, max_tokens=10)
    outs = eng.generate(prompts, 1, sp)
    for p, c in zip(prompts, outs):
        assert c.token_ids == naive_greedy(model, p, 10, set(tok.stop_token_ids()))
        with torch.no_grad():
            logits = model(torch.tensor([p + c.token_ids]))
        lp = torch.log_softmax(logits[0, len(p) - 1:-1], -1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
        torch.testing.assert_close(lp, torch.tensor(c.logprobs), rtol=1e-4, atol=1e-4)
    other = tiny_model(tok.vocab_size, seed=11)
    eng.update_weights(other.state_dict(), version=1)
    c = eng.generate(prompts[:1], 1, sp)[0]
    assert c.token_ids == naive_greedy(other, prompts[0], 10, set(tok.stop_token_ids()))
    assert_all_free(eng)
