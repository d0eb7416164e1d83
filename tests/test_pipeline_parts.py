"""The pipeline's parts without an engine: the admission rule and the stream's order and failures."""

import threading
import time

import pytest

from polyrl.pipeline.roles import EvalBatch, RolloutBatch, Ticket
from polyrl.pipeline.staleness import admitting_commit, behaviour_version, staleness_stats
from polyrl.pipeline.stream import InlineStream, Stream


def test_each_step_samples_exactly_k_versions_back_never_before_the_start():
    assert [behaviour_version(t, 0, 0) for t in range(4)] == [0, 1, 2, 3]
    assert [behaviour_version(t, 2, 0) for t in range(5)] == [0, 0, 0, 1, 2]
    assert [behaviour_version(t, 2, 7) for t in range(7, 11)] == [7, 7, 7, 8]  # resumed at step 7
    assert admitting_commit(5, 1, 0) == 4


def test_staleness_stats():
    assert staleness_stats(5, [5, 4, 4, 3]) == {"max": 2, "mean": 1.0, "hist": {"0": 1, "1": 2, "2": 1}}
    assert staleness_stats(5, []) == {"max": 0, "mean": 0.0, "hist": {}}


class FakeRollout:
    def __init__(self, delay=0.0, fail_at=None):
        self.delay, self.fail_at, self.seen = delay, fail_at, []

    def run(self, ticket):
        self.seen.append(ticket.step)
        if ticket.step == self.fail_at:
            raise ValueError("engine on fire")
        time.sleep(self.delay)
        out = [EvalBatch(ticket.eval_step, ticket.version, None)] if ticket.eval_step is not None else []
        return out + [RolloutBatch(ticket.step, ticket.version, [], self.delay, 0.0)]


class FakeReward:
    def __init__(self, delay=0.0):
        self.delay, self.threads = delay, set()

    def finish(self, item):
        self.threads.add(threading.current_thread().name)
        time.sleep(self.delay)
        if isinstance(item, EvalBatch):
            item.results = {"math": {"accuracy": 0.5}}
        else:
            item.reward_seconds = self.delay
        return item


@pytest.mark.parametrize("kind", [Stream, InlineStream])
def test_items_come_out_in_ticket_order_scored(kind):
    reward = FakeReward(0.01)
    stream = kind(FakeRollout(0.01), reward, depth=2)
    for t in range(4):
        stream.submit(Ticket(t, max(t - 1, 0), {"math": 1}, eval_step=t if t == 2 else None))
    got = [stream.next() for _ in range(5)]
    stream.close()
    assert [(type(x).__name__, x.step) for x in got] == [("RolloutBatch", 0), ("RolloutBatch", 1), ("EvalBatch", 2),
                                                         ("RolloutBatch", 2), ("RolloutBatch", 3)]
    assert got[2].results == {"math": {"accuracy": 0.5}} and got[3].reward_seconds == 0.01
    if kind is Stream:
        assert reward.threads == {"polyrl-reward"}


def test_a_failing_role_is_raised_by_the_trainer_naming_the_role():
    stream = Stream(FakeRollout(fail_at=1), FakeReward(), depth=1)
    for t in range(3):
        stream.submit(Ticket(t, 0, {"math": 1}))
    assert stream.next().step == 0
    with pytest.raises(RuntimeError, match="rollout role failed: engine on fire"):
        stream.next()
    stream.close()


def test_a_bounded_queue_holds_the_rollout_back_and_counts_its_wait():
    rollout = FakeRollout()
    stream = Stream(rollout, FakeReward(), depth=1)
    for t in range(6):
        stream.submit(Ticket(t, 0, {"math": 1}))
    time.sleep(0.5)  # the trainer takes nothing: both queues fill, the rollout role waits
    assert len(rollout.seen) < 6
    assert stream.idle["rollout"] > 0
    assert [stream.next().step for _ in range(6)] == list(range(6))
    stream.close()


def test_close_stops_the_roles_with_work_still_queued():
    stream = Stream(FakeRollout(0.01), FakeReward(), depth=1)
    for t in range(20):
        stream.submit(Ticket(t, 0, {"math": 1}))
    stream.next()
    stream.close()
    assert not any(t.is_alive() for t in stream._threads)
