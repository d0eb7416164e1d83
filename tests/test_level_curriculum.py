"""The level curriculum (rl_tasks[].level_curriculum, rl/level_curriculum.py): a domain's
training draws move toward the levels whose groups carry a signal, never below a floor; the
held-out set keeps its levels; the weights are on every metrics line and survive a resume."""

from __future__ import annotations

import collections
import json

import pytest

from polyrl.config import load_config_text
from polyrl.rewards import registry
from polyrl.rl.level_curriculum import LevelSignal
from polyrl.train.loop import train
from polyrl.train.setup import build_domains, draw_tasks
from tests.helpers import float_mismatches, random_model_dir
from tests.test_train import comparable


@pytest.fixture
def solved_level_one(monkeypatch):
    monkeypatch.setitem(registry._VERIFIERS, "solved_level_one", "tests.helpers:SolvedLevelOneVerifier")


def test_levels_without_signal_give_way_down_to_the_floor():
    signal = LevelSignal({"math": (1, 2, 3)}, floor=0.1, rate=0.5)
    assert signal.weights() == {"math": pytest.approx((1 / 3, 1 / 3, 1 / 3))}
    for _ in range(12):  # level 1 always solved, level 2 learning, level 3 out of reach
        signal.update([("math", 1, False)] * 4 + [("math", 2, True), ("math", 2, False)] + [("math", 3, False)] * 2)
    w1, w2, w3 = signal.weights()["math"]
    assert w2 > 0.75 and w1 == w3 and 0.08 < w1 < 0.1 and sum((w1, w2, w3)) == pytest.approx(1)
    for _ in range(12):  # level 3 starts to move: it gains again
        signal.update([("math", 3, True), ("math", 3, False)])
    assert signal.weights()["math"][2] > 0.3


def test_a_level_seen_in_no_group_keeps_its_signal_and_strangers_are_ignored():
    signal = LevelSignal({"math": (1, 2)}, rate=1.0)
    signal.update([("math", 1, False), ("code", 1, True), ("math", 9, True)])
    assert signal.signal == {"math": {1: 0.0, 2: 1.0}}


def test_the_state_round_trips():
    signal = LevelSignal({"math": (1, 2), "agent": (2, 3)}, rate=0.3)
    signal.update([("math", 1, False), ("agent", 3, True), ("agent", 2, False)])
    again = LevelSignal({"math": (1, 2), "agent": (2, 3)}, rate=0.3)
    again.load_state_dict(json.loads(json.dumps(signal.state_dict())))
    assert again.signal == signal.signal and again.weights() == signal.weights()


def test_a_reweighted_draw_leaves_the_domains_own_weights_alone(tmp_path, solved_level_one):
    model_dir = random_model_dir(tmp_path / "model")
    specs = build_domains(run_file(model_dir, 1), verifiers=False).specs
    drawn = draw_tasks(specs, {"math": 200}, seed=0, step=0, levels={"math": (0.05, 0.95)})
    counts = collections.Counter(t.difficulty for t in drawn)
    assert counts[2] > 150 and counts[1] > 0
    assert specs["math"].source.weights == (1.0, 1.0)


def test_a_domain_without_levels_is_refused(tmp_path):
    cfg = load_config_text(f"""
rl_tasks: [{{domain: alignment, weight: 1, level_curriculum: true}}]
model: {{path: {random_model_dir(tmp_path / 'model')}}}
""")
    with pytest.raises(ValueError, match="level_curriculum weights a generated domain's difficulty levels"):
        build_domains(cfg, verifiers=False)


def run_file(model_dir, steps: int):
    return load_config_text(f"""
seed: 5
rl_tasks:
  - {{domain: math, reward: solved_level_one, weight: 1.0, options: {{levels: [1, 2]}}, level_curriculum: true}}
model: {{path: {model_dir}}}
engine: {{max_tokens: 8}}
trainer: {{steps: {steps}, prompts_per_step: 8, group_size: 4, lr: 1.0e-3, overlong: none, checkpoint_every: 4}}
eval: {{every: 0, heldout_per_domain: 8, samples: 1, greedy: false}}
""")


def test_training_moves_the_draws_to_the_level_with_signal_and_resumes_the_same(tmp_path, solved_level_one):
    model_dir = random_model_dir(tmp_path / "model")
    train(run_file(model_dir, 8), tmp_path / "straight", log=lambda *_: None)
    metrics = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    first, last = metrics[0]["level_weights"]["math"], metrics[-1]["level_weights"]["math"]
    assert last["2"] > first["2"] and last["2"] > 0.8 and last["1"] >= 0.08
    drawn = [json.loads(line) for line in (tmp_path / "straight" / "trajectories.jsonl").read_text().splitlines()]
    late = collections.Counter(t["task_id"].split("-")[2] for t in drawn if t["step"] >= 5)
    assert late["2"] > 3 * late["1"]  # the draws followed the weights (level 2 from about 1 in 2 to over 3 in 4)
    # a resumed run restores the signal: the same level weights, the same tasks drawn each step
    train(run_file(model_dir, 8), tmp_path / "resumed", log=lambda *_: None, stop_after=3)
    train(run_file(model_dir, 8), tmp_path / "resumed", resume=True, log=lambda *_: None)
    straight, resumed = (comparable(tmp_path / run / "metrics.jsonl") for run in ("straight", "resumed"))
    assert [m["level_weights"] for m in resumed] == [m["level_weights"] for m in straight]
    assert draws(tmp_path / "resumed") == draws(tmp_path / "straight")
    # and the rest of each line too, up to float32 summation order: the update's loss can differ
    # in its 7th digit between two runs of the same process, resumed or not, and a loss whose
    # terms cancel to about 1e-8 differs by as much again (absolute 1e-6 is far below a real change)
    assert float_mismatches(resumed, straight, abs_=1e-6) == []


def draws(run) -> list[tuple[int, str]]:
    lines = (json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines())
    return [(t["step"], t["task_id"]) for t in lines]
