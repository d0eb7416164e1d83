"""kill -9 at random moments of a real training run, again and again, then resume: the run
ends with the metrics, trajectories and evaluations of a run never interrupted, apart from
timings. Each kill lands inside a write of the run directory or
between writes, chosen by a seeded random draw, in a child process that dies by SIGKILL."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from polyrl.config import load_config_text
from polyrl.rewards import registry
from polyrl.train.loop import train
from tests.helpers import random_model_dir

STEPS = 4

CONFIG = """
seed: 5
rl_tasks:
  - {{domain: math, reward: length_parity, weight: 1.0}}
model: {{path: {model}}}
engine: {{max_tokens: 8}}
trainer: {{steps: {steps}, prompts_per_step: 2, group_size: 2, lr: 1.0e-3, overlong: none, checkpoint_every: 100}}
eval: {{every: 2, heldout_per_domain: 2, samples: 1, greedy: false}}
"""

# The child: trains, and SIGKILLs itself at the `kill_at`-th write of the run directory, either
# before the write, or after writing only part of its bytes (a torn line).
CHILD = r"""
import os, random, signal, sys
from polyrl.rewards import registry
registry._VERIFIERS["length_parity"] = "tests.helpers:ParityVerifier"
from polyrl.config import load_config
from polyrl.obs import jsonl
from polyrl.train import run_dir as run_dir_module
from polyrl.train.loop import train

run, kill_at, torn, run_file = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
disk_full = sys.argv[3] == "full"  # the kill_at-th write fills the disk part-way instead
writes = [0]
real_append, real_save = jsonl.append_lines, run_dir_module.RunDir.save_state

class FullOs:  # os, with a disk that fills up after a few bytes of the next write
    def write(self, fd, data):
        os.write(fd, bytes(data[:7]))
        raise OSError(28, "No space left on device")

    def __getattr__(self, name):
        return getattr(os, name)

def append_lines(path, lines):
    writes[0] += 1
    if writes[0] == kill_at and disk_full:
        jsonl.os = FullOs()
        try:
            return real_append(path, lines)
        finally:
            jsonl.os = os
    if writes[0] == kill_at:
        if torn and lines:
            data = ("\n".join(lines)).encode()
            with open(path, "ab") as f:
                f.write(data[: max(1, len(data) // 2)])
        os.kill(os.getpid(), signal.SIGKILL)
    real_append(path, lines)

def save_state(self, state):
    writes[0] += 1
    if writes[0] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    real_save(self, state)

run_dir_module.append_lines = append_lines
run_dir_module.RunDir.save_state = save_state
cfg = load_config(run_file)
train(cfg, run, resume=os.path.exists(os.path.join(run, "state", "state.pt")), log=lambda *_: None)
"""


def comparable(path: Path, name: str) -> list[dict]:
    out = []
    for line in (path / name).read_text().splitlines():
        record = json.loads(line)
        for key in ("time", "tokens_per_s", "step_time", "clock", "pipeline"):  # timings
            record.pop(key, None)
        out.append(record)
    return out


@pytest.fixture
def parity_reward(monkeypatch):
    monkeypatch.setitem(registry._VERIFIERS, "length_parity", "tests.helpers:ParityVerifier")


def test_kill_9_at_random_moments_then_resume_equals_a_straight_run(tmp_path, parity_reward):
    model = random_model_dir(tmp_path / "model")
    (tmp_path / "run.yaml").write_text(CONFIG.format(model=model, steps=STEPS))
    cfg = load_config_text(CONFIG.format(model=model, steps=STEPS))
    train(cfg, tmp_path / "straight", log=lambda *_: None)

    run = tmp_path / "killed"
    rng = random.Random(43)  # a draw whose kills include torn metrics and trajectories lines and a save
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    kills, torn_lines = 0, 0
    for attempt in range(12):
        # writes per step: metrics, trajectories, flags, state (4); kill somewhere in the next two steps
        kill_at, torn = rng.randint(1, 9), rng.random() < 0.5
        child = subprocess.run([sys.executable, "-c", CHILD, str(run), str(kill_at), "1" if torn else "0",
                                str(tmp_path / "run.yaml")],
                               env=env, capture_output=True, text=True, timeout=120)
        if child.returncode == 0:
            break
        assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
        kills += 1
        torn_lines += torn and (kill_at - 1) % 4 in (0, 1)  # inside a metrics or trajectories write
    assert kills >= 3 and torn_lines >= 2 and (run / "eval" / "after.json").exists()
    for name in ("metrics.jsonl", "trajectories.jsonl"):
        assert comparable(run, name) == comparable(tmp_path / "straight", name), name
    for name in ("before", "after"):
        assert json.loads((run / "eval" / f"{name}.json").read_text()) == \
            json.loads((tmp_path / "straight" / "eval" / f"{name}.json").read_text())


def test_a_disk_that_fills_mid_run_stops_cleanly_and_resume_equals_a_straight_run(tmp_path, parity_reward):
    """The disk fills inside the trajectories write of step 2: the run stops with a disk-full
    error, the half-written line is taken back, and --resume (space freed) ends where a
    straight run ends."""
    model = random_model_dir(tmp_path / "model")
    (tmp_path / "run.yaml").write_text(CONFIG.format(model=model, steps=STEPS))
    train(load_config_text(CONFIG.format(model=model, steps=STEPS)), tmp_path / "straight", log=lambda *_: None)
    run = tmp_path / "full"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    full = subprocess.run([sys.executable, "-c", CHILD, str(run), str(4 * 2 + 2), "full", str(tmp_path / "run.yaml")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert full.returncode == 1 and "DiskFull" in full.stderr and "--resume" in full.stderr, full.stderr[-2000:]
    assert all(line.endswith("}") for line in (run / "trajectories.jsonl").read_text().splitlines())
    done = subprocess.run([sys.executable, "-c", CHILD, str(run), str(10**6), "0", str(tmp_path / "run.yaml")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    for name in ("metrics.jsonl", "trajectories.jsonl"):
        assert comparable(run, name) == comparable(tmp_path / "straight", name), name
    assert json.loads((run / "eval" / "after.json").read_text()) == \
        json.loads((tmp_path / "straight" / "eval" / "after.json").read_text())


SIDE_LOGS_CONFIG = """
seed: 3
rl_tasks:
  - {{domain: code, reward: unit_test_pass, weight: 1.0}}
  - {{domain: agent, reward: success_minus_cost, weight: 1.0, max_steps: 2}}
model: {{path: {model}}}
engine: {{max_tokens: 12}}
trainer: {{steps: {steps}, prompts_per_step: 2, group_size: 2, lr: 1.0e-3, overlong: none, checkpoint_every: 100}}
eval: {{every: 2, heldout_per_domain: 2, samples: 1, greedy: false}}
"""

TIMING = ("time", "duration", "latency", "seconds", "elapsed")
# What legitimately differs after a resume: the clock, the host's resource use, and the engine's
# prefix cache, which a new process starts cold (so cached and computed prefill tokens move).
UNSTABLE = (*TIMING, "cache", "cached", "prefill", "scheduled_tokens", "cpu_time_s", "max_rss_kb", "wall_time_s",
            "ttft_s", "engine")
NONCE = re.compile(r"^[0-9a-f]{32} ", re.MULTILINE)  # the sandbox harness's per-run token


def stable(value):
    """`value` without the fields named in UNSTABLE, at any depth."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if not any(u in k for u in UNSTABLE)}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def executions(run: Path) -> list[dict]:
    """The execution log without what depends on the clock or the host."""
    out = []
    for line in (run / "executions.jsonl").read_text().splitlines():
        r = json.loads(line)
        out.append({"id": r["id"], "step": r.get("step"), "task_id": r.get("task_id"), "code": r["request"]["code"],
                    "code_blob": r.get("code_blob"), "status": r["result"].get("status"),
                    "stdout": NONCE.sub("", r["result"].get("stdout") or "")})
    return out


def observability(run: Path) -> list[tuple]:
    from polyrl.obs.store import read_records

    return [(r.kind, r.name, r.task_id, r.step,
             stable(dict(sorted(r.attributes.items()))))
            for r in read_records(run)]


def test_kill_9_with_code_and_agent_domains_resumes_every_side_log(tmp_path):
    """The same kind of kill, in a run that writes executions (code in the sandbox) and
    observability records (agent calls and tools): after the resume, the execution log and
    the store hold exactly the straight run's records, ids included, nothing doubled."""
    steps = 4
    model = random_model_dir(tmp_path / "model")
    text = SIDE_LOGS_CONFIG.format(model=model, steps=steps)
    (tmp_path / "run.yaml").write_text(text)
    train(load_config_text(text), tmp_path / "straight", log=lambda *_: None)
    assert executions(tmp_path / "straight") and observability(tmp_path / "straight")

    run = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    for kill_at in (4 * 2 + 2, 10**6):  # inside step 2's trajectories write (torn), then to the end
        child = subprocess.run([sys.executable, "-c", CHILD, str(run), str(kill_at), "1", str(tmp_path / "run.yaml")],
                               env=env, capture_output=True, text=True, timeout=300)
        assert child.returncode == (-signal.SIGKILL if kill_at < 10**6 else 0), child.stderr[-2000:]
    for name in ("metrics.jsonl", "trajectories.jsonl"):
        assert stable(comparable(run, name)) == stable(comparable(tmp_path / "straight", name)), name
    assert executions(run) == executions(tmp_path / "straight")
    assert observability(run) == observability(tmp_path / "straight")
