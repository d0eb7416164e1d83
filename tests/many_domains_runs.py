"""Run files of the many-domains tests and bench: a 4-domain run any polyrl version reads
(the golden metrics of tests/test_many_domains.py come from it), and runs of generated
domains (math levels x level weights) of 4, 20 or 100 domains with one batch size."""

from __future__ import annotations

import json
from pathlib import Path

LEVEL_PAIRS = [[1, 2], [2, 3], [3, 4], [1, 3], [2, 4]]
MIXES = [[1, k] for k in range(1, 11)] + [[k, 1] for k in range(2, 12)]  # 20 level weightings


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
    """A run of `domains` (4, 20 or 100) generated math domains, `prompts` prompts a step."""
    levels, mixes = {4: ([[1, 2], [2, 3]], MIXES[:2]), 20: (LEVEL_PAIRS, MIXES[:4]), 100: (LEVEL_PAIRS, MIXES)}[domains]
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
      levels: {json.dumps(levels)}
      weights: {json.dumps(mixes)}
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
