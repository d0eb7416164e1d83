"""The fused decode pass (engine/runner/fused_decode.py over cpu_kernels.c): the model's
function to float32 rounding at mixed positions, a sampler equal to sample_batch, weights
that follow updates, and fallbacks that say why."""

import copy
from types import SimpleNamespace

import pytest
import torch

from polyrl.engine.base import SamplingParams
from polyrl.engine.config import NativeEngineConfig
from polyrl.engine.paged import PagedEngine
from polyrl.engine.runner import cpu_kernels
from polyrl.engine.runner.decode_backend import ForwardDecode, FusedDecode
from polyrl.engine.runner.fused_decode import FusedDecoder, unsupported
from polyrl.engine.sampler import counter_uniforms, sample_batch
from polyrl.models.config import ModelConfig
from polyrl.models.transformer import Transformer
from tests.helpers import tiny_model, tiny_tokenizer
from tests.test_engine_dense import PROMPTS, naive_greedy

SHAPES = {  # head sizes 12, 16 (generic kernel path), 32 and 64 (unrolled); biases; tied and untied heads
    "qwen2_hd16_gqa": dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_attention_heads=4,
                           num_key_value_heads=2, tie_word_embeddings=True),
    "llama_hd32_gqa_biased": dict(model_type="llama", hidden_size=128, intermediate_size=384, num_attention_heads=4,
                                  num_key_value_heads=2, attention_bias=True),
    "llama_hd64_mha": dict(model_type="llama", hidden_size=128, intermediate_size=256, num_attention_heads=2),
    "llama_hd12_rep6": dict(model_type="llama", hidden_size=72, intermediate_size=96, num_attention_heads=6,
                            num_key_value_heads=1),  # 6 query heads per K/V head: groups of 4 and 2; no AVX dots
    "llama_large_layers": dict(model_type="llama", hidden_size=256, intermediate_size=704, num_attention_heads=4,
                               num_key_value_heads=1),  # gate/up and lm_head run through the model's own modules
}


@pytest.fixture(scope="module")
def lib():
    lib = cpu_kernels.load()
    if isinstance(lib, str):
        pytest.skip(f"fused kernels unavailable here: {lib}")
    return lib


def random_model(shape: dict, seed: int = 0, vocab: int = 300, layers: int = 2) -> Transformer:
    model = Transformer(ModelConfig(vocab_size=vocab, num_hidden_layers=layers, **shape), seed=seed).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # non-trivial biases and norm weights, so that those paths count
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def empty_cache(cfg, rows: int, length: int = 16) -> SimpleNamespace:
    cache = SimpleNamespace(k=torch.zeros(cfg.num_hidden_layers, rows, cfg.num_key_value_heads, length, cfg.head_dim))
    cache.v = torch.zeros_like(cache.k)
    return cache


@pytest.mark.parametrize("whole", [True, False], ids=["whole_pass", "layer_loop"])
@pytest.mark.parametrize("name", SHAPES)
def test_fused_logits_equal_the_model_forward_at_mixed_positions(lib, name, whole):
    model = random_model(SHAPES[name])
    cfg = model.cfg
    S, T = 5, 9
    fused = FusedDecoder(model, empty_cache(cfg, S + 2), lib, whole_pass=whole)
    # Small models run the whole pass in one C call; large layers keep the Python loop.
    assert (fused.whole is not None) == (whole and name != "llama_large_layers" and not isinstance(
        cpu_kernels.blas_sgemm(), str))
    tokens = torch.randint(0, cfg.vocab_size, (S, T))
    rows = torch.tensor([2, 0, 6, 3, 1])  # sequence i lives in cache row rows[i]
    done = [0] * S  # tokens fed so far per sequence
    # Sequences advance unevenly, so one call mixes positions (and rows come in any order).
    for active in [range(S), [0, 2, 4], [0, 2], range(S), [1, 3, 4], range(S), [0, 1, 2, 3], range(S), [4]]:
        active = list(active)
        ids = torch.tensor([int(tokens[i, done[i]]) for i in active])
        pos = torch.tensor([done[i] for i in active])
        logits = fused.logits(ids, pos, rows[active])
        with torch.no_grad():
            for j, i in enumerate(active):
                expected = model(tokens[i:i + 1, :done[i] + 1])[0, -1]
                torch.testing.assert_close(logits[j], expected, rtol=1e-4, atol=2e-5)
        for i in active:
            done[i] += 1


def test_fused_sampler_equals_sample_batch(lib):
    g = torch.Generator().manual_seed(0)
    M, V = 64, 300
    logits = torch.randn(M, V, generator=g) * 3
    temperature = torch.tensor([0.0, 0.5, 1.0, 1.7] * (M // 4))
    u = counter_uniforms(torch.arange(M) * 7919, torch.zeros(M, dtype=torch.long))
    cache = SimpleNamespace(k=torch.zeros(1, 1, 1, 1, 16))
    fused = FusedDecoder(random_model(SHAPES["qwen2_hd16_gqa"], layers=1), cache, lib)
    tokens, logprobs = fused.sample(logits, temperature, u)
    expected_tokens, expected_logprobs, _ = sample_batch(logits, temperature, None, None, u)
    assert tokens.tolist() == expected_tokens.tolist()
    torch.testing.assert_close(logprobs, expected_logprobs, rtol=1e-5, atol=1e-5)
    assert len(set(tokens[1::4].tolist())) > 8  # sampled rows really sample


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tok = tiny_tokenizer(tmp_path_factory.mktemp("tok"))
    return tok, [tok.encode(tok.chat_prompt(p)) for p in PROMPTS]


def engine(model, tok, decode="auto", decode_cache=True, **kw) -> PagedEngine:
    return PagedEngine(copy.deepcopy(model), tok, NativeEngineConfig(**kw), decode=decode, decode_cache=decode_cache)


@pytest.mark.parametrize("name", ["qwen2_hd16_gqa", "llama_large_layers"])
def test_engine_on_the_fused_pass_equals_the_model_forward_pass(lib, setup, name):
    tok, prompts = setup
    model = random_model(SHAPES[name], vocab=tok.vocab_size)
    fused, plain = engine(model, tok, block_size=4), engine(model, tok, block_size=4, decode="forward")
    assert isinstance(fused.runner.decode_backend, FusedDecode)
    assert isinstance(plain.runner.decode_backend, ForwardDecode)
    assert plain.runner.decode_backend.reason == "the model's forward pass was asked for"
    greedy = SamplingParams(temperature=0, max_tokens=12)
    outs = fused.generate(prompts, 2, greedy)
    for c, d in zip(outs, plain.generate(prompts, 2, greedy)):
        assert c.token_ids == d.token_ids == naive_greedy(model, prompts[c.prompt_index], 12, set(tok.stop_token_ids()))
        torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(d.logprobs), rtol=1e-4, atol=1e-4)
    sampled = SamplingParams(temperature=1.0, max_tokens=12, seed=3, ignore_eos=True)
    a, b = fused.generate(prompts, 4, sampled), plain.generate(prompts, 4, sampled)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]  # same noise, same distribution
    # New weights reach the fused copies (and the repacked layers of the large shape).
    other = random_model(SHAPES[name], seed=9, vocab=tok.vocab_size)
    fused.update_weights(other.state_dict(), version=1)
    c = fused.generate(prompts[:1], 1, greedy)[0]
    assert c.token_ids == naive_greedy(other, prompts[0], 12, set(tok.stop_token_ids())) and c.weight_version == 1


def test_models_and_settings_the_fused_pass_does_not_cover_fall_back_with_a_reason(lib, setup):
    tok, prompts = setup
    qwen3 = random_model(dict(model_type="qwen3", hidden_size=64, intermediate_size=128, num_attention_heads=4,
                              num_key_value_heads=2), vocab=tok.vocab_size)
    assert "q/k norms" in unsupported(qwen3)
    eng = engine(qwen3, tok, block_size=4)
    assert isinstance(eng.runner.decode_backend, ForwardDecode) and "q/k norms" in eng.runner.decode_backend.reason
    c = eng.generate(prompts[:1], 1, SamplingParams(temperature=0, max_tokens=6))[0]
    assert c.token_ids == naive_greedy(qwen3, prompts[0], 6, set(tok.stop_token_ids()))
    assert "float32" in unsupported(tiny_model(tok.vocab_size).to(torch.float64))
    uncached = engine(tiny_model(tok.vocab_size), tok, decode_cache=False)
    assert isinstance(uncached.runner.decode_backend, ForwardDecode)
    assert "decode cache" in uncached.runner.decode_backend.reason


def test_kernel_build_failures_are_reasons_not_crashes(monkeypatch, tmp_path):
    monkeypatch.setenv("POLYRL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler-polyrl")
    assert "no C compiler" in cpu_kernels._build_and_load()
    monkeypatch.delenv("CC")
    if isinstance(cpu_kernels.load(), str):
        pytest.skip("no working C compiler here")
    broken = tmp_path / "broken.c"
    broken.write_text("void rms_norm(void) { this is not C }\n")
    monkeypatch.setattr(cpu_kernels, "SOURCE", broken)
    reason = cpu_kernels._build_and_load()
    assert "failed" in reason and "broken.c" in reason
    assert not list((tmp_path / "kernels").glob("*.so"))  # nothing half-built is left to load


def test_positions_past_the_cache_raise_instead_of_writing_out_of_bounds(lib):
    model = random_model(SHAPES["qwen2_hd16_gqa"], layers=1)
    cfg = model.cfg
    cache = SimpleNamespace(k=torch.zeros(1, 2, cfg.num_key_value_heads, 4, cfg.head_dim))
    cache.v = torch.zeros_like(cache.k)
    fused = FusedDecoder(model, cache, lib)
    with pytest.raises(IndexError, match="cannot hold"):
        fused.logits(torch.tensor([1]), torch.tensor([4]), torch.tensor([0]))
    with pytest.raises(IndexError, match="cannot hold"):
        fused.logits(torch.tensor([1]), torch.tensor([0]), torch.tensor([2]))
    assert fused.logits(torch.tensor([1, 2]), torch.tensor([0, 3]), torch.tensor([1, 0])).shape == (2, 300)


def test_the_whole_pass_in_c_equals_the_layer_loop_bit_for_bit(lib):
    if isinstance(cpu_kernels.blas_sgemm(), str):
        pytest.skip(f"no BLAS sgemm here: {cpu_kernels.blas_sgemm()}")
    model = random_model(SHAPES["llama_hd32_gqa_biased"], layers=3)
    whole, loop = (FusedDecoder(model, empty_cache(model.cfg, 6), lib, whole_pass=w) for w in (True, False))
    assert whole.whole is not None and loop.whole is None
    g = torch.Generator().manual_seed(0)
    for p in range(8):  # both write their own caches; every step must agree exactly
        ids, rows = torch.randint(0, 300, (4,), generator=g), torch.tensor([5, 0, 2, 3])
        assert torch.equal(whole.logits(ids, torch.full((4,), p), rows), loop.logits(ids, torch.full((4,), p), rows))
    assert torch.equal(whole.cache.k, loop.cache.k) and torch.equal(whole.cache.v, loop.cache.v)


def test_without_blas_sgemm_the_layer_loop_runs(lib, monkeypatch):
    monkeypatch.setattr("polyrl.engine.runner.fused_decode.blas_sgemm", lambda: "no BLAS sgemm_ in this build")
    model = random_model(SHAPES["qwen2_hd16_gqa"], layers=1)
    fused = FusedDecoder(model, empty_cache(model.cfg, 2), lib)
    assert fused.whole is None
    with torch.no_grad():
        expected = model(torch.tensor([[7]]))[0, -1]
    torch.testing.assert_close(fused.logits(torch.tensor([7]), torch.tensor([0]), torch.tensor([1]))[0], expected,
                               rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("whole", [True, False], ids=["whole_pass", "layer_loop"])
def test_rows_split_over_threads_give_the_one_thread_results_bit_for_bit(lib, monkeypatch, whole):
    """The per-row kernels (attention, SiLU-and-multiply, sampling) split 40 rows over 4
    threads, 10 rows each, or run them on one: logits, cache writes and samples are the
    same floats."""
    if not lib.threaded:
        pytest.skip("the kernels were built without OpenMP here: one thread only")
    model = random_model(SHAPES["llama_hd32_gqa_biased"], layers=2)
    S, g = 40, torch.Generator().manual_seed(0)
    ids = torch.randint(0, 300, (6, S), generator=g)
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.3] * (S // 4))
    u = counter_uniforms(torch.arange(S) * 7919, torch.zeros(S, dtype=torch.long))
    runs = []
    for threads in (1, 4):
        fused = FusedDecoder(model, empty_cache(model.cfg, S), lib, whole_pass=whole)
        monkeypatch.setattr(fused, "threads", lambda t=threads: t)
        logits = [fused.logits(ids[p], p + torch.arange(S) % 3, torch.arange(S).flip(0)) for p in range(6)]
        runs.append((logits, fused.sample(logits[-1], temperature, u), fused.cache.k, fused.cache.v))
    (logits1, samples1, k1, v1), (logits4, samples4, k4, v4) = runs
    assert all(torch.equal(a, b) for a, b in zip(logits1, logits4))
    assert all(torch.equal(a, b) for a, b in zip(samples1, samples4))
    assert torch.equal(k1, k4) and torch.equal(v1, v4)


def test_the_threaded_kernels_run_on_torchs_own_openmp_runtime(lib):
    """One libgomp in the process: the kernels' threads are the ones torch and MKL use, not a
    second pool fighting them for the cores."""
    if not lib.threaded:
        pytest.skip("the kernels were built without OpenMP here: one thread only")
    with open("/proc/self/maps") as maps:
        runtimes = {line.split()[-1] for line in maps if "libgomp" in line}
    assert len(runtimes) == 1, runtimes


def test_silu_mul_matches_torch_from_tiny_to_saturated_gates(lib):
    gate = torch.cat([torch.randn(200, generator=torch.Generator().manual_seed(0)),
                      torch.tensor([0.0, 1e-30, -1e-30, 20.0, -20.0, 87.5, -87.5, 100.0, -100.0, 1e4, -1e4])])
    up = torch.linspace(-2, 2, gate.numel())
    gu = torch.cat([gate, up])[None]  # one row: [gate | up]
    out = torch.empty(1, gate.numel())
    lib.silu_mul(gu.data_ptr(), out.data_ptr(), 1, gate.numel(), 1)
    torch.testing.assert_close(out[0], torch.nn.functional.silu(gate) * up, rtol=1e-6, atol=1e-30)


def python_burst(fused, ids, pos, rows, temperature, u, stop, keep):
    """The runner's burst loop, pass by pass: what FusedDecoder.burst does in one call."""
    tokens, logprobs, done = [], [], torch.zeros(len(ids), dtype=torch.bool)
    for k in range(pos.shape[0]):
        ids, lp = fused.sample(fused.logits(ids, pos[k], rows), temperature, u[k])
        tokens.append(ids)
        logprobs.append(lp)
        done |= (ids[:, None] == stop).any(-1) | (keep <= k + 1)
        if bool(done.all()):
            break
    return torch.stack(tokens), torch.stack(logprobs)


@pytest.mark.parametrize("stops", ["none", "mid_burst", "keep"])
def test_a_burst_in_one_call_equals_pass_by_pass_sampling(lib, stops):
    if isinstance(cpu_kernels.blas_sgemm(), str):
        pytest.skip(f"no BLAS sgemm here: {cpu_kernels.blas_sgemm()}")
    model = random_model(SHAPES["llama_hd32_gqa_biased"], layers=2)
    one, loop, probe = (FusedDecoder(model, empty_cache(model.cfg, 5), lib) for _ in range(3))
    K, S = 8, 4
    rows, ids = torch.tensor([3, 0, 4, 1]), torch.tensor([5, 9, 2, 7])
    pos = torch.tensor([2, 0, 5, 1])[None, :] + torch.arange(K)[:, None]  # (K, S): mixed positions
    temperature = torch.tensor([0.0, 1.0, 0.7, 1.3])
    u = counter_uniforms(torch.arange(S)[None, :].expand(K, -1) * 31, torch.arange(K)[:, None].expand(-1, S))
    no_stop, keep = torch.full((S, 1), -1), torch.tensor([K, K, 3, K])
    stop = no_stop
    if stops == "mid_burst":  # each row stops on the token it samples at pass 2, 3, 4 or 5 (or earlier)
        free = python_burst(probe, ids, pos, rows, temperature, u, no_stop, torch.full((S,), K))[0]
        stop = torch.stack([free[[2, 3, 4, 5], torch.arange(S)], torch.full((S,), -1)], dim=1)
        keep = torch.full((S,), K)
    if stops == "keep":  # every row's last kept pass comes before the burst's end
        keep = torch.tensor([2, 3, 2, 3])
    tokens, logprobs, passes = one.burst(ids, pos, rows, temperature, u, stop, keep)
    expected_tokens, expected_logprobs = python_burst(loop, ids, pos, rows, temperature, u, stop, keep)
    assert passes == len(expected_tokens) and (passes == K) == (stops == "none")
    assert stops != "keep" or passes == 3
    assert torch.equal(tokens[:passes], expected_tokens)
    assert torch.equal(logprobs[:passes], expected_logprobs)
    assert torch.equal(one.cache.k, loop.cache.k)


def test_write_back_in_c_equals_the_torch_copy(lib):
    from polyrl.engine.runner.decode_cache import DecodeCache
    from polyrl.engine.runner.paged_attention import KVPool

    pools = [KVPool(3, 6, 4, 2, 8, torch.float32) for _ in range(2)]
    caches = [DecodeCache(pool) for pool in pools]
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(3, 5, 2, 12, 8, generator=g), torch.randn(3, 5, 2, 12, 8, generator=g)
    for cache, pool in zip(caches, pools):
        cache.k, cache.v = k.clone(), v.clone()
        pool.k.zero_()
        pool.v.zero_()
    rows = torch.tensor([4, 0, 2])
    positions = torch.tensor([[3, 7, 0], [4, 8, 1]])  # (P, S)
    slots = torch.tensor([[5, 17, 22], [6, 18, pools[0].scratch_slot]])
    caches[0].write_back(rows, positions, slots, lib)
    caches[1].write_back(rows, positions, slots)
    assert torch.equal(pools[0].k, pools[1].k) and torch.equal(pools[0].v, pools[1].v)
    assert pools[0].k.view(3, -1, 2, 8)[1, 17].eq(k[1, 0, :, 7]).all()
    before = pools[0].k.clone()
    with pytest.raises(IndexError, match="past the pool"):
        caches[0].write_back(rows, positions, slots + 100, lib)
    with pytest.raises(IndexError, match="row 5, position 7, slot 17"):  # a row past the cache
        caches[0].write_back(torch.tensor([4, 5, 2]), positions, slots, lib)
    assert torch.equal(pools[0].k, before)  # checked before anything is copied
