"""The int8 KV pool (engine/runner/kv_int8.py, NativeEngineConfig.kv_cache_dtype = "int8"):
the quantization's error bound, the C kernel's rounding equal to torch's, the pool's
capacity against the float pool's, every engine path (prefix cache, chunked prefill,
preemption, fused or forward decode, no decode cache, speculative decoding, weight
updates) giving the same greedy tokens as the plain int8 engine, and on a trained model
greedy output diverging from the float cache only where float was nearly undecided."""

import copy
import ctypes

import pytest
import torch

from polyrl.engine.base import SamplingParams
from polyrl.engine.config import NativeEngineConfig
from polyrl.engine.paged import PagedEngine
from polyrl.engine.runner import cpu_kernels
from polyrl.engine.runner.decode_backend import FusedDecode
from polyrl.engine.runner.kv_int8 import Int8KVPool, dequantize, fake_quant, quantize
from polyrl.engine.speculative.config import SpeculativeConfig
from tests.helpers import small_trained_model_dir

INT8 = dict(kv_cache_dtype="int8", block_size=4)
TRAINED_PROMPTS = ["What is 4 + 3?", "Solve for x: 3x + 4 = 19.", "What is 47 + 38?", "Compute 12 * 11.",
                   "Write a function add(a, b) that returns a + b.", "hi", "What is 100 - 37?", "Is 91 prime?"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A trained model of the built-in family (a random one greedily repeats one token, so
    equal outputs would prove little), its tokenizer, and prompts: four questions and a
    grounded one that n-gram lookup can draft from."""
    from polyrl.models.loading import load_policy

    model, tok = load_policy(small_trained_model_dir(tmp_path_factory.mktemp("cache")), "float32")
    texts = TRAINED_PROMPTS[:4] + ["copy: 12 + 34 = 46; 12 + 34 = 46; 12 + 34 ="]
    return tok, model, [tok.encode(tok.chat_prompt(p)) for p in texts]


def engine(model, tok, decode="auto", decode_cache=True, draft=None, spec: dict | None = None, **kw) -> PagedEngine:
    config = NativeEngineConfig(speculative=SpeculativeConfig(**(spec or {})), **kw)
    return PagedEngine(copy.deepcopy(model), tok, config, decode=decode, decode_cache=decode_cache,
                       draft_model=draft)


def greedy(eng: PagedEngine, prompts, n: int = 2, max_tokens: int = 16) -> list[list[int]]:
    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [c.token_ids for c in eng.generate(prompts, n, sp)]


def assert_all_free(eng: PagedEngine) -> None:
    bm = eng.block_manager
    bm.check_invariants([])
    assert all(b.ref_count == 0 for b in bm.blocks) and bm.num_free_blocks == bm.num_blocks
    assert not eng.has_unfinished()


# ---- the quantization -------------------------------------------------------------------------


@pytest.mark.parametrize("magnitude", [0.0, 1e-30, 1e-4, 1.0, 3e4])
def test_round_trip_error_is_at_most_half_a_step(magnitude):
    x = torch.randn(64, 4, 32, generator=torch.Generator().manual_seed(0)) * magnitude
    x[0, 0] = 0.0  # an all-zero head
    q, s = quantize(x)
    assert q.dtype == torch.int8 and s.dtype == torch.bfloat16 and q.shape == x.shape and s.shape == x.shape[:-1]
    assert int(q.abs().max()) <= 127
    back = dequantize(q, s, torch.float32)
    assert torch.isfinite(back).all() and (back[0, 0] == 0).all()
    # Half a step of the stored scale, plus the bfloat16 rounding of the largest value's step.
    bound = s.float()[..., None] * (0.5 + 127 * 2.0 ** -8)
    assert ((back - x).abs() <= bound).all()
    if magnitude >= 1e-4:
        rel = (back - x).abs().amax(-1)[1:] / x.abs().amax(-1)[1:]  # past the zero head
        assert float(rel.max()) < 1 / 127  # about max |x| / 254 per head
    assert torch.equal(fake_quant(back), back)  # quantizing what the pool gives back changes nothing


def test_the_c_kernel_rounds_as_torch_does():
    """rope_attend with kv_q8 writes fake_quant of what it writes without: the same floats."""
    lib = cpu_kernels.load()
    if isinstance(lib, str):
        pytest.skip(f"C kernels unavailable here: {lib}")
    S, nh, nkv, hd, L = 3, 4, 2, 32, 8
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(S, (nh + 2 * nkv) * hd, generator=g) * torch.tensor([1e-3, 1.0, 50.0])[:, None]
    cos, sin = torch.ones(L, hd), torch.zeros(L, hd)  # RoPE at angle 0: k as it is
    pos, rows = torch.tensor([0, 3, 7]), torch.tensor([2, 0, 1])
    caches = []
    for flag in (0, 1):
        kc, vc = torch.zeros(S, nkv, L, hd), torch.zeros(S, nkv, L, hd)
        out, scores = torch.empty(S, nh * hd), torch.empty(4 * L)
        lib.rope_attend(qkv.data_ptr(), S, nh, nkv, hd, cos.data_ptr(), sin.data_ptr(), pos.data_ptr(),
                        rows.data_ptr(), kc.data_ptr(), vc.data_ptr(), L, out.data_ptr(), ctypes.c_float(0.1),
                        scores.data_ptr(), flag, 1)
        caches.append((kc[rows, :, pos], vc[rows, :, pos]))  # (S, nkv, hd)
    for plain, quantized in zip(*caches):
        assert torch.equal(quantized, fake_quant(plain))
        assert not torch.equal(quantized, plain)


# ---- capacity and configuration ---------------------------------------------------------------


def test_the_same_kv_cache_mb_holds_over_1_9x_the_tokens(setup):
    tok, model, _ = setup
    cfg = model.cfg
    float_eng = engine(model, tok, kv_cache_mb=8, block_size=4)
    int8_eng = engine(model, tok, kv_cache_mb=8, **INT8)
    ratio = int8_eng.num_blocks / float_eng.num_blocks
    hd = cfg.head_dim
    print(f"head_dim {hd}: int8 pool {int8_eng.num_blocks} blocks, float32 {float_eng.num_blocks}: {ratio:.2f}x")
    assert ratio >= 1.9
    assert ratio == pytest.approx(4 * hd / (hd + 2), rel=0.01)
    assert isinstance(int8_eng.runner.pool, Int8KVPool)
    assert int8_eng.runner.pool.bytes <= 8 * 2**20 + int8_eng.runner.pool.bytes // int8_eng.num_blocks  # + scratch


def test_int8_kv_needs_the_paged_engine_in_one_clear_line():
    with pytest.raises(ValueError, match="kv_cache_dtype 'int8' is a paged KV pool"):
        NativeEngineConfig(kv_cache_dtype="int8", paged=False)
    with pytest.raises(ValueError):
        NativeEngineConfig(kv_cache_dtype="fp8")
    assert NativeEngineConfig().kv_cache_dtype == "auto"
    from polyrl.config import ConfigError, load_config_text

    run = "rl_tasks:\n  - {domain: math, weight: 1}\nengine:\n  native:\n    kv_cache_dtype: int8\n"
    assert load_config_text(run, source="run.yaml").engine.native.kv_cache_dtype == "int8"
    with pytest.raises(ConfigError) as err:
        load_config_text(run + "    paged: false\n", source="run.yaml")
    assert str(err.value) == ("run.yaml:5: engine.native: kv_cache_dtype 'int8' is a paged KV pool: "
                              "set paged: true, or kv_cache_dtype: auto")


# ---- every engine path computes the same function -----------------------------------------------


VARIANTS = {
    "prefix_cache": dict(),
    "chunked_prefill": dict(max_num_batched_tokens=7),
    "tiny_pool": dict(num_blocks=16),  # forces preemption
    "tiny_pool_chunked_forward": dict(num_blocks=16, max_num_batched_tokens=8, decode="forward"),
    "no_decode_cache": dict(max_num_batched_tokens=8, decode_cache=False),
    "token_by_token": dict(decode_burst=1),
}


@pytest.fixture(scope="module")
def reference(setup):
    """The plain int8 engine: no prefix caching, whole prompts, an ample pool."""
    tok, model, prompts = setup
    return greedy(engine(model, tok, enable_prefix_caching=False, **INT8), prompts)


@pytest.mark.parametrize("name", VARIANTS)
def test_every_path_gives_the_plain_int8_engines_tokens(setup, reference, name):
    tok, model, prompts = setup
    eng = engine(model, tok, **INT8, **VARIANTS[name])
    assert greedy(eng, prompts) == reference
    if name == "prefix_cache":
        assert eng.counters.snapshot()["prefill_tokens_cached"] > 0  # the second sample of each prompt hits
    if name.startswith("tiny_pool"):
        assert eng.counters.preemptions > 0
    assert_all_free(eng)


def test_an_aborted_request_frees_its_blocks(setup, reference):
    tok, model, prompts = setup
    eng = engine(model, tok, decode_burst=1, **INT8)  # one token per step: the request is mid-way
    sp = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    ids = [eng.add_request(p, sp, seed=i) for i, p in enumerate(prompts[:2])]
    for _ in range(3):
        eng.step()
    assert eng.abort(ids[0])
    done = {}
    while eng.has_unfinished():
        done.update(eng.step())
    assert list(done) == [ids[1]] and done[ids[1]].token_ids == reference[2]
    assert_all_free(eng)


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculative_decoding_is_greedy_identical_on_int8_kv(setup, reference, method):
    tok, model, prompts = setup
    spec = dict(method=method, max_batch_size=64, min_acceptance_rate=0.0)
    draft = None
    if method == "draft":
        spec.update(draft_model="unused", num_speculative_tokens=3)
        draft = model  # the target as its own draft: every verify pass runs long
    fast = engine(model, tok, spec=spec, draft=draft, enable_prefix_caching=False, **INT8)
    assert greedy(fast, prompts) == reference
    assert fast.counters.spec_accepted_tokens > 0
    assert_all_free(fast)


def test_a_weight_update_on_int8_kv(setup):
    tok, model, prompts = setup
    g = torch.Generator().manual_seed(9)
    new = copy.deepcopy(model)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05 * p.abs().mean())
    eng = engine(model, tok, **INT8)
    before = greedy(eng, prompts[:2])
    eng.update_weights(new.state_dict(), version=1)
    after = greedy(eng, prompts[:2])
    assert after == greedy(engine(new, tok, **INT8), prompts[:2]) != before


# ---- quality on a trained model -------------------------------------------------------------------


MARGIN = 0.5
"""Float logit gap (nats) within which a greedy divergence counts as a near-tie (test_engine_int8.py)."""


def test_trained_model_diverges_from_the_float_cache_only_at_near_ties(setup):
    """As test_engine_int8.py's near-tie test: wherever the int8 cache's greedy output first
    departs from the float cache's, the float model ranked the two tokens within MARGIN."""
    tok, model, _ = setup
    prompts = [tok.encode(tok.chat_prompt(p)) for p in TRAINED_PROMPTS]
    sp = SamplingParams(temperature=0, max_tokens=32)
    outs = {}
    for dtype in ("auto", "int8"):
        eng = PagedEngine(copy.deepcopy(model), tok, NativeEngineConfig(kv_cache_dtype=dtype))
        outs[dtype] = [c.token_ids for c in eng.generate(prompts, 1, sp)]
        if not isinstance(cpu_kernels.load(), str):
            assert isinstance(eng.runner.decode_backend, FusedDecode)
    same = 0
    for prompt, a, b in zip(prompts, outs["auto"], outs["int8"]):
        n = next((i for i, (s, t) in enumerate(zip(a, b)) if s != t), None)
        if n is None:
            assert len(a) == len(b)
            same += 1
            continue
        with torch.no_grad():
            logits = model(torch.tensor([prompt + a[:n]]))[0, -1]
        gap = float(logits[a[n]] - logits[b[n]])
        assert 0 <= gap < MARGIN, f"int8 KV overruled a clear float choice (gap {gap:.3f}) at token {n}"
    print(f"int8 KV vs float greedy: {same}/{len(prompts)} identical")
    assert same / len(prompts) >= 0.5
