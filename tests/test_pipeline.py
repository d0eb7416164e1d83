"""The asynchronous pipeline end to end on a tiny random model: max_staleness 0 is the
synchronous loop, K > 0 trains K versions behind with decoupled PPO, reproducibly, and a
resumed run continues its versions without counting a step twice."""

import json

import pytest
import torch

from polyrl.rewards import registry
from polyrl.train.loop import train
from tests.helpers import random_model_dir
from tests.test_train import comparable, config


@pytest.fixture
def model_dir(tmp_path, monkeypatch):
    monkeypatch.setitem(registry._VERIFIERS, "length_parity", "tests.helpers:ParityVerifier")
    torch.use_deterministic_algorithms(True)  # the update's CPU kernels, run to run
    yield random_model_dir(tmp_path / "model")
    torch.use_deterministic_algorithms(False)


def run(model_dir, path, K, backend="local", steps=6, split=False, log=lambda *_: None, **kw):
    cfg = config(model_dir, steps=steps)
    cfg.trainer.max_staleness = K
    cfg.cluster.backend = backend
    cfg.cluster.split_cores = split
    return train(cfg, path, log=log, **kw)


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def trajectories(run_dir):
    return [{k: v for k, v in r.items() if k != "details"} for r in lines(run_dir / "trajectories.jsonl")]


def test_staleness_zero_is_the_synchronous_loop(model_dir, tmp_path):
    """The roles in their threads (local) give the very run the trainer gets calling them one
    after another in its own thread (inline): rollout, reward, update, evaluation, in order."""
    run(model_dir, tmp_path / "threads", K=0)
    run(model_dir, tmp_path / "inline", K=0, backend="inline")
    assert comparable(tmp_path / "threads" / "metrics.jsonl") == comparable(tmp_path / "inline" / "metrics.jsonl")
    assert trajectories(tmp_path / "threads") == trajectories(tmp_path / "inline")
    for m in lines(tmp_path / "threads" / "metrics.jsonl"):
        assert m["pipeline"]["staleness"] == {"max": 0, "mean": 0.0, "hist": {"0": 16}}
        assert "iw" not in m["pipeline"]  # the synchronous loss: nothing to correct


def test_k_versions_behind_with_decoupled_ppo_and_evaluation_beside_training(model_dir, tmp_path):
    run(model_dir, tmp_path / "k2", K=2, steps=8)
    metrics = lines(tmp_path / "k2" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(8))
    for m in metrics:
        p = m["pipeline"]
        assert p["max_staleness"] == 2 and p["dropped_stale"] == 0
        assert p["staleness"]["max"] <= 2
        assert 0.0 <= p["iw"]["capped_frac"] <= 1.0 and p["iw"]["mean"] > 0 and p["mismatch_kl"] >= 0
        assert set(p["idle_s"]) == {"rollout", "reward", "trainer"}
    updated = [m["step"] for m in metrics if m["loss"] is not None]
    assert len(updated) >= 6  # the parity reward leaves few groups flat
    # once the pipeline is full, each step trains on the weights of K steps before
    for m in metrics[2:]:
        assert m["pipeline"]["behaviour_version"] <= m["step"] - 2 + 0
        assert m["pipeline"]["staleness"]["hist"].keys() <= {"0", "1", "2"}
    assert metrics[0]["pipeline"]["staleness"]["max"] == 0 and metrics[0]["pipeline"]["mismatch_kl"] == 0.0
    # the evaluation after step 2 ran on version 2 (or the last one before) beside steps 3..4
    evals = [m for m in metrics if "eval" in m]
    assert evals and all(m["eval_of"]["version"] <= m["eval_of"]["step"] <= m["step"] for m in evals)
    assert evals[0]["eval_of"]["step"] == 2 and "math" in evals[0]["eval"]
    # every sample's versions are on record, none newer than the step's behaviour version
    for t in lines(tmp_path / "k2" / "trajectories.jsonl"):
        m = metrics[t["step"]]
        assert t["weight_version"] == m["pipeline"]["behaviour_version"]


def test_an_asynchronous_run_is_reproducible_whatever_the_timing(model_dir, tmp_path):
    """Versions are pinned by the admission rule, not by which role was faster: the threaded
    run equals the one with the roles called one after another."""
    run(model_dir, tmp_path / "threads", K=2)
    run(model_dir, tmp_path / "inline", K=2, backend="inline")
    assert comparable(tmp_path / "threads" / "metrics.jsonl") == comparable(tmp_path / "inline" / "metrics.jsonl")
    assert trajectories(tmp_path / "threads") == trajectories(tmp_path / "inline")


def test_resume_mid_pipeline_restarts_at_the_saved_version_and_counts_no_step_twice(model_dir, tmp_path):
    first = run(model_dir, tmp_path / "run", K=2, stop_after=3)  # killed with steps 3..5 in flight
    assert first.steps_done == 3
    with open(tmp_path / "run" / "metrics.jsonl", "a") as fh:  # a half-written step 3
        fh.write(json.dumps({"step": 3, "partial": True}) + "\n")
    cfg = config(model_dir, steps=6)
    cfg.trainer.max_staleness = 2
    second = train(cfg, tmp_path / "run", resume=True, log=lambda *_: None)
    assert second.steps_done == 6
    metrics = lines(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(6))
    steps = [t["step"] for t in lines(tmp_path / "run" / "trajectories.jsonl")]
    assert steps == sorted(steps) and set(steps) == set(range(6)) and len(steps) == 6 * 16
    resumed_at = torch.load(tmp_path / "run" / "state" / "state.pt", weights_only=False)
    assert resumed_at["step"] == 6
    # the rollouts in flight at the kill are not reused: steps 3..5 sample from the resumed
    # version (no older weights survive a restart), so their staleness is 0, 1, 2
    version_at_3 = metrics[3]["pipeline"]["behaviour_version"]
    assert [m["pipeline"]["behaviour_version"] for m in metrics[3:]] == [version_at_3] * 3
    assert version_at_3 <= 3 and [m["pipeline"]["staleness"]["max"] for m in metrics[3:]][0] == 0


def test_kill_9_mid_step_with_k2_resumes_its_versions_and_owed_evaluation(tmp_path):
    """A real kill (SIGKILL inside step 3's trajectories write, a torn line) of a K = 2 run with
    steps 3..5 in flight: the resumed run has every step once, rolls steps 3..5 out at the saved
    version, and runs the evaluation of step 2 that was still in the pipeline."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from tests.test_hardening_resume import CHILD, CONFIG

    model = random_model_dir(tmp_path / "model")
    text = CONFIG.format(model=model, steps=6).replace("overlong: none,", "overlong: none, max_staleness: 2,")
    (tmp_path / "run.yaml").write_text(text)
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}

    def child(kill_at: int) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", CHILD, str(run_dir), str(kill_at), "1", str(tmp_path / "run.yaml")],
                              env=env, capture_output=True, text=True, timeout=180)

    killed = child(4 * 3 + 2)  # writes per step: metrics, trajectories, flags, state
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    saved = torch.load(run_dir / "state" / "state.pt", weights_only=False)
    assert saved["step"] == 3
    done = child(10**6)
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = lines(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(6))
    steps = [t["step"] for t in lines(run_dir / "trajectories.jsonl")]
    assert steps == sorted(steps) and len(steps) == 6 * 4  # 2 prompts x 2 samples, each step once
    versions = [m["pipeline"]["behaviour_version"] for m in metrics]
    assert versions[3:] == [saved["policy_version"]] * 3
    assert all(m["pipeline"]["staleness"]["max"] <= 2 and m["pipeline"]["dropped_stale"] == 0 for m in metrics)
    assert [m["eval_of"] for m in metrics if "eval_of" in m] == [{"step": 2, "version": saved["policy_version"]}]


def test_a_scheduler_runs_the_evaluation_beside_the_rollout_with_the_same_results(model_dir, tmp_path):
    """With a `scheduler:` section the rollout role runs a ticket's evaluation and its training
    rollout at once on one engine (two loads sharing its slots). Each sequence keeps its own
    seed, so every token is the one the engine gives each load alone; logprobs differ only in
    float rounding (other rows in the batch)."""
    from polyrl.pipeline.scheduler import SchedulerConfig

    run(model_dir, tmp_path / "alone", K=2)
    cfg = config(model_dir, steps=6)
    cfg.trainer.max_staleness = 2
    cfg.scheduler = SchedulerConfig(capacity=8)  # fewer slots than the two loads' sequences: they must share
    train(cfg, tmp_path / "shared", log=lambda *_: None)
    shared, alone = (comparable(tmp_path / name / "metrics.jsonl") for name in ("shared", "alone"))
    assert [m["eval_of"] for m in shared if "eval_of" in m], "an evaluation ran beside training"
    for s, a in zip(shared, alone):  # the engine's counters over a rollout include an evaluation beside it
        beside = "eval_of" in s
        assert (s.pop("engine")["requests"] > a.pop("engine")["requests"]) == beside, s["step"]
    assert close(shared, alone)
    tokens = [[(t["step"], t["token_ids"], t["reward"]) for t in lines(tmp_path / name / "trajectories.jsonl")]
              for name in ("shared", "alone")]
    assert tokens[0] == tokens[1]


def close(a, b, rel=1e-5) -> bool:
    """Equal structure and values, floats to `rel`."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(close(a[k], b[k], rel) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(close(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return a == pytest.approx(b, rel=rel, abs=1e-7)
    return a == b
