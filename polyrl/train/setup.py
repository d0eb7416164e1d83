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
from polyrl.rl.curriculum import CapabilityCurriculum, CurveSettings
from polyrl.rollout.dispatch import AgentRollout
from polyrl.sandbox.execution_log import ExecutionLog

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
    verifier_of: dict[str, str]          # domain -> default verifier key
    verifiers: dict[str, Verifier]       # verifier key -> live verifier (key: name, or name@domain with options)
    kl_coef: dict[str, float]            # starting KL coefficient per domain
    kl_target: dict[str, float | None]   # per-token KL target (adaptive coefficient), None = fixed
    check_of: dict[str, str]             # domain -> independent check's verifier key (domains that have one)
    sampling: dict[str, SamplingParams]  # rollout sampling per domain (seed set per step)
    eval_sampling: dict[str, SamplingParams]
    agents: AgentRollout                 # the domains that roll out as multi-turn episodes

    def close(self) -> None:
        for v in self.verifiers.values():
            v.close()


def build_domains(cfg: RunConfig, execution_log: ExecutionLog | None = None) -> Domains:
    """Domains, verifiers and sampling of `cfg`; code executions are recorded in `execution_log`."""
    from polyrl.domains.pack import PackDomain, load_pack, verifier_for
    from polyrl.domains.registry import get_domain
    from polyrl.quality.quarantine import QuarantinedDomain, drop_quarantined, read_quarantine

    domains, weights, verifier_of, kl, sampling, eval_sampling = {}, {}, {}, {}, {}, {}
    kl_target, check_of = {}, {}
    names: set[str] = set()
    agents = AgentRollout({}, {})
    options: dict[str, tuple[str, dict]] = {}  # verifier key -> (name, options)
    for t in cfg.rl_tasks:
        if t.pack:
            loaded = load_pack(t.pack)
            if loaded.errors:
                lines = "\n".join(f"  {t.pack}:{e.line}: {e.message}" for e in loaded.errors[:10])
                raise ValueError(f"task pack for domain {t.domain!r} has malformed lines:\n{lines}")
            # Tasks train under the run file's name for the domain. A line that names its
            # verifier keeps it; the others use the run file's reward, else their line
            # domain's default (the domain's default when that is the pack's first line's).
            default = t.reward or (verifier_for(loaded.tasks[0][1]) if loaded.tasks else "answer_verify")
            tasks = [replace(task, domain=t.domain,
                             verifier=task.verifier or (None if t.reward or verifier_for(task) == default
                                                        else verifier_for(task)))
                     for _, task in loaded.tasks]
            if t.quarantine:
                tasks = drop_quarantined(tasks, t.quarantine)
            names |= {task.verifier for task in tasks if task.verifier}
            domain = PackDomain(t.domain, tasks, default)
        else:
            domain = get_domain(t.domain)
            if t.quarantine:
                domain = QuarantinedDomain(domain, read_quarantine(t.quarantine))
        domains[t.domain] = domain
        weights[t.domain] = t.weight
        name = t.reward or domain.default_verifier
        verifier_of[t.domain] = f"{name}@{t.domain}" if t.reward_options else name
        options[verifier_of[t.domain]] = (name, t.reward_options)
        check = t.check or getattr(domain, "default_check", None)
        if check:
            check_of[t.domain] = check
            options.setdefault(check, (check, {}))
        toolbox = getattr(domain, "toolbox", None)  # a domain with tools rolls out as episodes
        if toolbox is not None:
            agents.toolbox_for[t.domain], agents.max_steps[t.domain] = toolbox, t.max_steps
        kl[t.domain] = cfg.trainer.kl_coef if t.kl_coef is None else t.kl_coef
        kl_target[t.domain] = t.kl_target
        max_tokens = t.max_tokens or cfg.engine.max_tokens
        sampling[t.domain] = SamplingParams(temperature=cfg.engine.temperature, top_p=cfg.engine.top_p,
                                            top_k=cfg.engine.top_k, max_tokens=max_tokens)
        eval_sampling[t.domain] = replace(sampling[t.domain], max_tokens=cfg.eval.max_tokens or max_tokens)
    options.update((n, (n, {})) for n in names if n not in options)
    verifiers = {key: _verifier(name, opts, execution_log) for key, (name, opts) in sorted(options.items())}
    return Domains(domains, weights, verifier_of, verifiers, kl, kl_target, check_of, sampling, eval_sampling, agents)


def build_curriculum(cfg: RunConfig, weights: dict[str, float]) -> CapabilityCurriculum | None:
    """The capability-curve curriculum over the run's domains; None for `curriculum: static`."""
    if cfg.curriculum == "static":
        return None
    return CapabilityCurriculum(weights, CurveSettings(**cfg.capability_curve.model_dump()))


def _verifier(name: str, options: dict, execution_log: ExecutionLog | None) -> Verifier:
    try:
        return get_verifier(name, **options, **_run_options(name, execution_log))
    except TypeError as err:  # an option the verifier does not take
        raise ValueError(f"reward_options for {name!r}: {err}") from None


def _run_options(verifier: str, execution_log: ExecutionLog | None) -> dict:
    """What a training run gives a verifier beyond its defaults."""
    if verifier == "unit_test_pass" and execution_log is not None:
        return {"log": execution_log}
    return {}
