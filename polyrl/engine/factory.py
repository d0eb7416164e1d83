"""Which engine a run uses: the run file's `engine.backend` -> an Engine.

- "native": the paged engine (paged.py) on a copy of the policy; the trainer's default.
  With native.workers > 1, that many paged engines in worker processes sharing the
  weights (parallel.py). With native.paged false, the dense reference engine (dense.py):
  equivalence tests and before/after measurements.
- "vllm": vLLM loaded from the model directory (vllm_backend.py), optional extra.

The settings object is duck-typed (polyrl/config.py's EngineConfig in a run), so the
engine package does not depend on the run-file schema.

Out of scope: remote engines (a server or Ray actors behind the same interface).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polyrl.engine.config import PagedConfig
from polyrl.models.tokenizer import Tokenizer
from polyrl.models.transformer import Transformer

BACKENDS = ("native", "vllm")


def build_engine(settings: Any, model: Transformer, tokenizer: Tokenizer, model_dir: str | Path,
                 weight_version: int = 0) -> Any:
    """settings: .backend, and for "native" optionally .native (PagedConfig fields plus
    `paged`, as a model or a dict); for "vllm" optionally .vllm (keyword arguments of
    vllm.LLM). `model` is
    owned by the engine from here on (pass a copy of the policy)."""
    backend = getattr(settings, "backend", "native")
    if backend == "native":
        native = getattr(settings, "native", None)
        native = native.model_dump() if hasattr(native, "model_dump") else dict(native or {})
        workers = native.pop("workers", 1)
        if native.pop("paged", True):
            return _paged(model, tokenizer, PagedConfig(**native), weight_version, workers)
        from polyrl.engine.dense import DenseEngine

        return DenseEngine(model, tokenizer, weight_version)
    if backend == "vllm":
        from polyrl.engine.vllm_backend import VLLMEngine

        options = dict(getattr(settings, "vllm", None) or {})
        options.setdefault("dtype", str(next(model.parameters()).dtype).removeprefix("torch."))
        return VLLMEngine(model_dir, tokenizer, weight_version=weight_version, **options)
    raise ValueError(f"engine.backend: got {backend!r}; must be one of {', '.join(BACKENDS)}")


def _paged(model: Transformer, tokenizer: Tokenizer, config: PagedConfig, weight_version: int, workers: int) -> Any:
    if workers > 1:
        from polyrl.engine.parallel import DataParallelEngine

        return DataParallelEngine(model, tokenizer, config, workers, weight_version)
    from polyrl.engine.paged import PagedEngine

    return PagedEngine(model, tokenizer, config, weight_version)
