"""The tiny base model recipe, on a micro budget: files, caching, noise, HF loadability."""

import json
import random

import pytest

from polyrl.domains.math import MathDomain
from polyrl.models import tiny
from polyrl.models.tiny import TinyRecipe, ensure_tiny_model, noisy_demonstration, recipe_hash

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


def test_demonstrations_mix_math_and_code():
    examples = tiny.sft_examples(TinyRecipe(code_share=0.25), 400)
    code = sum(p.startswith("Write a Python function") for p, _ in examples)
    assert code == 100
