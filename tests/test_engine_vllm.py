"""vLLM backend behind the Engine interface. Skipped unless vllm imports (it lives in an
environment of its own here: `.venv-vllm/bin/python -m pytest tests/test_engine_vllm.py`)."""

import os

import pytest
import torch

vllm = pytest.importorskip("vllm")

from polyrl.engine.base import SamplingParams  # noqa: E402
from polyrl.engine.factory import build_engine  # noqa: E402
from polyrl.models.config import ModelConfig  # noqa: E402
from polyrl.models.hf_io import save_pretrained  # noqa: E402
from polyrl.models.tokenizer import Tokenizer, save_tokenizer, train_tiny_tokenizer  # noqa: E402
from polyrl.models.transformer import Transformer  # noqa: E402
from polyrl.train.batch import token_logprobs  # noqa: E402
from tests.helpers import CORPUS  # noqa: E402


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine core: no spawn
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    d = tmp_path_factory.mktemp("model")
    tok_hf = train_tiny_tokenizer(CORPUS, vocab_size=300)
    save_tokenizer(tok_hf, d)
    tok = Tokenizer.from_dir(d)
    # head_dim 64: vLLM's CPU attention supports a fixed set of head sizes.
    cfg = ModelConfig(model_type="llama", vocab_size=tok.vocab_size, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                      max_position_embeddings=256, eos_token_id=tok.eos_token_id)
    model = Transformer(cfg, seed=3).eval()
    save_pretrained(model, cfg, d)
    settings = type("S", (), {"backend": "vllm", "vllm": {"gpu_memory_utilization": 0.02, "max_model_len": 256}})()
    engine = build_engine(settings, model, tok, d)
    prompts = [tok.encode(tok.chat_prompt(p)) for p in ("What is 4 + 3?", "Solve for x: 3x + 4 = 19.")]
    return tok, model, engine, prompts


def recompute(model, prompt, tokens, temperature):
    seq = prompt + tokens
    with torch.no_grad():
        logits = model(torch.tensor([seq]))
    return token_logprobs(logits[:, :-1], torch.tensor([seq[1:]]), temperature)[0, len(prompt) - 1:], logits


def test_vllm_greedy_and_logprobs_match_our_forward(setup):
    tok, model, engine, prompts = setup
    outs = engine.generate(prompts, 2, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert [c.prompt_index for c in outs] == [0, 0, 1, 1]
    for c in outs:
        assert len(c.token_ids) == 8 and c.weight_version == 0
        lp, logits = recompute(model, prompts[c.prompt_index], c.token_ids, 1.0)
        torch.testing.assert_close(torch.tensor(c.logprobs), lp, rtol=1e-3, atol=1e-3)
        P = len(prompts[c.prompt_index])
        best = logits[0, P - 1:-1].max(-1).values
        chosen = logits[0, P - 1:-1].gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
        assert torch.all(best - chosen < 1e-3)  # greedy up to float ties


def test_vllm_sampled_logprobs_are_tempered(setup):
    tok, model, engine, prompts = setup
    outs = engine.generate(prompts, 2, SamplingParams(temperature=0.7, max_tokens=6, seed=1, ignore_eos=True))
    for c in outs:
        lp, _ = recompute(model, prompts[c.prompt_index], c.token_ids, 0.7)
        torch.testing.assert_close(torch.tensor(c.logprobs), lp, rtol=1e-3, atol=1e-3)


def test_vllm_update_weights(setup):
    tok, model, engine, prompts = setup
    other = Transformer(model.cfg, seed=11).eval()
    engine.update_weights(other.state_dict(), version=3)
    c = engine.generate(prompts[:1], 1, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
    assert c.weight_version == 3
    lp, _ = recompute(other, prompts[0], c.token_ids, 1.0)
    torch.testing.assert_close(torch.tensor(c.logprobs), lp, rtol=1e-3, atol=1e-3)
