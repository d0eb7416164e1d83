"""polyrl audit: every planted defect is caught by its check, clean packs raise no alarm,
the JSON document and exit code follow the contract, difficulty comes from a policy,
and training flags suspicious rewards and honours a quarantine list."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from polyrl.config import load_config_text
from polyrl.domains.registry import get_domain
from polyrl.quality.audit import AuditOptions, audit_domain, audit_pack, audit_tasks
from polyrl.domains.quarantine import QuarantinedDomain, read_quarantine, write_quarantine
from polyrl.train.monitor import RewardMonitor
from polyrl.rollout.groups import Group, SingleTurn
from polyrl.train.setup import build_domains
from polyrl.types import Completion, Score, Task
from tests.audit_packs import BROKEN, CLEAN, MALFORMED_LINE, write_pack

QUIET = dict(progress=None)
POLYRL = str(Path(sys.executable).parent / "polyrl")


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    path = write_pack(tmp_path_factory.mktemp("audit") / "broken.jsonl")
    return path, audit_pack(str(path), **QUIET)


@pytest.mark.parametrize("task_id", sorted(BROKEN))
def test_each_planted_defect_is_caught(broken, task_id):
    _, result = broken
    (audit,) = [a for a in result.tasks if a.id == task_id]
    check, severity = BROKEN[task_id]
    assert audit.status == severity
    assert any(f.check == check and f.severity == severity for f in audit.findings), audit.findings


def test_clean_tasks_of_the_broken_pack_pass(broken):
    _, result = broken
    for task_id in CLEAN:
        (audit,) = [a for a in result.tasks if a.id == task_id]
        assert audit.status == "pass", audit.findings


def test_malformed_line_is_reported_and_the_rest_audited(broken):
    _, result = broken
    (bad,) = [a for a in result.tasks if a.id is None]
    assert bad.line == MALFORMED_LINE and bad.status == "fail"
    assert bad.findings[0].check == "malformed_line"
    assert len(result.tasks) == len(BROKEN) + len(CLEAN) + 1
    assert result.failed


def test_cli_json_document_and_exit_code(broken, tmp_path):
    path, _ = broken
    quarantine = tmp_path / "q.txt"
    run = subprocess.run([POLYRL, "audit", str(path), "--json", "--quiet",
                          "--write-quarantine", str(quarantine)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stderr
    doc = json.loads(run.stdout)  # exactly one document on stdout
    assert set(doc) == {"tasks", "summary"}
    lines = {t["line"]: t for t in doc["tasks"]}
    assert lines[MALFORMED_LINE]["id"] is None and lines[MALFORMED_LINE]["status"] == "fail"
    for t in doc["tasks"]:
        assert t["status"] in ("pass", "warn", "fail")
        assert all({"check", "message"} <= set(f) for f in t["findings"])
    assert doc["summary"]["fail"] == sum(1 for s in BROKEN.values() if s[1] == "fail") + 1
    failing = {t["id"] for t in doc["tasks"] if t["status"] == "fail" and t["id"]}
    assert read_quarantine(quarantine) == failing


def test_unreadable_pack_exits_2(tmp_path):
    run = subprocess.run([POLYRL, "audit", str(tmp_path / "missing.jsonl")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "cannot read" in run.stderr


@pytest.mark.parametrize("domain", ["math", "code"])
def test_clean_built_in_domains_raise_no_alarm(domain):
    result = audit_domain(domain, 16, seed=3, **QUIET)
    assert len(result.tasks) == 16
    assert [(a.id, a.findings) for a in result.tasks if a.status != "pass"] == []
    held = {group: tally for group, tally in result.tally.items() if tally[0] != tally[1]}
    assert held == {}, f"probes that did not score as they must: {held}"


def test_humaneval_sample_has_no_failures():
    """Canonical solutions are solvable and deterministic; weak tests show up as warnings only."""
    result = audit_domain("humaneval", 8, seed=0, **QUIET)
    assert not result.failed, [(a.id, a.findings) for a in result.tasks if a.status == "fail"]
    assert all(f.severity == "warn" and f.check == "mutant" for a in result.tasks for f in a.findings)


class CannedPolicy:
    name = "canned"

    def __init__(self, answers):
        self.answers = answers

    def sample(self, tasks, k):
        return [[self.answers[t.id][j % len(self.answers[t.id])] for j in range(k)] for t in tasks]


def test_difficulty_flags_always_and_never_solved_tasks():
    tasks = [Task(id=f"m{i}", domain="math", prompt=f"What is {i} + {i}?", answer=str(2 * i),
                  verifier="answer_verify") for i in range(1, 4)]
    policy = CannedPolicy({"m1": [r"\boxed{2}"], "m2": [r"\boxed{5}"], "m3": [r"\boxed{6}", r"\boxed{7}"]})
    result = audit_tasks(list(enumerate(tasks, start=1)), [], "canned", policy, AuditOptions(samples=4), None)
    by_id = {a.id: a for a in result.tasks}
    assert by_id["m1"].difficulty["solved"] == 4 and by_id["m1"].has("difficulty")
    assert by_id["m2"].difficulty["solved"] == 0 and by_id["m2"].has("difficulty")
    assert by_id["m3"].difficulty["pass@1"] == pytest.approx(0.5) and not by_id["m3"].has("difficulty")


# ---------------------------------------------------------------------------- during training


def _group(task, texts, values):
    samples = [SingleTurn([1, 2], Completion(0, t, [1], [0.0], "stop", 0)) for t in texts]
    return Group(task, samples, [Score(v) for v in values])


def test_monitor_flags_full_reward_that_fails_the_independent_check():
    task = Task(id="c1", domain="code", prompt="Write f.", verifier="unit_test_pass",
                data={"entry_point": "f", "tests": [{"args": [1], "expected": 2}]})
    honest = "```python\ndef f(x):\n    return 2 * x\n```"
    exploit = "```python\nimport sys\ndef f(x):\n    sys.exit(0)\n```"
    flags = RewardMonitor().step(0, [_group(task, [honest, exploit, exploit], [1.0, 1.0, 0.0])],
                                 {"domains": {"code": {"reward": 0.7}}})
    assert [(f["kind"], f["task_id"], f["sample"]) for f in flags] == [("reward_without_check", "c1", 1)]


def test_monitor_flags_training_reward_rising_while_heldout_does_not():
    monitor = RewardMonitor(window=4, min_points=3)
    flags = []
    for k, reward in enumerate([0.2, 0.4, 0.6, 0.8, 0.9]):
        flags += monitor.step(k, [], {"domains": {"agent": {"reward": reward}}, "eval": {"agent": {"accuracy": 0.3}}})
    assert [(f["kind"], f["domain"]) for f in flags] == [("train_heldout_divergence", "agent")]
    followed = RewardMonitor(window=4, min_points=3)
    quiet = []
    for k, reward in enumerate([0.2, 0.4, 0.6, 0.8, 0.9]):
        quiet += followed.step(k, [], {"domains": {"agent": {"reward": reward}}, "eval": {"agent": {"accuracy": reward}}})
    assert quiet == []


def test_divergence_allows_for_the_heldout_accuracys_sampling_error():
    # The code domain of the quickstart (runs of 2026-12-06): the training reward jumped in the
    # first 80 steps while held-out accuracy over 128 tasks moved within its noise (about 0.04
    # per evaluation), and rose later. Flagged when the accuracy is taken as exact; not flagged
    # when the evaluation's task count says how noisy it is.
    points = [(0.482, 0.592), (0.614, 0.580), (0.614, 0.609)]

    def flags(tasks, points):
        monitor, out = RewardMonitor(), []
        for k, (reward, heldout) in enumerate(points):
            result = {"accuracy": heldout, **({"tasks": tasks} if tasks else {})}
            out += monitor.step(40 * k, [], {"domains": {"code": {"reward": reward}}, "eval": {"code": result}})
        return out

    assert [f["kind"] for f in flags(None, points)] == ["train_heldout_divergence"]
    assert flags(128, points) == []
    # a divergence well beyond that noise is still flagged, and its reason gives the noise
    (flag,) = flags(128, [(0.2, 0.3), (0.4, 0.31), (0.6, 0.29), (0.8, 0.3)])
    assert flag["kind"] == "train_heldout_divergence" and "± 0.0" in flag["reason"]


def test_quarantine_file_leaves_tasks_out_of_training(tmp_path):
    math = get_domain("math")
    drawn = math.sample("train", 6, seed=0)
    write_quarantine(tmp_path / "q.txt", [drawn[0].id, drawn[1].id], "test")
    (tmp_path / "flags.jsonl").write_text(json.dumps({"kind": "reward_without_check", "task_id": drawn[2].id}) + "\n"
                                          + json.dumps({"kind": "train_heldout_divergence", "task_id": None}) + "\n")
    assert read_quarantine(tmp_path / "flags.jsonl") == {drawn[2].id}
    kept = QuarantinedDomain(math, read_quarantine(tmp_path / "q.txt")).sample("train", 6, seed=0)
    assert len(kept) == 6 and not {drawn[0].id, drawn[1].id} & {t.id for t in kept}

    pack = tmp_path / "pack.jsonl"
    pack.write_text("".join(json.dumps({"id": f"p{i}", "domain": "math", "prompt": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                            for i in range(4))
                    + json.dumps({"id": "h", "domain": "math", "prompt": "What is 9 + 1?", "answer": "10",
                                  "split": "heldout"}) + "\n")  # evaluation needs a held-out task
    (tmp_path / "bad.txt").write_text("p1\np3\n")
    cfg = load_config_text("rl_tasks:\n  - {domain: sums, pack: pack.jsonl, quarantine: bad.txt, weight: 1}\n",
                           base_dir=tmp_path)
    doms = build_domains(cfg)
    assert {t.id for t in doms.specs["sums"].source.sample("train", 20, seed=0)} == {"p0", "p2"}


def test_missing_quarantine_file_is_a_config_error(tmp_path):
    (tmp_path / "pack.jsonl").write_text(json.dumps({"id": "a", "domain": "math", "prompt": "1+1?", "answer": "2"}) + "\n")
    with pytest.raises(Exception, match="quarantine: got 'nope.txt'; no such file"):
        load_config_text("rl_tasks:\n  - {domain: sums, pack: pack.jsonl, quarantine: nope.txt, weight: 1}\n",
                         source="run.yaml", base_dir=tmp_path)
