"""One model at two speeds: which engine serves a tier, and which tier a request asked for.

- "standard": the paged engine as training uses it (float weights, continuous batching,
  prefix cache, fused decode kernels).
- "fast": the same weights through the fast paths, each switchable: int8 linear layers
  (`NativeEngineConfig.quantization`), with decode bursts of FAST_BURST times the passes
  where it does not speculate, and speculative decoding (`NativeEngineConfig.speculative`:
  n-gram prompt lookup or a draft model the user names). Greedy output of speculative
  decoding equals the standard tier's; int8 changes outputs slightly (its parity is measured
  in bench/tiers.py and bench/int8.py).

Speculation pays only where one decode step is slow enough that verifying k + 1 positions
in one pass beats k + 1 plain steps: measured in bench/tiers.py, n-gram lookup made an 88M
model 1.9-2.5x faster at batch 1 and the 0.85M built-in model 4-20x slower (its plain steps
run in the fused C decode in about 0.1 ms; a verify pass is a PyTorch forward). So
`speculation_for` turns it on by default only for models of SPECULATE_FROM_PARAMS or more.

A request's `service_tier` of "fast" or "priority" selects the fast tier (the standard one
when the server runs without it); anything else the standard tier. The response reports
the tier that served it in OpenAI's vocabulary, "priority" for fast and "default" for
standard (typed clients reject other names), and by name in `system_fingerprint`
("polyrl-fast-v3": tier and weight version) and the `x-polyrl-tier` header.

Each tier owns a copy of the model (a tier's engine packs and quantizes its own weights),
so serving both costs twice the weight memory.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

from polyrl.engine.config import NativeEngineConfig
from polyrl.engine.paged import PagedEngine
from polyrl.models.loading import load_policy, resolve_model_dir
from polyrl.models.tokenizer import Tokenizer
from polyrl.models.transformer import Transformer

TIERS = ("standard", "fast")
FAST_REQUESTS = ("fast", "priority")
SPECULATE_FROM_PARAMS = 20_000_000
FAST_BURST = 2
"""With int8 layers and no speculation, the fast tier's decode bursts
(NativeEngineConfig.decode_burst) are this many times the standard tier's passes: its passes
are 2.5x to 4x shorter (bench/tiers.py), so a burst of twice the passes still ends sooner in
wall time than a standard burst, and a request that arrives meanwhile (or a stream's next
chunk) waits no longer than on the standard tier; the scheduling cost of a burst is paid
half as often per token."""


def tier_for(service_tier: str | None, available: tuple[str, ...]) -> str:
    wanted = "fast" if service_tier in FAST_REQUESTS else "standard"
    return wanted if wanted in available else available[0]


def reported_tier(tier: str) -> str:
    return "priority" if tier == "fast" else "default"


def parse_tiers(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    unknown = [t for t in names if t not in TIERS]
    if not names or unknown:
        raise ValueError(f"--tiers: got {text!r}; name one or both of {', '.join(TIERS)}, comma-separated")
    return names


def tier_config(tier: str, base: NativeEngineConfig, int8: bool = True, speculative: dict[str, Any] | None = None
                ) -> NativeEngineConfig:
    """The engine settings of `tier`: the standard tier's are `base`; the fast tier adds int8
    (unless int8 is False) and speculative decoding (n-gram unless `speculative` says
    otherwise; {"method": "none"} turns it off). With int8 and no speculation its decode
    bursts are FAST_BURST times the standard tier's; a speculating tier keeps the standard
    burst, because a burst's passes draft nothing: on the 88M model of bench/tiers.py the
    longer burst took n-gram lookup from 4.55x to 3.14x on prompts it could copy from."""
    if tier == "standard":
        return base
    update: dict[str, Any] = {}
    spec = {"method": "ngram", **(speculative or {})}
    update["speculative"] = spec
    if int8:
        update["quantization"] = "int8"
        if spec["method"] == "none":
            update["decode_burst"] = min(base.decode_burst * FAST_BURST, 4096)
    return NativeEngineConfig.model_validate({**base.model_dump(), **update})


def speculation_for(model: Transformer, method: str) -> str:
    """The speculative method the fast tier uses when the user asked for `method`
    ("auto": n-gram for models of SPECULATE_FROM_PARAMS parameters or more, else none)."""
    if method != "auto":
        return method
    params = sum(p.numel() for p in model.parameters())
    return "ngram" if params >= SPECULATE_FROM_PARAMS else "none"


def build_tier_engines(model: Transformer, tokenizer: Tokenizer, tiers: tuple[str, ...], base: NativeEngineConfig,
                       **fast_options: Any) -> dict[str, PagedEngine]:
    return {tier: PagedEngine(copy.deepcopy(model), tokenizer, tier_config(tier, base, **fast_options))
            for tier in tiers}


def load_served_model(name: str, dtype: str = "float32", log: Callable[[str], None] = print
                      ) -> tuple[Transformer, Tokenizer, Path]:
    """MODEL as `polyrl serve` takes it: builtin:NAME, a Hugging Face directory, or a run
    directory (its checkpoints/final, else its latest checkpoints/step-N)."""
    path = Path(name).expanduser()
    if not name.startswith("builtin:") and (path / "checkpoints").is_dir():
        path = run_checkpoint(path)
        name = str(path)
    model_dir = resolve_model_dir(name, log=log)
    model, tokenizer = load_policy(model_dir, dtype)
    return model, tokenizer, model_dir


def run_checkpoint(run_dir: Path) -> Path:
    final = run_dir / "checkpoints" / "final"
    if (final / "config.json").exists():
        return final
    steps = sorted(p for p in (run_dir / "checkpoints").glob("step-*") if (p / "config.json").exists())
    if not steps:
        raise FileNotFoundError(f"{run_dir}: a run directory without checkpoints yet (checkpoints/ is empty)")
    return steps[-1]
