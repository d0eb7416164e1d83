"""A role's thread held to one OpenMP thread (pipeline/openmp.py), the trainer's thread untouched."""

import threading

import pytest
import torch

from polyrl.config import default_config
from polyrl.pipeline.backend import one_thread_roles
from polyrl.pipeline.openmp import one_thread_here


def in_thread(fn):
    out = {}
    t = threading.Thread(target=lambda: out.update(fn()))
    t.start()
    t.join()
    return out


@pytest.mark.parametrize("warm", [False, True], ids=["fresh thread", "after a torch kernel"])
def test_one_thread_here_holds_only_the_calling_thread(warm):
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # torch re-applies an explicit count to each thread it first sees
    try:
        def role():
            if warm:
                torch.ones(1 << 20).sum()
            ok = one_thread_here()
            torch.ones(1 << 20).sum()  # a kernel after the call does not undo it
            return {"ok": ok, "threads": torch.get_num_threads()}

        got = in_thread(role)
        assert got["ok"], "torch's OpenMP runtime was not found"
        assert got["threads"] == 1
        assert torch.get_num_threads() == 2  # the calling (trainer's) thread keeps its own
        assert in_thread(lambda: {"threads": torch.get_num_threads()})["threads"] == 2  # and other threads theirs
    finally:
        torch.set_num_threads(before)


def test_the_rollout_thread_keeps_its_threads_only_where_it_decodes():
    cfg = default_config()
    assert cfg.engine.native.workers > 1  # the quickstart decodes in worker processes
    assert one_thread_roles(cfg) == ("rollout", "reward")
    native = cfg.engine.native.model_copy(update={"workers": 1})
    here = cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"native": native})})
    assert one_thread_roles(here) == ("reward",)
