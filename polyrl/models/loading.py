"""Model names -> Hugging Face directories -> a policy and its tokenizer.

A model is named by a directory (config.json, *.safetensors, tokenizer.json) or as
`builtin:NAME`, a model polyrl builds itself on first use and caches. Built-in models are
an extension point: a package names a builder under the entry-point group
`polyrl.builtin_models` (`NAME = "module:function"`, the function taking `log` and keyword
options and returning the directory, or a list of directories for an ensemble). polyrl's
own are `builtin:tiny` (the tiny policy) and `builtin:tiny-rm` (its reward models); see
pyproject.toml and polyrl/builtin/.

Out of scope: downloading from a model hub (give a local directory), device placement
(the trainer moves the model).
"""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Callable

import torch

from polyrl.models.hf_io import load_pretrained
from polyrl.models.tokenizer import Tokenizer
from polyrl.models.transformer import Transformer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BUILTIN = "builtin:"
GROUP = "polyrl.builtin_models"


def builtin_models() -> dict[str, Any]:
    """Built-in model name -> its entry point (not loaded yet)."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def builtin_model_dirs(name: str, log: Callable[[str], None] = print, **options: Any) -> list[Path]:
    """The directories of `builtin:name` (one, or an ensemble's members), built if needed."""
    found = builtin_models()
    if name not in found:
        known = ", ".join(BUILTIN + n for n in sorted(found)) or "none (is polyrl installed? pip install -e .)"
        raise FileNotFoundError(f"unknown built-in model {BUILTIN + name!r}; available: {known}")
    out = found[name].load()(log=log, **options)
    return [Path(p) for p in out] if isinstance(out, (list, tuple)) else [Path(out)]


def resolve_model_dir(path: str, log: Callable[[str], None] = print) -> Path:
    """The Hugging Face directory of a model name: `builtin:NAME` (built on first use) or a path."""
    if path.startswith(BUILTIN):
        dirs = builtin_model_dirs(path.removeprefix(BUILTIN), log=log)
        if len(dirs) != 1:
            raise ValueError(f"{path!r} is an ensemble of {len(dirs)} models, not one policy")
        return dirs[0]
    model_dir = Path(path).expanduser()
    if not (model_dir / "config.json").exists():
        raise FileNotFoundError(f"model.path {path!r}: not a Hugging Face model directory (no config.json); "
                                f"use builtin:tiny or a local directory saved with save_pretrained")
    return model_dir


def load_policy(model_dir: Path, dtype: str) -> tuple[Transformer, Tokenizer]:
    """The causal LM and tokenizer of a Hugging Face directory, weights in `dtype`."""
    model, _ = load_pretrained(model_dir, dtype=DTYPES[dtype])
    return model, Tokenizer.from_dir(model_dir)
