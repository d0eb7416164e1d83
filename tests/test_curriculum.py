"""The capability-curve curriculum: who gains, who loses, floors, regression boosts, resume."""

import pytest

from polyrl.rl.curriculum import CapabilityCurriculum, CurveSettings, allocate, apply_floor, slope

SEED = {"code": 0.35, "agent": 0.3, "math": 0.2, "alignment": 0.15}


def run(curves: dict[str, list[float]], settings: CurveSettings = CurveSettings(), seed=SEED):
    """Feed one evaluation per index of `curves` (domain -> scores); returns the curriculum and
    the weights after every update."""
    cur = CapabilityCurriculum(seed, settings)
    history = []
    for i in range(len(next(iter(curves.values())))):
        history.append(cur.update(10 * i, {d: c[i] for d, c in curves.items()}).weights)
    return cur, history


def test_weights_start_at_the_seed_and_always_sum_to_one():
    cur = CapabilityCurriculum(SEED)
    assert cur.weights == pytest.approx(SEED)
    _, history = run({"code": [0.2, 0.4, 0.6, 0.8], "agent": [0.9] * 4, "math": [0.1] * 4, "alignment": [0.5] * 4})
    for w in history:
        assert sum(w.values()) == pytest.approx(1.0)


def test_an_improving_domain_gains_weight_and_flat_ones_give_it_up():
    _, history = run({"code": [0.40, 0.40, 0.40, 0.40, 0.40],
                      "agent": [0.50, 0.50, 0.50, 0.50, 0.50],
                      "math": [0.10, 0.18, 0.26, 0.34, 0.42],   # +0.08 per evaluation
                      "alignment": [0.60, 0.60, 0.60, 0.60, 0.60]})
    first, last = history[0], history[-1]
    assert first["math"] == pytest.approx(SEED["math"], abs=1e-9)  # one point: no slope yet
    assert last["math"] > SEED["math"] + 0.15
    for d in ("code", "agent", "alignment"):
        assert last[d] < SEED[d]


def test_a_saturating_domain_loses_weight_down_to_the_floor():
    s = CurveSettings(floor=0.05)
    cur, history = run({"code": [0.40] * 8, "agent": [0.96] * 8, "math": [0.30] * 8, "alignment": [0.50] * 8}, s)
    assert history[0]["agent"] < SEED["agent"]
    assert history[-1]["agent"] == pytest.approx(s.floor)
    assert "saturated" in cur.reasons["agent"]
    # the share it gave up went to the others, in proportion to their seeds
    assert history[-1]["code"] / history[-1]["math"] == pytest.approx(SEED["code"] / SEED["math"], rel=1e-6)


def test_no_share_moves_more_than_max_change_per_update():
    s = CurveSettings(max_change=0.04)
    _, history = run({"code": [0.1, 0.5, 0.9, 0.9], "agent": [0.97] * 4, "math": [0.2] * 4, "alignment": [0.3] * 4}, s)
    prev = CapabilityCurriculum(SEED, s).weights
    for w in history:
        assert max(abs(w[d] - prev[d]) for d in w) <= 0.04 + 1e-9
        prev = w


def test_floors_hold_for_every_domain_whatever_the_curves():
    s = CurveSettings(floor=0.1, max_change=1.0)
    _, history = run({"code": [0.0, 0.3, 0.6, 0.9], "agent": [0.99] * 4, "math": [0.99] * 4, "alignment": [0.99] * 4}, s)
    for w in history:
        assert min(w.values()) >= 0.1 - 1e-9
    assert history[-1]["code"] == pytest.approx(0.7)  # everything the floors leave


def test_a_regressing_domain_gets_a_boost_that_ends():
    s = CurveSettings(regress_tolerance=0.05, boost=2.0, boost_updates=2, max_change=1.0)
    cur = CapabilityCurriculum(SEED, s)
    scores = {"code": 0.5, "agent": 0.6, "math": 0.4, "alignment": 0.5}
    for i in range(3):
        cur.update(i, scores)
    steady = cur.weights["math"]
    boosted = cur.update(3, {**scores, "math": 0.25})  # 0.15 below its best
    assert boosted.weights["math"] >= 2.0 * SEED["math"] - 1e-9
    assert boosted.weights["math"] > steady
    assert "regression boost" in boosted.reasons["math"]
    recovered = None
    for i in range(4, 7):  # back at its best: the boost runs out
        recovered = cur.update(i, scores)
    assert recovered.weights["math"] < boosted.weights["math"]
    assert "regression" not in recovered.reasons["math"]


def test_every_update_says_why_each_weight_moved():
    cur = CapabilityCurriculum(SEED)
    update = cur.update(0, {"code": 0.4, "agent": 0.5, "math": 0.2, "alignment": 0.3})
    assert set(update.reasons) == set(SEED)
    assert all("capability" in r and "weight" in r for r in update.reasons.values())


def test_an_update_must_score_every_domain():
    with pytest.raises(ValueError, match="every domain"):
        CapabilityCurriculum(SEED).update(0, {"code": 0.4})


def test_state_round_trip_continues_identically():
    curves = {"code": [0.2, 0.3, 0.5, 0.4, 0.6], "agent": [0.7, 0.7, 0.8, 0.9, 0.96],
              "math": [0.1, 0.1, 0.1, 0.2, 0.1], "alignment": [0.5, 0.4, 0.3, 0.5, 0.6]}
    straight, _ = run(curves)
    half, _ = run({d: c[:3] for d, c in curves.items()})
    resumed = CapabilityCurriculum.from_state(half.state_dict())
    for i in range(3, 5):
        resumed.update(10 * i, {d: c[i] for d, c in curves.items()})
    assert resumed.weights == pytest.approx(straight.weights)
    assert resumed.reasons == straight.reasons


def test_slope_and_floor_helpers():
    assert slope([0.1, 0.2, 0.3]) == pytest.approx(0.1)
    assert slope([0.5]) == 0.0
    w = apply_floor({"a": 0.98, "b": 0.01, "c": 0.01}, 0.1)
    assert w["b"] == pytest.approx(0.1) and w["c"] == pytest.approx(0.1) and sum(w.values()) == pytest.approx(1)


def test_allocate_follows_moved_weights():
    assert allocate(16, {"code": 0.5, "agent": 0.25, "math": 0.2, "alignment": 0.05}) == {
        "code": 8, "agent": 4, "math": 3, "alignment": 1}
