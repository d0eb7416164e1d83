"""Shared test fixtures: a tiny random model and a tokenizer built in a temp dir."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from polyrl.models.config import ModelConfig
from polyrl.models.tokenizer import Tokenizer, save_tokenizer, train_tiny_tokenizer
from polyrl.models.transformer import Transformer

CORPUS = ["What is 47 + 38?", "47 + 38 = 85.\n\\boxed{85}", "Solve for x: 3x + 4 = 19.", "user", "assistant"] * 20


def tiny_tokenizer(tmp: Path) -> Tokenizer:
    save_tokenizer(train_tiny_tokenizer(CORPUS, vocab_size=300), tmp)
    return Tokenizer.from_dir(tmp)


def tiny_model(vocab_size: int, seed: int = 0, layers: int = 2) -> Transformer:
    cfg = ModelConfig(model_type="qwen2", vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      tie_word_embeddings=True)
    return Transformer(cfg, seed=seed).eval()


class ParityVerifier:
    """Test reward: 1 when the completion has an even number of characters. A random model
    scores it about half the time, so groups have variance and training steps happen."""

    name = "length_parity"

    def __init__(self, **_):
        pass

    def score(self, tasks, completions):
        from polyrl.types import Score

        return [Score(float(len(c) % 2 == 0), {"status": "even" if len(c) % 2 == 0 else "odd"}) for c in completions]

    def close(self):
        pass


class SolvedLevelOneVerifier(ParityVerifier):
    """Test reward: every level-1 task is solved (reward 1, no signal in its groups); other
    levels score length parity, as ParityVerifier does."""

    name = "solved_level_one"

    def score(self, tasks, completions):
        from polyrl.types import Score

        parity = super().score(tasks, completions)
        return [Score(1.0, {"status": "solved"}) if t.difficulty == 1 else p for t, p in zip(tasks, parity)]


def random_model_dir(tmp: Path, seed: int = 0) -> Path:
    """A random tiny Qwen2 model with the test tokenizer, saved as a Hugging Face directory."""
    from polyrl.models.hf_io import save_pretrained

    tok = tiny_tokenizer(tmp)
    model = tiny_model(tok.vocab_size, seed=seed)
    save_pretrained(model, model.cfg, tmp)
    return tmp


SMALL_RECIPE = dict(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=192, steps=150,
                    batch_size=32, warmup=10)
"""A trained model of the built-in family small enough to build in about 10 s: what tests that
need a model with real preferences (not a random one) use instead of the full builtin:tiny,
whose build takes minutes on a machine with an empty cache."""


_small_model: Path | None = None


def small_trained_model_dir(cache: Path) -> Path:
    """The small recipe's model, built into `cache` (a test's own cache directory) by the first
    caller of this test process; later callers get that same directory (read it, do not write)."""
    global _small_model
    if _small_model is not None and (_small_model / "config.json").is_file():
        return _small_model
    _small_model = _build_small_model(cache)
    return _small_model


class _Built:
    """An entry point stand-in whose model is already built."""

    def __init__(self, model_dir: Path):
        self.model_dir = model_dir

    def load(self):
        return lambda log=print, **_: self.model_dir


@contextmanager
def builtin_tiny_as_small(cache: Path) -> Iterator[Path]:
    """Within it, builtin:tiny names the small recipe's model (built into `cache`): for tests of
    what a command does with a built-in name (or its tokenizer), where the full model would take
    minutes to build on a machine with an empty cache."""
    import pytest

    from polyrl.models import loading

    model_dir = small_trained_model_dir(cache)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loading, "builtin_models", lambda real=loading.builtin_models(): {**real, "tiny": _Built(model_dir)})
        yield model_dir


def _build_small_model(cache: Path) -> Path:
    import os

    from polyrl.builtin.tiny import TinyRecipe, ensure_tiny_model

    old = os.environ.get("POLYRL_CACHE")
    os.environ["POLYRL_CACHE"] = str(cache)
    try:
        return ensure_tiny_model(TinyRecipe(**SMALL_RECIPE), log=lambda *_: None)
    finally:
        if old is None:
            os.environ.pop("POLYRL_CACHE")
        else:
            os.environ["POLYRL_CACHE"] = old


def float_mismatches(got, want, path: str = "", rel: float = 1e-5, abs_: float = 1e-7) -> list[str]:
    """Where two JSON-like trees differ: keys, lengths, strings, integers and booleans exactly,
    floats beyond `rel`/`abs_` (a recorded run replayed on another CPU rounds its float32
    kernels differently, by about 1e-7). Empty when they agree."""
    if isinstance(want, dict) and isinstance(got, dict):
        if got.keys() != want.keys():
            return [f"{path}: keys {sorted(got.keys() ^ want.keys())}"]
        return [m for k in want for m in float_mismatches(got[k], want[k], f"{path}/{k}", rel, abs_)]
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{path}: {len(got)} items, {len(want)} recorded"]
        return [m for i, (g, w) in enumerate(zip(got, want)) for m in float_mismatches(g, w, f"{path}[{i}]", rel, abs_)]
    if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        close = abs(got - want) <= max(abs_, rel * max(abs(got), abs(want)))
        return [] if close else [f"{path}: {got!r}, {want!r} recorded"]
    return [] if got == want else [f"{path}: {got!r}, {want!r} recorded"]
