"""Dense engine equivalence: greedy = naive full recompute, logprobs = trainer recompute."""

import copy

import pytest
import torch

from polyrl.engine.base import SamplingParams
from polyrl.engine.dense import DenseEngine
from polyrl.train.batch import token_logprobs
from tests.helpers import tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tok = tiny_tokenizer(tmp_path_factory.mktemp("tok"))
    model = tiny_model(tok.vocab_size, seed=3)
    return tok, model


def naive_greedy(model, prompt, max_tokens, stop_ids):
    seq = list(prompt)
    out = []
    with torch.no_grad():
        for _ in range(max_tokens):
            logits = model(torch.tensor([seq]))[0, -1]
            t = int(logits.argmax())
            out.append(t)
            seq.append(t)
            if t in stop_ids:
                break
    return out


PROMPTS = ["What is 4 + 3?", "Solve for x: 3x + 4 = 19. Then what is 47 + 38 + 1?", "hi"]


def test_greedy_matches_full_recompute_mixed_lengths(setup):
    tok, model = setup
    engine = DenseEngine(copy.deepcopy(model), tok)
    prompts = [tok.encode(tok.chat_prompt(p)) for p in PROMPTS]
    assert len({len(p) for p in prompts}) == 3  # mixed lengths exercise left padding
    outs = engine.generate(prompts, n=2, sampling=SamplingParams(temperature=0, max_tokens=12))
    assert len(outs) == 6
    for i, p in enumerate(prompts):
        expected = naive_greedy(model, p, 12, set(tok.stop_token_ids()))
        for j in range(2):
            c = outs[i * 2 + j]
            assert c.prompt_index == i
            assert c.token_ids == expected
            assert c.finish_reason == ("stop" if expected[-1] in tok.stop_token_ids() else "length")


def test_sampled_logprobs_match_trainer_recompute(setup):
    tok, model = setup
    engine = DenseEngine(copy.deepcopy(model), tok)
    prompts = [tok.encode(tok.chat_prompt(p)) for p in PROMPTS]
    outs = engine.generate(prompts, n=3, sampling=SamplingParams(temperature=0.7, max_tokens=10, seed=1))
    for c in outs:
        seq = prompts[c.prompt_index] + c.token_ids
        P = len(prompts[c.prompt_index])
        with torch.no_grad():
            logits = model(torch.tensor([seq]))
        lp = token_logprobs(logits[:, :-1], torch.tensor([seq[1:]]), 0.7)[0, P - 1:]
        torch.testing.assert_close(lp, torch.tensor(c.logprobs), rtol=1e-4, atol=1e-4)


def test_sampling_is_seeded_and_topk1_is_greedy(setup):
    tok, model = setup
    engine = DenseEngine(copy.deepcopy(model), tok)
    prompts = [tok.encode(tok.chat_prompt(p)) for p in PROMPTS]
    a = engine.generate(prompts, 2, SamplingParams(temperature=1.0, max_tokens=8, seed=5))
    b = engine.generate(prompts, 2, SamplingParams(temperature=1.0, max_tokens=8, seed=5))
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    greedy = engine.generate(prompts, 1, SamplingParams(temperature=0, max_tokens=8))
    top1 = engine.generate(prompts, 1, SamplingParams(temperature=1.0, top_k=1, max_tokens=8, seed=9))
    assert [c.token_ids for c in greedy] == [c.token_ids for c in top1]
    nucleus = engine.generate(prompts, 1, SamplingParams(temperature=1.0, top_p=1e-6, max_tokens=8, seed=9))
    assert [c.token_ids for c in greedy] == [c.token_ids for c in nucleus]


def test_stop_strings_cut_text(setup):
    tok, model = setup
    engine = DenseEngine(copy.deepcopy(model), tok)
    prompt = [tok.encode(tok.chat_prompt("hi"))]
    full = engine.generate(prompt, 1, SamplingParams(temperature=0, max_tokens=16))[0]
    if len(full.text) < 3:
        pytest.skip("random model stopped too early to test stop strings")
    stop = full.text[1:3]
    cut = engine.generate(prompt, 1, SamplingParams(temperature=0, max_tokens=16, stop=(stop,)))[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.find(stop)]


def test_update_weights_sets_version_and_changes_output(setup):
    tok, model = setup
    engine = DenseEngine(copy.deepcopy(model), tok)
    other = tiny_model(tok.vocab_size, seed=11)
    prompt = [tok.encode(tok.chat_prompt("What is 4 + 3?"))]
    engine.update_weights(other.state_dict(), version=7)
    c = engine.generate(prompt, 1, SamplingParams(temperature=0, max_tokens=6))[0]
    assert c.weight_version == 7
    assert c.token_ids == naive_greedy(other, prompt[0], 6, set(tok.stop_token_ids()))
