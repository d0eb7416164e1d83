"""Per-domain adaptive KL: each coefficient moves its domain's KL toward its own target."""

import pytest

from polyrl.rl.kl_control import PerDomainKL, adaptive_kl_coef


def simulate(kl: PerDomainKL, drift: dict[str, float], steps: int, samples: int = 32) -> dict[str, list[float]]:
    """A plant where a domain's measured KL is drift / coefficient (a stronger leash, less KL);
    returns the measured KL of every step."""
    seen = {d: [] for d in drift}
    for _ in range(steps):
        measured = {d: drift[d] / max(kl.coefs[d], 1e-12) for d in drift}
        for d, v in measured.items():
            seen[d].append(v)
        kl.update(measured, {d: samples for d in drift})
    return seen


def test_each_coefficient_drives_its_domain_toward_its_own_target():
    kl = PerDomainKL({"alignment": 0.01, "agent": 0.01}, {"alignment": 0.05, "agent": 0.2}, horizon=320)
    seen = simulate(kl, {"alignment": 0.002, "agent": 0.0005}, steps=400)
    # start: alignment KL 0.2 (above 0.05) and agent 0.05 (below 0.2)
    assert seen["alignment"][0] == pytest.approx(0.2) and seen["agent"][0] == pytest.approx(0.05)
    assert seen["alignment"][-1] == pytest.approx(0.05, rel=0.05)
    assert seen["agent"][-1] == pytest.approx(0.2, rel=0.05)
    assert kl.coefs["alignment"] > 0.01 and kl.coefs["agent"] < 0.01  # raised and lowered


def test_kl_above_target_raises_the_coefficient_below_lowers_it_and_steps_are_bounded():
    assert adaptive_kl_coef(0.1, measured=0.5, target=0.1, n=100, horizon=100) == pytest.approx(0.12)  # +20% cap
    assert adaptive_kl_coef(0.1, measured=0.0, target=0.1, n=100, horizon=100) == pytest.approx(0.08)  # -20% cap
    assert adaptive_kl_coef(0.1, measured=0.11, target=0.1, n=10, horizon=100) == pytest.approx(0.1 * (1 + 0.1 * 0.1))
    assert adaptive_kl_coef(0.1, measured=0.1, target=0.1, n=10, horizon=100) == pytest.approx(0.1)


def test_domains_without_a_target_keep_their_coefficient():
    kl = PerDomainKL({"math": 0.0, "alignment": 0.01}, {"math": None, "alignment": 0.05}, horizon=10)
    kl.update({"math": 3.0, "alignment": 0.5}, {"math": 64, "alignment": 16})
    assert kl.coefs["math"] == 0.0 and kl.reasons["math"] == "fixed coefficient"
    assert kl.coefs["alignment"] > 0.01 and "target 0.0500" in kl.reasons["alignment"]


def test_a_domain_without_samples_this_step_stays():
    kl = PerDomainKL({"alignment": 0.01}, {"alignment": 0.05}, horizon=10)
    kl.update({}, {"alignment": 0})
    assert kl.coefs["alignment"] == 0.01 and "no samples" in kl.reasons["alignment"]


def test_a_target_needs_a_positive_start():
    with pytest.raises(ValueError, match="starting coefficient > 0"):
        PerDomainKL({"alignment": 0.0}, {"alignment": 0.05})


def test_state_round_trip():
    kl = PerDomainKL({"a": 0.01, "b": 0.0}, {"a": 0.05, "b": None}, horizon=50)
    kl.update({"a": 0.2}, {"a": 8})
    again = PerDomainKL.from_state(kl.state_dict())
    assert again.coefs == kl.coefs and again.targets == kl.targets and again.horizon == 50
