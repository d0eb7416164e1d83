"""The update's layout (train/packing.py): shared prefixes once and length-sorted pieces give
the padded layout's logprobs, loss and gradients, and the update the same new weights."""

import random
from types import SimpleNamespace

import pytest
import torch

from polyrl.agent.engine_model import Segment
from polyrl.models.config import ModelConfig
from polyrl.models.transformer import Transformer
from polyrl.rl.loss import policy_loss
from polyrl.rollout.groups import Group, SingleTurn
from polyrl.train.batch import build_batch, token_logprobs
from polyrl.train.update import update
from polyrl.train.packing import piece_logits, plan
from polyrl.types import Completion, Task

V = 97


def model(seed=0) -> Transformer:
    cfg = ModelConfig(model_type="llama", vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    return Transformer(cfg, seed=seed).eval()


def completion(rng, n):
    return Completion(0, "", [rng.randrange(V) for _ in range(n)], [-rng.random() for _ in range(n)], "stop", 0)


def episode(rng, system, turns):
    """An agent episode's single segment: system prompt, then turns of (generated, tool result)."""
    seg = Segment(list(system), [0] * len(system), [0.0] * len(system))
    for generated, result in turns:
        seg.token_ids += [rng.randrange(V) for _ in range(generated)] + [rng.randrange(V) for _ in range(result)]
        seg.loss_mask += [1] * generated + [0] * result
        seg.logprobs += [-rng.random() for _ in range(generated)] + [0.0] * result
    return SimpleNamespace(segments=[seg], rows=lambda: [(seg.token_ids, seg.loss_mask, seg.logprobs)])


def mixed_batch(seed=0):
    """Single-turn groups with prompts of 3-20 tokens and completions of 1-15, a one-sample
    group, agent groups whose episodes share a system prompt and have tool-result holes, and
    a group whose rows share nothing."""
    rng = random.Random(seed)
    groups, advantages = [], []
    for i, (plen, size) in enumerate([(12, 4), (3, 3), (20, 4), (7, 1)]):
        prompt = [rng.randrange(V) for _ in range(plen)]
        groups.append(Group(Task(str(i), "math", "p"),
                            [SingleTurn(prompt, completion(rng, rng.randint(1, 15))) for _ in range(size)]))
    for i in range(2):
        system = [rng.randrange(V) for _ in range(9)]
        eps = [episode(rng, system, [(rng.randint(1, 6), rng.randint(1, 5)) for _ in range(rng.randint(1, 3))])
               for _ in range(3)]
        completion(rng, 1)  # the draws the earlier layout made here, so the batch stays the same
        groups.append(Group(Task(f"a{i}", "agent", "p"), eps))
    # rows start with different tokens: nothing shared
    groups.append(Group(Task("x", "code", "p"), [SingleTurn([], completion(rng, 5)) for _ in range(2)]))
    for g in groups:
        advantages.append([rng.uniform(-1, 1) for _ in g.samples])
    weights = [[1.0] * len(g.samples) for g in groups]
    weights[0][1] = 0.0  # a masked sample (overlong "mask"): no counted token, left out
    return build_batch(groups, advantages, weights, {"math": 0.0, "agent": 0.02, "code": 0.01})


@pytest.mark.parametrize("budget,share", [(None, False), (None, True), (10_000, True), (10_000, False), (40, True),
                                          (1, True)])
def test_pieces_cover_the_counted_rows_once(budget, share):
    batch = mixed_batch()
    pieces = plan(batch, budget, share)
    rows = sorted(r for p in pieces for r in p.rows.tolist())
    assert rows == [r for r in range(len(batch)) if batch.mask[r].any()]  # each once; the masked row is out
    assert 1 not in rows
    for p in pieces:
        assert budget is None or p.tokens <= budget or len(p.rows) == 1
        assert (p.take(batch.mask) > 0).sum() == sum(batch.mask[r].gt(0).sum() for r in p.rows.tolist())
    if not share:
        assert all(p.prefix_ids.numel() == 0 for p in pieces)


def test_no_budget_is_the_padded_layout():
    batch = mixed_batch()
    (piece,) = plan(batch, None, False)
    assert piece.tokens == (len(batch) - 1) * batch.input_ids.shape[1]  # all rows but the masked one, padded


def test_pieces_are_cut_where_padding_costs_more_than_a_pass(monkeypatch):
    from polyrl.train import packing

    rows = [list(range(1, 4)) for _ in range(8)] + [list(range(1, 301)) for _ in range(2)]
    groups = [Group(Task(str(i), "math", "p"), [SingleTurn([], Completion(0, "", ids, [-1.0] * len(ids), "stop", 0))])
              for i, ids in enumerate(rows)]
    batch = build_batch(groups, [[1.0]] * len(groups), [[1.0]] * len(groups), {"math": 0.0})
    assert sorted(len(p.rows) for p in plan(batch, 10_000)) == [2, 8]  # 8 x 297 padding saved > one pass
    monkeypatch.setattr(packing, "PASS_COST_TOKENS", 10_000)
    assert [len(p.rows) for p in plan(batch, 10_000)] == [10]  # a pass now costs more than that padding


def test_the_shared_prompt_runs_once_per_group():
    batch = mixed_batch()
    shared = sum(p.tokens for p in plan(batch, None, True))
    padded = sum(p.tokens for p in plan(batch, None, False))
    assert shared < padded < batch.input_ids.numel()
    (piece,) = plan(batch, None, True)
    starts = dict(zip(piece.rows.tolist(), piece.start.tolist()))
    # a prompt up to its last token, whose logits score the first generated one
    assert starts[0] == starts[2] == starts[3] == 11  # group 0's 12-token prompt (row 1 masked out)
    assert starts[4] == starts[5] == starts[6] == 2  # a 3-token prompt
    assert starts[11] == 0  # the one-sample group: nothing to share
    assert all(starts[r] == 8 for r in range(12, 18))  # agent episodes' 9-token system prompt
    assert starts[18] == starts[19] == 0  # rows that share nothing


@pytest.mark.parametrize("budget,share", [(None, True), (None, False), (10_000, True), (40, True)])
def test_pieces_give_the_padded_layouts_logprobs_loss_and_gradients(budget, share):
    batch = mixed_batch()
    m_full, m_pieces = model(), model()
    full = token_logprobs(m_full(batch.input_ids), batch.targets, 0.7)
    loss, _ = policy_loss(full, batch.old_logp, batch.advantages, batch.mask, 0.2, 0.28)
    loss.backward()

    count = batch.mask.sum()
    total = 0.0
    for piece in plan(batch, budget, share):
        logp = token_logprobs(piece_logits(m_pieces, piece, piece.take(batch.input_ids)), piece.take(batch.targets), 0.7)
        mask = piece.take(batch.mask)
        assert torch.allclose(logp[mask > 0], piece.take(full.detach())[mask > 0], atol=1e-5)
        part, _ = policy_loss(logp, piece.take(batch.old_logp), batch.advantages[piece.rows], mask, 0.2, 0.28, count)
        part.backward()
        total += part.item()
    assert total == pytest.approx(loss.item(), abs=1e-6)
    for (name, a), b in zip(m_full.named_parameters(), m_pieces.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6, rtol=1e-4), name


def test_put_inverts_take():
    batch = mixed_batch()
    out = torch.zeros_like(batch.old_logp)
    for piece in plan(batch, 40, True):
        piece.put(out, piece.take(batch.old_logp))
    counted = batch.mask > 0
    assert torch.equal(out[counted], batch.old_logp[counted])


@pytest.mark.parametrize("kl", [0.0, 0.05])
def test_update_steps_to_the_same_weights_as_the_padded_layout(kl):
    batch = mixed_batch(seed=1)
    batch.kl_coef[:] = kl
    cfg = lambda budget, share: SimpleNamespace(  # noqa: E731
        seed=0, engine=SimpleNamespace(temperature=0.7),
        trainer=SimpleNamespace(ppo_epochs=2, minibatches=3, clip_low=0.2, clip_high=0.28, max_grad_norm=1.0,
                                micro_batch_tokens=budget, shared_prefix=share, max_staleness=0, iw_cap=2.0))
    results = []
    for budget, share in [(None, False), (48, True)]:
        policy = model()
        ref = model(seed=1).requires_grad_(False) if kl else None  # a reference away from the policy
        opt = torch.optim.AdamW(policy.parameters(), lr=1e-3)
        stats = update(policy, ref, opt, batch, cfg(budget, share), step=0)
        results.append((policy, stats))
    (a, sa), (b, sb) = results
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(pa, pb, atol=1e-5), (name, (pa - pb).abs().max())
    for d in ("math", "agent", "code"):
        for k in ("kl", "entropy", "clip_frac"):
            assert sa["domains"][d][k] == pytest.approx(sb["domains"][d][k], abs=1e-5), (d, k)
    assert sa["domains"]["agent"]["kl"] > 0 if kl else sa["domains"]["agent"]["kl"] == 0
