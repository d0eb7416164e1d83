"""The code domain: generated tasks (determinism, splits, well-posed examples, references
that pass in the sandbox), the HumanEval pack, and `polyrl pack`."""

from __future__ import annotations

import json
import shutil
from typing import Iterator

import pytest

from polyrl.cli import main as cli_main
from polyrl.domains.code import LEVELS, LIST_OPS, STR_OPS, CodeDomain
from polyrl.domains.humaneval import HumanEvalDomain, humaneval_tasks, pack_lines
from polyrl.domains.pack import hash_split, load_pack
from polyrl.domains.registry import get_domain
from polyrl.rewards.unit_test_pass import UnitTestPass

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing: apt-get install -y bubblewrap")


@pytest.fixture(scope="module")
def verifier() -> Iterator[UnitTestPass]:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap missing: apt-get install -y bubblewrap")
    v = UnitTestPass()
    yield v
    v.close()


def test_sampling_is_deterministic_and_splits_never_meet() -> None:
    domain = get_domain("code")
    train, heldout = domain.sample("train", 300, seed=1), domain.sample("heldout", 100, seed=1)
    assert [t.prompt for t in train] == [t.prompt for t in domain.sample("train", 300, seed=1)]
    assert not {t.prompt for t in train} & {t.prompt for t in heldout}
    assert all(hash_split(t.prompt) == t.split for t in train + heldout)
    assert {t.difficulty for t in train} == set(LEVELS)
    assert len({t.prompt for t in heldout}) == 100


def test_prompts_show_three_calls_and_the_tests_hide_three_more() -> None:
    for task in CodeDomain().sample("train", 80, seed=2):
        tests = task.data["tests"]
        shown = task.prompt.splitlines()[1:]
        assert len(tests) == 6 and len(shown) == 3
        assert all(json.dumps(t["expected"]) in line for t, line in zip(tests, shown))
        hidden_args = [json.dumps(t["args"][0]) for t in tests[3:]]
        assert not any(f"f({a})" in task.prompt for a in hidden_args), task.prompt


@pytest.mark.parametrize("level, ops", [(2, LIST_OPS), (3, STR_OPS)])
def test_the_shown_calls_tell_the_operation_apart(level: int, ops: dict) -> None:
    for task in CodeDomain(levels=(level,)).sample("train", 60, seed=3):
        shown = task.data["tests"][:3]
        matching = [name for name, op in ops.items() if all(op(*t["args"]) == t["expected"] for t in shown)]
        assert matching == [task.data["family"]], task.prompt


@needs_bwrap
def test_every_reference_passes_and_memorised_examples_score_half(verifier: UnitTestPass) -> None:
    tasks = CodeDomain().sample("heldout", 40, seed=4)
    scores = verifier.score(tasks, [CodeDomain.demonstration(t) for t in tasks])
    assert [s.value for s in scores] == [1.0] * len(tasks), [s.details for s in scores if s.value != 1.0][:2]
    for task in tasks[:8]:
        param = task.prompt.split("f(", 1)[1].split(")", 1)[0]
        cases = "".join(f"    if {param} == {t['args'][0]!r}: return {t['expected']!r}\n" for t in task.data["tests"][:3])
        assert verifier.score([task], [f"def f({param}):\n{cases}    return None\n"])[0].value == 0.5


def test_demonstrations_are_fenced_functions() -> None:
    task = CodeDomain(levels=(4,)).sample("train", 1, seed=5)[0]
    demo = CodeDomain.demonstration(task)
    assert demo.startswith("```python\ndef f(x):\n    # f(1) - f(0) = ") and demo.endswith("\n```")


def test_bad_levels_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="non-empty subset"):
        CodeDomain(levels=(9,))
    with pytest.raises(ValueError, match="split must be one of"):
        CodeDomain().sample("test", 1, seed=0)


# ------------------------------------------------------------------------------ HumanEval


def test_humaneval_pack_has_all_164_problems_in_the_design_shape(tmp_path) -> None:
    tasks = humaneval_tasks()
    assert len(tasks) == 164 and len({t.id for t in tasks}) == 164
    path = tmp_path / "he.jsonl"
    assert cli_main(["pack", "humaneval", "-o", str(path)]) == 0
    loaded = load_pack(path)
    assert loaded.errors == [] and len(loaded.tasks) == 164
    line = json.loads(path.read_text().splitlines()[0])
    assert {"id", "domain", "prompt", "entry_point", "test", "reference"} <= set(line) and line["domain"] == "code"
    assert [t.id for _, t in loaded.tasks] == [line["id"] for line in pack_lines()]
    domain = HumanEvalDomain()
    assert {t.domain for t in domain.sample("heldout", 10, seed=0)} == {"humaneval"}


@needs_bwrap
def test_polyrl_score_gives_canonical_solutions_one_and_pass_bodies_zero(tmp_path, capsys) -> None:
    pack = tmp_path / "he.jsonl"
    cli_main(["pack", "humaneval", "-o", str(pack)])
    lines = [json.loads(line) for line in pack.read_text().splitlines()]
    for name, body in (("canonical", None), ("pass", "    pass\n")):
        completions = tmp_path / f"{name}.jsonl"
        completions.write_text("".join(json.dumps({"id": line["id"], "completion": body or line["reference"]}) + "\n"
                                       for line in lines))
        capsys.readouterr()
        assert cli_main(["score", str(pack), "--completions", str(completions), "--json"]) == 0
        rewards = {r["id"]: r["reward"] for r in json.loads(capsys.readouterr().out)["results"]}
        assert len(rewards) == 164
        assert set(rewards.values()) == ({1.0} if body is None else {0.0})


def test_pack_command_writes_generated_domains(tmp_path, capsys) -> None:
    assert cli_main(["pack", "code", "-n", "5", "--split", "train"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 5 and all(line["domain"] == "code" and line["split"] == "train" for line in lines)
    path = tmp_path / "code.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert load_pack(path).errors == []
    assert cli_main(["pack", "nosuch"]) == 2
