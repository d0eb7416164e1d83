"""The mixed-load policy (polyrl/pipeline/scheduler.py) on a simulated clock.

`simulate` plays arrivals through worker slots: at every arrival or finish it asks the
policy which queued sequences start, and each runs for its given service time. Nothing
sleeps; a thousand simulated seconds take milliseconds.
"""

from __future__ import annotations

import heapq
import random
import re
from collections import deque

import pytest
from pydantic import ValidationError

from polyrl.pipeline.scheduler import (
    LoadConfig,
    LoadState,
    MixedLoadPolicy,
    SchedulerConfig,
)


def simulate(policy: MixedLoadPolicy, arrivals: list[tuple[float, str, float]], until: float,
             watch=None) -> list[tuple[str, float, float, float]]:
    """(load, arrival, start, finish) of every sequence that finished by `until`.
    arrivals: (time, load, service seconds); watch(now, running) sees every decision."""
    arrivals = sorted(arrivals, key=lambda a: a[0])  # stable: equal times keep their order
    queues = {name: deque() for name in policy.loads}
    running = {name: 0 for name in policy.loads}
    busy: list[tuple[float, int, str, float, float]] = []  # (finish, tiebreak, load, arrival, start)
    done, a, tick = [], 0, 0
    now = 0.0
    while now <= until:
        while busy and busy[0][0] <= now:
            finish, _, load, arrived, start = heapq.heappop(busy)
            running[load] -= 1
            done.append((load, arrived, start, finish))
        while a < len(arrivals) and arrivals[a][0] <= now:
            t, load, service = arrivals[a]
            queues[load].append((t, service))
            a += 1
        state = {n: LoadState(len(q), running[n], q[0][0] if q else None) for n, q in queues.items()}
        for load, k in policy.admit(now, state).items():
            for _ in range(k):
                arrived, service = queues[load].popleft()
                tick += 1
                heapq.heappush(busy, (now + service, tick, load, arrived, now))
                running[load] += 1
        assert sum(running.values()) <= policy.capacity
        if watch:
            watch(now, dict(running), {n: len(q) for n, q in queues.items()})
        upcoming = ([busy[0][0]] if busy else []) + ([arrivals[a][0]] if a < len(arrivals) else [])
        if not upcoming:
            break
        now = min(upcoming)
    return done


def backlog(load: str, count: int, rng: random.Random, low: float, high: float) -> list[tuple[float, str, float]]:
    """`count` sequences of `load` queued at time 0, with service times uniform in [low, high]."""
    return [(0.0, load, rng.uniform(low, high)) for _ in range(count)]


def poisson(load: str, rate: float, until: float, service: float, rng: random.Random) -> list[tuple[float, str, float]]:
    out, t = [], rng.expovariate(rate)
    while t < until:
        out.append((t, load, service))
        t += rng.expovariate(rate)
    return out


def finished_between(done, load: str, start: float, end: float) -> int:
    return sum(1 for name, _, _, finish in done if name == load and start <= finish < end)


def p99(values: list[float]) -> float:
    values = sorted(values)
    return values[max(0, -(-99 * len(values) // 100) - 1)]


def config(**loads: LoadConfig) -> SchedulerConfig:
    base = {"train": LoadConfig(), "eval": LoadConfig(), "interactive": LoadConfig()}
    return SchedulerConfig(**{**base, **loads})


# ---- (1) training keeps its share of throughput while evaluation runs ------------------------------


@pytest.mark.parametrize("eval_priority", [0, 2])
def test_training_keeps_its_share_of_throughput_beside_evaluation(eval_priority):
    cfg = config(train=LoadConfig(priority=1, share=0.5), eval=LoadConfig(priority=eval_priority, share=0.25),
                 interactive=LoadConfig(priority=3, share=0.25))
    policy = MixedLoadPolicy.from_config(cfg, capacity=16)
    rng = random.Random(0)
    train = backlog("train", 20_000, rng, 1.0, 3.0)
    alone = simulate(policy, train, until=600)
    low_share = []
    beside = simulate(policy, train + backlog("eval", 20_000, rng, 1.0, 3.0), until=600,
                      watch=lambda now, running, queued: low_share.append(running["train"] < 8))
    rate_alone = finished_between(alone, "train", 100, 600) / 500
    rate_beside = finished_between(beside, "train", 100, 600) / 500
    assert finished_between(beside, "eval", 100, 600) > 0  # evaluation did run beside training
    assert not any(low_share[1:])  # never below 8 of 16 slots once started
    assert rate_beside / rate_alone >= 0.5 - 0.03
    if eval_priority > 1:  # evaluation takes the surplus: training sits at its share
        assert rate_beside / rate_alone == pytest.approx(0.5, abs=0.05)
    else:  # training takes the surplus (and interactive's lent slots): evaluation sits at its share
        assert rate_beside / rate_alone == pytest.approx(0.75, abs=0.05)


# ---- (2) interactive latency under training load ------------------------------------------------


@pytest.mark.parametrize("reserve, bound", [(1.0, 0.5 + 1e-9), (0.0, 0.5 + 6.0)])
def test_interactive_p99_latency_holds_under_training_load(reserve, bound):
    """With its share reserved (4 slots; 4 or more requests at once have probability 0.2% here),
    a request starts at once: latency = its service time. With none reserved, it waits at most
    one training sequence's lifetime (6 s here) for a slot."""
    cfg = config(train=LoadConfig(priority=1, share=0.7), interactive=LoadConfig(priority=2, share=0.25,
                                                                                   reserve=reserve))
    policy = MixedLoadPolicy.from_config(cfg, capacity=16)
    rng = random.Random(1)
    requests = poisson("interactive", rate=1.0, until=2000, service=0.5, rng=rng)
    alone = simulate(policy, requests, until=2100)
    loaded = simulate(policy, requests + backlog("train", 20_000, rng, 2.0, 6.0), until=2100)
    lat_alone = [finish - arrived for load, arrived, _, finish in alone if load == "interactive"]
    lat_loaded = [finish - arrived for load, arrived, _, finish in loaded if load == "interactive"]
    assert len(lat_loaded) == len(requests)
    assert p99(lat_alone) == pytest.approx(0.5)
    assert p99(lat_loaded) <= bound
    assert finished_between(loaded, "train", 0, 2000) > 2000 * 11 / 4 * 0.9  # training ran on the rest


def test_without_a_share_interactive_waits_behind_training():
    """The control: the same load with no share and no priority queues behind the backlog."""
    cfg = config(train=LoadConfig(priority=1, share=0.7), interactive=LoadConfig(priority=0, share=0.0))
    policy = MixedLoadPolicy.from_config(cfg, capacity=16)
    rng = random.Random(1)
    requests = poisson("interactive", rate=1.0, until=200, service=0.5, rng=rng)
    loaded = simulate(policy, requests + backlog("train", 2000, rng, 2.0, 6.0), until=3000)
    lat = [finish - arrived for load, arrived, _, finish in loaded if load == "interactive"]
    assert p99(lat) > 100


# ---- (3) an idle load's slots are lent and given back -------------------------------------------


def test_idle_slots_are_lent_and_reclaimed_without_preemption():
    cfg = config(train=LoadConfig(priority=1, share=0.5), interactive=LoadConfig(priority=2, share=0.5))
    policy = MixedLoadPolicy.from_config(cfg, capacity=8)
    # interactive idle: training borrows its 4 slots
    assert policy.admit(0.0, {"train": LoadState(queued=100)}) == {"train": 8, "eval": 0, "interactive": 0}
    # interactive work arrives: nothing running is preempted, nothing starts
    full = {"train": LoadState(queued=92, running=8, oldest=0.0), "interactive": LoadState(queued=4, oldest=1.0)}
    assert policy.admit(1.0, full) == {"train": 0, "eval": 0, "interactive": 0}
    # each slot that frees goes to interactive until it is back at its share
    train_running, inter_running, inter_queued = 8, 0, 4
    while inter_running < 4:
        train_running -= 1  # a borrowed sequence finishes
        grant = policy.admit(2.0, {"train": LoadState(92, train_running, 0.0),
                                   "interactive": LoadState(inter_queued, inter_running, 1.0)})
        assert grant == {"train": 0, "eval": 0, "interactive": 1}
        inter_running, inter_queued = inter_running + 1, inter_queued - 1
    assert (train_running, inter_running) == (4, 4)
    # both at their share: a slot that frees goes back to its own load, whatever the priorities
    assert policy.admit(3.0, {"train": LoadState(92, 3, 0.0), "interactive": LoadState(2, 4, 1.0)})["train"] == 1
    # once interactive is idle again, training takes every slot back
    assert policy.admit(4.0, {"train": LoadState(92, 4, 0.0), "interactive": LoadState(0, 0)})["train"] == 4


def test_lending_and_giving_back_over_time():
    cfg = config(train=LoadConfig(priority=1, share=0.5), interactive=LoadConfig(priority=2, share=0.5))
    policy = MixedLoadPolicy.from_config(cfg, capacity=8)
    rng = random.Random(2)
    burst = [(50.0, "interactive", 5.0)] * 40  # 40 requests at t=50: more than its 4 slots
    seen = []
    simulate(policy, backlog("train", 5000, rng, 1.0, 3.0) + burst, until=200,
             watch=lambda now, running, queued: seen.append((now, running["train"], running["interactive"])))
    before = [t for now, t, i in seen if now < 50]
    during = [(t, i) for now, t, i in seen if 53 <= now < 80]
    after = [t for now, t, i in seen if now >= 120]
    assert min(before[1:]) == 8  # all lent to training
    assert set(during) == {(4, 4)}  # reclaimed as training's sequences (<= 3 s) finished; each at its share
    assert min(after) == 8  # given back once the burst (40 x 5 s on 4 slots) is served


def test_a_reserve_keeps_slots_free_for_an_idle_load():
    cfg = config(train=LoadConfig(priority=1, share=0.5), interactive=LoadConfig(priority=2, share=0.5, reserve=0.5))
    policy = MixedLoadPolicy.from_config(cfg, capacity=8)
    assert policy.admit(0.0, {"train": LoadState(queued=100)})["train"] == 6
    # one request arrives: it starts, and the reserve's other slot stays free for the next one
    assert policy.admit(0.0, {"train": LoadState(queued=100), "interactive": LoadState(queued=1)}) == {
        "train": 6, "eval": 0, "interactive": 1}
    # past its reserve, a request is served from its share like any other
    assert policy.admit(0.0, {"train": LoadState(queued=100), "interactive": LoadState(queued=3)}) == {
        "train": 5, "eval": 0, "interactive": 3}


def test_equal_priorities_split_the_surplus_by_share():
    cfg = config(train=LoadConfig(priority=1, share=0.4), eval=LoadConfig(priority=1, share=0.2))
    policy = MixedLoadPolicy.from_config(cfg, capacity=30)
    grant = policy.admit(0.0, {"train": LoadState(queued=100), "eval": LoadState(queued=100)})
    assert grant == {"train": 20, "eval": 10, "interactive": 0}


def test_the_longest_waiting_load_reclaims_first_among_equal_priorities():
    cfg = config(train=LoadConfig(priority=1, share=0.5), eval=LoadConfig(priority=1, share=0.5))
    policy = MixedLoadPolicy.from_config(cfg, capacity=4)
    state = {"train": LoadState(5, 1, oldest=3.0), "eval": LoadState(5, 1, oldest=1.0),
             "interactive": LoadState(0, 1)}  # one free slot, both below their 2
    assert policy.admit(4.0, state) == {"train": 0, "eval": 1, "interactive": 0}


# ---- (4) validation -------------------------------------------------------------------------------


@pytest.mark.parametrize("loads, message", [
    ({"train": {"share": 0.6}, "eval": {"share": 0.3}, "interactive": {"share": 0.2}},
     "shares sum to 1.1 (train 0.6 + eval 0.3 + interactive 0.2); they must sum to at most 1"),
    ({"train": {"share": 1.5}}, "less than or equal to 1"),
    ({"train": {"share": -0.1}}, "greater than or equal to 0"),
    ({"eval": {"priority": -1}}, "greater than or equal to 0"),
    ({"interactive": {"reserve": 2}}, "less than or equal to 1"),
    ({"training": {"share": 0.5}}, "Extra inputs are not permitted"),
    ({"train": {"shares": 0.5}}, "Extra inputs are not permitted"),
    ({"capacity": 0}, "greater than 0"),
])
def test_bad_scheduler_sections_are_errors(loads, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        SchedulerConfig.model_validate(loads)


def test_shares_summing_to_one_are_fine_and_capacity_is_required():
    cfg = SchedulerConfig.model_validate({"train": {"share": 0.7}, "eval": {"share": 0.2}, "interactive": {"share": 0.1}})
    assert MixedLoadPolicy.from_config(cfg, capacity=10).guaranteed == {"train": 7, "eval": 2, "interactive": 1}
    with pytest.raises(ValueError, match="scheduler.capacity"):
        MixedLoadPolicy.from_config(cfg)
