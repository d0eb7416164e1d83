"""Our forward = transformers' forward, both ways through save/load, for each family."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from polyrl.models.attention import CausalAttention, repeat_kv  # noqa: E402
from polyrl.models.config import ModelConfig  # noqa: E402
from polyrl.models.hf_io import load_pretrained, save_pretrained  # noqa: E402
from polyrl.models.transformer import Transformer  # noqa: E402

TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)

# (model_type, tied, extra HF config fields)
CASES = [
    ("llama", False, {}),
    ("llama", True, {"attention_bias": True}),
    ("qwen2", True, {}),
    ("qwen2", False, {}),
    ("qwen3", False, {"head_dim": 32}),  # head_dim != hidden/heads, as in real Qwen3
    ("qwen3", True, {"head_dim": 16}),
]
HF_CONFIGS = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config"}
HF_MODELS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def _hf_model(model_type: str, tied: bool, extra: dict) -> torch.nn.Module:
    torch.manual_seed(0)
    config = getattr(transformers, HF_CONFIGS[model_type])(
        **TINY, tie_word_embeddings=tied, rope_theta=500.0, rms_norm_eps=1e-5,
        bos_token_id=1, eos_token_id=2, attn_implementation="eager", **extra
    )
    model = getattr(transformers, HF_MODELS[model_type])(config).float().eval()
    with torch.no_grad():  # HF inits biases and norms to constants; randomise them so they are tested
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _hf_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


@pytest.mark.parametrize(("model_type", "tied", "extra"), CASES)
def test_hf_to_ours(tmp_path: Path, model_type: str, tied: bool, extra: dict) -> None:
    theirs = _hf_model(model_type, tied, extra)
    theirs.save_pretrained(tmp_path)
    ours, cfg = load_pretrained(tmp_path)
    assert cfg.model_type == model_type and cfg.tie_word_embeddings == tied and cfg.rope_theta == 500.0
    if tied:
        assert ours.lm_head.weight is ours.model.embed_tokens.weight
    ids = torch.randint(0, 97, (3, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = ours(ids)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, _hf_logits(theirs, ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("model_type", "tied", "extra"), CASES)
def test_ours_to_hf(tmp_path: Path, model_type: str, tied: bool, extra: dict) -> None:
    cfg = ModelConfig(model_type=model_type, tie_word_embeddings=tied, rope_theta=500.0,
                      eos_token_id=[2, 3], pad_token_id=0, **TINY, **extra)
    ours = Transformer(cfg, seed=3)
    save_pretrained(ours, cfg, tmp_path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, attn_implementation="eager", dtype=torch.float32
    ).eval()
    assert type(theirs).__name__ == HF_MODELS[model_type]
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = ours(ids)
    torch.testing.assert_close(logits, _hf_logits(theirs, ids), rtol=1e-5, atol=1e-5)
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [2, 3] and gen["pad_token_id"] == 0


def test_save_keeps_other_files_and_tied_omits_lm_head(tmp_path: Path) -> None:
    from safetensors import safe_open

    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "generation_config.json").write_text('{"temperature": 0.7, "eos_token_id": 9}')
    cfg = ModelConfig(model_type="qwen3", tie_word_embeddings=True, eos_token_id=2, **TINY)
    save_pretrained(Transformer(cfg), cfg, tmp_path)
    assert (tmp_path / "tokenizer.json").read_text() == "{}"
    assert json.loads((tmp_path / "generation_config.json").read_text()) == {"temperature": 0.7, "eos_token_id": 2}
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        assert "lm_head.weight" not in f.keys() and f.metadata() == {"format": "pt"}


def test_sharded_checkpoint_loads(tmp_path: Path) -> None:
    theirs = _hf_model("qwen2", False, {})
    theirs.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    ours, _ = load_pretrained(tmp_path)
    ids = torch.randint(0, 97, (1, 7))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), _hf_logits(theirs, ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_left_padded_batch_matches_each_sequence_alone(model_type: str) -> None:
    cfg = ModelConfig(model_type=model_type, **TINY)
    model = Transformer(cfg, seed=5).eval()
    g = torch.Generator().manual_seed(4)
    seqs = [torch.randint(3, 97, (n,), generator=g) for n in (7, 3, 5)]
    T = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, T - len(s):], mask[i, T - len(s):] = s, True
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T): real tokens count from 0
    with torch.no_grad():
        batched = model(ids, positions, CausalAttention(key_padding_mask=mask))
        assert not batched.isnan().any()
        for i, s in enumerate(seqs):
            alone = model(s[None])
            torch.testing.assert_close(batched[i, T - len(s):], alone[0], rtol=1e-5, atol=1e-5)


def test_right_padded_batch_matches_each_sequence_alone() -> None:
    cfg = ModelConfig(model_type="qwen2", **TINY)
    model = Transformer(cfg, seed=6).eval()
    a, b = torch.randint(3, 97, (6,)), torch.randint(3, 97, (2,))
    ids = torch.zeros(2, 6, dtype=torch.long)
    ids[0], ids[1, :2] = a, b
    mask = ids != 0
    with torch.no_grad():
        batched = model(ids, attention=CausalAttention(key_padding_mask=mask))
        torch.testing.assert_close(batched[1, :2], model(b[None])[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(batched[0], model(a[None])[0], rtol=1e-5, atol=1e-5)


def test_hidden_then_lm_head_equals_forward() -> None:
    model = Transformer(ModelConfig(model_type="llama", **TINY)).eval()
    ids = torch.randint(0, 97, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(model.lm_head(model.hidden(ids))[:, -1], model(ids)[:, -1])


def test_repeat_kv_is_repeat_interleave() -> None:
    x = torch.randn(2, 3, 4, 8)
    assert torch.equal(repeat_kv(x, 2), x.repeat_interleave(2, dim=1))


def test_init_is_seeded_and_small() -> None:
    cfg = ModelConfig(model_type="llama", **TINY)
    a, b = Transformer(cfg, seed=1), Transformer(cfg, seed=1)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert 0.015 < a.model.layers[0].mlp.up_proj.weight.std() < 0.025


@pytest.mark.parametrize(
    ("d", "match"),
    [
        ({"model_type": "gpt2"}, r"model_type='gpt2' is not supported; supported: \['llama', 'qwen2', 'qwen3'\]"),
        ({"model_type": "llama", **TINY, "rope_scaling": {"rope_type": "longrope", "factor": 8.0}},
         "rope_scaling.rope_type='longrope' is not supported; supported: "),
        ({"model_type": "qwen3", **TINY, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}},
         r"rope_parameters with rope_type='yarn' is missing \['factor'\]"),
        ({"model_type": "qwen2", **TINY, "use_sliding_window": True}, "sliding_window"),
        ({"model_type": "llama", "hidden_size": 64}, "missing required fields"),
    ],
)
def test_config_rejects_unsupported(d: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_hf_dict(d)


def test_config_reads_4x_and_5x_rope_fields() -> None:
    v4 = {"model_type": "qwen2", **TINY, "rope_theta": 1e6, "rope_scaling": None}
    v5 = {"model_type": "qwen2", **TINY, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
    assert ModelConfig.from_hf_dict(v4) == ModelConfig.from_hf_dict(v5)
    assert ModelConfig.from_hf_dict(v4).rope_theta == 1e6
    cfg = ModelConfig.from_hf_dict(v4)
    assert ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg


def test_load_errors_name_directory_and_missing_keys(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_pretrained(tmp_path)
    cfg = ModelConfig(model_type="llama", **TINY)
    save_pretrained(Transformer(cfg), cfg, tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}.*model.safetensors"):
        load_pretrained(tmp_path)
    cfg2 = ModelConfig(model_type="llama", **{**TINY, "num_hidden_layers": 3})
    save_pretrained(Transformer(cfg), cfg, tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(cfg2.to_hf_dict()))
    with pytest.raises(ValueError, match=r"missing weights \['model.layers.2"):
        load_pretrained(tmp_path)


def test_load_in_bfloat16_computes_in_bfloat16(tmp_path: Path) -> None:
    cfg = ModelConfig(model_type="qwen3", **TINY)
    ref = Transformer(cfg, seed=7)
    save_pretrained(ref, cfg, tmp_path)
    model, _ = load_pretrained(tmp_path, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "float32"
    ids = torch.randint(0, 97, (2, 6))
    with torch.no_grad():
        logits = model(ids)
        assert model.hidden(ids).dtype == torch.bfloat16 and logits.dtype == torch.float32
        torch.testing.assert_close(logits, ref(ids), rtol=0, atol=5e-2)
