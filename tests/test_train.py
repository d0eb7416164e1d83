"""The training loop end to end on a tiny random model: smoke run, run directory, resume."""

import json

import pytest

from polyrl.config import load_config_text
from polyrl.rewards import registry
from polyrl.train.loop import train
from tests.helpers import random_model_dir


@pytest.fixture
def parity_reward(monkeypatch):
    monkeypatch.setitem(registry._VERIFIERS, "length_parity", "tests.helpers:ParityVerifier")


def config(model_dir, steps, kl=0.01):
    return load_config_text(f"""
seed: 3
rl_tasks:
  - domain: math
    reward: length_parity
    weight: 1.0
model:
  path: {model_dir}
engine:
  max_tokens: 12
trainer:
  steps: {steps}
  prompts_per_step: 4
  group_size: 4
  lr: 1.0e-3
  kl_coef: {kl}
  overlong: none
  checkpoint_every: 2
eval:
  every: 2
  heldout_per_domain: 4
  samples: 2
""")


def comparable(metrics_file):
    """metrics.jsonl without wall-clock fields (and what depends on timing: the pipeline's waits)."""
    out = []
    for line in metrics_file.read_text().splitlines():
        r = json.loads(line)
        for k in ("time", "tokens_per_s", "step_time", "clock"):
            r.pop(k)
        for k in ("idle_s", "weight_sync_s", "queues"):
            r["pipeline"].pop(k)
        out.append(r)
    return out


def test_two_step_smoke_run(tmp_path, parity_reward):
    model_dir = random_model_dir(tmp_path / "model")
    result = train(config(model_dir, steps=2), tmp_path / "run", log=lambda *_: None)
    run = tmp_path / "run"
    assert result.steps_done == 2
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]
    m = metrics[0]["domains"]["math"]
    assert 0 <= m["reward"] <= 1 and m["groups"] == 4 and m["kl"] is not None and m["entropy"] > 0
    trajectories = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajectories) == 2 * 4 * 4
    t = trajectories[-1]
    assert len(t["token_ids"]) == len(t["logprobs"]) and t["weight_version"] == 1 and "details" in t
    assert json.loads((run / "eval" / "before.json").read_text())["math"]["tasks"] == 4
    assert (run / "eval" / "after.json").exists()
    assert (run / "config.yaml").read_text().startswith("# polyrl run config")
    # checkpoints are Hugging Face directories that transformers loads
    transformers = pytest.importorskip("transformers")
    for name in ("step-000002", "final"):
        ckpt = run / "checkpoints" / name
        hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt)
        assert hf.config.vocab_size > 0 and (ckpt / "tokenizer.json").exists()


def test_training_changes_the_policy(tmp_path, parity_reward):
    model_dir = random_model_dir(tmp_path / "model")
    train(config(model_dir, steps=2, kl=0.0), tmp_path / "run", log=lambda *_: None)
    from polyrl.models.hf_io import load_pretrained

    before, _ = load_pretrained(model_dir)
    after, _ = load_pretrained(tmp_path / "run" / "checkpoints" / "final")
    diff = sum((a - b).abs().sum().item() for a, b in zip(before.state_dict().values(), after.state_dict().values()))
    assert diff > 0


def test_resume_matches_a_straight_run(tmp_path, parity_reward):
    model_dir = random_model_dir(tmp_path / "model")
    cfg = config(model_dir, steps=4)
    train(cfg, tmp_path / "straight", log=lambda *_: None)
    first = train(cfg, tmp_path / "resumed", log=lambda *_: None, stop_after=2)
    assert first.steps_done == 2 and first.after is None
    # a half-written later step (killed mid-step) must be dropped on resume
    with open(tmp_path / "resumed" / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 2, "partial": True}) + "\n")
    second = train(cfg, tmp_path / "resumed", resume=True, log=lambda *_: None)
    assert second.steps_done == 4
    assert comparable(tmp_path / "resumed" / "metrics.jsonl") == comparable(tmp_path / "straight" / "metrics.jsonl")
    straight = json.loads((tmp_path / "straight" / "eval" / "after.json").read_text())
    resumed = json.loads((tmp_path / "resumed" / "eval" / "after.json").read_text())
    assert straight == resumed


def test_new_run_refuses_an_existing_run_dir(tmp_path, parity_reward):
    model_dir = random_model_dir(tmp_path / "model")
    train(config(model_dir, steps=1), tmp_path / "run", log=lambda *_: None)
    with pytest.raises(FileExistsError, match="--resume"):
        train(config(model_dir, steps=1), tmp_path / "run", log=lambda *_: None)
