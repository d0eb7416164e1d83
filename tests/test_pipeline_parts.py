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


def test_a_rollout_pools_shards_merge_in_prompt_order_with_summed_counters():
    from polyrl.engine.stats import counter_delta
    from polyrl.pipeline.roles import RolloutBatch, merge_shards
    from polyrl.rollout.groups import Group
    from polyrl.types import Task

    tasks = [Task(id=f"t{k}", domain="math", prompt=str(k)) for k in range(5)]
    counters = {"prefill_tokens_computed": 0, "prefill_tokens_cached": 0, "scheduled_seqs": 0, "steps": 0}

    def engine(computed, cached, seqs, steps):
        after = {"prefill_tokens_computed": computed, "prefill_tokens_cached": cached, "scheduled_seqs": seqs,
                 "steps": steps}
        return counter_delta(counters, after)

    first = RolloutBatch(3, 7, [Group(tasks[k], []) for k in (0, 2, 4)], 2.0, 0.1, engine(60, 40, 30, 10),
                         ["a"], order=[0, 2, 4])
    second = RolloutBatch(3, 6, [Group(tasks[k], []) for k in (3, 1)], 3.0, 0.2, engine(20, 80, 10, 10),
                          ["b"], order=[3, 1])
    merged = merge_shards([first, second])
    assert [g.task.id for g in merged.groups] == ["t0", "t1", "t2", "t3", "t4"] and merged.order == [0, 1, 2, 3, 4]
    assert (merged.step, merged.version, merged.rollout_seconds, merged.sync_seconds) == (3, 6, 3.0, 0.2)
    assert merged.engine["prefill_tokens_cached"] == 120 and merged.engine["prefix_hit_rate"] == 0.6
    assert merged.engine["batch_occupancy"] == 2.0 and merged.records == ["a", "b"]
    with pytest.raises(ValueError, match="different steps"):
        merge_shards([first, RolloutBatch(4, 7, [], 0.0, 0.0)])


def test_a_rollout_or_reward_pool_or_trainer_actors_need_the_ray_backend():
    from pydantic import ValidationError

    from polyrl.pipeline.cluster import ClusterConfig

    assert ClusterConfig(backend="ray", rollout_replicas=4).rollout_replicas == 4
    assert ClusterConfig(backend="ray", reward_replicas=3).reward_replicas == 3
    with pytest.raises(ValidationError, match="rollout_replicas: 2 needs backend: ray"):
        ClusterConfig(backend="local", rollout_replicas=2)
    with pytest.raises(ValidationError, match="reward_replicas: 2 needs backend: ray"):
        ClusterConfig(backend="inline", reward_replicas=2)
    assert ClusterConfig(backend="ray", trainer_actors=1).trainer_actors == 1
    assert ClusterConfig(backend="local").trainer_actors == 0  # the trainer in the driver
    with pytest.raises(ValidationError, match="trainer_actors: 1 needs backend: ray"):
        ClusterConfig(backend="local", trainer_actors=1)


def test_train_ray_flag_counts_before_the_run_file_is_checked():
    from polyrl.config import ConfigError, load_config_text

    text = """
rl_tasks:
  - {domain: math, weight: 1}
cluster: {rollout_replicas: 2, address: auto}
"""
    with pytest.raises(ConfigError, match="needs backend: ray"):
        load_config_text(text)
    assert load_config_text(text, ray="").cluster.model_dump(include={"backend", "address", "rollout_replicas"}) \
        == {"backend": "ray", "address": "auto", "rollout_replicas": 2}
    assert load_config_text(text, ray="ray://head:10001").cluster.address == "ray://head:10001"
    assert load_config_text("rl_tasks: [{domain: math, weight: 1}]\ncluster: null\n", ray="").cluster.backend == "ray"
    assert load_config_text("rl_tasks: [{domain: math, weight: 1}]\n").cluster.backend == "local"
