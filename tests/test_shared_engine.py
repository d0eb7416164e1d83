"""SharedEngine (polyrl/pipeline/shared_engine.py): several threads, one engine, the policy between.

Step mode runs a real tiny PagedEngine; round mode runs a scripted engine that records
its generate calls, so the order and shape of what reaches the engine can be checked.
"""

from __future__ import annotations

import copy
import threading
import time

import pytest

from polyrl.engine.base import SamplingParams
from polyrl.engine.config import NativeEngineConfig
from polyrl.engine.paged import PagedEngine
from polyrl.pipeline.scheduler import LoadConfig, SchedulerConfig
from polyrl.pipeline.shared_engine import SharedEngine
from polyrl.types import Completion
from tests.helpers import tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tok = tiny_tokenizer(tmp_path_factory.mktemp("tok"))
    return tiny_model(tok.vocab_size, seed=0), tok


def paged(tiny) -> PagedEngine:
    model, tok = tiny
    return PagedEngine(copy.deepcopy(model), tok, NativeEngineConfig(num_blocks=256, max_num_seqs=16))


def run_threads(*fns):
    results, errors = [None] * len(fns), []

    def wrap(k, fn):
        try:
            results[k] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised below in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(k, fn)) for k, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    if errors:
        raise errors[0]
    return results


def test_step_mode_gives_each_load_the_tokens_the_engine_alone_gives(tiny):
    """Loads run in one batch, yet a seeded call's tokens are those of the engine alone."""
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
    train_sp = SamplingParams(temperature=1.0, max_tokens=12, seed=7, ignore_eos=True)
    chat_sp = SamplingParams(temperature=0.0, max_tokens=6)
    alone = paged(tiny)
    want_train = alone.generate(prompts, n=4, sampling=train_sp)
    want_chat = alone.generate(prompts[:1], n=1, sampling=chat_sp)
    shared = SharedEngine(paged(tiny), SchedulerConfig(), capacity=6)
    assert shared.step_mode
    try:
        train, eval_, chat = shared.client("train"), shared.client("eval"), shared.client("interactive")
        got_train, got_eval, got_chat = run_threads(lambda: train.generate(prompts, 4, train_sp),
                                                    lambda: eval_.generate(prompts, 4, train_sp),
                                                    lambda: chat.generate(prompts[:1], 1, chat_sp))
        assert [c.token_ids for c in got_train] == [c.token_ids for c in want_train]
        assert [c.token_ids for c in got_eval] == [c.token_ids for c in want_train]
        assert [c.prompt_index for c in got_train] == [i for i in range(3) for _ in range(4)]
        assert got_chat[0].token_ids == want_chat[0].token_ids
        stats = shared.stats()
        assert stats["train"]["sequences"] == 12 and stats["interactive"]["calls"] == 1
        assert stats["train"]["queued"] == stats["train"]["running"] == 0
        assert stats["interactive"]["latency_p99"] is not None
    finally:
        shared.close()
    with pytest.raises(RuntimeError, match="closed"):
        shared.generate("train", prompts, 1, train_sp)


def test_update_waits_for_a_held_version(tiny):
    model, _ = tiny
    shared = SharedEngine(paged(tiny), SchedulerConfig(), capacity=4)
    try:
        weights = {k: v.clone() for k, v in model.state_dict().items()}
        with shared.hold_version() as v:
            assert v == 0
            updater = threading.Thread(target=shared.update_weights, args=(weights, 1))
            updater.start()
            time.sleep(0.2)
            assert shared.weight_version == 0  # held: the update waits
            out = shared.generate("eval", [[5, 6, 7]], 2, SamplingParams(max_tokens=4, seed=1))
            assert {c.weight_version for c in out} == {0}
        updater.join(timeout=10)
        assert shared.weight_version == 1
        with pytest.raises(ValueError, match="not loaded"), shared.hold_version(0):
            pass
    finally:
        shared.close()


def test_bad_calls_fail_their_caller_only(tiny):
    shared = SharedEngine(paged(tiny), SchedulerConfig(), capacity=4)
    try:
        with pytest.raises(ValueError, match="empty prompt"):
            shared.generate("train", [[]], 1, SamplingParams(max_tokens=2))
        with pytest.raises(ValueError, match="load"):
            shared.client("training")
        assert len(shared.generate("train", [[5, 6]], 2, SamplingParams(max_tokens=2))) == 2
    finally:
        shared.close()


class ScriptedEngine:
    """An Engine without the step API: completions of one token (the prompt's first), and a log of calls."""

    def __init__(self, delay: float = 0.0):
        self.weight_version, self.calls, self.delay = 0, [], delay

    def generate(self, prompts, n, sampling):
        self.calls.append((len(prompts), n, sampling.seed, prompts[0][0]))
        time.sleep(self.delay)
        return [Completion(i, "", [p[0]], [0.0], "length", self.weight_version) for i, p in enumerate(prompts)
                for _ in range(n)]

    def update_weights(self, weights, version):
        self.weight_version = version

    def close(self):
        pass


def test_round_mode_passes_whole_calls_through_and_splits_big_ones():
    engine = ScriptedEngine()
    shared = SharedEngine(engine, SchedulerConfig(), capacity=8)
    assert not shared.step_mode
    try:
        out = shared.generate("train", [[1], [2]], 3, SamplingParams(seed=5))
        assert engine.calls == [(2, 3, 5, 1)]  # admitted whole: the caller's own call
        assert [c.token_ids[0] for c in out] == [1, 1, 1, 2, 2, 2]
        engine.calls.clear()
        out = shared.generate("train", [[k] for k in range(10)], 2, SamplingParams(seed=5))
        assert [c.token_ids[0] for c in out] == [k for k in range(10) for _ in range(2)]
        assert [c.prompt_index for c in out] == [k for k in range(10) for _ in range(2)]
        assert [n for _, n, _, _ in engine.calls] == [1, 1, 1]  # 20 sequences in rounds of 8, 8, 4
        assert [size for size, _, _, _ in engine.calls] == [8, 8, 4]
    finally:
        shared.close()


def test_round_mode_runs_interactive_first_and_keeps_training_at_its_share():
    engine = ScriptedEngine(delay=0.02)
    cfg = SchedulerConfig(train=LoadConfig(priority=1, share=0.5), eval=LoadConfig(priority=2, share=0.25),
                          interactive=LoadConfig(priority=3, share=0.25))
    shared = SharedEngine(engine, cfg, capacity=8)
    rounds, run_round = [], shared._round

    def recording(admitted):  # what each round admitted, and the order its generate calls reached the engine
        start = len(engine.calls)
        run_round(admitted)
        rounds.append(([s.call.load for s in admitted], [first // 100 for *_, first in engine.calls[start:]]))

    shared._round = recording
    try:
        run_threads(lambda: shared.generate("train", [[100 + k] for k in range(40)], 1, SamplingParams()),
                    lambda: shared.generate("eval", [[200 + k] for k in range(40)], 1, SamplingParams(top_k=5)),
                    *[lambda k=k: shared.generate("interactive", [[300 + k]], 1, SamplingParams(max_tokens=8))
                      for k in range(3)])
    finally:
        shared.close()
    rank = {"interactive": 0, "eval": 1, "train": 2}
    for loads, kinds in rounds:
        assert loads == sorted(loads, key=rank.get)
        assert kinds == sorted(kinds, reverse=True)  # interactive (3xx) reaches the engine first
        assert len(kinds) == len(set(kinds))  # one generate call per load: seedless equal calls merged
    beside = [loads for loads, _ in rounds if {"train", "eval"} <= set(loads)]
    assert beside and all(loads.count("train") >= 4 for loads in beside)  # training keeps 4 of 8 slots
    assert sum(len(loads) for loads, _ in rounds) == 83
