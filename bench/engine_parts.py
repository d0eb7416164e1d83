"""The polyrl side of bench/engine.py: models, timing loops, peers, the machine bound.

Kept apart from bench/engine.py so that its worker modes (vLLM, TRL, run under
.venv-vllm) import nothing of polyrl or of this environment's torch.
"""

from __future__ import annotations

import copy
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from polyrl.engine.base import SamplingParams
from polyrl.engine.config import NativeEngineConfig
from polyrl.engine.dense import DenseEngine
from polyrl.engine.paged import PagedEngine
from polyrl.engine.parallel import DataParallelEngine
from polyrl.models.config import ModelConfig
from polyrl.models.hf_io import load_pretrained, save_pretrained
from polyrl.models.tokenizer import Tokenizer, save_tokenizer, train_tiny_tokenizer
from polyrl.models.transformer import Transformer

PROMPT_LEN, NEW_TOKENS = 16, 64
BIG = dict(vocab_size=16384, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
           num_attention_heads=12, num_key_value_heads=4)
TRL_PROMPTS = [f"What is {a} + {b}? Show the sum." for a, b in zip(range(11, 27), range(40, 56))]


class NoTextTokenizer:
    """Stop ids and decode for engines timed on raw token ids (EOS is ignored anyway)."""

    def stop_token_ids(self) -> list[int]:
        return [0]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return ""


def make_model_dir(name: str, workdir: Path, builtin: bool = False) -> Path:
    """An HF directory (config, weights, tokenizer) for `name`, made once."""
    if name == "tiny" and builtin:
        from polyrl.builtin.tiny import ensure_tiny_model

        return ensure_tiny_model()
    target = workdir / name
    if (target / "model.safetensors").exists():
        return target
    tok = train_tiny_tokenizer([p + " " + str(i) for i, p in enumerate(TRL_PROMPTS * 8)], vocab_size=300)
    if name == "tiny":
        from polyrl.builtin.tiny import TinyRecipe

        r = TinyRecipe()
        shape = dict(vocab_size=r.vocab_size, hidden_size=r.hidden_size, intermediate_size=r.intermediate_size,
                     num_hidden_layers=r.num_layers, num_attention_heads=r.num_heads, num_key_value_heads=r.num_kv_heads)
    else:
        shape = BIG
    cfg = ModelConfig(model_type="llama", tie_word_embeddings=True, max_position_embeddings=512, rms_norm_eps=1e-5,
                      eos_token_id=tok.token_to_id("<|im_end|>"), pad_token_id=tok.token_to_id("<|endoftext|>"),
                      **shape)
    save_pretrained(Transformer(cfg, seed=0), cfg, target)
    save_tokenizer(tok, target)
    return target


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def machine_bound() -> dict:
    """Measured fp32 matmul FLOP/s (the best of 2048^2 GEMMs by MKL, torch.mm, and by oneDNN on a
    packed weight, the two kernels polyrl's engine uses) and copy bandwidth (read + write)."""
    from polyrl.engine.runner.packed_linear import packed_linear_works

    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    kernels = [lambda: torch.mm(a, b)]
    if packed_linear_works():
        packed = torch.ops.mkldnn._reorder_linear_weight(b, None)
        kernels.append(lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], ""))
    best = float("inf")
    for kernel in kernels:
        kernel()
        for _ in range(5):
            t = time.perf_counter()
            kernel()
            best = min(best, time.perf_counter() - t)
    src, dst = torch.randn(64 * 2**20), torch.empty(64 * 2**20)  # 256 MiB each
    dst.copy_(src)
    bw = 0.0
    for _ in range(5):
        t = time.perf_counter()
        dst.copy_(src)
        bw = max(bw, 2 * src.numel() * 4 / (time.perf_counter() - t))
    return {"flops": 2 * 2048**3 / best, "bw": bw}


def ceiling(cfg: ModelConfig, params: int, batch: int, bound: dict) -> float:
    """Decode tokens/s the machine allows: per step every weight is read once and 2 FLOPs
    per matmul weight per sequence are done, plus the KV of the batch's mean context."""
    matmul_params = params - cfg.vocab_size * cfg.hidden_size * (0 if cfg.tie_word_embeddings else 1)
    ctx = PROMPT_LEN + NEW_TOKENS / 2
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4 * ctx * batch
    flops = 2 * matmul_params * batch + 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * ctx * batch
    t = max(flops / bound["flops"], (params * 4 + kv) / bound["bw"])
    return batch / t


class Worker:
    """A persistent peer process (bench/engine.py --worker KIND) timing generate requests
    sent as JSON lines: send() a request, then receive() its {seconds, tokens}.

    An idle peer is not always idle: vLLM CPU's processes keep cores busy between requests
    and slowed every engine timed beside them. So a peer can be paused (SIGSTOP to its
    process group) while the others run, and resumed for its own turn."""

    def __init__(self, kind: str, python: Path | str, model_dir: Path, threads: int, env: dict | None = None) -> None:
        self.proc = subprocess.Popen([str(python), str(Path(__file__).with_name("engine.py")), "--worker", kind,
                                      "--model-dir", str(model_dir), "--threads", str(threads)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=dict(os.environ, **(env or {})), cwd="/tmp", start_new_session=True)
        for line in self.proc.stdout:
            if line.strip() == "READY":
                break
        else:
            raise RuntimeError(f"{kind} worker did not start (see its stderr above)")

    def send(self, prompts: list[list[int]], max_tokens: int) -> None:
        self.proc.stdin.write(json.dumps({"prompts": prompts, "n": 1, "max_tokens": max_tokens}) + "\n")
        self.proc.stdin.flush()

    def receive(self) -> dict:
        return json.loads(self.proc.stdout.readline())

    def generate(self, prompts: list[list[int]], max_tokens: int) -> dict:
        self.send(prompts, max_tokens)
        return self.receive()

    def pause(self) -> None:
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        self.resume()
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def vllm_worker(python: Path, model_dir: Path, threads: int) -> Worker:
    """vLLM CPU with its documented CPU settings: the KV cache size and the cores its threads bind to."""
    return Worker("vllm", python, model_dir, threads, dict(VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="ERROR",
                                                          VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}"))


class HFDataParallel:
    """HF generate split by requests over one single-thread worker process per thread: the
    data-parallel peer of polyrl's "dp" engine. The time is the whole batch's wall clock."""

    def __init__(self, model_dir: Path, workers: int) -> None:
        self.workers = [Worker("hf", sys.executable, model_dir, 1) for _ in range(workers)]

    def generate(self, prompts: list[list[int]], max_tokens: int) -> dict:
        shards = [prompts[i::len(self.workers)] for i in range(len(self.workers))]
        busy = [(w, shard) for w, shard in zip(self.workers, shards) if shard]
        t = time.perf_counter()
        for w, shard in busy:
            w.send(shard, max_tokens)
        tokens = sum(w.receive()["tokens"] for w, _ in busy)
        return {"seconds": time.perf_counter() - t, "tokens": tokens}

    def close(self) -> None:
        for w in self.workers:
            w.close()


def hf_generate(hf_model, prompts: list[list[int]]) -> dict:
    ids = torch.tensor(prompts)
    t = time.perf_counter()
    with torch.inference_mode():
        out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
                                top_p=1.0, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=0)
    return {"seconds": time.perf_counter() - t, "tokens": (out.shape[1] - ids.shape[1]) * out.shape[0]}


def polyrl_generate(engine, prompts: list[list[int]]) -> dict:
    sp = SamplingParams(temperature=1.0, max_tokens=NEW_TOKENS, ignore_eos=True, seed=len(prompts))
    t = time.perf_counter()
    out = engine.generate(prompts, 1, sp)
    return {"seconds": time.perf_counter() - t, "tokens": sum(len(c.token_ids) for c in out)}


def throughput(name: str, model_dir: Path, batches: list[int], args, vllm_python: Path | None) -> dict:
    """{(engine, batch): [tokens/s per repeat]}, engines interleaved within each repeat."""
    model = load_pretrained(model_dir)[0].eval()
    vocab = model.cfg.vocab_size
    engines = {"polyrl": PagedEngine(copy.deepcopy(model), NoTextTokenizer()),
               "unfused": PagedEngine(copy.deepcopy(model), NoTextTokenizer(), decode="forward"),
               "dense": DenseEngine(copy.deepcopy(model), NoTextTokenizer())}
    if args.threads > 1:  # the same paged engine as one worker process per thread (engine/parallel.py)
        engines["dp"] = DataParallelEngine(copy.deepcopy(model), NoTextTokenizer(),
                                           NativeEngineConfig(workers=args.threads), threads_per_worker=1)
    hf = hf_dp = None
    if not args.skip_hf:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        if args.threads > 1:
            hf_dp = HFDataParallel(model_dir, args.threads)
    vllm = None
    if vllm_python is not None and not args.skip_vllm:
        try:
            vllm = vllm_worker(vllm_python, model_dir, args.threads)
            vllm.pause()
        except Exception as e:  # a missing peer is reported, not fatal
            print(f"vLLM CPU unavailable: {e}")
    print(f"\n== {name}: {n_params(model) / 1e6:.1f}M parameters, prompts {PROMPT_LEN} tokens, {NEW_TOKENS} sampled")
    runs: dict = {}
    rng = random.Random(0)
    for rep in range(-1, args.repeats):  # repeat -1 warms every engine up, untimed
        for B in batches:
            prompts = [[rng.randrange(3, vocab) for _ in range(PROMPT_LEN)] for _ in range(B)]  # fresh: no cache hits
            results = {k: polyrl_generate(e, prompts) for k, e in engines.items()}
            if hf is not None:
                results["hf"] = hf_generate(hf, prompts)
            if hf_dp is not None:
                results["hf-dp"] = hf_dp.generate(prompts, NEW_TOKENS)
            if vllm is not None:  # its turn: awake only while it is timed
                vllm.resume()
                vllm.generate(prompts[:2], 4)  # untimed: its processes back on their cores
                results["vllm"] = vllm.generate(prompts, NEW_TOKENS)
                vllm.pause()
            if rep < 0:
                continue
            line = []
            for k, r in results.items():
                assert r["tokens"] == B * NEW_TOKENS, (k, r)
                runs.setdefault((k, B), []).append(r["tokens"] / r["seconds"])
                line.append(f"{k} {r['tokens'] / r['seconds']:8.0f}")
            print(f"  repeat {rep} B={B:3d}: " + "  ".join(line) + f"  tok/s  load={os.getloadavg()[0]:.2f}")
    for peer in (vllm, hf_dp, *engines.values()):
        if peer is not None:
            peer.close()
    return runs


OURS, PEERS = ("polyrl", "dp"), ("unfused", "dense", "hf", "hf-dp", "vllm")


def median_table(name: str, model_dir: Path, runs: dict, batches: list[int], bound: dict) -> None:
    """Medians per engine and batch; ratios of each polyrl engine (paged; dp: paged in one worker
    process per thread) to every other engine; every engine's share of the machine's ceiling."""
    model = load_pretrained(model_dir)[0]
    params = n_params(model)
    engines = [e for e in OURS + PEERS if any(k == e for k, _ in runs)]
    pairs = [(a, b) for a in OURS if a in engines for b in engines if b != a and not (a == "dp" and b == "polyrl")]
    print(f"\n{name}: median tokens/s over repeats (ratios a/b; ceiling from the machine bound)")
    print(f"  {'B':>3}  " + "  ".join(f"{e:>8}" for e in engines) + "   ceiling  " +
          "  ".join(f"{a}/{b}" for a, b in pairs) + "  " + "  ".join(f"{e}%ceil" for e in engines))
    for B in batches:
        med = {e: statistics.median(runs[(e, B)]) for e in engines if (e, B) in runs}
        ceil = ceiling(model.cfg, params, B, bound)
        ratios = "  ".join(f"{med[a] / med[b]:>{len(a) + len(b)}.2f}x" for a, b in pairs if a in med and b in med)
        shares = "  ".join(f"{100 * med[e] / ceil:>{len(e) + 4}.0f}%" for e in engines if e in med)
        print(f"  {B:>3}  " + "  ".join(f"{med.get(e, float('nan')):>8.0f}" for e in engines) +
              f"  {ceil:>8.0f}  {ratios}  {shares}")


def grpo_workload(model_dir: Path) -> None:
    """16 prompts x G=8: prefill tokens computed with and without the prefix cache."""
    model = load_pretrained(model_dir)[0].eval()
    rng = random.Random(1)
    prompts = [[rng.randrange(3, model.cfg.vocab_size) for _ in range(96)] for _ in range(16)]
    sp = SamplingParams(temperature=1.0, max_tokens=32, ignore_eos=True, seed=0)
    print("\nGRPO-shaped workload: 16 prompts x G=8, 96-token prompts, 32 sampled tokens (tiny)")
    total = 16 * 8 * 96
    for caching in (True, False):
        times = []
        for rep in range(3):
            eng = PagedEngine(copy.deepcopy(model), NoTextTokenizer(), NativeEngineConfig(enable_prefix_caching=caching))
            t = time.perf_counter()
            eng.generate(prompts, 8, sp)
            times.append(time.perf_counter() - t)
        c = eng.counters
        print(f"  prefix cache {'on ' if caching else 'off'}: prefill computed {c.prefill_tokens_computed:6d} of {total} "
              f"prompt tokens ({total / c.prefill_tokens_computed:.2f}x fewer), served from cache "
              f"{c.prefill_tokens_cached}, median {statistics.median(times):.3f} s")


def rl_step_vs_trl(workdir: Path, vllm_python: Path | None, args) -> None:
    """One GRPO step of 16 prompts x 8 samples x 32 tokens: polyrl (paged engine, and the same
    in one worker process per thread) vs TRL GRPOTrainer. polyrl's steps are timed before and
    after TRL's run, so that a change in the machine's speed meanwhile hits both sides."""
    model_dir = make_model_dir("tiny", workdir, builtin=not args.random_weights)
    kinds = ["paged"] + (["dp"] if args.threads > 1 else [])
    ours = {k: polyrl_rl_steps(model_dir, k, args) for k in kinds}
    if vllm_python is None:
        print("  TRL: .venv-vllm not found; skipped")
        return
    pf = workdir / "trl_prompts.json"
    pf.write_text(json.dumps(TRL_PROMPTS))
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([str(vllm_python), str(Path(__file__).with_name("engine.py")), "--worker", "trl",
                           "--model-dir", str(model_dir), "--prompts-file", str(pf), "--steps", str(args.repeats + 1)],
                          capture_output=True, text=True, env=env, cwd="/tmp")
    result = next((json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")), None)
    if result is None:
        print("  TRL run failed:\n" + proc.stderr[-3000:])
        return
    for k in kinds:
        ours[k] += polyrl_rl_steps(model_dir, k, args)
    theirs = statistics.median(result["step_seconds"][1:])
    print(f"  TRL GRPOTrainer median {theirs:.3f} s (steps {[round(x, 3) for x in result['step_seconds'][1:]]})")
    for k, times in ours.items():
        mine = statistics.median(times)
        print(f"  polyrl ({k}) median {mine:.3f} s over {len(times)} steps: {theirs / mine:.2f}x faster than TRL")


def polyrl_rl_steps(model_dir: Path, kind: str, args) -> list[float]:
    """Seconds of args.repeats GRPO steps (after one untimed): rollout, reward, advantages, loss,
    AdamW step, weight update of the engine."""
    from polyrl.config import TrainerConfig
    from polyrl.rl.advantages import group_advantages
    from polyrl.rollout.groups import Group, SingleTurn
    from polyrl.train.batch import build_batch
    from polyrl.train.update import update
    from polyrl.types import Score, Task

    tok = Tokenizer.from_dir(model_dir)
    policy = load_pretrained(model_dir)[0]
    engine = (DataParallelEngine(copy.deepcopy(policy), tok, NativeEngineConfig(workers=args.threads),
                                 threads_per_worker=1)
              if kind == "dp" else PagedEngine(copy.deepcopy(policy), tok))
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4, betas=(0.9, 0.99))
    cfg = SimpleNamespace(seed=0, engine=SimpleNamespace(temperature=1.0),  # the run file's trainer defaults
                          trainer=TrainerConfig(ppo_epochs=1, minibatches=1, clip_low=0.2, clip_high=0.28,
                                                max_grad_norm=1.0))
    prompt_ids = [tok.encode(p) for p in TRL_PROMPTS]
    tasks = [Task(id=str(i), domain="bench", prompt=p) for i, p in enumerate(TRL_PROMPTS)]
    times = []
    for step in range(args.repeats + 1):
        t = time.perf_counter()
        outs = engine.generate(prompt_ids, 8, SamplingParams(temperature=1.0, max_tokens=32, seed=step))
        groups = [Group(tasks[i], [SingleTurn(prompt_ids[i], c) for c in outs[i * 8:(i + 1) * 8]]) for i in range(16)]
        for g in groups:
            g.scores = [Score(float(len(x.response) % 2 == 0)) for x in g.samples]
        adv = group_advantages(torch.tensor([g.rewards for g in groups]), [g.task.domain for g in groups])
        batch = build_batch(groups, adv.tolist(), [[1.0] * 8] * 16, {"bench": 0.0})
        update(policy, None, optimizer, batch, cfg, step)
        engine.update_weights(policy.state_dict(), version=step + 1)
        times.append(time.perf_counter() - t)
    engine.close()
    print(f"\nRL step, 16 prompts x 8 samples x 32 tokens (tiny), polyrl {kind}: "
          f"steps {[round(x, 3) for x in times[1:]]} s, load={os.getloadavg()[0]:.2f}")
    return times[1:]
