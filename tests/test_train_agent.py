"""Training with the agent domain: episodes roll out through the engine, train on the
policy's own tokens only, and leave observability records that `polyrl obs` reads."""

from __future__ import annotations

import json

import torch

from polyrl.cli import main as cli_main
from polyrl.config import load_config_text
from polyrl.domains.agent import AgentDomain
from polyrl.rollout.dispatch import Rollout
from polyrl.rollout.episodes import Episode
from polyrl.rollout.spec import AgentSpec, DomainSpec
from polyrl.train.batch import build_batch
from polyrl.train.loop import train
from tests.helpers import random_model_dir


def test_agent_and_math_train_together(tmp_path, capsys) -> None:
    cfg = load_config_text(f"""
rl_tasks:
  - {{domain: agent, weight: 1.0, max_steps: 2, max_tokens: 8, reward_options: {{alpha: 0.05, beta: 0.0}}}}
  - {{domain: math, weight: 1.0, max_tokens: 8}}
model: {{path: {random_model_dir(tmp_path / "model")}}}
trainer: {{steps: 1, prompts_per_step: 2, group_size: 2, checkpoint_every: 5}}
eval: {{every: 0, heldout_per_domain: 2, samples: 1, greedy: false}}
""")
    run = tmp_path / "run"
    result = train(cfg, run, log=lambda *_: None)
    assert result.after is not None and "tokens_per_success" in result.after["agent"]
    metrics = json.loads((run / "metrics.jsonl").read_text())
    assert set(metrics["domains"]) == {"agent", "math"}
    lines = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    agent = [t for t in lines if t["domain"] == "agent"]
    assert len(agent) == 2 and all("episode" in t and t["details"]["status"] in ("wrong", "no_answer", "success")
                                   for t in agent)
    assert all(t["details"]["steps"] <= 2 + 1 for t in agent)  # max_steps, then one conclusion call
    assert (run / "obs.sqlite").exists()
    capsys.readouterr()
    assert cli_main(["obs", str(run), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model_calls"] > 0 and report["scored_episodes"] >= 2 + 2 * 2  # training, and evaluations


def test_episode_rows_train_only_generated_tokens(tmp_path) -> None:
    from polyrl.engine.dense import DenseEngine
    from polyrl.models.hf_io import load_pretrained
    from polyrl.models.tokenizer import Tokenizer
    from polyrl.engine.base import SamplingParams

    model_dir = random_model_dir(tmp_path / "model")
    model, _ = load_pretrained(model_dir)
    tok = Tokenizer.from_dir(model_dir)
    tasks = AgentDomain().sample("train", 2, seed=0)
    sampling = SamplingParams(max_tokens=8, seed=1)
    spec = DomainSpec("agent", AgentDomain(), 1.0, "success_minus_cost", None, sampling, sampling, 0.0, None,
                      AgentSpec(AgentDomain.toolbox, 2))
    groups = Rollout(DenseEngine(model, tok), tok, {"agent": spec}, context_window=512).groups(
        tasks, 2, lambda s: s.sampling)
    assert [len(g.samples) for g in groups] == [2, 2] and all(isinstance(e, Episode) for g in groups for e in g.samples)
    batch = build_batch(groups, [[1.0, -1.0], [0.5, -0.5]], [[1.0, 1.0], [1.0, 1.0]], {"agent": 0.0})
    rows = [seg for g in groups for e in g.samples for seg in e.segments]
    assert len(batch) == len(rows)
    for b, seg in enumerate(rows):
        n = len(seg.token_ids)
        assert batch.input_ids[b, :n].tolist() == seg.token_ids
        assert batch.mask[b, :n - 1].tolist() == [float(m) for m in seg.loss_mask[1:]]  # token t scored at t - 1
        generated = [lp for lp, m in zip(seg.logprobs, seg.loss_mask) if m]
        assert torch.allclose(batch.old_logp[b][batch.mask[b] > 0], torch.tensor(generated))
    # prompt and tool-result tokens carry no loss
    assert 0 < batch.mask.sum() < sum(len(seg.token_ids) for seg in rows)
