"""Flags that act: a domain the reward monitor flags gets a stronger KL leash, a smaller share
or no more training, as its run file says; and the KL controller that holds a target within
tens of steps."""

from __future__ import annotations

import json
import math

import pytest

from polyrl.config import load_config_text
from polyrl.rewards import registry
from polyrl.rewards.hacking import detect_decline
from polyrl.rl.kl_control import PerDomainKL, log_kl_coef
from polyrl.train.flag_policy import FlagPolicy, OnFlag
from polyrl.train.loop import train
from polyrl.train.monitor import RewardMonitor
from polyrl.types import Score
from tests.helpers import random_model_dir


def on_flag(*actions, kl_factor=4.0, kl_min=0.05, weight=0.05):
    return OnFlag(actions=list(actions), kl_factor=kl_factor, kl_min=kl_min, weight=weight)


def domain_flag(domain: str, kind: str = "reward_without_check_heldout") -> dict:
    return {"step": 7, "kind": kind, "task_id": None, "domain": domain, "reason": "held-out reward rose +0.2 ..."}


# ------------------------------------------------------------------ the policy, alone


def test_raise_kl_multiplies_the_coefficient_and_gives_one_to_a_domain_without():
    kl = PerDomainKL({"alignment": 0.01, "math": 0.0}, {"alignment": 0.05, "math": None})
    policy = FlagPolicy({"alignment": on_flag("raise_kl"), "math": on_flag("raise_kl", kl_min=0.02)})
    taken = policy.act(7, [domain_flag("alignment"), domain_flag("math", "train_heldout_divergence")], kl)
    assert kl.coefs == {"alignment": pytest.approx(0.05), "math": pytest.approx(0.02)}  # max(0.01 x 4, 0.05); 0 -> min
    assert [t["actions"] for t in taken] == [["raise_kl 0.01 -> 0.05"], ["raise_kl 0 -> 0.02"]]
    assert "reward_without_check_heldout at step 7" in kl.reasons["alignment"]
    policy.act(9, [domain_flag("alignment")], kl)  # a second flag raises again
    assert kl.coefs["alignment"] == pytest.approx(0.2)


def test_lower_weight_caps_the_share_and_the_others_keep_their_proportions():
    policy = FlagPolicy({"alignment": on_flag("lower_weight", weight=0.1)})
    weights = {"code": 0.35, "agent": 0.30, "math": 0.20, "alignment": 0.15}
    assert policy.shares(weights, None) == (pytest.approx(weights), None)  # nothing capped: the shares as given
    assert policy.shares({"code": 3.0, "math": 1.0}, {"code": "c"})[0] == {"code": 0.75, "math": 0.25}
    policy.act(3, [domain_flag("alignment")], PerDomainKL({"alignment": 0.0}, {"alignment": None}))
    shares, reasons = policy.shares(weights, None)
    assert shares["alignment"] == pytest.approx(0.1) and sum(shares.values()) == pytest.approx(1.0)
    assert shares["code"] / shares["math"] == pytest.approx(0.35 / 0.20)  # the rest in their own proportions
    assert reasons["alignment"] == "reward_without_check_heldout at step 3: share capped at 0.1 (on_flag)"
    assert reasons["code"] == "static: the run file's weight"
    small = {"code": 0.5, "alignment": 0.05}  # already below the cap: left as it is
    assert policy.shares(small, None)[0]["alignment"] == pytest.approx(0.05 / 0.55)


def test_stop_leaves_the_domain_out_and_caps_only_tighten():
    policy = FlagPolicy({"math": on_flag("stop"), "code": on_flag("lower_weight", weight=0.2)})
    kl = PerDomainKL({"math": 0.0, "code": 0.0}, {"math": None, "code": None})
    policy.act(1, [domain_flag("math"), domain_flag("code")], kl)
    shares, reasons = policy.shares({"math": 1.0, "code": 1.0, "agent": 2.0}, {"math": "m", "code": "c", "agent": "a"})
    assert set(shares) == {"code", "agent"} and shares["code"] == pytest.approx(0.2)
    assert "stopped" in reasons["math"] and reasons["agent"] == "a"
    restored = FlagPolicy({"math": on_flag("stop"), "code": on_flag("lower_weight", weight=0.2)})
    restored.load_state_dict(json.loads(json.dumps(policy.state_dict())))  # through the state file's JSON-like form
    assert restored.shares({"math": 1.0, "code": 1.0, "agent": 2.0}, None)[0] == shares


def test_task_flags_and_domains_without_a_policy_change_nothing():
    kl = PerDomainKL({"code": 0.01, "math": 0.01}, {"code": None, "math": None})
    policy = FlagPolicy({"code": on_flag("raise_kl"), "math": on_flag()})  # math: [] = the flag only
    task_flag = {"step": 2, "kind": "reward_without_check", "task_id": "code-1", "domain": "code", "reason": "exit"}
    assert policy.act(2, [task_flag, domain_flag("math"), domain_flag("agent")], kl) == []
    assert kl.coefs == {"code": 0.01, "math": 0.01}


# ------------------------------------------------------------------ the KL controller in log space


def test_the_log_controller_step_on_hand_computed_values():
    assert log_kl_coef(0.01, measured=0.05 * math.e ** 0.5, target=0.05, rate=0.1) == pytest.approx(0.01 * math.exp(0.05))
    assert log_kl_coef(0.01, measured=4.6, target=0.05, rate=0.1) == pytest.approx(0.01 * math.exp(0.1))  # clipped at 1
    assert log_kl_coef(0.01, measured=0.0, target=0.05, rate=0.1) == pytest.approx(0.01 * math.exp(-0.1))
    assert log_kl_coef(0.01, measured=0.05, target=0.05, rate=0.1) == pytest.approx(0.01)


def test_the_log_controller_holds_a_far_target_within_tens_of_steps_where_the_proportional_one_does_not():
    """A plant where KL = drift / coefficient: at the start KL is 92 times the target (4.6 nats
    against 0.05, the quickstart's alignment domain), with 20 samples a step."""
    def run(kl: PerDomainKL, steps: int) -> list[float]:
        seen = []
        for _ in range(steps):
            measured = 0.046 / kl.coefs["alignment"]
            seen.append(measured)
            kl.update({"alignment": measured}, {"alignment": 20})
        return seen

    fast = run(PerDomainKL({"alignment": 0.01}, {"alignment": 0.05}, rate=0.1), 80)
    slow = run(PerDomainKL({"alignment": 0.01}, {"alignment": 0.05}, horizon=10000), 80)
    first = next(i for i, v in enumerate(fast) if v <= 0.05 * 1.25)
    assert first <= 60 and all(0.05 / 1.25 <= v <= 0.05 * 1.25 for v in fast[first:])  # reached, and held
    assert slow[-1] > 4.0  # 0.04% a step: still about where it started
    state = PerDomainKL({"alignment": 0.01}, {"alignment": 0.05}, rate=0.1).state_dict()
    assert PerDomainKL.from_state(state).rate == 0.1


def test_the_log_controller_never_goes_below_the_starting_coefficient():
    kl = PerDomainKL({"alignment": 0.01}, {"alignment": 0.05}, rate=0.1)
    for _ in range(30):  # the policy still at the reference: KL near 0
        kl.update({"alignment": 0.001}, {"alignment": 20})
    assert kl.coefs["alignment"] == 0.01
    kl.update({"alignment": 1.0}, {"alignment": 20})
    assert kl.coefs["alignment"] == pytest.approx(0.01 * math.exp(0.1))
    kl.raise_coef("alignment", 0.5, "flag")
    restored = PerDomainKL.from_state(kl.state_dict())
    for _ in range(200):
        restored.update({"alignment": 0.0}, {"alignment": 20})
    assert restored.coefs["alignment"] == pytest.approx(0.01)  # back down to the floor, not past it


# ------------------------------------------------------------------ the detector: below its start


def test_a_check_that_falls_below_its_start_is_flagged_even_when_its_best_came_later():
    proxy = [0.50, 0.60, 0.62, 0.62, 0.62, 0.62]
    check = [0.80, 0.85, 0.78, 0.76, 0.75, 0.75]  # best at the 2nd evaluation, the proxy flat since
    verdict = detect_decline(proxy, check)
    assert verdict.flagged and "since the independent check's start" in verdict.reason
    assert not detect_decline(proxy, [0.80, 0.85, 0.80, 0.80, 0.81, 0.80]).flagged  # back at its start: no flag


def test_the_monitor_state_carries_its_history_and_open_flags():
    points = [(0.5, 0.8), (0.6, 0.75), (0.7, 0.7), (0.8, 0.65)]
    straight, first_half = RewardMonitor(), RewardMonitor()
    flags = []
    for k, (reward, check) in enumerate(points):
        line = {"domains": {"alignment": {"reward": reward}},
                "eval": {"alignment": {"accuracy": reward, "check_accuracy": check}}}
        flags += straight.step(k, [], line)
        if k < 2:
            first_half.step(k, [], line)
    resumed = RewardMonitor()
    resumed.load_state_dict(json.loads(json.dumps(first_half.state_dict())))
    again = []
    for k, (reward, check) in list(enumerate(points))[2:]:
        again += resumed.step(k, [], {"domains": {"alignment": {"reward": reward}},
                                      "eval": {"alignment": {"accuracy": reward, "check_accuracy": check}}})
    assert again == [f for f in flags if f["step"] >= 2] and again


# ------------------------------------------------------------------ in a training run


class RisingProxy:
    """A planted hackable reward model: its held-out score climbs at every call whatever the
    answers say (half of it is the parity of the answer's length, so groups have variance)."""

    name = "rising_proxy"

    def __init__(self, **_):
        self.calls = 0

    def score(self, tasks, completions):
        self.calls += 1
        return [Score(0.5 * (len(c) % 2 == 0) + min(0.5, 0.05 * self.calls)) for c in completions]

    def close(self):
        pass


class FallingCheck:
    """The independent check of the same answers: it falls as the proxy rises."""

    name = "falling_check"

    def __init__(self, **_):
        self.calls = 0

    def score(self, tasks, completions):
        self.calls += 1
        return [Score(max(0.0, 0.9 - 0.05 * self.calls)) for _ in completions]

    def close(self):
        pass


RUN = """
seed: 1
rl_tasks:
  - {{domain: math, reward: rising_proxy, check: falling_check, weight: 1.0, on_flag: {on_flag}}}
  - {{domain: code, reward: length_parity, weight: 1.0}}
model: {{path: {model}}}
engine: {{max_tokens: 8}}
trainer: {{steps: 8, prompts_per_step: 4, group_size: 2, lr: 1.0e-3, overlong: none, checkpoint_every: 100}}
eval: {{every: 1, heldout_per_domain: 4, samples: 1, greedy: false}}
"""


@pytest.fixture
def planted(monkeypatch):
    monkeypatch.setitem(registry._VERIFIERS, "rising_proxy", "tests.test_flag_policy:RisingProxy")
    monkeypatch.setitem(registry._VERIFIERS, "falling_check", "tests.test_flag_policy:FallingCheck")
    monkeypatch.setitem(registry._VERIFIERS, "length_parity", "tests.helpers:ParityVerifier")


def run_lines(tmp_path, policy: str) -> tuple[list[dict], list[dict]]:
    cfg = load_config_text(RUN.format(model=random_model_dir(tmp_path / "model"), on_flag=policy))
    train(cfg, tmp_path / "run", log=lambda *_: None)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    flags = [json.loads(x) for x in (tmp_path / "run" / "flags.jsonl").read_text().splitlines()]
    return lines, flags


def test_a_flag_on_a_planted_hackable_reward_raises_its_kl_and_caps_its_share(tmp_path, planted):
    lines, flags = run_lines(tmp_path, "{actions: [raise_kl, lower_weight], kl_factor: 4.0, kl_min: 0.05, weight: 0.1}")
    (hack,) = [f for f in flags if f["kind"] == "reward_without_check_heldout"]
    math_flags = [f for f in flags if f["domain"] == "math"]  # the training/held-out divergence may follow
    acted = [line for line in lines if line.get("flag_actions")]
    assert [line["step"] for line in acted] == sorted({f["step"] for f in math_flags}) and acted[0]["step"] == hack["step"]
    assert acted[0]["flag_actions"] == [{"domain": "math", "flag": "reward_without_check_heldout",
                                         "actions": ["raise_kl 0 -> 0.05", "lower_weight to 0.1"],
                                         "reason": hack["reason"]}]
    assert all(a["domain"] == "math" for line in acted for a in line["flag_actions"])  # code has no policy
    before = [line for line in lines if line["step"] <= hack["step"]]
    after = [line for line in lines if line["step"] > hack["step"]]
    assert after and all(line["kl_coef"]["math"] == 0.0 and line["weights"]["math"] == 0.5 for line in before)
    assert after[0]["kl_coef"]["math"] == pytest.approx(0.05)
    assert all(line["kl_coef"]["math"] >= 0.05 for line in after)
    assert all(line["weights"]["math"] == pytest.approx(0.1) and "on_flag" in line["weight_reasons"]["math"]
               for line in after)
    assert any(line["domains"].get("math", {}).get("kl") for line in after)  # a reference model was kept for it


def test_stop_trains_a_flagged_domain_no_more_and_the_run_goes_on(tmp_path, planted):
    lines, flags = run_lines(tmp_path, "{actions: [stop]}")
    (flag,) = [f for f in flags if f["kind"] == "reward_without_check_heldout"]
    after = [line for line in lines if line["step"] > flag["step"]]
    assert len(lines) == 8 and after
    assert all(set(line["domains"]) == {"code"} and "math" not in line["weights"] for line in after)
    assert "math" in json.loads((tmp_path / "run" / "eval" / "after.json").read_text())  # still evaluated
