"""Versioned weight updates: how a trainer makes a polyrl server its rollout engine.

`POST /v1/weights` takes the full state dict either as a safetensors file in the body
(`Content-Type: application/octet-stream`, the version in the `x-weight-version` header:
works across machines) or as JSON `{"version": N, "path": DIR}` naming a directory of
*.safetensors files the server can read (a shared disk: no copy through HTTP). Optional
`in_flight` ("keep" or "recompute", header `x-in-flight` or JSON field) says what requests
running at that moment see (engine/paged.py). Versions only move forward: an update whose
version is not above the served one is refused with 409, so a late retry cannot roll the
weights back. Every tier gets the update, one after another, each between two of its engine
steps; the reply names the version and the seconds it took. `GET /v1/weights` gives the
version served now.

Out of scope: NCCL/IPC transfers (GPU-to-GPU weight sync: the vLLM backend's business),
partial updates (every tensor is sent), LoRA deltas.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from fastapi import Request
from safetensors import SafetensorError
from safetensors.torch import load as load_bytes
from safetensors.torch import load_file

from polyrl.serve.engine_loop import EngineLoop
from polyrl.serve.errors import APIError, bad_request


class WeightUpdater:
    def __init__(self, loops: dict[str, EngineLoop]) -> None:
        self.loops = loops
        self._lock = asyncio.Lock()

    def version(self) -> int:
        return min(loop.engine.weight_version for loop in self.loops.values())

    async def update(self, request: Request) -> dict[str, Any]:
        version, in_flight, weights = await self._read(request)
        async with self._lock:
            if version <= self.version():
                raise APIError(409, f"weight version {version} is not newer than the served {self.version()}",
                               "invalid_request_error", "version", "stale_version")
            start = time.perf_counter()
            for loop in self.loops.values():
                try:
                    await loop.call(lambda engine: engine.update_weights(weights, version, in_flight=in_flight))
                except KeyError as err:
                    raise bad_request(f"the weights do not fit this model: {err}", "weights") from None
            return {"version": version, "tiers": list(self.loops), "seconds": round(time.perf_counter() - start, 4)}

    async def _read(self, request: Request) -> tuple[int, str, dict]:
        if request.headers.get("content-type", "").startswith("application/json"):
            try:
                body = json.loads(await request.body())
                version, path = int(body["version"]), Path(str(body["path"]))
            except (ValueError, KeyError, TypeError):
                raise bad_request('expected {"version": N, "path": DIR} (or a safetensors body)') from None
            files = sorted(path.glob("*.safetensors"))
            if not files:
                raise bad_request(f"{path}: no *.safetensors files there", "path")
            weights: dict = {}
            for f in files:
                weights.update(await asyncio.to_thread(load_file, str(f)))
            in_flight = str(body.get("in_flight", "keep"))
        else:
            try:
                version = int(request.headers.get("x-weight-version", request.query_params.get("version", "")))
            except ValueError:
                raise bad_request("the x-weight-version header (an integer) is required", "version") from None
            try:
                weights = load_bytes(await request.body())
            except (SafetensorError, ValueError) as err:
                raise bad_request(f"the body is not a safetensors file ({err})", "weights") from None
            in_flight = request.headers.get("x-in-flight", "keep")
        if in_flight not in ("keep", "recompute"):
            raise bad_request(f"in_flight: got {in_flight!r}; keep or recompute", "in_flight")
        return version, in_flight, weights
