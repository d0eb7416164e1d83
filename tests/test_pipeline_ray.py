"""The pipeline on a local Ray cluster: rollout and reward roles as actors in a placement
group, a four-domain run (code in the sandbox, agent episodes, math, alignment judged by
reward models), synchronous and K = 1, with the trainer in the test's process or in two
trainer actors of its own."""

import argparse
import json

import pytest

pytest.importorskip("ray")

from polyrl.config import load_config_text  # noqa: E402
from polyrl.train.loop import train  # noqa: E402
from tests.helpers import random_model_dir  # noqa: E402
from tests.test_alignment import MICRO_RM, rm_cache  # noqa: E402, F401  (the module-scoped fixture)


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()
    mp.undo()


def four_domains(model_dir, K, replicas=1, rewards=1, trainers=0):
    share = 2 if trainers else 1  # two actors of a 2-CPU cluster's roles, and the trainers
    return load_config_text(f"""
seed: 1
rl_tasks:
  - domain: code
    weight: 0.3
  - domain: agent
    weight: 0.3
    max_steps: 2
  - domain: math
    weight: 0.2
  - domain: alignment
    weight: 0.2
    reward_options: {{members: 2, recipe: {json.dumps(MICRO_RM)}}}
model:
  path: {model_dir}
engine:
  max_tokens: 12
trainer:
  steps: 3
  prompts_per_step: 4
  group_size: 2
  overlong: none
  drop_zero_variance: false
  max_staleness: {K}
eval:
  every: 2
  heldout_per_domain: 2
  samples: 1
  greedy: false
cluster:
  backend: ray
  rollout: {{num_cpus: {1 / replicas / share}}}
  reward: {{num_cpus: {1 / rewards / share}}}
  rollout_replicas: {replicas}
  reward_replicas: {rewards}
  trainer: {{num_cpus: {1 / max(trainers, 1)}}}
  trainer_actors: {trainers}
""")


@pytest.mark.parametrize("K", [0, 1])
def test_a_four_domain_run_on_ray_actors(tmp_path, rm_cache, monkeypatch, ray_cluster, K):  # noqa: F811
    monkeypatch.setenv("POLYRL_CACHE", str(rm_cache))  # the actors read the micro reward models here
    model_dir = random_model_dir(tmp_path / "model")
    result = train(four_domains(model_dir, K), tmp_path / "run", log=lambda *_: None)
    assert result.steps_done == 3 and result.after is not None
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 2]
    for m in metrics:
        assert set(m["domains"]) <= {"code", "agent", "math", "alignment"}
        assert m["pipeline"]["staleness"]["max"] <= K
    assert {d for m in metrics for d in m["domains"]} == {"code", "agent", "math", "alignment"}
    assert set(result.after) == {"code", "agent", "math", "alignment"}
    # code ran in the reward actor's sandbox and was logged to the run directory
    assert (tmp_path / "run" / "executions.jsonl").read_text().strip()
    # agent episodes' model and tool calls came back from the rollout actor to the store
    import sqlite3

    with sqlite3.connect(tmp_path / "run" / "obs.sqlite") as db:
        kinds = {k for (k,) in db.execute("select kind from records")}
    assert {"model", "episode"} <= kinds
    assert not ray_cluster.util.placement_group_table() or all(
        pg["state"] == "REMOVED" for pg in ray_cluster.util.placement_group_table().values())


def test_a_pool_of_two_rollout_actors_shares_each_step(tmp_path, rm_cache, monkeypatch, ray_cluster):  # noqa: F811
    monkeypatch.setenv("POLYRL_CACHE", str(rm_cache))
    model_dir = random_model_dir(tmp_path / "model")
    cfg = four_domains(model_dir, 1, replicas=2)
    result = train(cfg, tmp_path / "run", log=lambda *_: None)
    assert result.steps_done == 3 and set(result.after) == {"code", "agent", "math", "alignment"}
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for m in metrics:  # every step trains on all its prompts, from both actors' shards
        assert sum(d["groups"] for d in m["domains"].values()) == cfg.trainer.prompts_per_step
        assert m["pipeline"]["staleness"]["max"] <= 1
    import sqlite3

    with sqlite3.connect(tmp_path / "run" / "obs.sqlite") as db:
        traces = [t for (t,) in db.execute("select trace_id from records where kind = 'model'")]
    for step in range(3):
        assert {t.split("-")[1] for t in traces if t.startswith(f"s{step}-")} == {"0", "1"}


def test_a_pool_of_two_reward_actors_scores_as_one(tmp_path, rm_cache, monkeypatch, ray_cluster, capsys):  # noqa: F811
    monkeypatch.setenv("POLYRL_CACHE", str(rm_cache))
    model_dir = random_model_dir(tmp_path / "model")
    runs = {}
    for rewards in (1, 2):
        result = train(four_domains(model_dir, 0, rewards=rewards), tmp_path / f"run{rewards}", log=lambda *_: None)
        assert result.steps_done == 3
        runs[rewards] = [json.loads(line) for line in (tmp_path / f"run{rewards}" / "metrics.jsonl").read_text()
                         .splitlines()]
    # K = 0 and the same seed: the same samples, so groups dealt to two actors and put back in
    # order score exactly as on one
    for one, two in zip(runs[1], runs[2]):
        rewards = [{d: v["reward"] for d, v in m["domains"].items()} for m in (one, two)]
        assert rewards[0] == rewards[1]
        assert one["loss"] == two["loss"]
    # each reward actor wrote its code executions to a log of its own, ids unique across them
    run = tmp_path / "run2"
    first, second = (run / "executions.jsonl").read_text().splitlines(), (run / "executions-1.jsonl").read_text()
    ids = [json.loads(line)["id"] for line in first] + [json.loads(line)["id"] for line in second.splitlines()]
    assert ids and any(i.startswith("x1-") for i in ids) and any(i[1].isdigit() and "-" not in i for i in ids)
    assert len(set(ids)) == len(ids)
    from polyrl.commands.replay import add_arguments, main

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    capsys.readouterr()  # (what the runs printed)
    assert main(parser.parse_args([str(run), "--list", "--json"])) == 0
    assert sorted(r["id"] for r in json.loads(capsys.readouterr().out)) == sorted(ids)


def test_the_trainer_in_two_ray_actors_takes_the_drivers_steps(tmp_path, rm_cache, monkeypatch, ray_cluster):  # noqa: F811
    """cluster.trainer_actors: 2: the policy sharded (FSDP over gloo) between two actors; the
    driver's loop gets the same rewards and losses as with the trainer in its own process, and
    its checkpoint and resume state hold the whole model."""
    monkeypatch.setenv("POLYRL_CACHE", str(rm_cache))
    model_dir = random_model_dir(tmp_path / "model")
    runs = {}
    for trainers in (0, 2):
        result = train(four_domains(model_dir, 0, trainers=trainers), tmp_path / f"run{trainers}", log=lambda *_: None)
        assert result.steps_done == 3 and set(result.after) == {"code", "agent", "math", "alignment"}
        runs[trainers] = [json.loads(line) for line in (tmp_path / f"run{trainers}" / "metrics.jsonl").read_text()
                          .splitlines()]
    for one, two in zip(runs[0], runs[2]):
        assert {d: v["reward"] for d, v in one["domains"].items()} == {d: v["reward"] for d, v in two["domains"].items()}
        assert two["loss"] == pytest.approx(one["loss"], rel=1e-3, abs=1e-6)
    import torch

    from polyrl.models.hf_io import load_pretrained

    state = torch.load(tmp_path / "run2" / "state" / "state.pt", weights_only=False)
    assert state["world_size"] == 2 and state["step"] == 3
    final, _ = load_pretrained(tmp_path / "run2" / "checkpoints" / "final")
    same, _ = load_pretrained(tmp_path / "run0" / "checkpoints" / "final")
    for name, p in same.state_dict().items():
        assert torch.allclose(final.state_dict()[name], p, atol=1e-4), name
    assert not ray_cluster.util.placement_group_table() or all(
        pg["state"] == "REMOVED" for pg in ray_cluster.util.placement_group_table().values())
