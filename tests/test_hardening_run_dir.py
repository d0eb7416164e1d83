"""Run directories under hostile conditions: a second writer, kills mid-write (torn lines),
a full disk, a corrupt state, resumes that must leave every log as an uninterrupted run's.
The loop is played here by hand, with RunDir's calls in its order."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time

import pytest
import torch

from polyrl.obs import jsonl
from polyrl.obs.records import ObsRecord
from polyrl.obs.store import read_records
from polyrl.sandbox.execution_log import ExecutionLog
from polyrl.train.run_dir import DiskFull, RunDir, RunDirError, RunExists


def _execution(k: int) -> dict:
    return {"request": {"code": f"print({k})"}, "result": {"status": "ok", "stdout": str(k), "stderr": ""}}


def _play(path, steps: range, kill_in: int | None = None, resume: bool = False):
    """The loop's calls for `steps`: records in every log, then the step's lines, then the state.
    With kill_in, that step writes half its records and the process 'dies' (nothing closed)."""
    rd = RunDir(path)
    state = rd.open(resume, "config: 1\n")
    log, obs = rd.execution_log(), rd.obs_store()
    for step in steps:
        for k in range(3):
            eid = log.add(_execution(step * 10 + k), task_id=f"t{step}-{k}")
            obs.record(ObsRecord("model", "chat tiny", f"trace-{step}-{k}", {"x.n": k}, f"t{step}", k, 0.0, 0.0))
            if step == kill_in and k == 1:
                with open(rd.metrics, "a") as f:
                    f.write('{"step": %d, "half' % step)  # killed inside a write
                return state
        rd.append(rd.metrics, [{"step": step, "loss": step / 10, "execution": eid}])
        rd.append(rd.trajectories, [{"step": step, "sample": j} for j in range(2)])
        rd.save_state({"step": step + 1, "policy": {}, "clock": 0.0})
    obs.close()
    rd.close()
    return state


def _logs(path) -> dict:
    out = {name: (path / name).read_text() for name in ("metrics.jsonl", "trajectories.jsonl", "executions.jsonl")}
    out["obs"] = [(r.trace_id, r.attributes) for r in read_records(path)]
    return out


def test_kill_mid_step_then_resume_equals_an_uninterrupted_run(tmp_path):
    _play(tmp_path / "straight", range(4))
    _play(tmp_path / "killed", range(4), kill_in=2)
    state = _play(tmp_path / "killed", range(2, 4), resume=True)
    assert state["step"] == 2
    assert _logs(tmp_path / "killed") == _logs(tmp_path / "straight")
    ids = [json.loads(x)["id"] for x in (tmp_path / "killed" / "executions.jsonl").read_text().splitlines()]
    assert ids == [f"x{k:06d}" for k in range(12)]  # ids go on where the last whole step stopped


def test_rollback_reports_torn_lines_and_removed_records(tmp_path):
    _play(tmp_path / "run", range(3), kill_in=2)
    with open(tmp_path / "run" / "executions.jsonl", "a") as f:
        f.write('{"id": "x000099", "ste')
    rd = RunDir(tmp_path / "run")
    assert rd.open(True)["step"] == 2
    notes = " | ".join(rd.notes)
    assert "metrics.jsonl: dropped a torn last line" in notes
    assert "executions.jsonl: dropped a torn last line" in notes
    assert "executions.jsonl: removed 2 record(s) of steps >= 2" in notes
    assert "obs.sqlite: removed" not in notes  # the killed step's rows were never committed
    assert (tmp_path / "run" / "metrics.jsonl").read_text().endswith("}\n")


def test_readers_skip_a_torn_last_line_and_say_so(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}\n{"step": 2, "lo')
    notes: list[str] = []
    assert [r["step"] for r in jsonl.iter_jsonl(path, notes)] == [0, 1]
    assert notes and "torn last line" in notes[0]
    log = ExecutionLog(tmp_path / "executions.jsonl")
    (tmp_path / "executions.jsonl").write_text(json.dumps({"id": "x000000", **_execution(0)}) + '\n{"id": "x0000')
    assert [r["id"] for r in log] == ["x000000"] and log.notes
    assert log.add(_execution(1)) == "x000001"  # the torn tail is cut off, not glued to the new line
    assert [r["id"] for r in ExecutionLog(tmp_path / "executions.jsonl")] == ["x000000", "x000001"]


def test_append_after_a_torn_line_never_glues_lines(tmp_path):
    rd = RunDir(tmp_path / "run")
    rd.create("x: 1\n")
    rd.metrics.write_text('{"step": 0}\n{"step": 1, "lo')
    rd.append(rd.metrics, [{"step": 1}])
    assert rd.metrics.read_text() == '{"step": 0}\n{"step":1}\n'


def test_disk_full_mid_append_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    rd = RunDir(tmp_path / "run")
    rd.create("x: 1\n")
    rd.append(rd.metrics, [{"step": 0}])
    before = rd.metrics.read_bytes()
    real_write = os.write

    def full_disk(fd, data):
        real_write(fd, bytes(data[:7]))  # part of the line reaches the disk, then it is full
        raise OSError(errno.ENOSPC, "No space left on device")

    class FullOs:  # os, with a disk that fills up
        write = staticmethod(full_disk)

        def __getattr__(self, name):
            return getattr(os, name)

    monkeypatch.setattr(jsonl, "os", FullOs())
    with pytest.raises(DiskFull, match=r"disk full writing .*metrics.jsonl.*--resume"):
        rd.append(rd.metrics, [{"step": 1, "loss": 0.5}] * 50)
    monkeypatch.undo()
    assert rd.metrics.read_bytes() == before
    assert DiskFull.exit_code == 1


def test_disk_full_while_saving_the_state_keeps_the_last_state(tmp_path, monkeypatch):
    rd = RunDir(tmp_path / "run")
    rd.create("x: 1\n")
    rd.save_state({"step": 1, "policy": {}})

    def full(obj, f, *a, **k):
        raise RuntimeError("[enforce fail at inline_container.cc:595] . PytorchStreamWriter failed writing "
                           "file data/0: file write failed")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(DiskFull):
        rd.save_state({"step": 2, "policy": {}})
    monkeypatch.undo()
    assert RunDir(tmp_path / "run").load_state()["step"] == 1
    assert not list((tmp_path / "run" / "state").glob("*.tmp"))


def test_a_second_writer_is_refused_with_the_first_ones_pid(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         f"f = open({str(run / 'lock')!r}, 'a+'); fcntl.flock(f, fcntl.LOCK_EX)\n"
         "f.write(str(os.getpid())); f.flush(); print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirError, match=f"in use by another run \\(pid {holder.pid}\\)"):
            RunDir(run).create("x: 1\n")
        with pytest.raises(RunDirError, match="in use"):
            RunDir(run).lock()
    finally:
        holder.kill()
        holder.wait()
    RunDir(run).create("x: 1\n")  # free once the holder is gone


def test_one_process_shares_its_own_lock(tmp_path):
    a, b = RunDir(tmp_path / "run"), RunDir(tmp_path / "run")
    a.create("x: 1\n")
    b.lock()  # a resume in the same process after an exception, say
    a.close()
    b.close()


def test_run_dir_that_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(RunDirError, match="is a file, not a directory"):
        RunDir(tmp_path / "f").create("x: 1\n")


def test_new_run_into_a_run_refuses(tmp_path):
    rd = RunDir(tmp_path / "run")
    rd.create("x: 1\n")
    rd.save_state({"step": 1, "policy": {}})
    rd.close()
    with pytest.raises(RunExists, match="--resume"):
        RunDir(tmp_path / "run").create("x: 2\n")
    assert (tmp_path / "run" / "config.yaml").read_text() == "x: 1\n"


@pytest.mark.parametrize("content,message", [
    (b"garbage, not a torch file", "is corrupt"),
    (b"", "is corrupt"),
    (None, "is not a polyrl training state"),
])
def test_corrupt_state_is_one_clear_error(tmp_path, content, message):
    rd = RunDir(tmp_path / "run")
    rd.create("x: 1\n")
    rd.state.parent.mkdir(parents=True)
    if content is None:
        torch.save([1, 2, 3], rd.state)
    else:
        rd.state.write_bytes(content)
    with pytest.raises(RunDirError, match=message):
        RunDir(tmp_path / "run").open(True)


def test_a_run_killed_before_its_first_step_starts_clean(tmp_path):
    _play(tmp_path / "run", range(1), kill_in=0)
    assert not (tmp_path / "run" / "state" / "state.pt").exists()
    _play(tmp_path / "run", range(2))
    _play(tmp_path / "straight", range(2))
    assert _logs(tmp_path / "run") == _logs(tmp_path / "straight")


def test_finished(tmp_path):
    rd = RunDir(tmp_path / "run")
    rd.create("x: 1\n")
    assert not rd.finished()
    rd.write_json(rd.eval_file("after"), {})
    final = rd.checkpoint_dir("final")
    final.mkdir(parents=True)
    (final / "config.json").write_text("{}")
    assert not rd.finished()
    (final / "model.safetensors").write_bytes(b"x")
    assert rd.finished()


def test_rollback_of_a_large_log_is_quick(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"step": s, "x": "y" * 200}) + "\n" for s in range(20000)))
    start = time.perf_counter()
    dropped = jsonl.drop_lines(path, 19990)
    assert dropped.records == 10 and time.perf_counter() - start < 5
    assert path.read_text().count("\n") == 19990
