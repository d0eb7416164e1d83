"""cluster.split_cores (pipeline/cores.py): the trainer's threads on some cores, the processes
below it and the roles' threads on the others; nothing a run learns changes."""

import os
import signal
import subprocess
import sys
import threading

import pytest
import torch

from polyrl.config import default_config
from polyrl.pipeline.cores import CoreSplit, _descendants, available
from tests.test_pipeline import model_dir, run  # noqa: F401 - the fixture
from tests.test_train import comparable

needs_two = pytest.mark.skipif(not available() or len(os.sched_getaffinity(0)) < 2,
                               reason="needs Linux affinity and at least 2 usable cores")


def test_halves():
    assert CoreSplit.halves({0, 1}) == CoreSplit(frozenset({0}), frozenset({1}))
    assert CoreSplit.halves({3, 5, 8, 9, 12}) == CoreSplit(frozenset({3, 5, 8}), frozenset({9, 12}))
    assert CoreSplit.halves({4}) is None


def test_descendants_reach_grandchildren():
    child = subprocess.Popen([sys.executable, "-c",
                              "import subprocess, sys; p = subprocess.Popen(['sleep', '30']); "
                              "print(p.pid, flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    grandchild = None
    try:
        grandchild = int(child.stdout.readline())
        assert {child.pid, grandchild} <= set(_descendants(os.getpid()))
    finally:
        if grandchild is not None:
            os.kill(grandchild, signal.SIGKILL)
        child.kill()
        child.wait()


@needs_two
def test_apply_pins_this_process_and_its_children_and_undo_restores():
    cores, threads = os.sched_getaffinity(0), torch.get_num_threads()
    split = CoreSplit.halves(cores)
    child = subprocess.Popen(["sleep", "30"])
    try:
        undo = split.apply()
        try:
            assert os.sched_getaffinity(0) == split.trainer
            assert os.sched_getaffinity(child.pid) == split.roles
            assert torch.get_num_threads() == len(split.trainer)
            seen = {}

            def role():
                split.pin_role_thread()
                seen["role"] = os.sched_getaffinity(0)
                late = subprocess.Popen(["sleep", "30"])  # started by a role: inherits its cores
                seen["late"] = os.sched_getaffinity(late.pid)
                late.kill()
                late.wait()

            t = threading.Thread(target=role)
            t.start()
            t.join()
            assert seen == {"role": split.roles, "late": split.roles}
            assert os.sched_getaffinity(0) == split.trainer  # the role's pin is its thread's own
        finally:
            undo()
        assert os.sched_getaffinity(0) == cores and torch.get_num_threads() == threads
    finally:
        child.kill()
        child.wait()


def test_split_cores_needs_the_local_backend():
    cfg = default_config().model_dump()
    for backend in ("inline", "ray"):
        with pytest.raises(ValueError, match="split_cores: true needs backend: local"):
            type(default_config().cluster).model_validate({**cfg["cluster"], "backend": backend,
                                                           "split_cores": True})


@needs_two
def test_a_run_with_split_cores_learns_what_the_shared_one_does(model_dir, tmp_path):  # noqa: F811
    cores, threads = os.sched_getaffinity(0), torch.get_num_threads()
    said = []
    run(model_dir, tmp_path / "split", K=2, log=said.append, split=True)
    run(model_dir, tmp_path / "inline", K=2, backend="inline")
    assert any("cluster.split_cores: trainer on cores" in s for s in said)
    assert comparable(tmp_path / "split" / "metrics.jsonl") == comparable(tmp_path / "inline" / "metrics.jsonl")
    assert os.sched_getaffinity(0) == cores and torch.get_num_threads() == threads  # put back at the end
