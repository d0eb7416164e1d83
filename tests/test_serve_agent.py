"""`polyrl agent` falling back to a lighter model when its budget runs low: a `polyrl serve`
endpoint's fast tier (--fallback-service-tier fast), or the fast tier in process (--fallback-model fast)."""

from __future__ import annotations

import copy
import json

import pytest

from polyrl.cli import main
from polyrl.engine.config import NativeEngineConfig
from polyrl.engine.paged import PagedEngine
from polyrl.models.hf_io import load_pretrained
from polyrl.models.tokenizer import Tokenizer
from polyrl.serve.app import Server, create_app
from polyrl.serve.engine_loop import EngineLoop
from polyrl.serve.tiers import tier_config
from tests.helpers import random_model_dir
from tests.serve_fakes import ServerThread


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    model_dir = random_model_dir(tmp_path_factory.mktemp("agentserve"))
    model, _ = load_pretrained(model_dir)
    tok = Tokenizer.from_dir(model_dir)
    cfg = NativeEngineConfig(num_blocks=256)
    loops = {"standard": EngineLoop(PagedEngine(copy.deepcopy(model), tok, cfg), "standard"),
             "fast": EngineLoop(PagedEngine(copy.deepcopy(model), tok, tier_config("fast", cfg)), "fast")}
    server = Server(loops, tok, "m", model.cfg.max_position_embeddings)
    thread = ServerThread(create_app(server))
    yield thread, server, model_dir
    thread.stop()
    for loop in loops.values():
        loop.close()


def _episode(run_dir):
    return json.loads((run_dir / "agent_episodes.jsonl").read_text().splitlines()[0])


def _agent(tmp_path, *args):
    return main(["agent", "--max-tokens", "16", "--max-steps", "2", "--quiet", "--json",
                 "--run-dir", str(tmp_path), *args])


@pytest.mark.parametrize("budget, tier", [(300, "fast"), (5000, "standard")])
def test_low_budget_falls_back_to_the_endpoints_fast_tier(endpoint, tmp_path, budget, tier):
    thread, server, _ = endpoint
    before = dict(server.metrics.requests)
    assert _agent(tmp_path, "--openai-base-url", thread.url, "--openai-model", "m", "--tool-format", "text",
                  "--budget", str(budget), "--fallback-service-tier", "fast") == 0
    grew = {key[1] for key, n in server.metrics.requests.items() if n > before.get(key, 0)}
    assert grew == {tier}
    first = _episode(tmp_path)["steps"][0]
    assert first["model"] == ("m@fast" if tier == "fast" else "m")
    downgrades = [e for e in _episode(tmp_path)["events"] if e["event"] == "model.downgrade"]
    assert bool(downgrades) == (tier == "fast")


def test_local_fallback_to_the_fast_tier(endpoint, tmp_path):
    assert _agent(tmp_path, "--model", str(endpoint[2]), "--budget", "150", "--fallback-model", "fast") == 0
    assert _episode(tmp_path)["steps"][0]["model"] == "fast"


def test_fallback_service_tier_needs_an_endpoint(tmp_path, capsys):
    assert _agent(tmp_path, "--fallback-service-tier", "fast") == 2
    assert "--fallback-service-tier needs --openai-base-url" in capsys.readouterr().err
