"""Runs of many generated domains (rl_tasks[].expand): the run file, a short training run on a
tiny random model, and what a step does not do for the domains outside its batch.

The step's costs are checked by counting calls (verifier constructions, task draws, held-out
evaluations), never by timing; bench/many_domains.py measures the time."""

import json
from collections import Counter
from pathlib import Path

import pytest

from polyrl.config import ConfigError, load_config_text
from polyrl.rewards import registry
from polyrl.rl.curriculum import CapabilityCurriculum, allocate
from polyrl.train import setup
from polyrl.train.evaluate import eval_domains
from polyrl.train.loop import train
from tests.helpers import float_mismatches, random_model_dir
from tests.many_domains_runs import four_domain_run, generated_run
from tests.test_train import comparable


@pytest.fixture
def parity_reward(monkeypatch):
    monkeypatch.setitem(registry._VERIFIERS, "length_parity", "tests.helpers:ParityVerifier")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return random_model_dir(tmp_path_factory.mktemp("model"))


def test_expand_generates_named_domains_sharing_the_weight(model_dir, parity_reward):
    cfg = load_config_text(generated_run(model_dir, 100))
    tasks = cfg.domain_tasks()
    names = [t.run_name for t in tasks]
    assert len(tasks) == 100 == len(set(names)) and len(cfg.rl_tasks) == 1
    assert names[1] == "math/levels=1+2+3+4,weights=2+2+2+2"
    assert tasks[1].options == {"levels": [1, 2, 3, 4], "weights": [2, 2, 2, 2]}
    assert sum(t.weight for t in tasks) == pytest.approx(1.0) and all(not t.expand for t in tasks)
    assert all(t.domain == "math" and t.kl_target == 0.05 for t in tasks)


@pytest.mark.parametrize("entries, line, expected", [
    ("  - {domain: math, weight: 1, expand: {levels: [[1], [5]]}}\n", 2,
     "rl_tasks[0].expand: generated domain 'math/levels=5': math levels must be a non-empty subset of (1, 2, 3, 4), got [5]"),
    ("  - {domain: math, weight: 1, expand: {levels: []}}\n", 2,
     "rl_tasks[0].expand.levels: must be a non-empty list of option values, one generated domain each"),
    ("  - {domain: math, weight: 1, expand: {levels: [[1]]}}\n  - {domain: math, name: math/levels=1, weight: 1}\n", 3,
     "rl_tasks[1].name: domain name 'math/levels=1' is already taken by rl_tasks[0]; give one of the entries a distinct `name`"),
    ("  - {domain: math, weight: 1, expand: {levels: [[1]], weights: [[1], [2], [3]], nope: [1]}}\n", 2,
     "rl_tasks[0].expand: generated domain 'math/levels=1,weights=1,nope=1': unknown option of the math domain"),
])
def test_expand_errors_are_one_line_at_the_entry(entries, line, expected):
    with pytest.raises(ConfigError) as err:
        load_config_text("rl_tasks:\n" + entries)
    assert len(err.value.problems) == 1
    assert str(err.value.problems[0]).startswith(f"<string>:{line}: {expected}")


def test_prompts_are_drawn_across_domains_when_they_outnumber_a_batch():
    weights = {f"d{i:03d}": 1.0 for i in range(100)}
    drawn = Counter()
    for step in range(200):
        counts = allocate(8, weights, seed=step)
        assert sum(counts.values()) == 8 and min(counts.values()) >= 0
        drawn.update(d for d, k in counts.items() if k)
    assert len(drawn) == 100  # largest remainder alone would give the same 8 domains every step
    assert allocate(8, {"a": 1, "b": 3}, seed=5) == allocate(8, {"a": 1, "b": 3})  # a small run: unchanged


def test_rotating_evaluation_covers_every_domain():
    names = [f"d{i:03d}" for i in range(100)]
    seen = [set(eval_domains(names, step, 5, 30)) for step in range(5, 5 * 5, 5)]  # 4 evaluations in a row
    assert all(len(s) == 30 for s in seen) and set().union(*seen) == set(names)
    assert eval_domains(names[:4], 5, 5, 30) == names[:4] and eval_domains(names, 5, 5, None) == names


def test_curriculum_moves_on_an_evaluation_of_some_domains():
    cur = CapabilityCurriculum({"a": 1.0, "b": 1.0, "c": 1.0})
    with pytest.raises(ValueError):
        cur.update(0, {"a": 0.1})  # the first evaluation scores every domain
    cur.update(0, {"a": 0.1, "b": 0.1, "c": 0.1})
    moved = cur.update(1, {"a": 0.6})
    assert len(cur.history["a"]) == 2 and len(cur.history["b"]) == 1 and moved.weights["a"] > moved.weights["b"]


def test_a_four_domain_run_is_unchanged(tmp_path, parity_reward):
    """The metrics of a 4-domain run, as the code before generated domains wrote them (tests/data):
    every count, reward and choice as recorded, floats up to the rounding of another CPU."""
    model = random_model_dir(tmp_path / "model")
    train(load_config_text(four_domain_run(model, tmp_path / "pack.jsonl")), tmp_path / "run", log=lambda *_: None)
    golden = json.loads((Path(__file__).parent / "data" / "four_domain_metrics.json").read_text())
    got = json.loads(json.dumps({"metrics": comparable(tmp_path / "run" / "metrics.jsonl"),
                                 "after": json.loads((tmp_path / "run" / "eval" / "after.json").read_text())}))
    assert float_mismatches(got, golden) == []


def test_hundred_domains_train_touching_only_the_batch(tmp_path, parity_reward, model_dir, monkeypatch):
    built, drawn, evaluated = Counter(), [], []
    real_verifier, real_draw = setup.get_verifier, setup.draw_tasks
    monkeypatch.setattr(setup, "get_verifier", lambda name, **kw: built.update([name]) or real_verifier(name, **kw))

    def draw(specs, counts, seed, step, levels=None):
        tasks = real_draw(specs, counts, seed, step, levels)
        drawn.append((counts, {t.domain for t in tasks}))
        return tasks

    from polyrl.pipeline import roles
    real_eval = roles.eval_rollout
    monkeypatch.setattr(roles, "draw_tasks", draw)
    monkeypatch.setattr(roles, "eval_rollout", lambda r, heldout, *a: evaluated.append(set(heldout)) or real_eval(r, heldout, *a))

    cfg = load_config_text(generated_run(model_dir, 100, steps=2, per_eval=10, heldout=1))
    result = train(cfg, tmp_path / "run", log=lambda *_: None)
    assert result.steps_done == 2
    assert built == {"length_parity": 1}  # one verifier for 100 domains, not one each
    for counts, domains in drawn:  # only the domains the batch holds are asked for tasks
        assert sum(counts.values()) == 8 and domains == {d for d, k in counts.items() if k} and len(domains) <= 8
    assert [len(e) for e in evaluated] == [100, 10, 100]  # before, one rotating block, after

    from polyrl.train.run_dir import RunDir
    state = RunDir(tmp_path / "run").load_state()
    names = {t.run_name for t in cfg.domain_tasks()}
    assert set(state["kl"]["coefs"]) == names and set(state["kl"]["targets"]) == names
    assert set(state["curriculum"]["weights"]) == names
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = {d for line in lines for d in line["domains"]}
    assert trained and trained <= names  # each generated domain normalises and reports under its own name
    assert len(lines[1]["kl_coef_reasons"]) < 100  # reasons logged when they change, not 100 every line


def test_domains_with_equal_reward_options_share_one_verifier(model_dir, parity_reward):
    text = generated_run(model_dir, 20).replace("    kl_coef: 0.01\n", "    kl_coef: 0.01\n    reward_options: {x: 1}\n")
    domains = setup.build_domains(load_config_text(text))
    try:
        assert list(domains.verifiers) == ["length_parity@math/levels=1+2+3+4,weights=1+1+1+1"]
        assert {s.verifier for s in domains.specs.values()} == set(domains.verifiers) and len(domains.specs) == 20
    finally:
        domains.close()
