"""Turn a validated RunConfig into live parts: model, tokenizer, domains, verifiers, sampling.

Everything here is construction; the loop in loop.py only uses what this returns.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from polyrl.config import RunConfig
from polyrl.domains.base import Domain
from polyrl.engine.base import SamplingParams
from polyrl.models.hf_io import load_pretrained
from polyrl.models.tokenizer import Tokenizer
from polyrl.models.transformer import Transformer
from polyrl.rewards.base import Verifier
from polyrl.rewards.registry import get_verifier

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def step_seed(seed: int, step: int, salt: str = "") -> int:
    """A stable 63-bit seed for (run seed, step, purpose); Python's hash() is salted per process."""
    digest = hashlib.sha256(f"{seed}:{step}:{salt}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def resolve_model_dir(path: str, log=print) -> Path:
    if path == "builtin:tiny":
        from polyrl.models.tiny import ensure_tiny_model

        return ensure_tiny_model(log=log)
    model_dir = Path(path).expanduser()
    if not (model_dir / "config.json").exists():
        raise FileNotFoundError(f"model.path {path!r}: not a Hugging Face model directory (no config.json); "
                                f"use builtin:tiny or a local directory saved with save_pretrained")
    return model_dir


def load_policy(model_dir: Path, dtype: str) -> tuple[Transformer, Tokenizer]:
    model, _ = load_pretrained(model_dir, dtype=DTYPES[dtype])
    return model, Tokenizer.from_dir(model_dir)


@dataclass
class Domains:
    """The run's domains, their verifiers and per-domain settings, keyed by domain name."""

    domains: dict[str, Domain]
    weights: dict[str, float]
    verifier_of: dict[str, str]          # domain -> default verifier name
    verifiers: dict[str, Verifier]       # verifier name -> live verifier
    kl_coef: dict[str, float]
    sampling: dict[str, SamplingParams]  # rollout sampling per domain (seed set per step)
    eval_sampling: dict[str, SamplingParams]

    def close(self) -> None:
        for v in self.verifiers.values():
            v.close()


def build_domains(cfg: RunConfig) -> Domains:
    from polyrl.domains.pack import DEFAULT_VERIFIERS, PackDomain, load_pack
    from polyrl.domains.registry import get_domain

    domains, weights, verifier_of, kl, sampling, eval_sampling = {}, {}, {}, {}, {}, {}
    for t in cfg.rl_tasks:
        if t.pack:
            loaded = load_pack(t.pack)
            if loaded.errors:
                lines = "\n".join(f"  {t.pack}:{e.line}: {e.message}" for e in loaded.errors[:10])
                raise ValueError(f"task pack for domain {t.domain!r} has malformed lines:\n{lines}")
            # Lines of other domains name their verifier (load_pack checks), so any default works.
            default = t.reward or DEFAULT_VERIFIERS.get(t.domain, "answer_verify")
            domain = PackDomain(t.domain, [task for _, task in loaded.tasks], default)
        else:
            domain = get_domain(t.domain)
        domains[t.domain] = domain
        weights[t.domain] = t.weight
        verifier_of[t.domain] = t.reward or domain.default_verifier
        kl[t.domain] = cfg.trainer.kl_coef if t.kl_coef is None else t.kl_coef
        max_tokens = t.max_tokens or cfg.engine.max_tokens
        sampling[t.domain] = SamplingParams(temperature=cfg.engine.temperature, top_p=cfg.engine.top_p,
                                            top_k=cfg.engine.top_k, max_tokens=max_tokens)
        eval_sampling[t.domain] = replace(sampling[t.domain], max_tokens=cfg.eval.max_tokens or max_tokens)
    names = set(verifier_of.values())
    return Domains(domains, weights, verifier_of, {n: get_verifier(n) for n in sorted(names)}, kl,
                   sampling, eval_sampling)

