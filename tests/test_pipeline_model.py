"""bench/pipeline_model.py on cases small enough to check by hand."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "bench" / "pipeline_model.py"
_spec = importlib.util.spec_from_file_location("pipeline_model", _PATH)
pm = importlib.util.module_from_spec(_spec)
sys.modules["pipeline_model"] = pm
_spec.loader.exec_module(pm)


def spec(rollout=2.0, reward=0.0, update=1.0, sync=0.0, k=0, steps=40, cores=None, slots=1, engines=1,
         update_parallel=1.0, sequences=1, lengths=None, **kw):
    """One sequence per step of one token whose decode step takes `rollout` seconds."""
    lengths = lengths or tuple((1,) * sequences for _ in range(steps))
    return pm.Spec(engines, slots, rollout, 1.0, lengths, 1, reward, update, sync, k, cores=cores,
                   update_parallel=update_parallel, **kw)


@pytest.mark.parametrize("k, step_s", [(0, 3.0), (1, 2.0), (2, 2.0), (4, 2.0)])
def test_rollout_2s_update_1s(k, step_s):
    """Synchronous: 2 + 1. Overlapped on separate resources: the longer phase."""
    assert pm.simulate(spec(k=k)).step_s == pytest.approx(step_s)


@pytest.mark.parametrize("k, step_s", [(0, 5.0), (1, 3.0), (4, 3.0)])
def test_the_trainer_bound_pipeline_runs_at_the_update_time(k, step_s):
    assert pm.simulate(spec(update=3.0, k=k)).step_s == pytest.approx(step_s)


def test_reward_is_a_third_stage():
    assert pm.simulate(spec(reward=0.5, k=0)).step_s == pytest.approx(3.5)
    assert pm.simulate(spec(reward=0.5, k=1)).step_s == pytest.approx(2.0)
    assert pm.simulate(spec(reward=2.5, k=2)).step_s == pytest.approx(2.5)  # the reward role limits


def test_weight_sync_costs_the_synchronous_loop_and_pauses_generation():
    """sync 0.5 s: the synchronous step grows by it; overlapped, generation pauses for it
    once per version (worked out by hand: publishes at 3.5, 6, 8.5, ...)."""
    assert pm.simulate(spec(sync=0.5, k=0)).step_s == pytest.approx(3.5)
    assert pm.simulate(spec(sync=0.5, k=1)).step_s == pytest.approx(2.5)
    assert pm.simulate(spec(sync=0.5, k=1, pause_during_sync=False)).step_s == pytest.approx(2.0)


def test_staleness_bounds_how_far_generation_runs_ahead():
    """Generation alone runs at 1 s/step (1-token steps of 1 s); the trainer takes 4 s. The
    rollout of step s never starts before version s - K is published."""
    r = pm.simulate(spec(rollout=1.0, update=4.0, k=2, steps=10))
    assert r.step_s == pytest.approx(4.0)
    assert r.started[:3] == [0.0, 0.0, 0.0]  # versions 0 >= step - 2 for steps 0, 1, 2
    for step in range(3, 10):  # step s waits for version s - 2: the publish of step s - 3
        assert r.started[step] == pytest.approx(r.published[step - 3])
    assert r.published[:2] == pytest.approx([5.0, 9.0])


def test_one_core_gains_nothing_two_cores_overlap():
    """On one shared core, rollout and update split it: 3 s of work per step either way. On
    two cores, an engine worker (1 core) and a single-threaded update (p = 0) overlap fully."""
    assert pm.simulate(spec(k=0, cores=1, update_parallel=0.0)).step_s == pytest.approx(3.0)
    assert pm.simulate(spec(k=1, cores=1, update_parallel=0.0)).step_s == pytest.approx(3.0)
    assert pm.simulate(spec(k=1, cores=2, update_parallel=0.0)).step_s == pytest.approx(2.0)
    # an update that keeps both cores busy (p = 1): both run at 2/3 speed while they overlap, so
    # the update takes 1.5 s, during which 1 s of generation is done; the other 1 s runs alone
    assert pm.simulate(spec(k=0, cores=2, update_parallel=1.0)).step_s == pytest.approx(3.0)
    assert pm.simulate(spec(k=1, cores=2, update_parallel=1.0)).step_s == pytest.approx(2.5)


def test_contention_slows_only_what_oversubscribes_the_cores():
    """Rollout (1 core) beside an update that wants both (p = 1): demand 2 + 1 > 2 cores, so
    with contention 0.2 both run at 2/3 x 0.8 while they overlap. The synchronous loop never
    oversubscribes and is unchanged."""
    assert pm.simulate(spec(k=0, cores=2, update_parallel=1.0, contention=0.2)).step_s == pytest.approx(3.0)
    # overlap: the update's 1 s of work at 8/15 speed takes 1.875 s, during which 1 s of
    # generation is done; the remaining 1 s of generation runs alone
    assert pm.simulate(spec(k=1, cores=2, update_parallel=1.0, contention=0.2)).step_s == pytest.approx(2.875)


def test_fit_contention_recovers_a_planted_value():
    w = pm.Workload(rollout_s=0.25, reward_s=0.1, update_s=0.55, sequences=32, max_tokens=64)
    lengths = pm.draw_lengths(w, 12)
    tau0 = pm.calibrate_tau0(w, lengths)
    planted = pm.replace(w, contention=0.25)
    sync = pm.simulate(pm.one_machine(w, 0, lengths, tau0)).step_s
    measured = sync / pm.simulate(pm.one_machine(planted, 1, lengths, tau0)).step_s
    assert pm.fit_contention(w, 1, measured, steps=12) == pytest.approx(0.25, abs=1e-3)
    assert pm.fit_contention(w, 1, 10.0, steps=12) == 0.0  # faster than any contention allows: none


def test_the_tail_of_a_synchronous_batch_is_what_overlap_fills():
    """Memory-bound decode (f = 1: a step costs the same for any batch): 2 sequences of 1 and 3
    tokens per step, 1 s per decode step, 2 slots. Synchronous: 3 s of generation (the slot of
    the short one idles 2 s) + 1 s update. With K = 1 the next step fills the idle slot."""
    lengths = tuple((1, 3) for _ in range(16))
    sync = pm.simulate(spec(rollout=1.0, k=0, slots=2, lengths=lengths))
    assert sync.step_s == pytest.approx(4.0)
    overlapped = pm.simulate(spec(rollout=1.0, k=1, slots=2, lengths=lengths))
    assert overlapped.step_s < 3.0


def test_calibration_reproduces_the_measured_synchronous_step():
    w = pm.Workload(rollout_s=0.233, reward_s=0.096, update_s=0.2, sync_s=0.01, sequences=64, max_tokens=64)
    lengths = pm.draw_lengths(w, 12)
    tau0 = pm.calibrate_tau0(w, lengths)
    sync = pm.simulate(pm.one_machine(w, 0, lengths, tau0))
    assert sync.rollout_s == pytest.approx(0.233, rel=1e-6)
    assert sync.step_s == pytest.approx(w.sync_step_s, rel=0.05)  # steps' lengths differ around the mean


def test_predict_prints_every_row_and_the_anchors(capsys):
    assert pm.main(["--rollout", "0.2", "--reward", "0.1", "--update", "0.2", "--sequences", "8", "--group-size", "4",
                    "--steps", "8",
                    "--measured", "1=1.3"]) == 0
    out = capsys.readouterr().out
    for row in ("1 machine", "8 accelerators", "64 accelerators", "512 accelerators", "K=1", "K=4",
                "AReaL 2.77x", "assumptions:", "error"):
        assert row in out
