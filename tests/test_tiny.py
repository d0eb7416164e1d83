"""The tiny base model recipe, on a micro budget: files, caching, noise, HF loadability."""

import json
import math
import random

import pytest
import torch

from polyrl.builtin import tiny
from polyrl.builtin.tiny import TinyRecipe, ensure_tiny_model, noisy_demonstration, recipe_hash
from polyrl.domains.math import MathDomain
from polyrl.models.attention import DocumentCausalAttention

MICRO = TinyRecipe(hidden_size=32, num_heads=2, num_kv_heads=1, intermediate_size=64, num_layers=1,
                   steps=3, batch_size=8, warmup=1, vocab_size=300)


def test_build_cache_and_reuse(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYRL_CACHE", str(tmp_path))
    path = ensure_tiny_model(MICRO, log=lambda *_: None)
    assert path.name == f"tiny-{recipe_hash(MICRO)}"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "polyrl_recipe.json"):
        assert (path / name).exists(), name
    assert json.loads((path / "polyrl_recipe.json").read_text())["recipe"]["steps"] == 3

    def fail(*_):
        raise AssertionError("rebuilt a cached model")

    monkeypatch.setattr(tiny, "build_tiny_model", fail)
    assert ensure_tiny_model(MICRO, log=lambda *_: None) == path


@pytest.mark.parametrize("native", [True, False])
def test_products_run_in_bfloat16_only_where_the_cpu_has_it(tmp_path, monkeypatch, native):
    monkeypatch.setenv("POLYRL_CACHE", str(tmp_path))
    monkeypatch.setattr(tiny, "native_bf16", lambda: native)
    card = json.loads((ensure_tiny_model(MICRO, log=lambda *_: None) / "polyrl_recipe.json").read_text())
    assert card["products"] == ("bfloat16" if native else "float32")
    assert math.isfinite(card["final_loss"])
    off = TinyRecipe(**{**MICRO.__dict__, "bf16_products": False})
    assert json.loads((ensure_tiny_model(off, log=lambda *_: None) / "polyrl_recipe.json").read_text())["products"] == "float32"


def test_document_attention_keeps_float32_under_a_bfloat16_autocast():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 10, 8).bfloat16(), torch.randn(2, 2, 10, 8).bfloat16(), torch.randn(2, 2, 10, 8).bfloat16()
    documents = torch.tensor([[0] * 4 + [1] * 6, [2] * 10])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        kept = DocumentCausalAttention(documents, dtype=torch.float32).attend(0, q, k, v)
    exact = DocumentCausalAttention(documents).attend(0, q.float(), k.float(), v.float())
    assert kept.dtype == torch.float32 and torch.equal(kept, exact)


def test_a_demonstration_longer_than_the_models_positions_is_refused(tmp_path, monkeypatch):
    long = [{"role": "user", "content": "What is 1 + 1?"}, {"role": "assistant", "content": "1 " * 600}]
    monkeypatch.setattr(tiny, "sft_examples", lambda recipe, n: [long] * n)
    with pytest.raises(ValueError, match="longer than the model's 512 positions"):
        tiny.build_tiny_model(MICRO, tmp_path, log=lambda *_: None)


def test_recipe_change_changes_the_cache_key():
    assert recipe_hash(MICRO) != recipe_hash(TinyRecipe(**{**MICRO.__dict__, "seed": 1}))


def test_built_model_loads_in_transformers(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("POLYRL_CACHE", str(tmp_path))
    path = ensure_tiny_model(MICRO, log=lambda *_: None)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    assert model.config.vocab_size == len(tok)


def test_noisy_teacher_rates():
    recipe = TinyRecipe(slip_rate=0.2, format_rate=0.25)
    rng = random.Random(0)
    tasks = MathDomain().sample("train", 2000, seed=0)
    kinds = {"clean": 0, "slip": 0, "unboxed": 0}
    for t in tasks:
        demo = MathDomain.demonstration(t)
        noisy = noisy_demonstration(t, demo, recipe, rng)
        if noisy == demo:
            kinds["clean"] += 1
        elif "\\boxed" not in noisy:
            kinds["unboxed"] += 1
        else:
            assert f"\\boxed{{{t.answer}}}" not in noisy  # a slip changes the final answer
            kinds["slip"] += 1
    assert 0.15 < kinds["slip"] / len(tasks) < 0.25
    assert 0.2 < kinds["unboxed"] / len(tasks) < 0.3


def test_noisy_teacher_code_slips_change_the_function():
    from polyrl.domains.code import CodeDomain

    recipe = TinyRecipe(slip_rate=0.2, format_rate=0.25)
    rng = random.Random(0)
    kinds = {"clean": 0, "slip": 0, "no_return": 0}
    tasks = CodeDomain().sample("train", 2000, seed=0)
    for t in tasks:
        demo = CodeDomain.demonstration(t)
        noisy = noisy_demonstration(t, demo, recipe, rng)
        if noisy == demo:
            kinds["clean"] += 1
        elif "return" not in noisy:
            kinds["no_return"] += 1
        else:
            assert noisy.split("return ")[1] != demo.split("return ")[1]  # another function
            kinds["slip"] += 1
    assert 0.15 < kinds["slip"] / len(tasks) < 0.25
    assert 0.2 < kinds["no_return"] / len(tasks) < 0.3


def test_demonstrations_mix_the_domains_and_mask_only_the_assistant():
    examples = tiny.sft_examples(TinyRecipe(mix=(("math", 1), ("code", 1), ("agent", 2))), 400)
    firsts = [e[0]["content"] if e[0]["role"] == "user" else "system" for e in examples]
    assert sum(f.startswith("Write a Python function") for f in firsts) == 100
    assert firsts.count("system") == 200
    agent = next(e for e in examples if e[0]["role"] == "system")
    assert [m["role"] for m in agent[:3]] == ["system", "user", "assistant"] and agent[-1]["role"] == "assistant"


def test_agent_teacher_slips_and_detours():
    from polyrl.domains.agent import AgentDomain

    recipe, rng = TinyRecipe(slip_rate=0.2, format_rate=0.25), random.Random(0)
    kinds = {"clean": 0, "slip": 0, "detour": 0}
    for t in AgentDomain(levels=(2, 3)).sample("train", 1000, seed=0):
        demo = AgentDomain.demonstration(t)
        noisy = tiny._agent_noise(t, demo, recipe, rng)
        if noisy == demo:
            kinds["clean"] += 1
        elif len(noisy) > len(demo):
            assert noisy[-1] == demo[-1] and noisy[-3:-1] == demo[-3:-1] == noisy[-5:-3]  # the last lookup twice
            kinds["detour"] += 1
        else:
            assert noisy[-1]["content"] != demo[-1]["content"] and len(noisy) == len(demo)
            kinds["slip"] += 1
    assert 0.15 < kinds["slip"] / 1000 < 0.25 and 0.2 < kinds["detour"] / 1000 < 0.3


def test_packed_rows_give_the_loss_of_one_padded_row_per_sequence():
    import torch

    from polyrl.agent.engine_model import Segment
    from polyrl.models.attention import CausalAttention, DocumentCausalAttention
    from tests.helpers import tiny_model

    model = tiny_model(vocab_size=50, layers=2)
    rng = random.Random(1)
    batch = []
    for n in (5, 9, 3, 12, 7, 4):
        ids = [rng.randrange(50) for _ in range(n)]
        batch.append(Segment(ids, [0] * (n // 2) + [1] * (n - n // 2), [0.0] * n))
    ids, targets, mask, positions, documents = tiny.pack(batch, length=16)
    assert ids.shape[0] < len(batch) and mask.sum() == sum(sum(s.loss_mask[1:]) for s in batch)
    per_token = torch.nn.functional.cross_entropy(
        model(ids, positions, DocumentCausalAttention(documents)).transpose(1, 2), targets, reduction="none")
    packed = sorted((per_token * mask)[mask > 0].tolist())
    padded = []
    for seg in batch:
        x = torch.tensor([seg.token_ids])
        losses = torch.nn.functional.cross_entropy(model(x, attention=CausalAttention())[0, :-1], x[0, 1:],
                                                   reduction="none")
        padded += [v for v, m in zip(losses.tolist(), seg.loss_mask[1:]) if m]
    assert packed == pytest.approx(sorted(padded), abs=1e-5)
