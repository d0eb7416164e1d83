"""Observability: records land in SQLite, `polyrl obs` prints the figures from them."""

import json
import sqlite3
import threading

import pytest

from polyrl.agent.budget import TokenBudget
from polyrl.agent.loop import AgentConfig, ModelSlot, run_agent
from polyrl.cli import main as cli_main
from polyrl.obs import records as R
from polyrl.obs.report import Prices, build_report, percentile
from polyrl.obs.store import ObsStore, read_records
from tests.agent_fakes import ScriptedModel, call, toy_tools


class CachingModel(ScriptedModel):
    """Reports the first 10 prompt tokens of every call as read from a prefix cache."""

    def complete(self, request):
        reply = super().complete(request)
        reply.usage.cached_tokens = min(10, reply.usage.input_tokens)
        return reply


def _run(store: ObsStore) -> list:
    """Three episodes: a success with a tool error, a wrong answer, one that runs out of budget."""
    scripts = [
        ([call("boom"), call("add", a=2, b=3), "<answer>5</answer>"], None, "5"),
        ([call("add", a=1, b=1), "<answer>3</answer>"], None, "2"),
        ([call("echo", text="long " * 30)] * 20, 300, "x"),
    ]
    results = []
    for k, (texts, limit, gold) in enumerate(scripts):
        budget = TokenBudget(limit) if limit else None
        result = run_agent("task", toy_tools(), [ModelSlot(CachingModel(texts))],
                           AgentConfig(max_steps=20, max_tokens=16, conclude=False), budget, store, f"ep{k}", f"t{k}")
        success = result.answer == gold
        store.record(R.episode(f"ep{k}", f"t{k}", success=success, reward=float(success),
                               stop_reason=result.stop_reason, steps=len(result.steps),
                               input_tokens=result.input_tokens, output_tokens=result.output_tokens,
                               cached_tokens=result.cached_tokens))
        results.append(result)
    return results


def test_records_land_in_sqlite(tmp_path):
    with ObsStore.in_run_dir(tmp_path) as store:
        results = _run(store)
    db = sqlite3.connect(tmp_path / "obs.sqlite")
    kinds = dict(db.execute("SELECT kind, COUNT(*) FROM records GROUP BY kind").fetchall())
    assert kinds["model"] == sum(len(r.steps) for r in results)
    assert kinds["tool"] == sum(len(r.tool_results) for r in results) and kinds["episode"] == 3
    row = db.execute("SELECT input_tokens, cached_tokens, output_tokens, finish_reason, model FROM records "
                     "WHERE kind = 'model' AND trace_id = 'ep0' ORDER BY id").fetchone()
    first = results[0].steps[0].reply.usage
    assert row == (first.input_tokens, 10, first.output_tokens, "stop", "scripted")
    [(error,)] = db.execute("SELECT error_type FROM records WHERE kind = 'tool' AND error_type IS NOT NULL")
    assert error == "RuntimeError"
    events = {name for (name,) in db.execute("SELECT name FROM records WHERE kind = 'event'")}
    assert {"episode.stop", "budget.exhausted", "episode.conclude"} <= events
    back = list(read_records(tmp_path, "model"))[0]
    assert back.attributes[R.INPUT_TOKENS] == first.input_tokens and back.attributes["gen_ai.operation.name"] == "chat"


def test_store_is_thread_safe(tmp_path):
    store = ObsStore(tmp_path / "x.sqlite", flush_every=7)

    def write(k):
        for i in range(50):
            store.record(R.event(f"t{k}", None, i, "budget.alert"))

    threads = [threading.Thread(target=write, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.close()
    assert len(list(read_records(tmp_path / "x.sqlite"))) == 200


def test_polyrl_obs_prints_the_figures(tmp_path, capsys):
    with ObsStore.in_run_dir(tmp_path) as store:
        results = _run(store)
    rep = build_report(tmp_path, Prices(input=1.0, output=2.0, cached=0.1))
    inputs = sum(r.input_tokens for r in results)
    outputs = sum(r.output_tokens for r in results)
    cached = sum(r.cached_tokens for r in results)
    calls = sum(len(r.steps) for r in results)
    assert (rep.model_calls, rep.input_tokens, rep.output_tokens, rep.cached_tokens) == (calls, inputs, outputs, cached)
    assert rep.cache_hit_rate == pytest.approx(cached / inputs)
    assert rep.tokens_per_step == pytest.approx((inputs + outputs) / calls)
    assert rep.tool_failure_rate == pytest.approx(1 / sum(len(r.tool_results) for r in results))
    assert rep.tool_errors == {"RuntimeError": 1} and rep.tools["boom"]["failures"] == 1
    assert rep.successes == 1 and rep.tokens_per_success == inputs + outputs
    assert rep.cost == pytest.approx(((inputs - cached) * 1.0 + cached * 0.1 + outputs * 2.0) / 1e6)
    assert rep.stop_reasons == {"answer": 2, "budget": 1}
    assert rep.budget_exhausted_at_step == {len(results[2].steps): 1}
    assert rep.actions.get("conclude") == 3 - 2  # only the episode that stopped without an answer

    assert cli_main(["obs", str(tmp_path), "--price-input", "1", "--price-output", "2", "--price-cached", "0.1"]) == 0
    out = capsys.readouterr().out
    assert f"prefix-cache hits  {100 * cached / inputs:.1f}%" in out
    assert f"tokens per success {inputs + outputs:.1f}" in out
    assert "failure rate" in out and "RuntimeError 1" in out
    assert f"budget ran out     step {len(results[2].steps)}: 1" in out
    assert "tool latency       p50" in out and "tokens per step" in out

    assert cli_main(["obs", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["successes"] == 1 and doc["cost"] is None


def test_polyrl_obs_without_a_store_is_a_clear_error(tmp_path, capsys):
    assert cli_main(["obs", str(tmp_path)]) == 2
    assert "no observability store" in capsys.readouterr().err


def test_percentiles():
    assert percentile([], 0.5) is None
    assert percentile([3.0], 0.95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == pytest.approx(2.5)
    assert percentile(list(map(float, range(101))), 0.95) == pytest.approx(95.0)


def test_otel_export_uses_genai_names():
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from polyrl.obs.otel import OTelRecorder

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    run_agent("task", toy_tools(), [ModelSlot(ScriptedModel([call("add", a=1, b=2), "<answer>3</answer>"]))],
              recorder=OTelRecorder(provider))
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans][:2] == ["chat scripted", "execute_tool add"]
    assert spans[0].attributes["gen_ai.usage.input_tokens"] > 0
    assert spans[1].attributes["gen_ai.tool.name"] == "add"
