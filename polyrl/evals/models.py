"""Model names on the `polyrl eval` command line -> adapters that make chat models.

    builtin:tiny                       the built-in tiny policy (built on first use, cached)
    PATH                               a Hugging Face directory (config.json, *.safetensors, tokenizer)
    RUN_DIR                            a polyrl run: its checkpoints/final, else its latest step-N
    openai:BASE_URL#MODEL              any OpenAI-compatible endpoint (vLLM, `polyrl serve`, OpenAI);
                                       #MODEL defaults to "default"; the key is $OPENAI_API_KEY

An adapter is loaded once (weights, engine, client) and makes a fresh `ChatModel` (the
agent loop's contract, polyrl/agent/model.py) for every episode, with the context window
the run's limits ask for. Local models run on the native paged engine through
`EngineChatModel`, exactly as training's rollouts do; endpoints through `OpenAIChatModel`.

A model that cannot be loaded (no such directory, no checkpoint in a run, an unknown
built-in, an endpoint that refuses connections or the key) is a `ModelError`: the command
exits 2 before any task runs.

Out of scope: several engines sharing one GPU, vLLM as the local backend (serve it and
use `openai:`), and endpoints that are not OpenAI-compatible.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from polyrl.agent.model import ChatModel

OPENAI = "openai:"


class ModelError(ValueError):
    """A --model that cannot be loaded; the command exits 2 with this message."""

    exit_code = 2


class ModelAdapter(Protocol):
    spec: str
    """The model as given on the command line (the key of the price card, the name in reports)."""
    kind: str
    """"builtin", "hf", "checkpoint" or "openai"."""
    context_window: int | None
    """The model's own window (prompt + completion tokens); None = unknown (endpoints)."""

    def chat_model(self, context_window: int | None) -> ChatModel:
        """A fresh chat model for one task, applying `context_window` (None = no limit)."""
        ...

    def close(self) -> None:
        ...


@dataclass
class EngineAdapter:
    """A local model on the native engine: one engine, a fresh EngineChatModel per task."""

    spec: str
    kind: str
    model_dir: Path
    temperature: float = 0.0
    seed: int = 0
    context_window: int | None = None
    _engine: Any = field(default=None, repr=False)
    _tokenizer: Any = field(default=None, repr=False)

    def load(self) -> "EngineAdapter":
        from polyrl.config import EngineConfig
        from polyrl.engine.factory import build_engine
        from polyrl.models.loading import load_policy

        try:
            model, tokenizer = load_policy(self.model_dir, "float32")
        except Exception as err:  # noqa: BLE001 -- a broken directory is the user's to fix; say what broke
            raise ModelError(f"--model {self.spec}: cannot load {self.model_dir}: {type(err).__name__}: "
                             f"{str(err).splitlines()[0] if str(err) else ''}") from None
        self._engine = build_engine(EngineConfig(), model, tokenizer, self.model_dir)
        self._tokenizer = tokenizer
        self.context_window = model.cfg.max_position_embeddings
        return self

    def chat_model(self, context_window: int | None) -> ChatModel:
        from polyrl.agent.engine_model import EngineChatModel
        from polyrl.engine.base import SamplingParams

        sampling = SamplingParams(temperature=self.temperature, seed=self.seed)
        return EngineChatModel(self._engine, self._tokenizer, sampling, self.spec, context_window)

    def close(self) -> None:
        self._engine = None


@dataclass
class OpenAIAdapter:
    """An OpenAI-compatible endpoint: one client, a fresh OpenAIChatModel per task."""

    spec: str
    base_url: str
    model: str
    temperature: float = 0.0
    timeout_s: float = 60.0
    kind: str = "openai"
    context_window: int | None = None
    _client: Any = field(default=None, repr=False)

    def load(self) -> "OpenAIAdapter":
        try:
            import openai
        except ImportError:
            raise ModelError(f"--model {self.spec}: OpenAI-compatible endpoints need the `openai` package: "
                             f"pip install 'polyrl[openai]'") from None
        key = os.environ.get("OPENAI_API_KEY") or "EMPTY"  # local servers accept any key
        self._client = openai.OpenAI(base_url=self.base_url, api_key=key, timeout=self.timeout_s, max_retries=0)
        try:
            self._client.models.list()
        except (openai.APIConnectionError, openai.APITimeoutError) as err:
            raise ModelError(f"--model {self.spec}: cannot reach {self.base_url}: {type(err).__name__}") from None
        except (openai.AuthenticationError, openai.PermissionDeniedError) as err:
            raise ModelError(f"--model {self.spec}: {self.base_url} refused the key in $OPENAI_API_KEY "
                             f"({err.status_code})") from None
        except openai.APIError:
            pass  # reachable; some servers have no /models route
        return self

    def chat_model(self, context_window: int | None) -> ChatModel:
        from polyrl.agent.openai_model import OpenAIChatModel

        return OpenAIChatModel(self.model, temperature=self.temperature, context_window=context_window,
                               client=self._client)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def load_model(spec: str, temperature: float = 0.0, seed: int = 0) -> ModelAdapter:
    """The adapter of one --model, loaded; ModelError when it cannot be."""
    if spec.startswith(OPENAI):
        base_url, _, model = spec.removeprefix(OPENAI).partition("#")
        if not re.match(r"https?://\S+\Z", base_url):
            raise ModelError(f"--model {spec}: expected openai:BASE_URL#MODEL with an http(s) URL, "
                             f"e.g. openai:http://localhost:8000/v1#Qwen/Qwen2.5-7B-Instruct")
        return OpenAIAdapter(spec, base_url, model or "default", temperature).load()
    kind, model_dir = _local_dir(spec)
    return EngineAdapter(spec, kind, model_dir, temperature, seed).load()


def _local_dir(spec: str) -> tuple[str, Path]:
    from polyrl.models.loading import BUILTIN, resolve_model_dir

    if spec.startswith(BUILTIN):
        try:
            return "builtin", resolve_model_dir(spec, log=lambda message: None)
        except (FileNotFoundError, ValueError) as err:
            raise ModelError(f"--model {spec}: {err}") from None
    path = Path(spec).expanduser()
    if (path / "config.json").is_file():
        return ("checkpoint" if path.parent.name == "checkpoints" else "hf"), path
    checkpoints = path / "checkpoints"
    if checkpoints.is_dir():
        final = checkpoints / "final"
        if (final / "config.json").is_file():
            return "checkpoint", final
        steps = sorted((int(m.group(1)), p) for p in checkpoints.iterdir()
                       if (m := re.fullmatch(r"step-(\d+)", p.name)) and (p / "config.json").is_file())
        if steps:
            return "checkpoint", steps[-1][1]
        raise ModelError(f"--model {spec}: the run has no checkpoint yet ({checkpoints} holds no final/ "
                         f"or step-N/ with a config.json)")
    if not path.exists():
        raise ModelError(f"--model {spec}: no such directory; give builtin:tiny, a Hugging Face directory, "
                         f"a run directory or openai:BASE_URL#MODEL")
    raise ModelError(f"--model {spec}: not a model (no config.json) nor a run directory (no checkpoints/)")
