"""Batched sampling: a row's sample depends on its own logits, settings and noise only."""

import torch

from polyrl.engine.sampler import counter_uniforms, sample_batch


def test_a_rows_sample_does_not_depend_on_other_rows_truncating():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    u = counter_uniforms(torch.arange(6) * 7 + 1, torch.zeros(6, dtype=torch.long))
    temperature = torch.ones(6)
    plain, plain_lp, _ = sample_batch(logits, temperature, None, None, u)
    # Rows 0-2 truncate, rows 3-5 (top_k 0, top_p 1) do not: rows 3-5 must sample as before.
    top_k = torch.tensor([3, 0, 1, 0, 0, 0])
    top_p = torch.tensor([1.0, 0.5, 1.0, 1.0, 1.0, 1.0])
    mixed, mixed_lp, _ = sample_batch(logits, temperature, top_k, top_p, u)
    assert mixed[3:].tolist() == plain[3:].tolist()
    torch.testing.assert_close(mixed_lp, logits.log_softmax(-1).gather(-1, mixed[:, None]).squeeze(-1))
    assert mixed[0].item() in logits[0].topk(3).indices.tolist()
    assert mixed[2].item() == logits[2].argmax().item()
    probs = logits[1].softmax(-1)
    ranked = probs.argsort(descending=True).tolist()
    nucleus = ranked[:int((probs[ranked].cumsum(0) < 0.5).sum()) + 1]
    assert mixed[1].item() in nucleus


def test_inverse_cdf_samples_follow_the_distribution():
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]]).log_softmax(-1).expand(20000, 4)
    u = counter_uniforms(torch.full((20000,), 12345), torch.arange(20000))
    tokens, _, _ = sample_batch(logits, torch.ones(20000), None, None, u)
    freq = torch.bincount(tokens, minlength=4).float() / 20000
    torch.testing.assert_close(freq, logits[0].softmax(-1), atol=0.015, rtol=0)
