"""Run-file schema and loader: defaults, and errors that name the file, line and field."""

import textwrap

import pytest
from pydantic import ValidationError

from polyrl.config import ConfigError, RunConfig, default_config, load_config, load_config_text

GOOD = """\
name: demo
rl_tasks:
  - domain: math
    weight: 1.0
"""


def errors(text: str, **kwargs) -> list[str]:
    """The problem lines a run file produces (it must produce some)."""
    with pytest.raises(ConfigError) as info:
        load_config_text(textwrap.dedent(text), source="run.yaml", **kwargs)
    lines = str(info.value).splitlines()
    assert len(lines) == len(info.value.problems)
    return lines


@pytest.fixture(autouse=True)
def known_domains(monkeypatch):
    """A fixed list of built-in domains, so domain checks do not depend on which domains exist."""
    import polyrl.domains.registry as registry

    monkeypatch.setattr(registry, "available_domains", lambda: ["agent", "alignment", "code", "math"])


def test_good_file_gets_defaults():
    cfg = load_config_text(GOOD)
    assert cfg.name == "demo" and cfg.seed == 0 and cfg.curriculum == "static"
    assert cfg.rl_tasks[0].domain == "math" and cfg.rl_tasks[0].reward is None
    assert cfg.model.path == "builtin:tiny" and cfg.engine.backend == "native"
    assert cfg.trainer.group_size == 8 and cfg.trainer.minibatches == 1
    assert cfg.eval.every == 10


def test_default_config_is_the_quickstart():
    cfg = default_config()
    assert cfg.name == "quickstart"
    assert [(t.domain, t.reward, t.weight) for t in cfg.rl_tasks] == [
        ("code", "unit_test_pass", 0.35), ("agent", "success_minus_cost", 0.3), ("math", "answer_verify", 0.2),
        ("alignment", "preference_model", 0.15)]
    assert cfg.curriculum == "capability_curve" and cfg.eval.every > 0


def test_yaml_11_exponent_floats_are_accepted():
    cfg = load_config_text(GOOD + "trainer:\n  lr: 3e-4\n")  # PyYAML reads 3e-4 as a string
    assert cfg.trainer.lr == pytest.approx(3e-4)


def test_bad_value_names_line_field_value_and_bound():
    assert errors(GOOD + "trainer:\n  steps: 5\n  lr: -1\n") == ["run.yaml:7: trainer.lr: got -1; must be > 0 and <= 1"]
    assert errors(GOOD + "engine:\n  top_p: 2\n") == ["run.yaml:6: engine.top_p: got 2; must be > 0 and <= 1"]


def test_bad_value_in_a_list_item_has_its_index():
    text = GOOD + "  - domain: code\n    weight: 0\n"
    assert errors(text) == ["run.yaml:6: rl_tasks[1].weight: got 0; must be > 0 and <= 1e+06"]


def test_unknown_key_top_level_suggests_the_nearest():
    (line,) = errors(GOOD + "trainr:\n  lr: 0.1\n")
    assert line.startswith("run.yaml:5: trainr: unknown key 'trainr'; allowed: name, seed, run_dir,")
    assert line.endswith("did you mean 'trainer'?")


def test_unknown_key_nested_suggests_the_nearest():
    (line,) = errors(GOOD + "trainer:\n  steps: 3\n  lrr: 0.1\n")
    assert line.startswith("run.yaml:7: trainer.lrr: unknown key 'lrr'; allowed: steps, prompts_per_step,")
    assert line.endswith("did you mean 'lr'?")
    (line,) = errors("rl_tasks:\n  - domain: math\n    wieght: 1\n    weight: 1\n")
    assert line.startswith("run.yaml:3: rl_tasks[0].wieght: unknown key 'wieght'; allowed: domain, reward, weight,")
    assert line.endswith("did you mean 'weight'?")


def test_wrong_type():
    assert errors(GOOD + "seed: seven\n") == ["run.yaml:5: seed: got 'seven'; must be an integer >= 0 and < 2**63"]
    assert errors(GOOD + "trainer:\n  steps: 1.5\n") == ["run.yaml:6: trainer.steps: got 1.5; must be an integer > 0 and <= 10**8"]
    assert errors(GOOD + "eval: 5\n") == ["run.yaml:5: eval: got 5; must be a mapping (keys: every, heldout_per_domain, max_tokens, samples, greedy, domains_per_eval)"]
    (line,) = errors("rl_tasks: math\n")
    assert line.startswith("run.yaml:1: rl_tasks: got 'math'; must be a list of mappings (keys: domain,")


def test_missing_required_points_at_the_parent_mapping():
    (line,) = errors("# a comment\nname: x\ntrainer:\n  steps: 3\n")
    assert line.startswith("run.yaml:2: rl_tasks: missing required key")
    (line,) = errors("rl_tasks:\n  - domain: math\n    weight: 1\n  - domain: code\n    reward: unit_test_pass\n")
    assert line.startswith("run.yaml:4: rl_tasks[1].weight: missing required key")
    assert errors("rl_tasks: []\n") == ["run.yaml:1: rl_tasks: got an empty list; must have at least 1 item"]


def test_bad_literal_lists_the_choices():
    assert errors(GOOD + "engine:\n  backend: vlm\n") == [
        "run.yaml:6: engine.backend: got 'vlm'; must be one of native, vllm; did you mean 'vllm'?"
    ]
    assert errors(GOOD + "model:\n  dtype: fp8\n") == ["run.yaml:6: model.dtype: got 'fp8'; must be one of float32, bfloat16, float16"]


def test_duplicate_domain_points_at_the_second():
    text = GOOD + "  - domain: math\n    weight: 2\n"
    assert errors(text) == ["run.yaml:5: rl_tasks[1].domain: got 'math'; duplicate domain, already listed as rl_tasks[0]; list each domain once"]


def test_unknown_reward_lists_verifiers():
    (line,) = errors("rl_tasks:\n  - domain: math\n    reward: answr_verify\n    weight: 1\n")
    assert line.startswith("run.yaml:3: rl_tasks[0].reward: got 'answr_verify'; must be one of answer_verify,")
    assert line.endswith("did you mean 'answer_verify'?")


def test_unknown_domain_unless_a_pack_is_given(known_domains, tmp_path):
    (line,) = errors("rl_tasks:\n  - domain: mth\n    weight: 1\n")
    assert line == "run.yaml:2: rl_tasks[0].domain: got 'mth'; must be a built-in or plugin domain (agent, alignment, code, math), or any name together with `pack`; did you mean 'math'?"
    (tmp_path / "mine.jsonl").write_text('{"id": "m1", "domain": "math", "prompt": "1 + 1?", "answer": "2", "split": "heldout"}\n')
    cfg = load_config_text("rl_tasks:\n  - {domain: mine, pack: mine.jsonl, weight: 1}\n", base_dir=tmp_path)
    assert cfg.rl_tasks[0].domain == "mine"


def test_missing_pack(tmp_path):
    (line,) = errors("rl_tasks:\n  - domain: mine\n    pack: packs/none.jsonl\n    weight: 1\n", base_dir=tmp_path)
    assert line == f"run.yaml:3: rl_tasks[0].pack: got 'packs/none.jsonl'; no such file (looked for {tmp_path.resolve() / 'packs/none.jsonl'})"


def test_pack_resolves_against_the_run_file_directory(tmp_path, monkeypatch):
    (tmp_path / "packs").mkdir()
    (tmp_path / "packs" / "mine.jsonl").write_text('{"id": "m1", "domain": "math", "prompt": "1 + 1?", "answer": "2", "split": "heldout"}\n')
    (tmp_path / "run.yaml").write_text("rl_tasks:\n  - {domain: mine, pack: packs/mine.jsonl, weight: 1}\n")
    monkeypatch.chdir("/")
    cfg = load_config(tmp_path / "run.yaml")
    assert cfg.rl_tasks[0].pack == str((tmp_path / "packs" / "mine.jsonl").resolve())


def test_minibatches_must_divide_the_batch():
    assert errors(GOOD + "trainer:\n  prompts_per_step: 4\n  group_size: 3\n  minibatches: 5\n") == [
        "run.yaml:8: trainer.minibatches: got 5; must divide prompts_per_step * group_size = 4 * 3 = 12 (one of 1, 2, 3, 4, 6, 12)"
    ]


def test_yaml_syntax_error_has_the_line():
    (line,) = errors("rl_tasks:\n  - domain: math\n   weight: 1\n")
    assert line.startswith("run.yaml:3: YAML syntax error: ")
    (line,) = errors("rl_tasks:\n\t- domain: math\n")
    assert line.startswith("run.yaml:2: YAML syntax error: ") and line.endswith("not tabs")


def test_top_level_must_be_a_mapping():
    (line,) = errors("- domain: math\n")
    assert line.startswith("run.yaml:1: the top level must be a mapping") and line.endswith("got a list")
    (line,) = errors("# nothing here\n")
    assert line.startswith("run.yaml: empty run file")


def test_duplicate_yaml_key():
    lines = errors(GOOD + "trainer:\n  lr: 0.1\n  lr: 0.2\n")
    assert lines == ["run.yaml:7: trainer.lr: duplicate key; first given at line 6, and only the last value would count"]


def test_all_problems_are_reported_together_in_line_order():
    text = """\
        seed: x
        rl_tasks:
          - domain: math
            weight: -1
        engine:
          backend: vlm
        trainer:
          lrr: 1
          minibatches: 3
        """
    lines = errors(text)
    assert [line.split(": ")[0:2] for line in lines] == [
        ["run.yaml:1", "seed"],
        ["run.yaml:4", "rl_tasks[0].weight"],
        ["run.yaml:6", "engine.backend"],
        ["run.yaml:8", "trainer.lrr"],
        ["run.yaml:9", "trainer.minibatches"],
    ]


def test_file_not_found(tmp_path):
    with pytest.raises(ConfigError, match="run file not found"):
        load_config(tmp_path / "nope.yaml")


def test_errors_in_configs_built_in_python():
    with pytest.raises(ValidationError, match="rl_tasks\\[0\\].reward: got 'nope'"):
        RunConfig(rl_tasks=[{"domain": "math", "weight": 1, "reward": "nope"}])
    with pytest.raises(ValidationError, match="extra"):
        RunConfig(rl_tasks=[{"domain": "math", "weight": 1}], trainer={"lrr": 1})


def test_to_yaml_round_trips(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"id": "m1", "domain": "math", "prompt": "1 + 1?", "answer": "2", "split": "heldout"}\n')
    text = """\
        name: rt
        seed: 3
        rl_tasks:
          - {domain: math, reward: answer_verify, weight: 2.5, kl_coef: 0.01}
          - {domain: mine, pack: p.jsonl, weight: 1, max_tokens: 64}
        model: {dtype: bfloat16}
        engine: {top_p: 0.9, top_k: 20}
        trainer: {lr: 3.0e-6, max_minutes: 1.5, minibatches: 4, overlong: penalty}
        eval: {every: 0, max_tokens: 128}
        """
    cfg = load_config_text(textwrap.dedent(text), base_dir=tmp_path)
    written = cfg.to_yaml()
    for field in ("run_dir: null", "checkpoint_every: 25", "drop_zero_variance: true", "heldout_per_domain: 200"):
        assert field in written
    assert load_config_text(written) == cfg
    assert load_config_text(default_config().to_yaml()) == default_config()


def test_options_of_a_built_in_domain_choose_its_levels(tmp_path):
    from polyrl.train.setup import build_domains

    cfg = load_config_text("rl_tasks:\n  - {domain: math, weight: 1, options: {levels: [1, 2], weights: [3, 1]}}\n")
    source = build_domains(cfg, verifiers=False).specs["math"].source
    assert {t.difficulty for t in source.sample("train", 60, seed=0)} == {1, 2}
    assert {t.difficulty for t in source.sample("heldout", 60, seed=0)} == {1, 2}
    assert errors("rl_tasks:\n  - {domain: math, weight: 1, options: {level: [1]}}\n") == [
        "run.yaml:2: rl_tasks[0].options.level: unknown option of the math domain; it takes levels, weights; "
        "did you mean 'levels'?"]
    assert errors("rl_tasks:\n  - {domain: math, weight: 1, options: {levels: [1, 5]}}\n") == [
        "run.yaml:2: rl_tasks[0].options: math levels must be a non-empty subset of (1, 2, 3, 4), got [1, 5]"]
    (tmp_path / "p.jsonl").write_text('{"id": "a", "domain": "math", "prompt": "1+1?", "answer": "2", "split": "heldout"}\n')
    (line,) = errors("rl_tasks:\n  - {domain: mine, pack: p.jsonl, weight: 1, options: {levels: [1]}}\n",
                     base_dir=tmp_path)
    assert line.endswith("rl_tasks[0].options: options are for built-in domains; a pack's tasks are the ones in its file")
