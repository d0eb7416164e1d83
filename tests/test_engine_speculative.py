"""Speculative decoding is lossless: the verifier on hand-computed cases and in distribution,
greedy output token for token equal to the plain engine (n-gram lookup, a random draft
model, the target as its own draft), sampled output distributed as the target's."""

import copy

import pytest
import torch

from polyrl.engine.base import SamplingParams
from polyrl.engine.config import NativeEngineConfig
from polyrl.engine.paged import PagedEngine
from polyrl.engine.speculative.config import SpeculativeConfig
from polyrl.engine.speculative.proposers import lookup
from polyrl.engine.speculative.rejection import verify
from polyrl.engine.stats import counter_delta
from tests.helpers import tiny_model, tiny_tokenizer
from tests.test_engine_dense import PROMPTS

NGRAM = dict(method="ngram", max_batch_size=64, min_acceptance_rate=0.0)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tok = tiny_tokenizer(tmp_path_factory.mktemp("tok"))
    model = tiny_model(tok.vocab_size, seed=3)
    prompts = [tok.encode(tok.chat_prompt(p)) for p in PROMPTS]
    # A grounded prompt: the answer can copy from it.
    prompts.append(tok.encode(tok.chat_prompt("copy: 12 + 34 = 46; 12 + 34 = 46; 12 + 34 =")))
    return tok, model, prompts


def engine(model, tok, spec: dict | None = None, draft=None, **kw) -> PagedEngine:
    config = NativeEngineConfig(speculative=SpeculativeConfig(**(spec or {})), **kw)
    return PagedEngine(copy.deepcopy(model), tok, config, draft_model=draft)


def greedy_run(eng: PagedEngine, prompts, n=2, **sp):
    outs = eng.generate(prompts, n, SamplingParams(temperature=0, **sp))
    return [c.token_ids for c in outs], [c.logprobs for c in outs], [c.finish_reason for c in outs], outs


def assert_all_free(eng: PagedEngine) -> None:
    bm = eng.block_manager
    bm.check_invariants([])
    assert bm.num_free_blocks == bm.num_blocks and not eng.has_unfinished()


# ---- the verifier on hand-computed cases --------------------------------------------------


def one(logits_rows, drafts, temperature=0.0, q=None, u_acc=None, u_s=None, top_k=None):
    """verify() on one sequence: logits_rows (K+1, V) as lists, drafts (K,)."""
    logits = torch.tensor([logits_rows], dtype=torch.float32)
    K = len(drafts)
    return verify(logits, torch.tensor([drafts], dtype=torch.long), torch.tensor([K]),
                  None if q is None else torch.tensor([q], dtype=torch.float32), torch.tensor([temperature]),
                  None if top_k is None else torch.tensor([top_k]), None,
                  torch.tensor([u_acc or [0.0] * K], dtype=torch.float64),
                  torch.tensor([u_s or [0.0] * (K + 1)], dtype=torch.float64))


def emitted(v) -> list[int]:
    return v.tokens[0, :int(v.num_emitted[0])].tolist()


def test_greedy_verifier_accepts_while_draft_is_argmax():
    rows = [[0, 5, 1], [3, 0, 0], [0, 0, 9], [1, 2, 3]]  # argmax per position: 1, 0, 2, 2
    assert emitted(one(rows, [1, 0, 2])) == [1, 0, 2, 2]  # all kept + bonus argmax
    assert emitted(one(rows, [1, 2, 2])) == [1, 0]  # second draft wrong: the target's argmax replaces it
    assert emitted(one(rows, [0, 0, 2])) == [1]
    v = one(rows, [1, 0, 2])
    lp = torch.tensor(rows, dtype=torch.float32).log_softmax(-1)
    torch.testing.assert_close(v.logprobs[0], lp[[0, 1, 2, 3], [1, 0, 2, 2]])  # the target's, untempered


def test_sampled_verifier_one_hot_draft_by_hand():
    logits = [torch.tensor([0.3, 0.5, 0.2]).log().tolist(), [0.0, 0.0, 0.0]]
    # Draft token 0 with p = 0.3: u = 0.2 accepts (bonus from p at position 1, u = 0.9 -> token 2).
    assert emitted(one(logits, [0], 1.0, u_acc=[0.2], u_s=[0.0, 0.9])) == [0, 2]
    # u = 0.5 rejects: sample from p without token 0, i.e. (0, 5/7, 2/7).
    assert emitted(one(logits, [0], 1.0, u_acc=[0.5], u_s=[0.6, 0.0])) == [1]  # 0.6 * 0.7 = 0.42 <= 0.5
    assert emitted(one(logits, [0], 1.0, u_acc=[0.5], u_s=[0.8, 0.0])) == [2]  # 0.56 > 0.5
    v = one(logits, [0], 2.0, u_acc=[0.99], u_s=[0.8, 0.0])
    lp = (torch.tensor(logits[0]) / 2.0).log_softmax(-1)  # the target's tempered logprob, before truncation
    assert v.logprobs[0, 0].item() == pytest.approx(lp[int(v.tokens[0, 0])].item(), abs=1e-6)


def test_sampled_verifier_with_draft_probabilities_by_hand():
    p = [0.5, 0.3, 0.2]
    logits = [torch.tensor(p).log().tolist(), [0.0, 0.0, 0.0]]
    q = [[0.2, 0.6, 0.2]]  # draft token 1: accept with p/q = 0.5
    assert emitted(one(logits, [1], 1.0, q=q, u_acc=[0.45], u_s=[0.0, 0.0])) == [1, 0]
    # Rejected: the residual max(0, p - q) = (0.3, 0, 0) puts all mass on token 0, whatever u.
    for u in (0.0, 0.5, 0.99):
        assert emitted(one(logits, [1], 1.0, q=q, u_acc=[0.55], u_s=[u, 0.0])) == [0]


def test_draft_outside_the_target_top_k_is_always_rejected():
    logits = [[2.0, 1.9, 0.0, -1.0], [0.0] * 4]
    v = one(logits, [2], 1.0, u_acc=[0.0], u_s=[0.3, 0.0], top_k=2)  # u = 0 accepts anything with p > 0
    assert emitted(v) == [0] and int(v.num_accepted[0]) == 0


def first_token_freq(logits_row, q_row, draft, temperature=1.0, top_k=None, top_p=None, n=40000):
    """Frequencies of the first emitted token over n independent verifications of a one-token
    draft: `draft` itself (one-hot q) or, with q_row, a token drawn from q_row."""
    V = len(logits_row)
    gen = torch.Generator().manual_seed(7)
    logits = torch.tensor(logits_row, dtype=torch.float32)[None, None].expand(n, 2, V).contiguous()
    q = None if q_row is None else torch.tensor(q_row)[None, None].expand(n, 1, V).contiguous()
    # A deterministic proposal is fixed; a draft model's is drawn from q (independently of the verifier's noise).
    drafts = torch.full((n, 1), draft) if q is None else torch.multinomial(q[:, 0], 1, generator=gen)
    v = verify(logits, drafts, torch.ones(n, dtype=torch.long), q,
               torch.full((n,), temperature), None if top_k is None else torch.full((n,), top_k),
               None if top_p is None else torch.full((n,), top_p),
               torch.rand(n, 1, generator=gen, dtype=torch.float64), torch.rand(n, 2, generator=gen, dtype=torch.float64))
    return torch.bincount(v.tokens[:, 0], minlength=V).double() / n


def chi2(freq, exact, n) -> float:
    """Pearson's statistic of frequencies `freq` (n samples) against probabilities `exact`,
    cells expected fewer than 5 times lumped into one."""
    freq, exact = torch.as_tensor(freq, dtype=torch.float64), torch.as_tensor(exact, dtype=torch.float64)
    big = exact * n >= 5
    obs = torch.cat([freq[big], freq[~big].sum()[None]]) * n
    exp = torch.cat([exact[big], exact[~big].sum()[None]]) * n
    keep = exp > 0
    return float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())


def chi2_critical(exact, n, z: float = 3.719) -> float:
    """The chi-square statistic's 1 - 1e-4 quantile for chi2()'s cells (Wilson-Hilferty)."""
    df = int((torch.as_tensor(exact) * n >= 5).sum())  # the lumped cell adds one, the constraint takes one
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


def tv(a, b) -> float:
    return 0.5 * float((torch.as_tensor(a, dtype=torch.float64) - torch.as_tensor(b, dtype=torch.float64)).abs().sum())


@pytest.mark.parametrize("case", ["one_hot", "draft_probs", "top_k_top_p_temperature"])
def test_verifier_output_is_distributed_as_the_target(case):
    """40,000 seeded verifications: the first emitted token's frequencies are within 0.01 in
    total variation of the target's processed distribution (noise ~0.004), while the wrong
    recovery rule (sampling p itself after a rejection) is > 0.05 away."""
    logits = [1.0, 2.0, 0.5, 1.5, -1.0, 0.0]
    q = None
    top_k = top_p = None
    temperature = 1.0
    if case == "draft_probs":
        q = [0.05, 0.1, 0.4, 0.3, 0.1, 0.05]
    if case == "top_k_top_p_temperature":
        temperature, top_k, top_p = 0.7, 4, 0.9
    draft = 3
    freq = first_token_freq(logits, q, draft, temperature, top_k, top_p)
    from polyrl.engine.sampler import processed_probs

    _, probs = processed_probs(torch.tensor([logits]), torch.tensor([temperature]),
                               None if top_k is None else torch.tensor([top_k]),
                               None if top_p is None else torch.tensor([top_p]))
    p = (probs / probs.sum())[0].double()
    assert tv(freq, p) < 0.01
    qq = torch.zeros(6, dtype=torch.float64)
    if q is None:
        qq[draft] = 1.0
    else:
        qq = torch.tensor(q, dtype=torch.float64)
    alpha = torch.minimum(p, qq).sum()
    wrong = torch.minimum(p, qq) + (1 - alpha) * p  # accepted mass + rejections resampled from p
    assert tv(wrong, p) > 0.05


# ---- n-gram lookup --------------------------------------------------------------------------


def test_prompt_lookup_finds_the_longest_suffix_match():
    assert lookup([1, 2, 3, 4, 1, 2], 3, 4, 2) == [3, 4, 1]
    assert lookup([5, 6, 7], 3, 2, 1) == []
    assert lookup([9, 1, 2, 7, 7, 1, 2, 8, 8, 1, 2], 2, 2, 2) == [8, 8]  # latest match with k tokens after it
    assert lookup([3, 3, 3, 3, 3, 3], 4, 2, 1) == [3, 3, 3, 3]
    assert lookup([1, 2, 3, 4, 1, 2, 3], 2, 3, 2) == [4, 1]  # 3-gram (1, 2, 3) beats 2-gram (2, 3)
    assert lookup([1, 2, 3, 4, 5, 6], 4, 3, 1) == []


# ---- greedy identity in the engine ----------------------------------------------------------


@pytest.mark.parametrize("variant", ["ngram", "ngram_tiny_pool_chunked", "draft_random", "draft_is_target",
                                     "draft_no_decode_cache_path"])
def test_greedy_output_is_token_for_token_the_plain_engines(setup, variant):
    tok, model, prompts = setup
    kw = dict(block_size=4)
    spec, draft = dict(NGRAM), None
    if variant == "ngram_tiny_pool_chunked":
        kw = dict(block_size=4, num_blocks=40, max_num_batched_tokens=16)
    if variant.startswith("draft"):
        spec = dict(method="draft", draft_model="unused", max_batch_size=64, num_speculative_tokens=3,
                    min_acceptance_rate=0.0)
        draft = model if variant == "draft_is_target" else tiny_model(tok.vocab_size, seed=11, layers=1)
    if variant == "draft_no_decode_cache_path":
        kw["decode_burst"] = 1
    plain = engine(model, tok, **kw)
    fast = engine(model, tok, spec, draft=draft, **kw)
    base, base_lp, base_fr, _ = greedy_run(plain, prompts, max_tokens=24, ignore_eos=True)
    got, got_lp, got_fr, _ = greedy_run(fast, prompts, max_tokens=24, ignore_eos=True)
    assert got == base and got_fr == base_fr
    for a, b in zip(base_lp, got_lp):  # the target's logprobs, as without speculation
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-4, atol=1e-4)
    c = fast.counters
    assert c.spec_drafts > 0 and c.spec_draft_tokens >= c.spec_accepted_tokens > 0
    assert sum(c.spec_accepted_by_position) == c.spec_accepted_tokens
    assert c.spec_accepted_by_position == sorted(c.spec_accepted_by_position, reverse=True)
    if variant == "draft_is_target":
        assert c.spec_accepted_tokens == c.spec_draft_tokens  # the target agrees with itself
    snap = c.snapshot()
    d = counter_delta(dict.fromkeys(snap, 0), snap)
    assert 1 < d["spec_mean_acceptance_length"] <= 1 + spec.get("num_speculative_tokens", 4)
    assert_all_free(fast)


def test_stop_strings_stop_tokens_and_max_tokens_mid_draft(setup):
    tok, model, prompts = setup
    plain = engine(model, tok, block_size=4)
    fast = engine(model, tok, NGRAM, block_size=4)
    full = greedy_run(plain, prompts, n=1, max_tokens=30, ignore_eos=True)[3]
    for i, c in enumerate(full):
        stop_tok = c.token_ids[7]
        text = c.text
        for sp in (dict(max_tokens=30, ignore_eos=True, stop_token_ids=(stop_tok,)),
                   dict(max_tokens=30, ignore_eos=True, stop=(text[9:12],) if len(text) > 12 else ()),
                   *(dict(max_tokens=m, ignore_eos=True) for m in (1, 2, 5, 13)),
                   dict(max_tokens=30)):
            a = plain.generate([prompts[i]], 1, SamplingParams(temperature=0, **sp))[0]
            b = fast.generate([prompts[i]], 1, SamplingParams(temperature=0, **sp))[0]
            assert (b.token_ids, b.text, b.finish_reason) == (a.token_ids, a.text, a.finish_reason), sp
    assert fast.counters.spec_drafts > 0
    assert_all_free(fast)


def test_mixed_batches_prefix_cache_and_next_turn(setup):
    """Speculating and plain sequences in one step (greedy and sampled, lookups that find
    nothing), requests joining mid-flight, the prefix cache on: every step the hashed blocks
    hold only computed (verified) tokens, and a next turn served from those blocks continues
    exactly as the plain engine does."""
    tok, model, prompts = setup
    plain = engine(model, tok, block_size=4)
    fast = engine(model, tok, NGRAM, block_size=4)
    sampled = SamplingParams(temperature=0.8, top_k=20, max_tokens=20, ignore_eos=True)
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    requests = [(prompts[3], greedy, 1), (prompts[0], sampled, 2), (prompts[1], greedy, 3), (prompts[2], greedy, 4)]

    def run(eng, check):
        ids = {}
        out = {}
        for i, (p, sp, seed) in enumerate(requests):  # one request joins per step
            ids[eng.add_request(p, sp, seed=seed)] = i
            out.update((ids[r], c) for r, c in eng.step())
            check(eng)
        while eng.has_unfinished():
            out.update((ids[r], c) for r, c in eng.step())
            check(eng)
        return [out[i] for i in range(len(requests))]

    def verified_blocks_only(eng):
        bm = eng.block_manager
        for seq in eng.scheduler.running:
            assert len(seq.block_hashes) * bm.block_size <= seq.num_computed_tokens <= len(seq.token_ids)
            for i, h in enumerate(seq.block_hashes):
                block = bm.blocks[seq.block_table[i]]
                assert block.hash in (None, h) and (block.hash is None or block.token_ids == seq.block_tokens(i, 4))

    a = run(plain, lambda e: None)
    b = run(fast, verified_blocks_only)
    greedy_rows = [i for i, r in enumerate(requests) if r[1].temperature == 0]
    assert [a[i].token_ids for i in greedy_rows] == [b[i].token_ids for i in greedy_rows]
    assert fast.counters.spec_drafts > 0
    # Next turn: history (prompt + completion) + more, served from the speculating engine's cache.
    nxt = [prompts[i] + b[i].token_ids + prompts[2][-3:] for i in greedy_rows]
    x = plain.generate(nxt, 1, greedy)
    y = fast.generate(nxt, 1, greedy)
    assert [c.token_ids for c in x] == [c.token_ids for c in y]
    assert sum(c.num_cached_tokens for c in y) > 0
    assert_all_free(fast)


def test_speculation_switches_itself_off_at_large_batch(setup):
    tok, model, prompts = setup
    fast = engine(model, tok, dict(NGRAM, max_batch_size=2), block_size=4)
    greedy_run(fast, prompts, n=2, max_tokens=16, ignore_eos=True)  # 8 sequences decode together
    assert fast.counters.spec_drafts == 0


def test_config_errors_are_clear():
    with pytest.raises(ValueError, match="needs speculative.draft_model"):
        SpeculativeConfig(method="draft")
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        SpeculativeConfig(method="ngram", prompt_lookup_min=5, prompt_lookup_max=3)
    with pytest.raises(ValueError):
        NativeEngineConfig(speculative={"method": "ngram", "k": 3})  # unknown key


# ---- sampled output in the engine is distributed as the target's -----------------------------


def test_sampled_two_token_distribution_matches_the_target(setup):
    """2,000 seeded samples of 3 tokens with a random draft model (q differs from p). The first
    token comes from the prompt's prefill step; the second is drafted and verified, the third
    is the verifier's bonus or the target's next plain token. The counts of token 2 and of
    (token 2, token 3) pass a chi-square test (p = 1e-4) against the target's exact
    distribution, which the wrong recovery rule (sampling p itself after a rejection) fails by
    far even in expectation."""
    tok, model, prompts = setup
    target = copy.deepcopy(model)
    with torch.no_grad():
        target.model.norm.weight.mul_(12.0)  # a peaked target: a few tokens carry most mass
    draft = tiny_model(tok.vocab_size, seed=21, layers=1)
    with torch.no_grad():
        draft.model.norm.weight.mul_(8.0)
    prompt = prompts[2]
    N, T = 2000, 1.0
    fast = engine(target, tok, dict(method="draft", draft_model="unused", max_batch_size=4096,
                                    min_acceptance_rate=0.0), draft=draft, max_num_seqs=4096,
                  max_num_batched_tokens=65536)  # all admitted in one step: token 2 is always drafted
    outs = fast.generate([prompt], N, SamplingParams(temperature=T, max_tokens=3, ignore_eos=True, seed=123))
    c = fast.counters
    assert c.spec_drafts == N and 0 < c.spec_accepted_tokens < c.spec_drafts  # accepts and rejections both

    with torch.no_grad():
        p1 = torch.softmax(target(torch.tensor([prompt]))[0, -1].double() / T, -1)  # (V,)
        V = p1.shape[0]
        first = p1.argsort(descending=True)[:6]  # likely first tokens
        ctx = torch.tensor([prompt + [int(t)] for t in first])
        p2 = torch.softmax(target(ctx)[:, -1].double() / T, -1)  # (6, V)
        q2 = torch.softmax(draft(ctx)[:, -1].double() / T, -1)
        ctx3 = torch.tensor([prompt + [int(t), v] for t in first for v in range(V)])
        p3 = torch.softmax(target(ctx3)[:, -1].double() / T, -1).view(6, V, V)
    w = p1[first]  # (6,)
    exact2 = torch.cat([(w[:, None] * p2).sum(0), (1 - w.sum())[None]])  # (V + 1,): token 2, or "first not likely"
    exact23 = torch.cat([(w[:, None, None] * p2[:, :, None] * p3).sum(0).view(-1), (1 - w.sum())[None]])
    alpha = torch.minimum(p2, q2).sum(-1, keepdim=True)
    wrong = torch.cat([(w[:, None] * (torch.minimum(p2, q2) + (1 - alpha) * p2)).sum(0), (1 - w.sum())[None]])
    emp2, emp23 = torch.zeros_like(exact2), torch.zeros_like(exact23)
    likely = {int(t) for t in first}
    for o in outs:
        t1, t2, t3 = o.token_ids
        emp2[t2 if t1 in likely else V] += 1 / N
        emp23[t2 * V + t3 if t1 in likely else V * V] += 1 / N
    crit2, crit23 = chi2_critical(exact2, N), chi2_critical(exact23, N)
    assert chi2(emp2, exact2, N) < crit2 and chi2(emp23, exact23, N) < crit23
    assert chi2(wrong, exact2, N) > 3 * crit2  # the wrong rule's expected frequencies fail by far
    for o in outs[:30]:  # logprobs are the target's
        with torch.no_grad():
            lp = torch.log_softmax(target(torch.tensor([prompt + o.token_ids]))[0, -4:-1] / T, -1)
        expected = lp[[0, 1, 2], o.token_ids]
        torch.testing.assert_close(torch.tensor(o.logprobs), expected.float(), rtol=1e-4, atol=1e-4)


def test_an_aborted_request_frees_its_blocks_and_its_drafts_cache(setup):
    tok, model, prompts = setup
    spec = dict(method="draft", draft_model="unused", max_batch_size=64, num_speculative_tokens=3,
                min_acceptance_rate=0.0)
    fast = engine(model, tok, spec, draft=tiny_model(tok.vocab_size, seed=11, layers=1), block_size=4)
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    ids = [fast.add_request(p, sp, seed=i) for i, p in enumerate(prompts[:2])]
    for _ in range(3):  # a few steps in: both hold blocks and a draft cache
        fast.step()
    proposer = fast.speculator.proposer
    assert ids[0] in proposer.caches
    assert fast.abort(ids[0]) and not fast.abort(ids[0])
    assert ids[0] not in proposer.caches
    done = []
    while fast.has_unfinished():
        done += [rid for rid, _ in fast.step()]
    assert done == [ids[1]] and not proposer.caches
    assert_all_free(fast)
