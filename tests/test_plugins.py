"""Domains and verifiers from installed packages (polyrl/plugins.py, docs/plugins.md).

The example package (docs/plugin-example) is installed with pip into a temporary folder
and used from a fresh process, as a user would: audited, validated and trained two steps.
The other tests make packages by hand (a dist-info folder with entry_points.txt on
sys.path is what importlib.metadata reads) to check the rules: a built-in name wins, a
broken plugin is one line, unknown names list the plugins.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from polyrl.config import ConfigError, load_config_text
from polyrl.domains import registry as domains
from polyrl.plugins import PluginError
from polyrl.rewards import registry as rewards
from polyrl.types import Task

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "plugin-example"


# ------------------------------------------------------------------ packages made by hand

def fake_package(site: Path, name: str, entry_points: dict[str, dict[str, str]], modules: dict[str, str]) -> None:
    """A package as pip would leave it: modules, and a dist-info folder with the entry points."""
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for group, eps in entry_points.items()))
    for module, source in modules.items():
        (site / f"{module}.py").write_text(source)


GOOD_MODULE = '''
from polyrl.types import Score, Task

class ShoutDomain:
    name = "shout"
    default_verifier = "upper_match"

    def __init__(self, word: str = "hi"):
        self.word = word

    def sample(self, split, n, seed):
        return [Task(id=f"shout-{split}-{seed}-{i}", domain=self.name, prompt=f"Shout {self.word}", answer=self.word.upper(),
                     split=split) for i in range(n)]

class LastLine:
    """Takes the last line: the audit must catch that a hedged answer pays."""
    name = "upper_match"

    def __init__(self):
        pass

    def score(self, tasks, responses):
        return [Score(float(r.strip().splitlines()[-1:] == [t.answer]) if r.strip() else 0.0, {}) for t, r in zip(tasks, responses)]

    @staticmethod
    def reference(task):
        return task.answer

    def close(self):
        pass
'''


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on sys.path for hand-made packages; the registries rediscover before and after."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    for plugins in (domains.PLUGINS, rewards.PLUGINS):
        plugins.refresh()
    yield folder
    for module in [m for m in sys.modules if m.split(".")[0] in ("shout_plugin", "other_plugin", "broken_plugin")]:
        del sys.modules[module]
    for plugins in (domains.PLUGINS, rewards.PLUGINS):
        plugins.refresh()


def test_a_plugin_domain_and_verifier_are_found_listed_and_built(site):
    fake_package(site, "shout-plugin", {"polyrl.domains": {"shout": "shout_plugin:ShoutDomain"},
                                        "polyrl.rewards": {"upper_match": "shout_plugin:LastLine"}},
                 {"shout_plugin": GOOD_MODULE})
    assert "shout" in domains.available_domains() and "math" in domains.available_domains()
    assert "upper_match" in rewards.available_verifiers()
    domain = domains.get_domain("shout", word="hey")
    assert domain.sample("train", 1, 0)[0].answer == "HEY"
    assert rewards.get_verifier("upper_match").score([domain.sample("train", 1, 0)[0]], ["x\nHEY"])[0].value == 1.0
    with pytest.raises(domains.UnknownDomain, match=r"unknown domain 'shuot'; available: .*math.*shout"):
        domains.get_domain("shuot")
    with pytest.raises(rewards.UnknownVerifier, match=r"available: .*answer_verify.*upper_match"):
        rewards.get_verifier("upper")


def test_a_built_in_name_wins_and_the_plugin_is_ignored_with_a_warning(site):
    fake_package(site, "shout-plugin", {"polyrl.domains": {"math": "shout_plugin:ShoutDomain"}},
                 {"shout_plugin": GOOD_MODULE})
    with pytest.warns(UserWarning, match=r"plugin domain 'math' from package shout-plugin 0.1 .* is ignored: "
                                         r"a built-in domain has that name"):
        names = domains.available_domains()
    assert names.count("math") == 1
    assert type(domains.get_domain("math")).__name__ == "MathDomain"
    assert "shout_plugin" not in sys.modules


def test_a_plugin_that_fails_to_import_is_one_line_naming_package_and_entry_point(site):
    fake_package(site, "broken-plugin", {"polyrl.domains": {"broken": "broken_plugin:Domain"},
                                         "polyrl.rewards": {"missing": "broken_plugin_nowhere:Verifier"}},
                 {"broken_plugin": "import not_a_module_anywhere\n"})
    assert "broken" in domains.available_domains()  # listing reads metadata only, imports nothing
    with pytest.raises(PluginError) as err:
        domains.domain_class("broken")
    message = str(err.value)
    assert message == ("plugin domain 'broken' from package broken-plugin 0.1 (entry point broken = broken_plugin:Domain "
                       "in group polyrl.domains) failed to import: ModuleNotFoundError: No module named "
                       "'not_a_module_anywhere'")
    with pytest.raises(PluginError, match=r"^plugin verifier 'missing' from package broken-plugin 0.1 .*"
                                          r"ModuleNotFoundError"):
        rewards.verifier_class("missing")
    # the run file names the domain and the reward: both are errors on their own lines
    with pytest.raises(ConfigError) as config_err:
        load_config_text("rl_tasks:\n  - domain: broken\n    reward: missing\n    weight: 1\n", source="run.yaml")
    lines = str(config_err.value).splitlines()
    assert any(line.startswith("run.yaml:2: rl_tasks[0].domain: plugin domain 'broken'") for line in lines), lines
    assert any(line.startswith("run.yaml:3: rl_tasks[0].reward: plugin verifier 'missing'") for line in lines), lines


def test_two_packages_with_one_name_is_an_error_naming_both(site):
    for name in ("shout-plugin", "other-plugin"):
        module = name.replace("-", "_")
        fake_package(site, name, {"polyrl.domains": {"shout": f"{module}:ShoutDomain"}}, {module: GOOD_MODULE})
    with pytest.raises(PluginError, match=r"^plugin domain 'shout' is registered by more than one package: ") as err:
        domains.domain_class("shout")
    assert "shout-plugin 0.1 (shout_plugin:ShoutDomain)" in str(err.value)
    assert "other-plugin 0.1 (other_plugin:ShoutDomain)" in str(err.value)


def test_an_entry_point_named_unlike_its_class_is_a_run_file_error(site):
    fake_package(site, "shout-plugin", {"polyrl.domains": {"yell": "shout_plugin:ShoutDomain"}},
                 {"shout_plugin": GOOD_MODULE})
    with pytest.raises(ConfigError, match=r"run.yaml:2: rl_tasks\[0\].domain: got 'yell'; the plugin's class names "
                                          r"itself 'shout'"):
        load_config_text("rl_tasks:\n  - domain: yell\n    weight: 1\n", source="run.yaml")


def test_unknown_names_in_a_run_file_list_the_plugins(site):
    fake_package(site, "shout-plugin", {"polyrl.domains": {"shout": "shout_plugin:ShoutDomain"},
                                        "polyrl.rewards": {"upper_match": "shout_plugin:LastLine"}},
                 {"shout_plugin": GOOD_MODULE})
    with pytest.raises(ConfigError) as err:
        load_config_text("rl_tasks:\n  - domain: shuot\n    reward: upper_mach\n", source="run.yaml")
    text = str(err.value)
    assert "must be a built-in or plugin domain (" in text and "shout" in text and "did you mean 'shout'?" in text
    assert "did you mean 'upper_match'?" in text
    cfg = load_config_text("rl_tasks:\n  - domain: shout\n    reward: upper_match\n    weight: 1\n    options: {word: yo}\n")
    assert cfg.rl_tasks[0].domain == "shout"
    with pytest.raises(ConfigError, match=r"unknown option of the shout domain; it takes word"):
        load_config_text("rl_tasks:\n  - domain: shout\n    weight: 1\n    options: {wrod: yo}\n")
    with pytest.raises(ConfigError, match=r"reward_options.strict: unknown option of upper_match; it takes none"):
        load_config_text("rl_tasks:\n  - domain: shout\n    weight: 1\n    reward_options: {strict: true}\n")


def test_the_audit_probes_a_plugin_verifier_through_its_reference(site):
    """LastLine pays a hedged answer (a wrong line, then the right one): the exploit probe fails."""
    from polyrl.quality.audit import AuditOptions, audit_tasks

    fake_package(site, "shout-plugin", {"polyrl.rewards": {"upper_match": "shout_plugin:LastLine"}},
                 {"shout_plugin": GOOD_MODULE})
    tasks = [Task(id=f"t{i}", domain="shout", prompt=f"Shout {w}", answer=w.upper(), verifier="upper_match")
             for i, w in enumerate(["hi", "yo"])]
    result = audit_tasks(list(enumerate(tasks, 1)), [], "test", options=AuditOptions(repeats=1), progress=None)
    findings = {(f.check, f.severity) for a in result.tasks for f in a.findings}
    assert ("exploit", "fail") in findings and result.failed
    assert result.tally["exploit"] == [0, 2]


def test_a_plugin_domain_with_tools_rolls_out_as_agent_episodes(site):
    """The same path as the built-in agent domain: a `toolbox(task)` makes an AgentSpec."""
    from polyrl.agent.tools import ToolBox
    from polyrl.train.setup import build_domains

    tools = GOOD_MODULE + '''
from polyrl.agent.tools import ToolBox

class ToolShout(ShoutDomain):
    name = "toolshout"

    @staticmethod
    def toolbox(task):
        return ToolBox([])
'''
    fake_package(site, "shout-plugin", {"polyrl.domains": {"toolshout": "shout_plugin:ToolShout"},
                                        "polyrl.rewards": {"upper_match": "shout_plugin:LastLine"}},
                 {"shout_plugin": tools})
    cfg = load_config_text("rl_tasks:\n  - domain: toolshout\n    weight: 1\n    max_steps: 3\n")
    built = build_domains(cfg)
    try:
        spec = built.specs["toolshout"]
        assert spec.agent is not None and spec.agent.max_steps == 3 and spec.verifier == "upper_match"
        assert isinstance(spec.agent.toolbox_for(spec.source.sample("train", 1, 0)[0]), ToolBox)
    finally:
        built.close()


# ------------------------------------------------------------------ the example package, installed with pip

@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """docs/plugin-example installed with pip into a folder (copied first: a build writes beside the sources)."""
    work = tmp_path_factory.mktemp("example")
    shutil.copytree(EXAMPLE, work / "src", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    target = work / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target), str(work / "src")], check=True, capture_output=True)
    assert (target / "polyrl_wordops-0.1.0.dist-info" / "entry_points.txt").is_file()
    return target


def polyrl_cli(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])}
    return subprocess.run([sys.executable, "-c", "import sys; from polyrl.cli import main; sys.exit(main())", *args],
                          env=env, cwd=cwd, capture_output=True, text=True)


def test_the_example_package_is_audited_like_a_built_in_domain(installed, tmp_path):
    done = polyrl_cli(installed, "audit", "--domain", "wordops", "--n", "20", "--json", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["summary"]["fail"] == 0 and report["summary"]["warn"] == 0
    probes = report["summary"]["probes"]
    assert probes["exploit"]["held"] == probes["exploit"]["total"] > 0


def test_the_example_run_file_validates_and_trains_two_steps(installed, tmp_path):
    from tests.helpers import random_model_dir

    model = random_model_dir(tmp_path / "model")
    run_file = (EXAMPLE / "wordops.yaml").read_text()
    run_file = run_file.replace("path: builtin:tiny", f"path: {model}")
    for key, value in (("steps", 2), ("prompts_per_step", 4), ("heldout_per_domain", 4), ("every", 2),
                       ("checkpoint_every", 2)):
        run_file = "\n".join(line if not line.strip().startswith(f"{key}:") else
                             f"{line[:len(line) - len(line.lstrip())]}{key}: {value}" for line in run_file.splitlines())
    (tmp_path / "run.yaml").write_text(run_file + "\nengine:\n  max_tokens: 12\n")
    done = polyrl_cli(installed, "train", "run.yaml", "--run-dir", "run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]
    assert {"wordops", "wordtools", "math"} <= set(metrics[0]["domains"])
    trajectories = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    assert any(t["domain"] == "wordops" and t["details"].get("status") in ("no_answer", "wrong", "correct")
               for t in trajectories)
    assert any(t["domain"] == "wordtools" for t in trajectories)  # the plugin's tools' episodes
