"""Training with code domains: the built-in one and a user pack under a name of its own,
graded in the sandbox, every execution in the run's log and replayable."""

from __future__ import annotations

import json
import shutil

import pytest

from polyrl.cli import main as cli_main
from polyrl.config import load_config_text
from polyrl.train.loop import train
from tests.helpers import random_model_dir

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing: apt-get install -y bubblewrap")

PACK = [
    {"id": "double", "domain": "code", "prompt": "Write f(x) returning 2 * x.", "entry_point": "f",
     "tests": [{"args": [1], "expected": 2}, {"args": [3], "expected": 6}], "split": "train"},
    {"id": "neg", "domain": "code", "prompt": "Write f(x) returning -x.", "entry_point": "f",
     "tests": [{"args": [1], "expected": -1}], "split": "heldout"},
]


def test_code_and_a_code_pack_train_together(tmp_path, capsys) -> None:
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps(line) + "\n" for line in PACK))
    cfg = load_config_text(f"""
rl_tasks:
  - {{domain: code, weight: 1.0}}
  - {{domain: mine, pack: mine.jsonl, weight: 1.0}}
model: {{path: {random_model_dir(tmp_path / "model")}}}
engine: {{max_tokens: 8}}
trainer: {{steps: 1, prompts_per_step: 2, group_size: 2, checkpoint_every: 5}}
eval: {{every: 0, heldout_per_domain: 2, samples: 1, greedy: false}}
""", base_dir=tmp_path)
    run = tmp_path / "run"
    train(cfg, run, log=lambda *_: None)
    metrics = json.loads((run / "metrics.jsonl").read_text())
    assert set(metrics["domains"]) == {"code", "mine"}
    trajectories = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    assert {t["domain"] for t in trajectories} == {"code", "mine"}
    ids = [t["details"]["execution"] for t in trajectories]
    logged = [json.loads(line) for line in (run / "executions.jsonl").read_text().splitlines()]
    assert set(ids) <= {r["id"] for r in logged}
    assert len(logged) == len(ids) + 2 * 2 * 2  # and 2 held-out tasks of 2 domains, before and after
    assert {r["task_id"] for r in logged} >= {t["task_id"] for t in trajectories}
    capsys.readouterr()
    assert cli_main(["replay", str(run), ids[0], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reproduced"]
