"""The Engine interface over HTTP: a polyrl server (`polyrl serve`) as a trainer's rollout engine.

The way RL frameworks use a vLLM server, with exact tokens: prompts go as token ids to
/v1/completions with the `return_token_ids` extension, so each Completion carries the
sampled ids, their sampling logprobs, the weight version(s) that sampled them and the
prompt tokens served from the server's prefix cache, never re-tokenised text. A seeded
call returns what a local PagedEngine.generate with the same weights and seed returns
(the server derives each sample's seed the same way). `update_weights` sends the state
dict as one safetensors body to POST /v1/weights with its version; the server refuses a
version that is not newer.

Only the standard library is used (urllib), so the engine package gains no dependency.
An HTTP failure raises RuntimeError with the server's error message.

Out of scope: retries, streaming, load balancing over several servers (one URL per engine;
a pool of servers is the pipeline's business), NCCL weight transfer.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Mapping, Sequence

import torch

from polyrl.engine.base import SamplingParams, check_prompts
from polyrl.types import Completion


class HTTPEngine:
    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None,
                 service_tier: str | None = None, timeout_s: float = 600.0) -> None:
        """base_url: the server's API root, e.g. http://127.0.0.1:8000/v1."""
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.service_tier = service_tier
        self.timeout_s = timeout_s
        self.weight_version = int(self._call("GET", "/weights")["version"])

    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams) -> list[Completion]:
        """n completions per prompt, grouped: result[i*n + j] is sample j of prompt i."""
        check_prompts(prompts, n)
        body: dict[str, Any] = {
            "prompt": [list(map(int, p)) for p in prompts], "n": n, "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
            "stop": list(sampling.stop) or None, "stop_token_ids": list(sampling.stop_token_ids) or None,
            "seed": sampling.seed, "ignore_eos": sampling.ignore_eos, "return_token_ids": True,
            "logprobs": sampling.logprobs or None}
        if self.model:
            body["model"] = self.model
        if self.service_tier:
            body["service_tier"] = self.service_tier
        choices = sorted(self._call("POST", "/completions", json.dumps(body).encode())["choices"],
                         key=lambda c: c["index"])
        assert len(choices) == len(prompts) * n, "the server returned a different number of choices"
        return [_completion(c, c["index"] // n) for c in choices]

    def update_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        from safetensors.torch import save

        # clone: safetensors refuses tensors sharing storage (tied embeddings)
        body = save({name: t.detach().to("cpu").contiguous().clone() for name, t in weights.items()})
        self._call("POST", "/weights", body, {"content-type": "application/octet-stream",
                                              "x-weight-version": str(version)})
        self.weight_version = version

    def close(self) -> None:
        """Nothing held open between calls."""

    def _call(self, method: str, path: str, body: bytes | None = None,
              headers: dict[str, str] | None = None) -> dict[str, Any]:
        request = urllib.request.Request(self.base_url + path, data=body, method=method,
                                         headers={"content-type": "application/json", **(headers or {})})
        if self.api_key:
            request.add_header("authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            try:
                message = json.loads(err.read())["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = err.reason
            raise RuntimeError(f"{method} {self.base_url}{path}: HTTP {err.code}: {message}") from None
        except urllib.error.URLError as err:
            raise RuntimeError(f"{method} {self.base_url}{path}: {err.reason}") from None


def _completion(choice: dict[str, Any], prompt_index: int) -> Completion:
    top = choice.get("top_logprobs_ids")
    return Completion(
        prompt_index=prompt_index, text=choice["text"], token_ids=list(choice["token_ids"]),
        logprobs=list(choice["token_logprobs"]), finish_reason=choice["finish_reason"],
        weight_version=int(choice["weight_version"]),
        top_logprobs=[{int(t): v for t, v in d.items()} for d in top] if top is not None else None,
        num_cached_tokens=int(choice.get("cached_tokens") or 0), token_versions=choice.get("token_versions"))
