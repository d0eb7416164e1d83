"""Hostile run files: each is refused at load with one line naming the file, line and field,
quickly, before anything is built."""

import json
import textwrap
import time

import pytest

from polyrl.config import ConfigError, RunConfig, load_config_text
from tests.helpers import random_model_dir

GOOD = "rl_tasks:\n  - domain: math\n    weight: 1.0\n"


def errors(text: str, **kwargs) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config_text(textwrap.dedent(text), source="run.yaml", **kwargs)
    return str(info.value).splitlines()


def one_error(text: str, **kwargs) -> str:
    lines = errors(text, **kwargs)
    assert len(lines) == 1, lines
    return lines[0]


# ---------------------------------------------------------------------------- domain and reward must fit


@pytest.mark.parametrize("domain,reward,fits", [
    ("math", "unit_test_pass", "answer_verify or preference_model"),
    ("code", "answer_verify", "unit_test_pass or preference_model"),
    ("agent", "answer_verify", "success_minus_cost"),
    ("math", "success_minus_cost", "answer_verify or preference_model"),
    ("code", "rule_check", "unit_test_pass or preference_model"),
])
def test_reward_that_cannot_grade_the_domain(domain, reward, fits):
    line = one_error(f"rl_tasks:\n  - domain: {domain}\n    reward: {reward}\n    weight: 1\n")
    assert line.startswith(f"run.yaml:3: rl_tasks[0].reward: got '{reward}'; it cannot grade {domain} tasks")
    assert line.endswith(f"for {domain} use {fits}")


def test_check_that_cannot_grade_the_domain():
    line = one_error("rl_tasks:\n  - domain: code\n    check: answer_verify\n    weight: 1\n")
    assert line.startswith("run.yaml:3: rl_tasks[0].check: got 'answer_verify'; it cannot grade code tasks")


def test_fitting_rewards_load():
    text = ("rl_tasks:\n  - {domain: math, reward: answer_verify, weight: 1}\n"
            "  - {domain: code, reward: unit_test_pass, weight: 1}\n"
            "  - {domain: agent, reward: success_minus_cost, weight: 1}\n")
    assert len(load_config_text(text).rl_tasks) == 3


def test_unknown_reward_option():
    line = one_error("rl_tasks:\n  - domain: agent\n    reward: success_minus_cost\n    weight: 1\n"
                     "    reward_options: {alpha: 0.1, betta: 1.0}\n")
    assert line.startswith("run.yaml:5: rl_tasks[0].reward_options.betta: unknown option of success_minus_cost;")
    assert "did you mean 'beta'?" in line


def test_python_built_configs_are_checked_too():
    with pytest.raises(ValueError, match="cannot grade math tasks"):
        RunConfig(rl_tasks=[{"domain": "math", "weight": 1, "reward": "unit_test_pass"}])


# ---------------------------------------------------------------------------- numbers: finite, in range


@pytest.mark.parametrize("field,value,expected", [
    ("trainer.lr", "1.0e999", "got '1.0e999'; must be a finite number > 0 and <= 1"),  # a string to YAML 1.1
    ("trainer.lr", "1.0e+999", "got inf; must be a finite number > 0 and <= 1"),
    ("trainer.lr", ".nan", "got nan; must be a finite number > 0 and <= 1"),
    ("trainer.lr", "-.inf", "got -inf; must be a finite number > 0 and <= 1"),
    ("trainer.lr", "5.0", "got 5.0; must be > 0 and <= 1"),
    ("trainer.prompts_per_step", "1000000000", "got 1000000000; must be > 0 and <= 65536"),
    ("trainer.max_minutes", ".inf", "got inf; must be a finite number > 0 and <= 10**7"),
    ("engine.temperature", "1.0e+400", "got inf; must be a finite number > 0 and <= 100"),
    ("engine.max_tokens", "99999999999", "got 99999999999; must be > 0 and <= 2**20"),
])
def test_numbers_out_of_range(field, value, expected):
    section, key = field.split(".")
    line = one_error(GOOD + f"{section}:\n  {key}: {value}\n")
    assert line == f"run.yaml:5: {field}: {expected}"


def test_absurd_kv_cache():
    line = one_error(GOOD + "engine:\n  native:\n    kv_cache_mb: 104857600\n")  # 100 TB
    assert line == "run.yaml:6: engine.native.kv_cache_mb: got 104857600; must be > 0 and <= 2**20"
    line = one_error(GOOD + "engine:\n  native:\n    num_blocks: 10000000000\n")
    assert line.startswith("run.yaml:6: engine.native.num_blocks: got 10000000000; must be > 0 and <= 2**24")


def test_batch_of_too_many_samples():
    line = one_error(GOOD + "trainer:\n  prompts_per_step: 65536\n  group_size: 4096\n")
    assert line.startswith("run.yaml:5: trainer.prompts_per_step: got 65536; prompts_per_step * group_size")


def test_integer_of_thousands_of_digits():
    line = one_error(GOOD + "trainer:\n  steps: " + "9" * 5000 + "\n")
    assert line == "run.yaml:5: refused: an integer of 5000 characters; no setting needs more than 64"


def test_long_integer_below_the_literal_limit_is_shown_short():
    line = one_error(GOOD + "seed: " + "9" * 60 + "\n")
    assert line.startswith("run.yaml:4: seed: got 999") and "<" in line and len(line) < 200


def test_huge_sexagesimal_integer_is_bounded():
    line = one_error(GOOD + "seed: " + ":".join(["59"] * 21) + "\n")
    assert "seed:" in line and len(line) < 200


# ---------------------------------------------------------------------------- YAML that would hang or overflow


BOMB = """\
a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
rl_tasks: [{domain: math, weight: 1, reward_options: {x: *i}}]
"""


def test_alias_bomb_is_refused_quickly():
    start = time.perf_counter()
    line = one_error(BOMB)
    assert time.perf_counter() - start < 2
    assert line.startswith("run.yaml:") and "refused: more than 100,000 values once its aliases are expanded" in line


@pytest.mark.parametrize("text", ["a: &a [*a]\nrl_tasks: []\n", "a: &a {b: *a}\n", "&a [1, *a]\n"])
def test_recursive_alias_is_refused(text):
    line = one_error(text)
    assert line.startswith("run.yaml:") and "refused: a recursive alias" in line


def test_deep_nesting_is_refused():
    assert "refused: nested more than 64 levels deep" in one_error("a: " + "[" * 100 + "]" * 100 + "\n")
    assert one_error("a: " + "[" * 50000 + "]" * 50000 + "\n").startswith("run.yaml")


def test_aliases_within_reason_still_work():
    text = GOOD + "trainer: &t {steps: 3}\n" + "name: x\n"
    assert load_config_text(text).trainer.steps == 3


def test_bad_timestamp_is_an_error_not_a_traceback():
    assert "cannot read a value" in one_error(GOOD + "name: 2024-13-45\n")


def test_huge_run_file():
    assert "run files are settings" in one_error(GOOD + "#" + "x" * (1 << 20) + "\n")


# ---------------------------------------------------------------------------- model and packs, checked at load


def test_model_path_that_is_not_a_model(tmp_path):
    line = one_error(GOOD + f"model:\n  path: {tmp_path / 'absent'}\n")
    assert line.startswith(f"run.yaml:5: model.path: got '{tmp_path / 'absent'}'; no such directory")
    (tmp_path / "empty").mkdir()
    line = one_error(GOOD + f"model:\n  path: {tmp_path / 'empty'}\n")
    assert "not a Hugging Face model directory" in line and "config.json" in line
    (tmp_path / "file").write_text("x")
    assert "a file, not a model directory" in one_error(GOOD + f"model:\n  path: {tmp_path / 'file'}\n")
    assert "no such built-in model" in one_error(GOOD + "model:\n  path: builtin:nope\n")


def test_model_directory_loads(tmp_path):
    model = random_model_dir(tmp_path / "m")
    assert load_config_text(GOOD + f"model:\n  path: {model}\n").model.path == str(model)


def _pack(tmp_path, lines) -> str:
    path = tmp_path / "p.jsonl"
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return str(path)


MATH = {"id": "m1", "domain": "math", "prompt": "1 + 1?", "answer": "2", "split": "heldout"}


def test_pack_with_a_malformed_line(tmp_path):
    path = _pack(tmp_path, [MATH, "{not json", {**MATH, "id": "m3", "answer": None}])
    line = one_error(f"rl_tasks:\n  - domain: mine\n    pack: {path}\n    weight: 1\n")
    assert line.startswith(f"run.yaml:3: rl_tasks[0].pack: {path}:2: not valid JSON")
    assert line.endswith(f"(and 1 more malformed lines); `polyrl audit {path}` lists them all")


def test_pack_without_heldout_tasks(tmp_path):
    path = _pack(tmp_path, [{**MATH, "split": "train"}])
    line = one_error(f"rl_tasks:\n  - domain: mine\n    pack: {path}\n    weight: 1\n")
    assert line.startswith(f"run.yaml:3: rl_tasks[0].pack: {path} has no held-out tasks")


def test_empty_pack(tmp_path):
    path = _pack(tmp_path, [])
    assert one_error(f"rl_tasks:\n  - {{domain: mine, pack: {path}, weight: 1}}\n").endswith("is empty: a pack has one task per line")


def test_pack_whose_tasks_the_reward_cannot_grade(tmp_path):
    path = _pack(tmp_path, [MATH])
    line = one_error(f"rl_tasks:\n  - domain: mine\n    pack: {path}\n    reward: unit_test_pass\n    weight: 1\n")
    assert line == (f"run.yaml:4: rl_tasks[0].reward: {path}:1 (task 'm1'): unit_test_pass grades code tasks "
                    "(entry_point with tests or test); this task has none")


def test_pack_with_deeply_nested_and_huge_lines(tmp_path):
    path = _pack(tmp_path, [MATH, '{"id": "d", "x": ' + "[" * 5000 + "]" * 5000 + "}",
                            '{"id": "n", "answer": ' + "9" * 5000 + "}"])
    line = one_error(f"rl_tasks:\n  - {{domain: mine, pack: {path}, weight: 1}}\n")
    assert f"{path}:2: not readable: JSON nested more than 100 levels deep" in line
