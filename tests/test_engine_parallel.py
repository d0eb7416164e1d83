"""Data-parallel engine: worker processes sharing the weights give the paged engine's
results (seeded samples, greedy = naive recompute, logprobs), follow weight updates,
keep a group together and an agent's turns on one worker, and report failures."""

import copy

import pytest
import torch

from polyrl.engine.base import SamplingParams
from polyrl.engine.config import NativeEngineConfig
from polyrl.engine.parallel import DataParallelEngine, PrefixRouter
from polyrl.engine.paged import PagedEngine
from tests.helpers import tiny_model, tiny_tokenizer
from tests.test_engine_dense import PROMPTS, naive_greedy


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tok = tiny_tokenizer(tmp_path_factory.mktemp("tok"))
    model = tiny_model(tok.vocab_size, seed=3)
    prompts = [tok.encode(tok.chat_prompt(p)) for p in PROMPTS]
    eng = DataParallelEngine(copy.deepcopy(model), tok, NativeEngineConfig(num_blocks=64, workers=2),
                             threads_per_worker=1)
    yield tok, model, prompts, eng
    eng.close()


def test_seeded_samples_and_logprobs_equal_the_single_engine(setup):
    tok, model, prompts, eng = setup
    sp = SamplingParams(temperature=1.0, top_k=20, max_tokens=10, seed=5, logprobs=2)
    ours = eng.generate(prompts * 2, 3, sp)
    single = PagedEngine(copy.deepcopy(model), tok).generate(prompts * 2, 3, sp)
    assert [c.token_ids for c in ours] == [c.token_ids for c in single]
    assert [c.prompt_index for c in ours] == [i for i in range(6) for _ in range(3)]
    for a, b in zip(ours, single):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=1e-4, atol=1e-4)
        assert len(a.top_logprobs) == len(a.token_ids)
    assert eng.counters.snapshot()["requests"] >= 18


def test_greedy_equals_naive_and_weight_updates_reach_every_worker(setup):
    tok, model, prompts, eng = setup
    stop = set(tok.stop_token_ids())
    sp = SamplingParams(temperature=0, max_tokens=8)
    for p, c in zip(prompts, eng.generate(prompts, 1, sp)):
        assert c.token_ids == naive_greedy(model, p, 8, stop)
    other = tiny_model(tok.vocab_size, seed=11)
    eng.update_weights(other.state_dict(), version=3)
    outs = eng.generate(prompts * 3, 1, sp)  # spread over both workers
    assert {c.weight_version for c in outs} == {3}
    for i, c in enumerate(outs):
        assert c.token_ids == naive_greedy(other, prompts[i % 3], 8, stop)
    eng.update_weights(model.state_dict(), version=4)


def test_a_failed_call_is_an_error_and_the_engine_goes_on(setup):
    tok, model, prompts, eng = setup
    with pytest.raises(ValueError, match="empty prompt"):
        eng.generate([[]], 1, SamplingParams())
    huge = [5] * (64 * eng.config.block_size)  # the whole pool, and no room for a token
    eng.router.forget()  # so the bad prompt goes to worker 0 and the good one to worker 1
    with pytest.raises(RuntimeError, match="does not fit the KV pool"):
        eng.generate([huge, prompts[0]], 1, SamplingParams(max_tokens=2))
    # Worker 1's answer to the failed call was read, so it is not taken for this one's.
    outs = eng.generate(prompts, 1, SamplingParams(temperature=0, max_tokens=4))
    for p, c in zip(prompts, outs):
        assert c.token_ids == naive_greedy(model, p, 4, set(tok.stop_token_ids()))


def test_router_keeps_groups_whole_follows_prefixes_and_balances():
    router = PrefixRouter(workers=2, block_size=4)
    distinct = [[i] * 12 for i in range(1, 9)]
    owners = router.assign(distinct, n=8, max_tokens=16)
    assert sorted(owners.count(w) for w in (0, 1)) == [4, 4]  # equal work, split evenly
    # Next turns (history + more tokens) go where their history is.
    turns = [p + [99, 98, 97, 96, 95] for p in distinct]
    assert router.assign(turns, n=1, max_tokens=16) == owners
    router.forget()
    assert router.assign([distinct[0]], n=1, max_tokens=16) == [0]  # no affinity left: least loaded, lowest


def test_run_file_chooses_workers(setup, tmp_path):
    from polyrl.config import EngineConfig
    from polyrl.engine.factory import build_engine

    tok, model, prompts, _ = setup
    eng = build_engine(EngineConfig(native={"workers": 2}), copy.deepcopy(model), tok, tmp_path, weight_version=2)
    try:
        assert isinstance(eng, DataParallelEngine) and eng.workers == 2 and eng.weight_version == 2
        assert eng.generate(prompts[:1], 2, SamplingParams(max_tokens=3, seed=1))[0].weight_version == 2
    finally:
        eng.close()
    assert not any(p.is_alive() for p in eng._procs)
