"""The swe domain (domains/swe*.py, rewards/swe_patch.py): generated repositories are
deterministic, planted bugs show on visible and hidden tests, splits never share a
generator seed, tasks round-trip through a pack, the verifier passes the reference and
zeroes empty, test-editing, unapplicable and visible-only patches, every tool works, and
the audit passes."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import pytest

from polyrl.agent.outcome import EpisodeOutcome
from polyrl.agent.tools import ToolCall
from polyrl.config import ConfigError, load_config_text
from polyrl.domains.pack import load_pack, task_line, verifier_for
from polyrl.domains.registry import available_domains, get_domain
from polyrl.domains.swe import SweDomain, seed_split
from polyrl.domains.swe_diff import apply_diff, extract_diff, make_diff, parse_diff
from polyrl.domains.swe_repos import VISIBLE_MODULES, generate
from polyrl.domains.swe_templates import FAMILIES, MODULES
from polyrl.domains.swe_tools import Workspace, toolbox_over
from polyrl.quality.audit import audit_domain
from polyrl.quality.swe_probes import overfit
from polyrl.types import Task

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None,
                                 reason="bubblewrap missing: apt-get install -y bubblewrap")


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    return SweDomain().sample("train", 40, seed=0)


@pytest.fixture(scope="module")
def task(tasks) -> Task:
    return next(t for t in tasks if t.difficulty == 3)


@pytest.fixture(scope="module")
def verifier():
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap missing: apt-get install -y bubblewrap")
    from polyrl.rewards.swe_patch import SwePatch

    v = SwePatch(workers=2)
    yield v
    v.close()


# ------------------------------------------------------------------ generator


def test_sampling_is_a_pure_function_of_split_n_seed(tasks):
    again = SweDomain().sample("train", 40, seed=0)
    assert [t.to_json() for t in again] == [t.to_json() for t in tasks]
    assert {t.id for t in SweDomain().sample("train", 10, seed=1)} != {t.id for t in tasks[:10]}
    assert len({t.id for t in tasks}) == 40


def test_every_family_and_level_is_drawn_and_each_task_has_one_bug(tasks):
    assert set(Counter(t.data["bug_family"] for t in tasks)) == set(FAMILIES)
    assert set(t.difficulty for t in tasks) == {1, 2, 3, 4}
    for t in tasks:
        original, buggy = t.data["original_files"], t.data["files"]
        changed = [p for p in original if original[p] != buggy[p]]
        assert changed == [f"{t.data['package']}/{t.data['bug_site'].split('.')[0]}.py"]
        patched, error = apply_diff(buggy, parse_diff(t.data["reference_patch"])[0])
        assert error is None and patched == original
        shown = {c["target"].split(".")[0] for c in t.data["visible_tests"]}
        assert shown <= set(VISIBLE_MODULES[t.difficulty])
        assert {f"tests/test_{m}.py" for m in shown} == {p for p in buggy if p.startswith("tests/")}
        assert t.data["failing_tests"] and len(t.data["failing_tests"]) < len(t.data["visible_tests"])


def test_every_bug_site_fragment_occurs_once_in_its_module():
    for module in MODULES.values():
        for site in module.sites:
            assert module.source.count(site.old) == 1, (module.name, site)
            assert f"def {site.function}(" in module.source


def test_families_option_restricts_the_bugs_and_rejects_impossible_levels():
    drawn = SweDomain(levels=(3,), families=("wrong_call",)).sample("train", 6, seed=0)
    assert {t.data["bug_family"] for t in drawn} == {"wrong_call"}
    with pytest.raises(ValueError, match="level 1 has no bug site"):
        SweDomain(levels=(1,), families=("wrong_call",))
    with pytest.raises(ValueError, match="families"):
        SweDomain(families=("typo",))


def test_no_visible_test_file_names_a_hidden_case(tasks):
    for t in tasks[:10]:
        text = "\n".join(t.data["files"].values()) + t.prompt
        assert "hidden_" not in text
        assert all(c["name"].startswith("hidden_") for c in t.data["hidden_tests"])


def test_prompt_names_the_failing_test_and_level_4_says_no_more(tasks):
    for t in tasks:
        first = t.data["failing_tests"][0]
        assert f"::{first} fails" in t.prompt and t.data["package"] in t.prompt
        assert ("returned" in t.prompt) == (t.difficulty <= 3)


def test_train_and_heldout_never_share_a_generator_seed(tasks):
    heldout = SweDomain().sample("heldout", 10, seed=0)
    assert {t.data["seed"] for t in heldout}.isdisjoint({t.data["seed"] for t in tasks})
    assert all(seed_split(t.data["seed"], t.difficulty) == t.split for t in tasks + heldout)
    assert [t.id for t in SweDomain().sample("heldout", 10, seed=5)] == [t.id for t in SweDomain().sample(
        "heldout", 10, seed=5)]
    assert generate(heldout[0].data["seed"], heldout[0].difficulty, FAMILIES).buggy == heldout[0].data["files"]


def test_registered():
    assert "swe" in available_domains()
    assert get_domain("swe").default_verifier == "swe_patch"


# ------------------------------------------------------------------ diffs


def test_diff_round_trip_with_new_deleted_and_unterminated_files():
    old = {"a.py": "x = 1\ny = 2\n", "gone.py": "pass\n", "raw.py": "no newline"}
    new = {"a.py": "x = 1\ny = 3\n", "new.py": "print(1)\n", "raw.py": "no newline, still"}
    patches, error = parse_diff(make_diff(old, new))
    assert error is None
    patched, error = apply_diff(old, patches)
    assert error is None
    assert {k: v.rstrip("\n") for k, v in patched.items()} == {k: v.rstrip("\n") for k, v in new.items()}


def test_hunk_at_a_wrong_line_number_applies_where_its_context_is():
    old = {"m.py": "".join(f"line{i}\n" for i in range(30))}
    diff = "--- a/m.py\n+++ b/m.py\n@@ -3,3 +3,3 @@\n line19\n-line20\n+LINE20\n line21\n"
    patched, error = apply_diff(old, parse_diff(diff)[0])
    assert error is None and "LINE20\n" in patched["m.py"] and "line20\n" not in patched["m.py"]


@pytest.mark.parametrize("text, error", [
    ("just prose", "no '--- a/path'"),
    ("--- a/m.py\n+++ b/m.py\n", "without hunks"),
    ("@@ -1 +1 @@\n-a\n+b\n", "before any"),
    ("--- a/../etc/passwd\n+++ b/../etc/passwd\n@@ -1 +1 @@\n-a\n+b\n", "not a relative path"),
])
def test_unreadable_diffs_say_why(text, error):
    patches, why = parse_diff(text)
    assert patches == [] and error in why


def test_the_diff_is_found_in_fenced_and_prose_answers():
    diff = "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a\n+b\n"
    assert extract_diff(f"Here:\n```diff\n{diff}```\nDone.") == diff
    assert extract_diff(f"The fix follows.\n{diff}") == diff
    assert extract_diff("no diff at all") == ""


# ------------------------------------------------------------------ verifier


def _test_path(task: Task) -> str:
    return next(p for p in task.data["files"] if p.startswith("tests/"))


def _cases(task: Task) -> dict[str, tuple[str, str]]:
    files, ref = task.data["files"], task.data["reference_patch"]
    test = _test_path(task)
    package = task.data["package"]
    module = f"{package}/{task.data['bug_site'].split('.')[0]}.py"
    return {
        "reference": (ref, "passed"),
        "reference fenced in prose": (f"Fixed it:\n```diff\n{ref}```", "passed"),
        "empty answer": ("", "no_patch"),
        "a patch changing nothing tested": (make_diff(files, {**files, f"{package}/__init__.py": "# x\n"}), "failed"),
        "deleting a test file": (make_diff(files, {k: v for k, v in files.items() if k != test}), "edits_tests"),
        "editing a test's expectation": (make_diff(files, {**files, test: files[test].replace(
            "assert got == expected", "assert True")}), "edits_tests"),
        "the reference plus a test edit": (ref + make_diff(files, {**files, test: files[test] + "# x\n"}),
                                           "edits_tests"),
        "adding a conftest.py": (make_diff(files, {**files, "conftest.py": "x = 1\n"}), "edits_tests"),
        "a hunk whose context is not in the file": (
            f"--- a/{module}\n+++ b/{module}\n@@ -1,2 +1,2 @@\n def nothing_here():\n-    pass\n+    return 1\n",
            "patch_failed"),
        "a patch to a missing file": ("--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n", "patch_failed"),
        "the package exits on import": (make_diff(files, {**files, module: "raise SystemExit(0)\n" + files[module]}),
                                        "failed"),
        "the fix exits the process": (make_diff(files, {**files, module: files[module].replace(
            "\ndef ", "\ndef _x():\n    pass\n\n\nimport os\nos._exit(0)\n\n\ndef ", 1)}), "failed"),
    }


def test_verifier_table(verifier, task):
    cases = _cases(task)
    scores = verifier.score([task] * len(cases), [c for c, _ in cases.values()])
    got = {name: (s.value, s.details["status"]) for name, s in zip(cases, scores)}
    want = {name: (1.0 if status == "passed" else 0.0, status) for name, (_, status) in cases.items()}
    assert got == want
    reference = scores[0].details
    assert reference["passed"] == reference["total"] == len(task.data["visible_tests"]) + len(task.data["hidden_tests"])
    assert "does not apply" in scores[list(cases).index("a hunk whose context is not in the file")].details["error"]


def test_a_patch_passing_only_the_visible_tests_is_caught_by_the_hidden_ones(verifier, tasks):
    """The special-cased patch returns each visible test's expected value for its arguments:
    every visible test passes, and the hidden tests (other arguments) still fail."""
    for t in tasks[:8]:
        failing = [c for c in t.data["visible_tests"] if c["name"] in t.data["failing_tests"]]
        patch = make_diff(t.data["files"], overfit(t.data["files"], t.data["package"], t.data["visible_tests"],
                                                   failing))
        (score,) = verifier.score([t], [patch])
        visible = [x for x in score.details["tests"] if not x["hidden"]]
        assert score.value == 0.0 and all(x["passed"] for x in visible), t.id
        assert score.details["hidden_failed"] > 0


def test_episode_outcomes_are_graded_by_their_answer(verifier, task):
    ref = task.data["reference_patch"]
    scores = verifier.score([task] * 2, [EpisodeOutcome(f"<patch>\n{ref}"), EpisodeOutcome(None)])
    assert [(s.value, s.details["status"]) for s in scores] == [(1.0, "passed"), (0.0, "no_patch")]


def test_a_task_without_a_repository_is_an_error(verifier):
    with pytest.raises(ValueError, match="swe_patch grades swe tasks"):
        verifier.score([Task("x", "swe", "p")], [""])


def test_pack_round_trip_keeps_every_field_and_the_grade(tmp_path, tasks, verifier):
    chosen = tasks[:4] + SweDomain().sample("heldout", 2, seed=0)
    path = tmp_path / "swe.jsonl"
    path.write_text("".join(json.dumps(task_line(t)) + "\n" for t in chosen))
    loaded = load_pack(path)
    assert loaded.errors == []
    back = [t for _, t in loaded.tasks]
    assert [(t.id, t.prompt, t.split, t.difficulty, t.data) for t in back] == \
        [(t.id, t.prompt, t.split, t.difficulty, t.data) for t in chosen]
    assert {verifier_for(t) for t in back} == {"swe_patch"}
    scores = verifier.score(back, [t.data["reference_patch"] for t in back])
    assert [s.value for s in scores] == [1.0] * len(back)


# ------------------------------------------------------------------ tools


def _call(tools, name: str, **arguments) -> str:
    outcome = tools.run(ToolCall("c", name, arguments))
    return outcome.content if outcome.ok else f"[{outcome.error_type}] {outcome.content}"


@needs_bwrap
def test_each_tool_and_the_diff_it_makes_is_a_winning_answer(verifier, task):
    ws = Workspace(task.data["files"], verifier.backend)
    tools = toolbox_over(ws)
    package = task.data["package"]
    listing = _call(tools, "list_files")
    assert f"{package}/calc.py" in listing and "tests/test_report.py" in listing
    assert _call(tools, "read_file", path=f"{package}/calc.py", start=4, end=4) == "   4| def clamp(value, low, high):"
    assert f"{package}/calc.py:12: def total(values):" in _call(tools, "search", pattern=r"def total\(")
    assert "no match" in _call(tools, "search", pattern="zzz(")  # not a regex: searched literally
    first = task.data["failing_tests"][0]
    before = _call(tools, "run_tests")
    assert f"::{first} - AssertionError" in before and f"{len(task.data['failing_tests'])} failed" in before
    assert _call(tools, "diff") == "no changes yet"
    assert "patch applied" in _call(tools, "apply_patch", patch=task.data["reference_patch"])
    assert "0 failed" in _call(tools, "run_tests")
    assert "passed, 0 failed" in _call(tools, "run_tests", only=first)
    (score,) = verifier.score([task], [_call(tools, "diff")])
    assert score.value == 1.0
    assert _call(tools, "apply_patch", patch=task.data["reference_patch"]).startswith("[ValueError] Error: patch not")


@needs_bwrap
def test_edit_replaces_inserts_and_creates_lines(verifier, task):
    ws = Workspace(task.data["files"], verifier.backend)
    tools = toolbox_over(ws)
    path = f"{task.data['package']}/calc.py"
    assert "replaced by 1 lines" in _call(tools, "edit", path=path, start=1, end=1, text='"""Edited."""')
    assert _call(tools, "read_file", path=path, start=1, end=1) == '   1| """Edited."""'
    _call(tools, "edit", path=path, start=2, end=1, text="X = 1")
    assert ws.files[path].splitlines()[:2] == ['"""Edited."""', "X = 1"]
    assert "replaced" in _call(tools, "edit", path="notes.txt", start=1, end=0, text="hello")
    assert ws.files["notes.txt"] == "hello\n"
    assert "[ValueError]" in _call(tools, "edit", path=path, start=99, end=99, text="x")
    assert "[ValueError]" in _call(tools, "edit", path="../escape.py", start=1, end=0, text="x")
    assert "[ValueError]" in _call(tools, "read_file", path="missing.py")
    assert "[invalid_arguments]" in _call(tools, "edit", path=path)


@needs_bwrap
def test_run_tests_stops_a_hanging_test(verifier, task):
    ws = Workspace(task.data["files"], verifier.backend, run_timeout_s=1.0)
    test = _test_path(task)
    ws.files[test] += "\n\ndef test_zz_hangs():\n    while True:\n        pass\n"
    assert "[tests stopped: timeout" in toolbox_over(ws).run(ToolCall("c", "run_tests", {})).content


# ------------------------------------------------------------------ wiring and audit


def test_run_file_defaults_swe_to_swe_patch_with_tools():
    from polyrl.train.setup import build_domains

    domains = build_domains(load_config_text("rl_tasks:\n  - {domain: swe, weight: 1}\n"), verifiers=False)
    spec = domains.specs["swe"]
    assert spec.verifier == "swe_patch" and spec.agent is not None
    tools = spec.agent.toolbox_for(spec.source.sample("train", 1, seed=0)[0])
    assert [t.name for t in tools] == ["list_files", "read_file", "search", "edit", "apply_patch", "diff", "run_tests"]
    domains.close()
    with pytest.raises(ConfigError, match="for swe use swe_patch"):
        load_config_text("rl_tasks:\n  - {domain: swe, weight: 1, reward: answer_verify}\n")


@needs_bwrap
def test_audit_passes_and_every_probe_scores_as_it_must():
    result = audit_domain("swe", 8, seed=0, progress=None)
    assert [(a.id, a.findings) for a in result.tasks if a.status != "pass"] == []
    assert {group for group in result.tally} == {"exploit", "negative_control", "false_negative"}
    assert all(held == total for held, total in result.tally.values()), result.tally


@needs_bwrap
def test_an_agent_episode_answers_with_the_patch_its_tools_made(verifier, task):
    """Scripted turns: apply the fix, run the tests, print the diff, answer with it; the
    episode's outcome is what swe_patch grades."""
    from polyrl.agent.call_format import format_answer, format_call
    from polyrl.agent.loop import AgentConfig, ModelSlot, run_agent
    from tests.agent_fakes import ScriptedModel

    tools = toolbox_over(Workspace(task.data["files"], verifier.backend))
    turns = [format_call("apply_patch", {"patch": task.data["reference_patch"]}), format_call("run_tests", {}),
             format_call("diff", {}), format_answer(task.data["reference_patch"])]
    episode = run_agent(task.prompt, tools, [ModelSlot(ScriptedModel(turns))],
                            AgentConfig(max_steps=6, result_chars=SweDomain.result_chars))
    assert [r.outcome.ok for r in episode.tool_results] == [True, True, True]
    assert "0 failed" in episode.tool_results[1].outcome.content
    assert episode.tool_results[2].outcome.content == task.data["reference_patch"]
    (score,) = verifier.score([task], [episode.outcome])
    assert score.value == 1.0, score.details


def test_a_pack_of_swe_tasks_rolls_out_with_tools(tmp_path, tasks):
    from polyrl.train.setup import build_domains

    path = tmp_path / "swe.jsonl"
    path.write_text("".join(json.dumps(task_line(t)) + "\n" for t in tasks[:4] + SweDomain().sample("heldout", 1, 0)))
    domains = build_domains(load_config_text(f"rl_tasks:\n  - {{domain: repair, weight: 1, pack: {path}}}\n"),
                            verifiers=False)
    spec = domains.specs["repair"]
    assert spec.verifier == "swe_patch" and spec.agent is not None and spec.agent.result_chars == 4000
    assert "list_files" in [t.name for t in spec.agent.toolbox_for(tasks[0])]
    domains.close()
