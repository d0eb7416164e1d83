"""Load and save Hugging Face model directories (config.json + safetensors weights).

Reads `model.safetensors` or a sharded `model.safetensors.index.json`; writes one
`model.safetensors` plus config.json and generation_config.json, which transformers'
`AutoModelForCausalLM.from_pretrained` loads. Tokenizer files are not touched here
(see tokenizer.py), and saving never deletes other files in the directory.

Out of scope: PyTorch `.bin` checkpoints, writing sharded checkpoints, quantised
weights, adapters (LoRA).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from polyrl.models.config import ModelConfig
from polyrl.models.transformer import Transformer

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
"""Non-persistent buffers some older checkpoints carry; we recompute RoPE instead."""


def load_pretrained(
    model_dir: str | os.PathLike[str],
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> tuple[Transformer, ModelConfig]:
    """Build a Transformer from an HF directory, weights cast to `dtype` on `device`."""
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{model_dir}: no config.json; is this a Hugging Face model directory?")
    cfg = ModelConfig.from_hf_dict(json.loads(config_path.read_text()))

    tensors = _read_weights(model_dir, dtype, torch.device(device))
    if cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)  # some tied checkpoints store a copy; the embedding wins

    # Build on the meta device (no memory, no init), then adopt the loaded tensors as parameters.
    with torch.device("meta"):
        model = Transformer(cfg)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        del expected["lm_head.weight"]
    _check_keys(model_dir, expected, tensors)
    model.load_state_dict(tensors, strict=False, assign=True)
    model.tie_weights()
    return model, cfg


def save_pretrained(model: Transformer, cfg: ModelConfig, model_dir: str | os.PathLike[str]) -> None:
    """Write config.json, generation_config.json and model.safetensors into model_dir."""
    save_weights(model.state_dict(), cfg, model_dir)


def save_weights(weights: dict[str, torch.Tensor], cfg: ModelConfig, model_dir: str | os.PathLike[str]) -> None:
    """save_pretrained from a model's full state dict (what a sharded trainer gathers)."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in weights.items()}
    dtype = str(state["lm_head.weight"].dtype).removeprefix("torch.")
    if cfg.tie_word_embeddings:
        del state["lm_head.weight"]  # HF re-ties it from embed_tokens on load

    tmp = model_dir / (WEIGHTS_NAME + ".tmp")
    save_file(state, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, model_dir / WEIGHTS_NAME)  # atomic: a crash never leaves half a checkpoint
    _write_json(model_dir / "config.json", cfg.to_hf_dict(dtype=dtype))

    # Keep sampling defaults a copied generation_config.json may hold; refresh the token ids.
    gen_path = model_dir / "generation_config.json"
    gen: dict[str, Any] = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(cfg, name) is not None:
            gen[name] = getattr(cfg, name)
    _write_json(gen_path, gen)


def _weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files to read: the single file if present (as transformers prefers), else the shards."""
    if (model_dir / WEIGHTS_NAME).is_file():
        return [model_dir / WEIGHTS_NAME]
    index_path = model_dir / INDEX_NAME
    if index_path.is_file():
        shards = sorted(set(json.loads(index_path.read_text())["weight_map"].values()))
        absent = [s for s in shards if not (model_dir / s).is_file()]
        if absent:
            raise FileNotFoundError(f"{model_dir}: {INDEX_NAME} lists shards that are missing: {absent}")
        return [model_dir / s for s in shards]
    has_bin = (model_dir / "pytorch_model.bin").exists()
    hint = " (found pytorch_model.bin: convert it to safetensors)" if has_bin else ""
    raise FileNotFoundError(f"{model_dir}: neither {WEIGHTS_NAME} nor {INDEX_NAME} found{hint}")


def _read_weights(model_dir: Path, dtype: torch.dtype, device: torch.device) -> dict[str, Tensor]:
    tensors: dict[str, Tensor] = {}
    for path in _weight_files(model_dir):
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            for key in f.keys():
                if not key.endswith(_IGNORED_SUFFIXES):
                    tensors[key] = f.get_tensor(key).to(dtype)
    return tensors


def _check_keys(model_dir: Path, expected: dict[str, torch.Size], tensors: dict[str, Tensor]) -> None:
    """Raise naming the directory and the missing, unexpected or mis-shaped weights."""
    problems = []
    missing = sorted(expected.keys() - tensors.keys())
    unexpected = sorted(tensors.keys() - expected.keys())
    mis_shaped = [
        f"{k}: file {tuple(tensors[k].shape)} vs config {tuple(expected[k])}"
        for k in sorted(expected.keys() & tensors.keys())
        if tensors[k].shape != expected[k]
    ]
    if missing:
        problems.append(f"missing weights {_head(missing)}")
    if unexpected:
        problems.append(f"unexpected weights {_head(unexpected)}")
    if mis_shaped:
        problems.append(f"shape mismatches {_head(mis_shaped)}")
    if problems:
        raise ValueError(f"{model_dir}: checkpoint does not match config.json: " + "; ".join(problems))


def _head(items: list[str], n: int = 5) -> str:
    more = f" ... and {len(items) - n} more" if len(items) > n else ""
    return f"{items[:n]}{more}"


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
