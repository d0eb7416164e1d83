"""TokenBudget.commit edges: negative or non-integer usage and settling a reservation twice are
clear errors, never silent accounting, even with -O."""

import threading

import pytest

from polyrl.agent.budget import TokenBudget


@pytest.mark.parametrize("used", [-1, -10**9, 1.5, float("nan"), "10", None, True])
def test_commit_refuses_usage_that_is_not_a_count(used):
    b = TokenBudget(100)
    r = b.reserve(10)
    with pytest.raises(ValueError, match="used tokens must be an integer >= 0"):
        b.commit(r, used)
    assert (b.spent, b.reserved) == (0, 10) and r.open  # nothing changed: the call can still be settled
    b.commit(r, 4)
    assert (b.spent, b.reserved) == (4, 0)


@pytest.mark.parametrize("first,second", [("commit", "commit"), ("commit", "cancel"), ("cancel", "commit"),
                                          ("cancel", "cancel")])
def test_a_reservation_is_settled_once(first, second):
    b = TokenBudget(100)
    r = b.reserve(30)
    settle = {"commit": lambda: b.commit(r, 20), "cancel": lambda: b.cancel(r)}
    settle[first]()
    state = (b.spent, b.reserved)
    with pytest.raises(ValueError, match="already committed or cancelled"):
        settle[second]()
    assert (b.spent, b.reserved) == state


def test_concurrent_double_commit_charges_once():
    b = TokenBudget(1000)
    r = b.reserve(100)
    outcomes = []
    barrier = threading.Barrier(8)

    def commit():
        barrier.wait()
        try:
            b.commit(r, 50)
            outcomes.append("ok")
        except ValueError:
            outcomes.append("refused")

    threads = [threading.Thread(target=commit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["ok"] + ["refused"] * 7
    assert (b.spent, b.reserved) == (50, 0)
