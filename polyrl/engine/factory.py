"""Which engine a run uses: the run file's `engine.backend` -> an Engine.

- "native": the paged engine (paged.py) on a copy of the policy; the trainer's default.
  With native.workers > 1, that many paged engines in worker processes sharing the
  weights (parallel.py). With native.paged false, the dense reference engine (dense.py):
  equivalence tests and before/after comparisons.
- "vllm": vLLM loaded from the model directory (vllm_backend.py), optional extra.

The settings are polyrl/config.py's EngineConfig in a run, or anything with the same
attributes (`EngineSettings`), so the engine package does not depend on the run-file
schema; `native` is this package's own NativeEngineConfig either way.

Out of scope: remote engines (a server or Ray actors behind the same interface).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from polyrl.engine.config import NativeEngineConfig
from polyrl.models.tokenizer import Tokenizer
from polyrl.models.transformer import Transformer

BACKENDS = ("native", "vllm")


class EngineSettings(Protocol):
    backend: str
    """"native" or "vllm"."""
    native: NativeEngineConfig
    """The native engine's settings (absent: the defaults)."""
    vllm: dict[str, Any]
    """Keyword arguments of vllm.LLM (absent: none)."""


def build_engine(settings: EngineSettings, model: Transformer, tokenizer: Tokenizer, model_dir: str | Path,
                 weight_version: int = 0) -> Any:
    """The engine `settings` name. `model` is owned by the engine from here on (pass a copy
    of the policy); `model_dir` is where vLLM loads it from."""
    backend = getattr(settings, "backend", "native")
    if backend == "native":
        native = getattr(settings, "native", None) or NativeEngineConfig()
        if not native.paged:
            from polyrl.engine.dense import DenseEngine

            return DenseEngine(model, tokenizer, weight_version)
        if native.workers > 1:
            from polyrl.engine.parallel import DataParallelEngine

            return DataParallelEngine(model, tokenizer, native, weight_version)
        from polyrl.engine.paged import PagedEngine

        return PagedEngine(model, tokenizer, native, weight_version)
    if backend == "vllm":
        from polyrl.engine.vllm_backend import VLLMEngine

        options = dict(getattr(settings, "vllm", None) or {})
        options.setdefault("dtype", str(next(model.parameters()).dtype).removeprefix("torch."))
        return VLLMEngine(model_dir, tokenizer, weight_version=weight_version, **options)
    raise ValueError(f"engine.backend: got {backend!r}; must be one of {', '.join(BACKENDS)}")
