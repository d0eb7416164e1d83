"""The loop with the stability controls: alignment domain judged by reward models, the
capability-curve curriculum, per-domain adaptive KL, the held-out check, resume, and the
rollout-token budget."""

import json

import pytest

from polyrl.config import load_config_text
from polyrl.rewards import registry
from polyrl.train.loop import train
from tests.helpers import random_model_dir
from tests.test_alignment import MICRO_RM, rm_cache  # noqa: F401  (the module-scoped fixture)


@pytest.fixture
def setup(tmp_path, rm_cache, monkeypatch):  # noqa: F811
    monkeypatch.setenv("POLYRL_CACHE", str(rm_cache))
    monkeypatch.setitem(registry._VERIFIERS, "length_parity", "tests.helpers:ParityVerifier")
    return random_model_dir(tmp_path / "model")


def config(model_dir, steps=4, curriculum="capability_curve", extra=""):
    return load_config_text(f"""
seed: 5
curriculum: {curriculum}
capability_curve: {{window: 2, floor: 0.1}}
rl_tasks:
  - domain: math
    reward: length_parity
    weight: 0.6
  - domain: alignment
    weight: 0.4
    reward_options: {{members: 2, recipe: {json.dumps(MICRO_RM)}}}
    kl_coef: 0.01
    kl_target: 0.001
model:
  path: {model_dir}
engine:
  max_tokens: 10
trainer:
  steps: {steps}
  prompts_per_step: 4
  group_size: 4
  lr: 1.0e-3
  kl_horizon: 16
  overlong: none
  checkpoint_every: 100
{extra}
eval:
  every: 2
  heldout_per_domain: 4
  samples: 2
  greedy: false
""")


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_curriculum_and_adaptive_kl_are_applied_and_logged(tmp_path, setup):
    train(config(setup), tmp_path / "run", log=lambda *_: None)
    metrics = lines(tmp_path / "run" / "metrics.jsonl")
    before = json.loads((tmp_path / "run" / "eval" / "before.json").read_text())
    assert 0 <= before["alignment"]["check_accuracy"] <= 1 and "check_accuracy" not in before["math"]
    for m in metrics:
        assert sum(m["weights"].values()) == pytest.approx(1, abs=1e-3)
        assert set(m["weight_reasons"]) == {"math", "alignment"} and m["kl_coef"]["math"] == 0.0
        assert m["kl_coef_reasons"]["math"] == "fixed coefficient"
    updates = [m for m in metrics if "curriculum_update" in m]
    assert [m["step"] for m in updates] == [1]  # eval.every = 2, the last step is the final evaluation
    assert updates[0]["eval"]["alignment"]["check_accuracy"] is not None
    assert metrics[2]["weights"] == updates[0]["curriculum_update"]["weights"]  # the new shares hold next
    # the alignment coefficient moved (KL of a trained random model is far above 0.001) and is logged
    assert metrics[-1]["kl_coef"]["alignment"] > 0.01
    assert "vs target 0.0010" in metrics[-1]["kl_coef_reasons"]["alignment"]


def test_static_weights_are_logged_as_static(tmp_path, setup):
    train(config(setup, steps=2, curriculum="static"), tmp_path / "run", log=lambda *_: None)
    metrics = lines(tmp_path / "run" / "metrics.jsonl")
    assert metrics[0]["weights"] == {"alignment": 0.4, "math": 0.6}
    assert not any("curriculum_update" in m for m in metrics)
    assert metrics[0]["weight_reasons"]["math"].startswith("static")


def test_resume_restores_the_curriculum_and_kl_controllers(tmp_path, setup):
    cfg = config(setup, steps=5)
    train(cfg, tmp_path / "straight", log=lambda *_: None)
    train(cfg, tmp_path / "resumed", log=lambda *_: None, stop_after=3)
    train(cfg, tmp_path / "resumed", resume=True, log=lambda *_: None)
    def comparable(run):
        return [{k: v for k, v in m.items() if k not in ("time", "tokens_per_s", "step_time", "clock", "pipeline")}
                for m in lines(tmp_path / run / "metrics.jsonl")]
    assert comparable("resumed") == comparable("straight")


def test_a_rollout_token_budget_ends_the_run(tmp_path, setup):
    cfg = config(setup, steps=50, extra="  max_rollout_tokens: 200")
    result = train(cfg, tmp_path / "run", log=lambda *_: None)
    metrics = lines(tmp_path / "run" / "metrics.jsonl")
    assert result.steps_done == len(metrics) < 50
    assert metrics[-1]["rollout_tokens"] >= 200 > metrics[-2]["rollout_tokens"]
