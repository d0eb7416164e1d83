"""Run files of the many-domains tests and bench: a 4-domain run any polyrl version reads
(the golden metrics of tests/test_many_domains.py come from it), and runs of generated
math domains (one per level weighting) of any number with one batch size."""

from __future__ import annotations

import json
from pathlib import Path


def mixes(domains: int) -> list[list[int]]:
    """`domains` level weightings that all give the same task mix (k, k, k, k): the generated
    domains differ in name and state only, so runs of 4, 20 and 100 train on one distribution."""
    return [[k] * 4 for k in range(1, domains + 1)]


def four_domain_run(model_dir: Path, pack: Path, steps: int = 3) -> str:
    """math, code, alignment and a pack, each its own domain, graded by length_parity (tests.helpers)."""
    pack.write_text("".join(json.dumps({"id": f"p{i}", "domain": "math", "prompt": f"What is {i} + {i}?",
                                        "answer": str(2 * i), "split": "heldout" if i % 3 == 0 else "train"}) + "\n"
                            for i in range(12)))
    tasks = "".join(f"""
  - domain: {d}
    reward: length_parity
    weight: {w}{extra}""" for d, w, extra in [("math", 1.0, ""), ("code", 0.5, ""), ("alignment", 0.5, ""),
                                                ("mypack", 1.0, f"\n    pack: {pack}")])
    return f"""
seed: 5
rl_tasks:{tasks}
model:
  path: {model_dir}
engine:
  max_tokens: 8
trainer:
  steps: {steps}
  prompts_per_step: 8
  group_size: 2
  lr: 1.0e-3
  kl_coef: 0.01
  overlong: none
  checkpoint_every: 100
eval:
  every: 2
  heldout_per_domain: 2
  samples: 2
"""


def generated_run(model_dir: Path, domains: int, steps: int = 2, per_eval: int | None = None,
                  prompts: int = 8, every: int = 1, heldout: int = 2, max_tokens: int = 8,
                  reward: str = "length_parity") -> str:
    """A run of `domains` generated math domains (levels 1-4, equal weights), `prompts` prompts a step."""
    return f"""
seed: 7
curriculum: capability_curve
capability_curve:
  floor: {min(0.05, 0.5 / domains)}
rl_tasks:
  - domain: math
    reward: {reward}
    weight: 1.0
    kl_coef: 0.01
    kl_target: 0.05
    expand:
      levels: [[1, 2, 3, 4]]
      weights: {json.dumps(mixes(domains))}
model:
  path: {model_dir}
engine:
  max_tokens: {max_tokens}
trainer:
  steps: {steps}
  prompts_per_step: {prompts}
  group_size: 2
  lr: 1.0e-3
  overlong: none
  checkpoint_every: 1000
eval:
  every: {every}
  heldout_per_domain: {heldout}
  samples: 1
  greedy: false
  domains_per_eval: {per_eval if per_eval is not None else 'null'}
"""
