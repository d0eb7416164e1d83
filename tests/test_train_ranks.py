"""`polyrl train` on two trainer processes (FSDP over gloo, train/ranks.py): rank 0 runs the
loop, rank 1 follows its collectives. The same run on one process is the reference."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from polyrl.config import load_config_text
from polyrl.models.hf_io import load_pretrained
from polyrl.rewards import registry
from polyrl.train.loop import train
from tests.helpers import random_model_dir

ROOT = Path(__file__).resolve().parent.parent

RUN = """
seed: 3
rl_tasks:
  - domain: math
    reward: {reward}
    weight: 1
    kl_coef: 0.05
model:
  path: {model}
engine:
  max_tokens: 10
trainer:
  steps: 3
  prompts_per_step: 4
  group_size: 4
  overlong: none
  drop_zero_variance: false
  lr: 1.0e-3
eval:
  every: 0
  heldout_per_domain: 2
  samples: 1
"""

WORKER = textwrap.dedent("""
    import sys
    from polyrl.config import load_config
    from polyrl.rewards import registry
    from polyrl.train.loop import train

    registry._VERIFIERS["length_parity"] = "tests.helpers:ParityVerifier"  # as tests/test_train.py's fixture

    run_file, run_dir, resume, stop_after = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
    train(load_config(run_file), run_dir, resume=resume, stop_after=stop_after or None, log=lambda *_: None)
""")


def launch(tmp: Path, *args: str) -> None:
    """`python -m torch.distributed.run --nproc-per-node 2 ...` (what torchrun runs), checked."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           *args], cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The run on one process; on two (rank 0 leads, rank 1 follows); on two stopped after one
    step and resumed; and the built-in math reward's run through `polyrl train --nproc 2`."""
    tmp = tmp_path_factory.mktemp("ranks")
    model = random_model_dir(tmp / "model")
    run_file = tmp / "run.yaml"
    run_file.write_text(RUN.format(model=model, reward="length_parity"))  # a random model scores it half the time
    (tmp / "worker.py").write_text(WORKER)
    torch.set_num_threads(1)  # as each rank runs
    try:
        registry._VERIFIERS["length_parity"] = "tests.helpers:ParityVerifier"
        train(load_config_text(run_file.read_text()), tmp / "one", log=lambda *_: None)
    finally:
        registry._VERIFIERS.pop("length_parity")
        torch.set_num_threads(os.cpu_count() or 1)
    launch(tmp, "worker.py", str(run_file), str(tmp / "two"), "0", "0")
    launch(tmp, "worker.py", str(run_file), str(tmp / "resumed"), "0", "1")
    stopped = metrics(tmp / "resumed")
    launch(tmp, "worker.py", str(run_file), str(tmp / "resumed"), "1", "0")
    cli_file = tmp / "cli.yaml"
    cli_file.write_text(RUN.format(model=model, reward="answer_verify"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cli = subprocess.run([sys.executable, "-m", "polyrl.cli", "train", str(cli_file), "--nproc", "2",
                          "--run-dir", str(tmp / "cli")], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    again = subprocess.run([sys.executable, "-m", "polyrl.cli", "train", "--resume", str(tmp / "cli"), "--nproc", "2"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return {"tmp": tmp, "stopped": stopped, "cli": cli, "again": again}


def test_two_ranks_take_the_one_process_steps(runs):
    one, two = metrics(runs["tmp"] / "one"), metrics(runs["tmp"] / "two")
    assert [m["step"] for m in two] == [0, 1, 2]
    # The first step's rollouts come from the same weights: the same rewards, and the update
    # split over two ranks gives the one-process loss (tests/test_distributed.py: to 1e-5).
    assert two[0]["domains"]["math"]["reward"] == one[0]["domains"]["math"]["reward"]
    for key in ("loss", "grad_norm"):
        assert two[0][key] == pytest.approx(one[0][key], rel=1e-4, abs=1e-6), key
    assert one[0]["grad_norm"] > 0  # a real update


def test_polyrl_train_nproc_launches_the_ranks(runs):
    """`polyrl train RUN --nproc 2` starts torch's launcher on itself: one run directory,
    written by rank 0, its three steps, its report."""
    cli, run_dir = runs["cli"], runs["tmp"] / "cli"
    assert cli.returncode == 0, cli.stdout[-3000:] + cli.stderr[-3000:]
    assert [m["step"] for m in metrics(run_dir)] == [0, 1, 2]
    assert (run_dir / "report.html").exists() and (run_dir / "checkpoints" / "final").is_dir()


def test_resuming_a_finished_run_on_two_ranks_repeats_nothing(runs):
    """Rank 0 says the run is finished; rank 1 sees the same and ends too (no rank left
    waiting for a collective)."""
    again = runs["again"]
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "already finished" in again.stdout + again.stderr
    assert [m["step"] for m in metrics(runs["tmp"] / "cli")] == [0, 1, 2]


def test_the_checkpoint_holds_the_whole_model(runs):
    """Rank 0 writes the full (gathered) weights, which load as a Hugging Face directory and
    differ from the base model: the ranks' updates are in them."""
    tmp = runs["tmp"]
    final, _ = load_pretrained(tmp / "two" / "checkpoints" / "final")
    base, _ = load_pretrained(tmp / "model")
    one, _ = load_pretrained(tmp / "one" / "checkpoints" / "final")
    changed = [n for n, p in final.state_dict().items() if not torch.equal(p, base.state_dict()[n])]
    assert len(changed) == len(base.state_dict())
    assert set(final.state_dict()) == set(one.state_dict())


def test_a_two_rank_run_resumes_where_it_stopped(runs):
    tmp = runs["tmp"]
    assert [m["step"] for m in runs["stopped"]] == [0]
    resumed, straight = metrics(tmp / "resumed"), metrics(tmp / "two")
    assert [m["step"] for m in resumed] == [0, 1, 2]  # no step lost or done twice
    state = torch.load(tmp / "resumed" / "state" / "state.pt", weights_only=False)
    assert state["world_size"] == 2 and state["step"] == 3
    # The resumed run continued from the saved policy and optimizer: its later steps are
    # those of the uninterrupted two-rank run.
    for a, b in zip(resumed, straight):
        assert a["domains"]["math"]["reward"] == b["domains"]["math"]["reward"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)


def test_a_run_resumes_only_with_the_world_size_it_was_saved_with(runs, tmp_path, monkeypatch):
    monkeypatch.setitem(registry._VERIFIERS, "length_parity", "tests.helpers:ParityVerifier")
    tmp = runs["tmp"]
    run_file = tmp / "run.yaml"
    launch(tmp, "worker.py", str(run_file), str(tmp_path / "stopped"), "0", "1")
    with pytest.raises(RuntimeError, match="saved by 2 trainer process"):
        train(load_config_text(run_file.read_text()), tmp_path / "stopped", resume=True, log=lambda *_: None)


def test_a_rank_0_refusal_ends_the_other_ranks(runs):
    """Rank 0 refuses a run directory that holds a run (exit 2) before any collective; rank 1,
    already waiting for the group, is ended, and the command exits with rank 0's status."""
    tmp = runs["tmp"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    again = subprocess.run([sys.executable, "-m", "polyrl.cli", "train", str(tmp / "cli.yaml"), "--nproc", "2",
                            "--run-dir", str(tmp / "cli")], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 2, again.stdout[-3000:] + again.stderr[-3000:]
    assert "already holds a run" in again.stderr


RANK_SCRIPT = """
import os, sys, time
rank = int(os.environ["RANK"])
assert os.environ["WORLD_SIZE"] == "3" and os.environ["MASTER_ADDR"] == "127.0.0.1" and os.environ["MASTER_PORT"]
if sys.argv[1] == "fail" and rank == 2:
    sys.exit(3)
if sys.argv[1] == "fail":
    time.sleep(600)  # waits on a peer that is gone, until ended
sys.exit(0)
"""


@pytest.mark.parametrize("mode, code", [("ok", 0), ("fail", 3)])
def test_run_ranks_waits_for_all_and_ends_them_on_a_failure(mode, code):
    from polyrl.train.launch import run_ranks

    assert run_ranks([sys.executable, "-c", RANK_SCRIPT, mode], 3, poll_s=0.05) == code
