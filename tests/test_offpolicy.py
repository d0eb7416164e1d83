"""Decoupled PPO (rl/offpolicy.py) on hand-computed values."""

import math

import pytest
import torch

from polyrl.rl.loss import policy_loss
from polyrl.rl.offpolicy import decoupled_policy_loss, importance_weights, mismatch_kl


def logs(*p):
    return torch.tensor([[math.log(x) for x in p]])


def test_the_weight_is_prox_over_behaviour_clamped_and_the_ratio_is_taken_to_prox():
    # r = 0.5 / 0.4 = 1.25 (inside [0.8, 1.28]); w = 0.4 / 0.2 = 2.0 (at the cap)
    logp = logs(0.5).requires_grad_()
    loss = decoupled_policy_loss(logp, logs(0.4), logs(0.2), torch.tensor([1.0]), torch.ones(1, 1), 0.2, 0.28, 2.0)
    assert loss.item() == pytest.approx(-2.5)
    loss.backward()
    assert logp.grad.item() == pytest.approx(-2.5)  # d(-w r A)/dlogp = -w r A: w carries no gradient


def test_a_weight_past_the_cap_is_clamped():
    w = importance_weights(logs(0.4, 0.4), logs(0.1, 0.4), cap=2.0)
    assert w.tolist()[0] == pytest.approx([2.0, 1.0])  # 4.0 clamped; equal policies weigh 1
    loss = decoupled_policy_loss(logs(0.5), logs(0.4), logs(0.1), torch.tensor([1.0]), torch.ones(1, 1), 0.2, 0.28, 2.0)
    assert loss.item() == pytest.approx(-2.5)


def test_clipping_is_around_the_proximal_policy():
    # negative advantage, r = 0.6 / 0.4 = 1.5: min(-1.5, -1.28) = -1.5 (unclipped, pessimistic)
    loss = decoupled_policy_loss(logs(0.6), logs(0.4), logs(0.4), torch.tensor([-1.0]), torch.ones(1, 1), 0.2, 0.28, 2.0)
    assert loss.item() == pytest.approx(1.5)
    # positive advantage, same ratio: clipped to 1.28, and no gradient flows
    logp = logs(0.6).requires_grad_()
    loss = decoupled_policy_loss(logp, logs(0.4), logs(0.4), torch.tensor([1.0]), torch.ones(1, 1), 0.2, 0.28, 2.0)
    assert loss.item() == pytest.approx(-1.28)
    loss.backward()
    assert logp.grad.item() == 0.0


def test_with_behaviour_equal_to_prox_it_is_the_synchronous_loss():
    g = torch.Generator().manual_seed(0)
    logp, old = -torch.rand(3, 5, generator=g), -torch.rand(3, 5, generator=g)
    adv, mask = torch.tensor([1.0, -0.5, 2.0]), (torch.rand(3, 5, generator=g) > 0.3).float()
    sync, _ = policy_loss(logp, old, adv, mask, 0.2, 0.28)
    assert decoupled_policy_loss(logp, old, old, adv, mask, 0.2, 0.28, 2.0).item() == pytest.approx(sync.item())


def test_masked_tokens_do_not_count_and_count_normalises_pieces():
    logp, prox, behav = logs(0.5, 0.9), logs(0.4, 0.1), logs(0.2, 0.1)
    mask = torch.tensor([[1.0, 0.0]])
    full = decoupled_policy_loss(logp, prox, behav, torch.tensor([1.0]), mask, 0.2, 0.28, 2.0)
    assert full.item() == pytest.approx(-2.5)
    half = decoupled_policy_loss(logp, prox, behav, torch.tensor([1.0]), mask, 0.2, 0.28, 2.0, count=2.0)
    assert half.item() == pytest.approx(-1.25)


def test_mismatch_kl_is_zero_for_equal_policies_and_k3_otherwise():
    assert mismatch_kl(logs(0.3), logs(0.3)).item() == 0.0
    d = math.log(0.4) - math.log(0.2)  # log pi_prox - log mu
    assert mismatch_kl(logs(0.2), logs(0.4)).item() == pytest.approx(math.exp(d) - d - 1)
