"""RoPE scaling (models/rope.py): the same frequencies and logits as transformers for each
type past the original context, config.json both ways, clear errors for bad values, and
the engine (fused decode tables included) on the same scaled table as the model."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from polyrl.engine.base import SamplingParams  # noqa: E402
from polyrl.engine.config import NativeEngineConfig  # noqa: E402
from polyrl.engine.paged import PagedEngine  # noqa: E402
from polyrl.engine.runner import cpu_kernels  # noqa: E402
from polyrl.engine.runner.decode_backend import FusedDecode  # noqa: E402
from polyrl.engine.runner.fused_decode import unsupported  # noqa: E402
from polyrl.models.config import ModelConfig  # noqa: E402
from polyrl.models.hf_io import load_pretrained, save_pretrained  # noqa: E402
from polyrl.models.rope import RopeScaling, Rotary, inv_freq_and_scale  # noqa: E402
from polyrl.models.transformer import Transformer  # noqa: E402
from tests.helpers import tiny_tokenizer  # noqa: E402
from tests.test_engine_dense import naive_greedy  # noqa: E402

TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)
ORIGINAL = 32  # the "pretraining" context; every parity check runs well past it
LENGTH = 100

# name -> (rope_parameters without rope_theta, max_position_embeddings)
SCALINGS = {
    "linear": ({"rope_type": "linear", "factor": 4.0}, ORIGINAL),
    "dynamic": ({"rope_type": "dynamic", "factor": 4.0}, ORIGINAL),
    "yarn": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL}, 4 * ORIGINAL),
    "yarn_mscale": ({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": ORIGINAL,
                     "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 16.0, "beta_slow": 2.0}, 8 * ORIGINAL),
    "llama3": ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": ORIGINAL}, 8 * ORIGINAL),
}
HF = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM")}


def _hf_model(model_type: str, scaling: dict, max_positions: int) -> torch.nn.Module:
    torch.manual_seed(0)
    config_cls, model_cls = HF[model_type]
    config = getattr(transformers, config_cls)(
        **TINY, max_position_embeddings=max_positions, rope_parameters={**scaling, "rope_theta": 500.0},
        rms_norm_eps=1e-5, attn_implementation="eager")
    model = getattr(transformers, model_cls)(config).float().eval()
    with torch.no_grad():  # non-trivial biases and norms
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _ids(length: int = LENGTH, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, TINY["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(1))


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids) if isinstance(model, Transformer) else model(input_ids=ids).logits
    return out.float()


@pytest.mark.parametrize("model_type", sorted(HF))
@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_logits_equal_transformers_past_the_original_context(tmp_path: Path, name: str, model_type: str) -> None:
    scaling, max_positions = SCALINGS[name]
    theirs = _hf_model(model_type, scaling, max_positions)
    theirs.save_pretrained(tmp_path)
    ours, cfg = load_pretrained(tmp_path)
    assert cfg.rope_scaling is not None and cfg.rope_scaling.rope_type == scaling["rope_type"]
    if name == "dynamic":
        ours.rope.dynamic_length = None  # transformers' per-call base (see rope.Rotary)
    ids = _ids()
    torch.testing.assert_close(_logits(ours, ids), _logits(theirs, ids), rtol=1e-5, atol=1e-5)
    # The scaling matters at this length: plain RoPE gives other logits.
    plain = copy.deepcopy(ours)
    plain.rope = Rotary(cfg.head_dim, cfg.rope_theta, None, cfg.max_position_embeddings)
    assert not torch.allclose(_logits(plain, ids), _logits(theirs, ids), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_saved_config_is_read_back_by_transformers_with_the_same_logits(tmp_path: Path, name: str) -> None:
    scaling, max_positions = SCALINGS[name]
    cfg = ModelConfig.from_hf_dict({"model_type": "llama", **TINY, "max_position_embeddings": max_positions,
                                    "rope_theta": 500.0, "rope_scaling": scaling})
    ours = Transformer(cfg, seed=3).eval()
    if name == "dynamic":
        ours.rope.dynamic_length = None
    save_pretrained(ours, cfg, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["rope_scaling"]["rope_type"] == written["rope_parameters"]["rope_type"] == scaling["rope_type"]
    assert ModelConfig.from_hf_dict(written) == cfg
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager",
                                                               dtype=torch.float32).eval()
    assert theirs.config.rope_parameters["rope_type"] == scaling["rope_type"]
    ids = _ids(batch=1)
    torch.testing.assert_close(_logits(ours, ids), _logits(theirs, ids), rtol=1e-5, atol=1e-5)


GRID = [  # (rope dict, head_dim, theta, max_position_embeddings)
    ({"rope_type": "linear", "factor": 2.5}, 16, 10000.0, 64),
    ({"rope_type": "dynamic", "factor": 2.0}, 64, 1e6, 512),
    ({"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32,
      "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}, 64, 10000.0, 163840),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, 128, 1e6, 131072),
    ({"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": 512, "truncate": False,
      "attention_factor": 1.25}, 32, 50000.0, 1536),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}, 128, 500000.0, 131072),
    ({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
      "original_max_position_embeddings": 64}, 24, 10000.0, 2048),
]


@pytest.mark.parametrize(("params", "head_dim", "theta", "max_positions"), GRID)
def test_frequencies_equal_transformers_init_functions(params: dict, head_dim: int, theta: float,
                                                       max_positions: int) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                                      max_position_embeddings=max_positions,
                                      rope_parameters={**params, "rope_theta": theta})
    scaling = RopeScaling.from_hf(params, max_positions)
    for seq_len in (None, 3 * max_positions):  # the second matters to dynamic NTK only
        theirs, their_scale = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu", seq_len=seq_len)
        ours, our_scale = inv_freq_and_scale(head_dim, theta, scaling, max_positions, seq_len)
        torch.testing.assert_close(ours, theirs.float(), rtol=1e-6, atol=0)
        assert our_scale == pytest.approx(their_scale, rel=1e-12)


def test_both_spellings_and_the_legacy_type_key_read_the_same() -> None:
    llama3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    base = {"model_type": "llama", **TINY, "max_position_embeddings": 512}
    v4 = {**base, "rope_theta": 5e5, "rope_scaling": {"type": "llama3", **llama3}}
    v5 = {**base, "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, **llama3}}
    assert ModelConfig.from_hf_dict(v4) == ModelConfig.from_hf_dict(v5)
    assert ModelConfig.from_hf_dict(v5).rope_theta == 5e5
    # yarn without original_max_position_embeddings takes max_position_embeddings, as transformers does
    yarn = ModelConfig.from_hf_dict({**base, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}})
    assert yarn.rope_scaling.original_max_position_embeddings == 512
    # A default-type dict is plain RoPE
    assert ModelConfig.from_hf_dict({**base, "rope_parameters": {"rope_type": "default", "rope_theta": 1.0}}
                                    ).rope_scaling is None


@pytest.mark.parametrize(
    ("rope", "match"),
    [
        ({"rope_type": "linear", "factor": 0.5}, r"rope_scaling\.factor=0\.5 must be a number >= 1"),
        ({"rope_type": "dynamic", "factor": "4"}, r"rope_scaling\.factor='4' must be a number"),
        ({"rope_type": "linear"}, r"rope_scaling with rope_type='linear' is missing \['factor'\]"),
        ({"rope_type": "llama3", "factor": 8.0}, r"missing \['high_freq_factor', 'low_freq_factor'\]"),
        ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0},
         r"rope_scaling\.high_freq_factor=1\.0 must exceed low_freq_factor=4\.0"),
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": -8},
         r"rope_scaling\.original_max_position_embeddings=-8 must be a positive integer"),
        ({"rope_type": "yarn", "factor": 4.0, "attention_factor": 0.0}, r"rope_scaling\.attention_factor=0\.0"),
        ({"rope_type": "longrope", "factor": 4.0}, r"rope_scaling\.rope_type='longrope' is not supported"),
        ({"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0},
         r"rope_scaling has fields \['low_freq_factor'\] that rope_type='linear' does not use"),
        ({"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}, r"partial_rotary_factor=0\.5"),
        ("yarn", r"rope_scaling must be a mapping, not str"),
    ],
)
def test_bad_values_are_errors_naming_the_field(rope, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_hf_dict({"model_type": "qwen2", **TINY, "rope_scaling": rope})


def test_pinned_dynamic_ntk_keeps_a_prefix_independent_of_what_follows() -> None:
    """polyrl's dynamic NTK is computed for one length (dynamic_length); transformers' per-call
    base changes a prefix's logits once the sequence grows past max_position_embeddings."""
    cfg = ModelConfig.from_hf_dict({"model_type": "llama", **TINY, "max_position_embeddings": ORIGINAL,
                                    "rope_theta": 500.0, "rms_norm_eps": 1e-5, "rope_scaling": SCALINGS["dynamic"][0]})
    model = Transformer(cfg, seed=2).eval()
    assert model.rope.dynamic_length == 4 * ORIGINAL
    ids = _ids(length=4 * ORIGINAL, batch=1)
    short = 40  # past the original context, short of the full sequence
    torch.testing.assert_close(_logits(model, ids[:, :short]), _logits(model, ids)[:, :short], rtol=1e-5, atol=1e-5)
    # The pinned base is transformers' base at that length.
    theirs = _hf_model("llama", SCALINGS["dynamic"][0], ORIGINAL)
    model.load_state_dict(theirs.state_dict())
    torch.testing.assert_close(_logits(model, ids), _logits(theirs, ids), rtol=1e-5, atol=1e-5)
    # Per call, the prefix moves: the trap pinning avoids.
    model.rope.dynamic_length = None
    assert not torch.allclose(_logits(model, ids[:, :short]), _logits(model, ids)[:, :short], rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.mark.parametrize("name", ["dynamic", "yarn_mscale", "llama3"])
def test_engine_decodes_on_the_scaled_table(tok, name: str) -> None:
    """Greedy tokens from the paged engine (fused decode where the kernels build, whose cos/sin
    tables carry YaRN's attention factor) equal full recomputes with the model, past the
    original context; logprobs equal between the fused pass and the model's forward."""
    scaling, max_positions = SCALINGS[name]
    cfg = ModelConfig.from_hf_dict({"model_type": "qwen2", **{**TINY, "vocab_size": tok.vocab_size},
                                    "max_position_embeddings": max_positions, "rope_scaling": scaling})
    model = Transformer(cfg, seed=5).eval()
    prompt = torch.randint(3, tok.vocab_size, (ORIGINAL + 8,), generator=torch.Generator().manual_seed(4)).tolist()
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    expected = naive_greedy(model, prompt, 10, set())
    outs = {}
    for decode in ("auto", "forward"):
        eng = PagedEngine(copy.deepcopy(model), tok, NativeEngineConfig(block_size=4), decode=decode)
        if decode == "auto" and not isinstance(cpu_kernels.load(), str):
            assert isinstance(eng.runner.decode_backend, FusedDecode)
        outs[decode] = eng.generate([prompt], 1, greedy)[0]
        assert outs[decode].token_ids == expected
    torch.testing.assert_close(torch.tensor(outs["auto"].logprobs), torch.tensor(outs["forward"].logprobs),
                               rtol=1e-4, atol=1e-4)


def test_fused_decode_refuses_a_per_call_dynamic_table() -> None:
    cfg = ModelConfig.from_hf_dict({"model_type": "llama", **TINY, "max_position_embeddings": ORIGINAL,
                                    "rope_scaling": SCALINGS["dynamic"][0]})
    model = Transformer(cfg).eval()
    assert unsupported(model) is None
    model.rope.dynamic_length = None
    assert "dynamic NTK" in unsupported(model)
