"""A model directory with a longer context window: the same weights, RoPE scaling in its config.

    extend_context("path/to/model", "path/to/model-8k", rope_type="yarn", factor=16)

The new directory's config.json sets `max_position_embeddings` to factor x the original and a
`rope_scaling` of the given type (polyrl/models/rope.py computes every type, as transformers
does, so the directory loads the same in both). The other files are copied (not linked: a
training run that saves into the new directory must not write through to the original). With no training this is "scaling alone",
the baseline staged extrapolation has to beat; a run file that trains from the new directory
fine-tunes at the longer length.

Out of scope: rescaling an already scaled config (extend the original instead).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from polyrl.models.config import ModelConfig
from polyrl.models.rope import ROPE_TYPES

LLAMA3_DEFAULTS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
"""Llama 3.1's published values, used when a llama3 extension does not name them."""


def extend_context(model_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], rope_type: str,
                   factor: float) -> Path:
    """Write `out_dir`: `model_dir` with factor x its window by `rope_type` RoPE scaling."""
    src, dst = Path(model_dir), Path(out_dir)
    if rope_type not in ROPE_TYPES or rope_type == "default":
        raise ValueError(f"rope type {rope_type!r} cannot extend a window; choose one of {list(ROPE_TYPES[1:])}")
    if not factor > 1:
        raise ValueError(f"factor must be greater than 1, got {factor}")
    try:
        raw = json.loads((src / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{src}: not a model directory with a readable config.json ({err})") from None
    if dst.exists() and any(dst.iterdir()):
        raise ValueError(f"{dst} exists and is not empty")
    config = scaled_config(raw, rope_type, factor, src)
    ModelConfig.from_hf_dict(config)  # refuse what the model code could not load, before writing
    dst.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        if path.is_file() and path.name != "config.json":
            shutil.copy2(path, dst / path.name)
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return dst


def scaled_config(raw: dict[str, Any], rope_type: str, factor: float, name: object = "the model") -> dict[str, Any]:
    """config.json of `raw` (an unscaled model's) with factor x its window by `rope_type`."""
    if raw.get("rope_scaling") not in (None, {}) and raw["rope_scaling"].get("rope_type", "default") != "default":
        raise ValueError(f"{name} already has rope_scaling {raw['rope_scaling']}; extend the unscaled original")
    original = int(raw.get("max_position_embeddings", 2048))
    scaling: dict[str, Any] = {"rope_type": rope_type, "factor": float(factor)}
    if rope_type in ("yarn", "llama3"):
        scaling["original_max_position_embeddings"] = original
    if rope_type == "llama3":
        scaling.update(LLAMA3_DEFAULTS)
    config = {**raw, "max_position_embeddings": int(original * factor), "rope_scaling": scaling}
    config.pop("rope_parameters", None)  # transformers 5.x prefers a non-null rope_scaling anyway
    return config
