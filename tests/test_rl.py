"""GRPO pieces on hand-computed values."""

import math

import pytest
import torch

from polyrl.rl.advantages import group_advantages, zero_variance_groups
from polyrl.rl.loss import kl_k3, kl_penalty, masked_mean, policy_loss
from polyrl.rl.overlong import overlong_mask, overlong_rewards


def test_group_advantages_one_domain():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    # centred: [.5,-.5,-.5,.5] and [.25,.25,.25,-.75]; domain std = sqrt(1.75 / 8)
    scale = math.sqrt(1.75 / 8)
    adv = group_advantages(rewards, ["math", "math"])
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.25, 0.25, 0.25, -0.75]]) / scale
    torch.testing.assert_close(adv, expected, rtol=1e-5, atol=1e-5)


def test_group_advantages_normalised_per_domain():
    # Same pattern, rewards 10x larger in "b": per-domain scaling makes advantages equal.
    rewards = torch.tensor([[1.0, 0.0], [10.0, 0.0]])
    adv = group_advantages(rewards, ["a", "b"])
    torch.testing.assert_close(adv[0], adv[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(adv[0], torch.tensor([1.0, -1.0]), rtol=1e-4, atol=1e-4)


def test_zero_variance_groups():
    rewards = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    assert zero_variance_groups(rewards).tolist() == [True, True, False]
    assert group_advantages(rewards, ["m"] * 3)[:2].abs().sum() == 0


@pytest.mark.parametrize(
    "ratio, adv, loss, clipped",
    [
        (1.5, 1.0, -1.28, 1.0),   # positive advantage: capped at 1 + clip_high
        (1.5, -1.0, 1.5, 0.0),    # negative advantage, ratio up: not clipped (pessimistic min)
        (0.5, 1.0, -0.5, 0.0),    # positive advantage, ratio down: not clipped
        (0.5, -1.0, 0.8, 1.0),    # negative advantage: floored at 1 - clip_low
        (1.1, 1.0, -1.1, 0.0),    # inside the trust region
    ],
)
def test_policy_loss_asymmetric_clip(ratio, adv, loss, clipped):
    logp = torch.tensor([[math.log(ratio)]])
    out, stats = policy_loss(logp, torch.zeros(1, 1), torch.tensor([adv]), torch.ones(1, 1), 0.2, 0.28)
    assert out.item() == pytest.approx(loss, abs=1e-6)
    assert stats["clip_frac"] == pytest.approx(clipped)


def test_policy_loss_is_token_level_mean():
    # Sample 0 has 3 counted tokens, sample 1 has 1: a token-level mean weighs tokens equally.
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    out, _ = policy_loss(logp, logp, torch.tensor([1.0, -1.0]), mask, 0.2, 0.2)
    assert out.item() == pytest.approx(-(3 * 1.0 - 1.0) / 4)


def test_policy_gradient_direction():
    logp = torch.zeros(1, 2, requires_grad=True)
    loss, _ = policy_loss(logp, torch.zeros(1, 2), torch.tensor([2.0]), torch.ones(1, 2), 0.2, 0.2)
    loss.backward()
    assert (logp.grad < 0).all()  # descending the loss raises the logprob of a good sample


def test_kl_k3_hand_value():
    value = kl_k3(torch.tensor([0.0]), torch.tensor([math.log(0.5)]))
    assert value.item() == pytest.approx(0.5 + math.log(2) - 1)
    assert kl_k3(torch.tensor([0.3]), torch.tensor([0.3])).item() == 0.0


def test_kl_penalty_per_domain_coefficient():
    logp = torch.zeros(2, 1)
    ref = torch.full((2, 1), math.log(0.5))
    k3 = 0.5 + math.log(2) - 1
    out = kl_penalty(logp, ref, torch.tensor([0.1, 0.0]), torch.ones(2, 1))
    assert out.item() == pytest.approx(0.1 * k3 / 2)


def test_masked_mean_empty_mask_is_zero():
    assert masked_mean(torch.ones(2, 2), torch.zeros(2, 2)).item() == 0.0


def test_overlong():
    assert overlong_mask(["stop", "length"], "mask") == [1.0, 0.0]
    assert overlong_mask(["stop", "length"], "penalty") == [1.0, 1.0]
    assert overlong_rewards([1.0, 1.0], ["stop", "length"], "penalty") == [1.0, 0.0]
    assert overlong_rewards([1.0, 1.0], ["stop", "length"], "mask") == [1.0, 1.0]


def test_allocate_largest_remainder():
    from polyrl.rl.curriculum import allocate

    assert allocate(16, {"math": 1.0}) == {"math": 16}
    assert allocate(10, {"a": 0.35, "b": 0.30, "c": 0.20, "d": 0.15}) == {"a": 4, "b": 3, "c": 2, "d": 1}
    assert allocate(3, {"a": 100.0, "b": 1.0, "c": 1.0}) == {"a": 1, "b": 1, "c": 1}
    assert sum(allocate(17, {"a": 1.0, "b": 2.0, "c": 3.0}).values()) == 17
