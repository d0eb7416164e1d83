"""One error path for every command: a user's mistake is one line and exit 2, an internal
error one line naming its traceback file and exit 1, Ctrl-C one line and exit 130."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polyrl import cli
from polyrl.config import default_config
from polyrl.train.run_dir import DiskFull


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as exit_:  # argparse
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# ---------------------------------------------------------------------------- the error path itself


def test_internal_error_names_its_traceback_file(capsys, tmp_path):
    def broken() -> int:
        raise ZeroDivisionError("division by zero")

    code = cli.run_command("polyrl x", broken)
    line = one_line(capsys.readouterr().err)
    assert code == 1 and line.startswith("polyrl x: internal error: ZeroDivisionError: division by zero; "
                                         "the full traceback is in ")
    written = Path(line.rsplit(" ", 1)[1])
    assert "Traceback" in written.read_text() and "broken" in written.read_text()
    written.unlink()


def test_internal_error_traceback_goes_to_the_commands_crash_dir(capsys, tmp_path):
    import argparse

    code = cli.run_command("polyrl x", lambda: [][1], argparse.Namespace(crash_dir=tmp_path))
    assert code == 1 and str(tmp_path) in one_line(capsys.readouterr().err)
    assert len(list(tmp_path.glob("polyrl-crash-*.txt"))) == 1


def test_ctrl_c_is_one_line_and_130(capsys):
    def interrupted() -> int:
        raise KeyboardInterrupt

    assert cli.run_command("polyrl x", interrupted) == 130
    assert one_line(capsys.readouterr().err) == "polyrl x: interrupted"


def test_errors_that_carry_an_exit_code_are_one_line(capsys):
    def full() -> int:
        raise DiskFull("disk full writing m.jsonl")

    assert cli.run_command("polyrl x", full) == 1
    assert one_line(capsys.readouterr().err) == "polyrl x: disk full writing m.jsonl"


@pytest.mark.parametrize("argv,message", [
    (["pack", "math", "-n", "-5"], "argument -n: must be at least 1, got -5"),
    (["pack", "math", "-n", "x"], "argument -n: 'x' is not an integer"),
    (["agent", "--budget", "0"], "argument --budget: must be at least 1, got 0"),
    (["agent", "--timeout", "nan"], "argument --timeout: must be a finite number > 0, got nan"),
    (["audit", "--domain", "math", "--n", "-1"], "argument --n: must be at least 1, got -1"),
    (["obs", "r", "--price-input", "-1"], "argument --price-input: must be a finite number >= 0, got -1"),
    (["trian"], "argument command: invalid choice: 'trian'"),
])
def test_usage_errors_are_one_line(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and message in one_line(err)


# ---------------------------------------------------------------------------- the misuse list of the issue


def test_pack_into_a_missing_folder(capsys, tmp_path):
    code, _, err = run(capsys, "pack", "math", "-n", "2", "-o", str(tmp_path / "no" / "such" / "p.jsonl"))
    assert code == 2 and one_line(err).startswith("polyrl pack: cannot write ") and "No such file" in err


def test_agent_with_a_missing_model(capsys, tmp_path):
    code, _, err = run(capsys, "agent", "--model", str(tmp_path / "absent"), "--run-dir", str(tmp_path / "r"))
    assert code == 2 and one_line(err).startswith(f"polyrl agent: --model {tmp_path / 'absent'}: ")


def _fake_run(path: Path, finished: bool = False) -> Path:
    (path / "state").mkdir(parents=True)
    (path / "state" / "state.pt").write_bytes(b"not a torch file")
    (path / "config.yaml").write_text(default_config().to_yaml())
    if finished:
        (path / "eval").mkdir()
        (path / "eval" / "after.json").write_text("{}")
        (path / "checkpoints" / "final").mkdir(parents=True)
        (path / "checkpoints" / "final" / "config.json").write_text("{}")
        (path / "checkpoints" / "final" / "model.safetensors").write_bytes(b"x")
    return path


def test_train_into_an_existing_run_without_resume(capsys, tmp_path):
    run_dir = _fake_run(tmp_path / "run")
    code, _, err = run(capsys, "train", "--run-dir", str(run_dir))
    assert code == 2 and one_line(err) == (f"polyrl train: {run_dir} already holds a run; continue it with "
                                           f"`polyrl train --resume {run_dir}` or choose another --run-dir")


def test_train_run_dir_naming_a_file(capsys, tmp_path):
    (tmp_path / "f").write_text("x")
    code, _, err = run(capsys, "train", "--run-dir", str(tmp_path / "f"))
    assert code == 2 and one_line(err) == f"polyrl train: run directory {tmp_path / 'f'} is a file, not a directory"
    code, _, err = run(capsys, "train", "--resume", str(tmp_path / "f"))
    assert code == 2 and "is a file" in one_line(err)


def test_resume_of_a_finished_run_repeats_nothing(capsys, tmp_path):
    run_dir = _fake_run(tmp_path / "run", finished=True)
    before = sorted(p.name for p in run_dir.rglob("*"))
    code, _, err = run(capsys, "train", "--resume", str(run_dir))
    assert code == 0 and "already finished" in one_line(err)
    assert sorted(p.name for p in run_dir.rglob("*")) == before


def test_resume_with_a_corrupt_state(capsys, tmp_path, monkeypatch):
    from polyrl.rewards import registry
    from tests.helpers import random_model_dir

    monkeypatch.setitem(registry._VERIFIERS, "length_parity", "tests.helpers:ParityVerifier")
    model = random_model_dir(tmp_path / "model")
    run_dir = _fake_run(tmp_path / "run")
    (run_dir / "config.yaml").write_text(
        f"rl_tasks: [{{domain: math, reward: length_parity, weight: 1}}]\nmodel: {{path: {model}}}\n"
        "engine: {max_tokens: 4}\ntrainer: {steps: 1, prompts_per_step: 2, group_size: 2}\n"
        "eval: {heldout_per_domain: 2, samples: 1}\n")
    code, _, err = run(capsys, "train", "--resume", str(run_dir))
    line = [x for x in err.strip().splitlines() if x.startswith("polyrl train:")]
    assert code == 2 and "Traceback" not in err
    assert line == [line[0]] and f"{run_dir / 'state' / 'state.pt'} is corrupt" in line[0]


def test_train_ctrl_c_and_disk_full_are_one_line_with_the_resume_hint(capsys, tmp_path, monkeypatch):
    import polyrl.train.loop as loop

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    def full(*args, **kwargs):
        raise DiskFull(f"disk full writing x; free some space and continue it with `polyrl train --resume {tmp_path}`")

    monkeypatch.setattr(loop, "train", interrupted)
    code, _, err = run(capsys, "train", "--run-dir", str(tmp_path / "run"))
    assert code == 130 and one_line(err).endswith(f"continue it with `polyrl train --resume {tmp_path / 'run'}`")
    monkeypatch.setattr(loop, "train", full)
    code, _, err = run(capsys, "train", "--run-dir", str(tmp_path / "run2"))
    assert code == 1 and "--resume" in one_line(err)


def test_invalid_run_file_is_lines_not_a_traceback(capsys, tmp_path):
    (tmp_path / "run.yaml").write_text("rl_tasks:\n  - domain: math\n    reward: unit_test_pass\n    weight: 1\n")
    code, _, err = run(capsys, "train", str(tmp_path / "run.yaml"))
    assert code == 2 and "Traceback" not in err
    assert err.splitlines()[1].startswith(f"{tmp_path / 'run.yaml'}:3: rl_tasks[0].reward: got 'unit_test_pass'")
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------------------- readers of damaged run directories


def test_obs_on_a_damaged_store(capsys, tmp_path):
    (tmp_path / "obs.sqlite").write_bytes(b"SQLite format 3\x00" + b"\x00" * 50 + b"garbage" * 100)
    code, out, err = run(capsys, "obs", str(tmp_path))
    assert code == 2 and out == "" and one_line(err).startswith("polyrl obs: ")


def test_obs_reads_a_store_a_killed_writer_left_mid_commit(capsys, tmp_path):
    import subprocess
    import sys

    from polyrl.obs.records import ObsRecord
    from polyrl.obs.store import ObsStore

    with ObsStore(tmp_path / "obs.sqlite") as store:
        store.record(ObsRecord("model", "chat tiny", "t1", {"gen_ai.usage.input_tokens": 3}, "task", 0, 0.0, 0.1))
    killed = ("import os, sqlite3, sys\n"
              "db = sqlite3.connect(sys.argv[1], isolation_level=None); db.execute('PRAGMA cache_size=1')\n"
              "db.execute('BEGIN')\n"
              "db.executemany(\"INSERT INTO records (kind, name, trace_id, attributes) VALUES ('model', 'x', 't2', ?)\","
              " [('{\"pad\": \"' + 'p' * 2000 + '\"}',) for _ in range(500)])\n"
              "os._exit(9)  # dies mid-transaction: a hot journal is left behind\n")
    subprocess.run([sys.executable, "-c", killed, str(tmp_path / "obs.sqlite")], check=False)
    code, out, err = run(capsys, "obs", str(tmp_path), "--json")
    assert code == 0, err
    assert json.loads(out)["model_calls"] == 1


def test_replay_list_skips_a_torn_last_line(capsys, tmp_path):
    rec = {"id": "x000000", "task_id": "t", "request": {"code": "1"}, "result": {"status": "ok", "stdout": "",
                                                                                "stderr": ""}, "verdicts": []}
    (tmp_path / "executions.jsonl").write_text(json.dumps(rec) + '\n{"id": "x000001", "requ')
    code, out, err = run(capsys, "replay", str(tmp_path), "--list")
    assert code == 0 and out.startswith("x000000") and "torn last line" in err
    (tmp_path / "executions.jsonl").write_text("{broken\n" + json.dumps(rec) + "\n")
    code, out, err = run(capsys, "replay", str(tmp_path), "--list")
    assert code == 2 and "not a JSON line" in one_line(err)
