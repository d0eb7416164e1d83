"""TokenBudget: reservations hold under threads, milestones fire once, loops share a budget."""

import random
import threading

import pytest

from polyrl.agent.budget import TokenBudget
from polyrl.agent.loop import AgentConfig, ModelSlot, run_agent
from tests.agent_fakes import ScriptedModel, call, toy_tools


def test_reserve_commit_cancel():
    b = TokenBudget(100)
    r = b.reserve(60)
    assert r is not None and b.available == 40
    assert b.reserve(41) is None  # does not fit beside the open reservation
    assert b.commit(r, 30) == []
    assert (b.spent, b.reserved, b.available) == (30, 0, 70)
    r2 = b.reserve(70)
    b.cancel(r2)
    assert (b.spent, b.available) == (30, 70)
    with pytest.raises(ValueError, match="already committed or cancelled"):
        b.commit(r2, 1)


def test_never_overspent_under_concurrent_calls():
    b = TokenBudget(10_000)
    peaks = []
    lock = threading.Lock()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(300):
            estimate = rng.randint(1, 120)
            r = b.reserve(estimate)
            if r is None:
                continue
            used = rng.randint(0, estimate)  # a reservation bounds the call's usage
            b.commit(r, used)
            with lock:
                peaks.append(b.spent + b.reserved)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert b.spent <= 10_000 and b.reserved == 0 and b.overrun == 0
    assert max(peaks) <= 10_000
    assert b.spent > 9_000  # the budget was actually contended, not trivially unused


def test_milestones_fire_once_each():
    seen = []
    b = TokenBudget(100, on_alert=seen.append)
    fired = []
    for used in (30, 25, 10, 20, 10, 5):  # 30, 55, 65, 85, 95, 100
        r = b.reserve(used)
        fired.append([a.milestone for a in b.commit(r, used)])
    assert fired == [[], [0.5], [], [0.8], [], [1.0]]
    assert [a.milestone for a in seen] == [0.5, 0.8, 1.0]
    b2 = TokenBudget(100)
    assert [a.milestone for a in b2.commit(b2.reserve(100), 100)] == [0.5, 0.8, 1.0]  # one jump, each once
    assert b2.commit(b2.reserve(0), 0) == []


def test_overrun_is_counted_not_hidden():
    b = TokenBudget(100)
    b.commit(b.reserve(10), 25)
    assert b.spent == 25 and b.overrun == 15


def test_bad_budgets_are_clear_errors():
    with pytest.raises(ValueError, match="positive"):
        TokenBudget(0)
    with pytest.raises(ValueError, match="milestones"):
        TokenBudget(10, milestones=(1.5,))


def test_concurrent_agent_loops_share_one_budget():
    """Eight agents in threads, each wanting many tool turns, on one budget: the budget
    holds, every agent stops with a result, and the alerts fire once in total."""
    budget = TokenBudget(3_000)
    results = []
    lock = threading.Lock()

    def agent(k: int) -> None:
        model = ScriptedModel([call("add", a=k, b=1)])  # never answers: only the budget stops it
        result = run_agent("add numbers forever", toy_tools(), [ModelSlot(model)],
                           AgentConfig(max_steps=100, max_tokens=16, conclude=False), budget, trace_id=f"t{k}")
        with lock:
            results.append(result)

    threads = [threading.Thread(target=agent, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8
    assert budget.spent <= 3_000 and budget.reserved == 0 and budget.overrun == 0
    assert sum(s.charged for r in results for s in r.steps) == budget.spent
    assert {r.stop_reason for r in results} == {"budget"}
    assert sorted(a.milestone for a in budget.alerts) == [0.5, 0.8]  # 100% is never reached: calls must fit
    assert all(r.conclusion and "add(a=" in r.conclusion for r in results if r.steps)
