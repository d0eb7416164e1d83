"""Evaluation statistics on hand-computed values: Wilson intervals, exact McNemar, percentiles,
price-card costs, and the paired comparison of two models."""

from __future__ import annotations

import math

import pytest

from polyrl.evals.document import compare
from polyrl.evals.prices import Price, PriceCard, PriceError, load_price_card
from polyrl.evals.stats import mcnemar_exact, percentile, wilson_interval


@pytest.mark.parametrize("successes, n, low, high", [
    # p = 0.5, n = 10: center 0.5, half = 1.96 * sqrt(0.025 + 0.0096) / 1.384 = 0.2634...
    (5, 10, 0.236593, 0.763407),
    # 0 of 10: low is exactly 0, high = z^2/n / (1 + z^2/n) = 0.38415 / 1.38415
    (0, 10, 0.0, 0.277533),
    (10, 10, 0.722467, 1.0),
    # 81 of 263: center (0.307985 + 0.007303) / 1.014606 = 0.310749, half 0.055461 (by hand)
    (81, 263, 0.255288, 0.366210),
])
def test_wilson_interval(successes, n, low, high):
    lo, hi = wilson_interval(successes, n)
    assert lo == pytest.approx(low, abs=1e-5) and hi == pytest.approx(high, abs=1e-5)


def test_wilson_interval_without_trials_is_none():
    assert wilson_interval(0, 0) is None


@pytest.mark.parametrize("b, c, p", [
    (0, 0, 1.0),
    (1, 0, 1.0),               # 2 * 1/2
    (5, 0, 2 / 32),            # 2 * (1/2)^5 = 0.0625
    (6, 1, 2 * 8 / 128),       # 2 * (C(7,0) + C(7,1)) / 2^7 = 0.125
    (3, 3, 1.0),               # capped at 1
    (10, 2, 2 * (1 + 12 + 66) / 4096),
])
def test_mcnemar_exact(b, c, p):
    assert mcnemar_exact(b, c) == pytest.approx(p)
    assert mcnemar_exact(c, b) == pytest.approx(p)  # two-sided: symmetric


def test_percentile_interpolates_like_numpy():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([4, 1, 3, 2], 95) == pytest.approx(3.85)
    assert percentile([7], 95) == 7
    assert percentile([], 50) is None


def test_price_card_cost_counts_cached_tokens_inside_input():
    price = Price(input=2.0, cached_input=0.5, output=10.0)
    # 1000 prompt tokens of which 400 cached, 100 out: 600*2 + 400*0.5 + 100*10 = 2400 per 1e6
    assert price.cost(1000, 400, 100) == pytest.approx(2400 / 1e6)
    assert Price(input=2.0).cost(1000, 400, 0) == pytest.approx(2000 / 1e6)  # no cache price: full input price
    card = PriceCard(models={"big": price})
    assert card.price("big") is price and card.price("other").cost(10**6, 0, 10**6) == 0.0


def test_price_card_file_errors_are_clear(tmp_path):
    good = tmp_path / "p.yaml"
    good.write_text("models:\n  openai:http://x/v1#m: {input: 1, output: 3}\ndefault: {input: 0.5}\n")
    card = load_price_card(good)
    assert card.price("openai:http://x/v1#m").output == 3 and card.price("tiny").input == 0.5
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  m: {input: -1}\n")
    with pytest.raises(PriceError, match=r"models\.m\.input"):
        load_price_card(bad)
    extra = tmp_path / "extra.json"
    extra.write_text('{"models": {"m": {"inputs": 1}}}')
    with pytest.raises(PriceError, match="inputs"):
        load_price_card(extra)
    with pytest.raises(PriceError, match="cannot read"):
        load_price_card(tmp_path / "missing.yaml")


def test_paired_comparison_counts_the_two_by_two_table():
    outcomes = {"t1": (True, True), "t2": (True, False), "t3": (True, False), "t4": (False, True),
                "t5": (False, False), "t6": (True, False)}
    entries = [{"model": m, "id": i, "success": pair[k]} for i, pair in outcomes.items() for k, m in enumerate("ab")]
    c = compare("a", "b", entries)
    assert (c["tasks"], c["both"], c["only_a"], c["only_b"], c["neither"]) == (6, 1, 3, 1, 1)
    assert c["differ"] == ["t2", "t3", "t4", "t6"]
    assert c["p_value"] == pytest.approx(2 * (1 + 4) / 16)  # b=3, c=1: 2 * P(X <= 1), X ~ Bin(4, 1/2)
    assert math.isclose(compare("a", "b", entries[:0])["p_value"], 1.0)
