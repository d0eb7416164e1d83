"""The alignment domain, its rule check, the preference-model reward and its guards, and the
reward-hacking detector against a planted hackable reward model."""

import random

import pytest

from polyrl.domains.alignment import BAD_KINDS, AlignmentDomain, bad_answer, good_answer, preference_pairs
from polyrl.train.monitor import RewardMonitor
from polyrl.rewards.alignment_rules import AlignmentRules, rule_checks, rule_score, words
from polyrl.rewards.preference_model import PreferenceModel
from polyrl.rewards.registry import get_verifier

MICRO_RM = {"vocab_size": 300, "hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
            "intermediate_size": 64, "steps": 60, "batch_size": 16, "heldout_pairs": 64}


@pytest.fixture(scope="module")
def rm_cache(tmp_path_factory):
    """A cache with two micro reward models, built once for the module."""
    root = tmp_path_factory.mktemp("rm-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("POLYRL_CACHE", str(root))
    PreferenceModel(members=2, recipe=MICRO_RM, log=lambda *_: None)
    yield root
    mp.undo()


@pytest.fixture
def micro_pm(rm_cache, monkeypatch):
    monkeypatch.setenv("POLYRL_CACHE", str(rm_cache))
    return PreferenceModel(members=2, recipe=MICRO_RM, log=lambda *_: None)


def tasks(split="heldout", n=60, seed=0):
    return AlignmentDomain().sample(split, n, seed)


# ------------------------------------------------------------------ domain and rules


def test_splits_are_disjoint_fixed_and_cover_every_intent():
    train, heldout = tasks("train", 300), tasks("heldout", 100)
    assert not {t.prompt for t in train} & {t.prompt for t in heldout}
    assert [t.id for t in tasks("heldout", 100)] == [t.id for t in heldout]
    assert {t.data["intent"] for t in heldout} == {"ask", "thank", "decline", "invite", "apologise"}
    assert all(t.domain == "alignment" and t.split == "heldout" for t in heldout)


def test_good_answers_pass_every_rule_and_each_bad_kind_fails_one():
    rng = random.Random(0)
    for t in tasks(n=100):
        assert all(rule_checks(t, good_answer(t, rng)).values()), t.prompt
        assert rule_score(t, AlignmentDomain.demonstration(t)) == 1.0
        for kind in BAD_KINDS:
            assert rule_score(t, bad_answer(t, kind, rng)) < 1.0, (kind, t.prompt)


def test_rule_check_verifier_names_the_failed_rules():
    t = next(t for t in tasks() if t.data["intent"] == "thank")
    (good, rude) = AlignmentRules().score([t, t], [good_answer(t, random.Random(0)),
                                                  f"Whatever, {t.data['fields']['name']}."])
    assert good.value == 1.0 and good.details["failed"] == []
    assert rude.value < 1.0 and {"not_rude", "helpful"} <= set(rude.details["failed"])


def test_alignment_is_a_registered_domain_with_a_default_check():
    from polyrl.domains.registry import get_domain

    d = get_domain("alignment")
    assert d.default_verifier == "preference_model" and d.default_check == "rule_check"
    assert isinstance(get_verifier("rule_check"), AlignmentRules)


def test_preference_pairs_reject_every_kind():
    pairs = preference_pairs(120, seed=1)
    assert {kind for *_, kind in pairs} == set(BAD_KINDS)
    assert all(chosen != rejected for _, chosen, rejected, _ in pairs)


# ------------------------------------------------------------------ the reward model


def test_built_in_reward_models_prefer_good_answers(micro_pm):
    rng = random.Random(3)
    ts = tasks(n=80)
    good = micro_pm.score(ts, [good_answer(t, rng) for t in ts])
    rude = micro_pm.score(ts, [bad_answer(t, "rude", rng) for t in ts])
    assert all(0.0 <= s.value <= 1.0 for s in good + rude)
    assert sum(s.value for s in good) > sum(s.value for s in rude)
    assert len(good[0].details["raw"]) == 2 and good[0].details["status"] == "ok"


def test_reward_model_directories_load_in_transformers(rm_cache, micro_pm):
    transformers = pytest.importorskip("transformers")
    import torch

    from polyrl.rewards.preference_model import render

    member = micro_pm.members[0]
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(member.model_dir).eval()
    t = tasks(n=1)[0]
    text = good_answer(t, random.Random(0))
    ids = torch.tensor([member.tok.encode(render(member.tok, t.prompt, text))])
    with torch.no_grad():
        theirs = hf(input_ids=ids).logits[0, 0].item()
    assert member.raw_scores([t.prompt], [text])[0] == pytest.approx(theirs, abs=1e-4)


class FixedRM:
    """A reward model scoring by a function of the completion, for the guards and the detector."""

    calibration = (0.0, 1.0)

    def __init__(self, fn):
        self.fn = fn

    def raw_scores(self, prompts, completions):
        return [self.fn(c) for c in completions]


def test_disagreement_between_members_lowers_the_reward():
    t = tasks(n=1)[0]
    agree = PreferenceModel(reward_models=[FixedRM(lambda c: 1.0), FixedRM(lambda c: 1.0)])
    split = PreferenceModel(reward_models=[FixedRM(lambda c: 3.0), FixedRM(lambda c: -1.0)])  # same mean
    a, s = agree.score([t], ["Hi."])[0], split.score([t], ["Hi."])[0]
    assert a.details["mean_z"] == s.details["mean_z"] == 1.0
    assert s.value < a.value and s.details["ensemble_penalty"] > 0 and a.details["ensemble_penalty"] == 0


def test_length_penalty_takes_back_what_a_length_loving_model_gives():
    t = tasks(n=1)[0]
    long_answer = good_answer(t, random.Random(0)) + " and so on" * 20
    length_rm = FixedRM(lambda c: len(words(c)) / 10)
    unguarded = PreferenceModel(reward_models=[length_rm], length_penalty=0.0).score([t], [long_answer])[0]
    guarded = PreferenceModel(reward_models=[length_rm], length_penalty=0.5).score([t], [long_answer])[0]
    assert unguarded.value > 0.99 and guarded.value < 0.2 and guarded.details["length_penalty"] > 0


def test_options_are_checked():
    with pytest.raises(ValueError, match="disagreement"):
        PreferenceModel(reward_models=[FixedRM(len)], disagreement=-1)


# ------------------------------------------------------------------ the hacking detector


def evaluations(pm: PreferenceModel, answer_mix: list[float], kind: str, start_kind: str = "terse"):
    """Held-out reward and rule check of a simulated policy, one per evaluation: at evaluation k
    the share answer_mix[k] of answers are of `kind` (else `start_kind`)."""
    ts, rules, rng = tasks(n=60), AlignmentRules(), random.Random(7)
    out = []
    for share in answer_mix:
        texts = []
        for i, t in enumerate(ts):
            pick = kind if i < share * len(ts) else start_kind
            texts.append(good_answer(t, rng) if pick == "good" else bad_answer(t, pick, rng))
        reward = sum(s.value for s in pm.score(ts, texts)) / len(ts)
        check = sum(s.value for s in rules.score(ts, texts)) / len(ts)
        out.append((reward, check))
    return out


def flags_over(points):
    monitor, flags = RewardMonitor(), []
    for k, (reward, check) in enumerate(points):
        flags += monitor.step(10 * k, [], {"domains": {}, "eval": {"alignment": {"accuracy": reward,
                                                                                 "check_accuracy": check}}})
    return [f for f in flags if f["kind"] == "reward_without_check_heldout"]


@pytest.mark.parametrize("hack", ["keyword", "length"])
def test_a_planted_hackable_reward_model_is_flagged(hack):
    # The planted RM rewards "please"/"thank" (keyword) or word count (length), and has no
    # length guard; the policy drifts from good answers to stuffed or verbose ones.
    if hack == "keyword":
        rm, kind = FixedRM(lambda c: sum(w in ("please", "thank") for w in words(c)) - 1.0), "stuffed"
    else:
        rm, kind = FixedRM(lambda c: len(words(c)) / 8 - 1.5), "verbose"
    pm = PreferenceModel(reward_models=[rm], length_penalty=0.0)
    points = evaluations(pm, [0.0, 0.25, 0.5, 0.75, 1.0], kind=kind, start_kind="good")
    assert points[-1][0] > points[0][0] + 0.1 and points[-1][1] < points[0][1]  # reward up, check down
    (flag,) = flags_over(points)
    assert flag["domain"] == "alignment" and "held-out reward rose" in flag["reason"]


def test_a_policy_that_really_improves_is_not_flagged():
    rm = FixedRM(lambda c: sum(w in ("please", "thank") for w in words(c)) - 1.0)  # the same hackable RM
    pm = PreferenceModel(reward_models=[rm], length_penalty=0.0)
    points = evaluations(pm, [0.0, 0.25, 0.5, 0.75, 1.0], kind="good", start_kind="terse")
    assert points[-1][0] > points[0][0] + 0.1 and points[-1][1] > points[0][1] + 0.1  # both rise
    assert flags_over(points) == []


# The alignment evaluations of a 700-step quickstart (runs/quickstart-20261204-080944):
# (step, held-out reward-model score, held-out rule check). The score crept up by about
# 0.01 per evaluation while the check slid from its best at the first evaluation.
QUICKSTART_700 = [(39, 0.6504, 0.8672), (79, 0.6568, 0.8662), (119, 0.6461, 0.8434), (159, 0.6673, 0.8398),
                  (199, 0.6659, 0.8369), (239, 0.6856, 0.8389), (279, 0.6866, 0.8379), (319, 0.6879, 0.8262),
                  (359, 0.6892, 0.8001), (399, 0.6922, 0.7969), (439, 0.6908, 0.7969), (479, 0.7019, 0.7998),
                  (519, 0.7047, 0.8027), (559, 0.708, 0.8008), (599, 0.7114, 0.7952), (639, 0.7237, 0.7975),
                  (679, 0.7245, 0.7956)]


def test_slow_over_optimisation_is_flagged_from_the_checks_best():
    from polyrl.rewards.hacking import detect_hacking

    proxy, check = [p for _, p, _ in QUICKSTART_700], [c for _, _, c in QUICKSTART_700]
    # no five-evaluation window rises enough to be judged
    assert not any(detect_hacking(proxy[:k], check[:k], min_rise=0.1).flagged for k in range(1, len(proxy) + 1))
    monitor, flags = RewardMonitor(), []
    for step, reward, chk in QUICKSTART_700:
        flags += monitor.step(step, [], {"domains": {}, "eval": {"alignment": {"accuracy": reward,
                                                                              "check_accuracy": chk}}})
    (flag,) = [f for f in flags if f["kind"] == "reward_without_check_heldout"]  # once, not at every evaluation
    assert flag["step"] == 559 and "since the independent check's best" in flag["reason"]


@pytest.mark.parametrize("proxy_gain,check_drop,flagged", [(0.08, 0.06, True), (0.0, 0.06, False), (0.08, 0.01, False)])
def test_a_decline_needs_the_proxy_up_and_the_check_down(proxy_gain, check_drop, flagged):
    from polyrl.rewards.hacking import HackingMonitor

    monitor = HackingMonitor(min_rise=0.1)
    for k in range(8):  # small steps: no window rises 0.1
        verdict = monitor.observe("a", k, proxy=0.5 + proxy_gain * k / 7, check=0.8 - check_drop * k / 7)
    assert verdict.flagged is flagged
    restored = HackingMonitor.from_dict(monitor.to_dict())
    assert restored.verdict("a") == verdict
    old_state = {k: v for k, v in monitor.to_dict().items() if k != "decline"}  # a state saved before the rule
    assert HackingMonitor.from_dict(old_state).verdict("a") == verdict
