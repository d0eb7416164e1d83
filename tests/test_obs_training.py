"""Observability in training: a record for every model call of every domain, training and
evaluation apart (x.phase), `polyrl obs` per phase, a resume that drops the records of the
step it repeats, and OpenTelemetry export of both phases."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from polyrl.cli import main as cli_main
from polyrl.config import load_config_text
from polyrl.obs import records as R
from polyrl.obs.store import ObsStore, read_phases, read_records
from polyrl.rewards import registry
from polyrl.rollout.groups import latency_shares
from polyrl.train.loop import train
from polyrl.train.run_dir import RunDir
from tests.helpers import random_model_dir

STEPS, PROMPTS, G = 3, 4, 4
HELDOUT, SAMPLES = 4, 2
CONFIG = f"""
seed: 5
rl_tasks:
  - {{{{domain: math, reward: length_parity, weight: 0.5}}}}
  - {{{{domain: code, reward: length_parity, weight: 0.5}}}}
model: {{{{path: {{model}}}}}}
engine: {{{{max_tokens: 12}}}}
trainer: {{{{steps: {STEPS}, prompts_per_step: {PROMPTS}, group_size: {G}, lr: 1.0e-3, overlong: none,
          checkpoint_every: 100}}}}
eval: {{{{every: 1, heldout_per_domain: {HELDOUT}, samples: {SAMPLES}}}}}
"""
EVAL_CALLS = 2 * HELDOUT * (SAMPLES + 1)
"""model calls of one held-out evaluation: two domains, sampled responses and one greedy each"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    registry._VERIFIERS.setdefault("length_parity", "tests.helpers:ParityVerifier")
    return random_model_dir(tmp_path_factory.mktemp("obs-model"))


@pytest.fixture(scope="module")
def straight(model_dir, tmp_path_factory):
    """An uninterrupted run, its records also exported as OpenTelemetry spans (when the SDK is there)."""
    exporter, export = None, None
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from polyrl.obs.otel import OTelRecorder

        exporter, provider = InMemorySpanExporter(), TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        export = OTelRecorder(provider)
    except ImportError:
        pass
    run = tmp_path_factory.mktemp("obs-straight") / "run"
    train(load_config_text(CONFIG.format(model=model_dir)), run, log=lambda *_: None, export=export)
    return run, exporter


def calls(run: Path, phase: str | None = None) -> list[R.ObsRecord]:
    return list(read_records(run, "model", phase))


def test_every_single_turn_sample_is_a_model_call_record(straight):
    run, _ = straight
    train_calls = calls(run, "train")
    assert len(train_calls) == STEPS * PROMPTS * G
    assert {c.attributes[R.DOMAIN] for c in train_calls} == {"math", "code"}
    assert all(c.attributes[R.PHASE] == "train" and c.name == "chat policy" for c in train_calls)
    # the records agree with the trajectory log, sample by sample
    samples = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    assert sum(c.attributes[R.OUTPUT_TOKENS] for c in train_calls) == sum(len(s["token_ids"]) for s in samples)
    assert sum(c.attributes[R.INPUT_TOKENS] for c in train_calls) == sum(len(s["prompt_ids"]) for s in samples)
    assert (Counter(c.attributes[R.FINISH_REASONS][0] for c in train_calls)
            == Counter(s["finish_reason"] for s in samples))
    assert Counter((c.task_id, c.attributes[R.DOMAIN]) for c in train_calls) == Counter(
        (s["task_id"], s["domain"]) for s in samples)
    for c in train_calls:
        a = c.attributes
        assert 0 <= a[R.CACHE_READ_TOKENS] <= a[R.INPUT_TOKENS]
        assert 0 < c.duration_s <= a["x.call.batch_duration"] + 1e-9 and a["x.call.batch_size"] >= G


def test_evaluation_calls_are_phase_eval_and_tagged_with_the_step(straight):
    run, _ = straight
    assert read_phases(run) == ["train", "eval"]
    # before (0), after steps 1 and 2 (every: 1, not after the last), and the final one
    assert len(calls(run, "eval")) == (1 + (STEPS - 1) + 1) * EVAL_CALLS
    with sqlite3.connect(run / "obs.sqlite") as db:
        rows = db.execute("SELECT phase, train_step, COUNT(*) FROM records GROUP BY phase, train_step").fetchall()
    assert sorted(rows) == sorted([("train", s, PROMPTS * G) for s in range(STEPS)]
                                  + [("eval", 0, 2 * EVAL_CALLS), ("eval", 1, EVAL_CALLS), ("eval", STEPS, EVAL_CALLS)])


def test_latency_shares_split_the_batch_call_by_generated_tokens():
    shares = latency_shares(2.0, [0, 9, 19])  # weights 1, 10, 20
    assert shares == pytest.approx([2.0 / 31, 2.0 * 10 / 31, 2.0 * 20 / 31]) and sum(shares) == pytest.approx(2.0)


def test_polyrl_obs_reports_training_and_evaluation_apart(straight, capsys):
    run, _ = straight
    assert cli_main(["obs", str(run)]) == 0
    out = capsys.readouterr().out
    train_part, eval_part = out.split("== evaluation (phase eval) ==")
    assert train_part.startswith("== training rollouts (phase train) ==")
    assert f"model calls        {STEPS * PROMPTS * G} in" in train_part
    assert f"model calls        {(STEPS + 1) * EVAL_CALLS} in" in eval_part
    assert "  math " in train_part and "  code " in train_part  # the per-domain lines

    assert cli_main(["obs", str(run), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model_calls"] == doc["phases"]["train"]["model_calls"] + doc["phases"]["eval"]["model_calls"]
    assert doc["phases"]["train"]["domains"]["math"]["calls"] + doc["phases"]["train"]["domains"]["code"]["calls"] \
        == STEPS * PROMPTS * G
    assert cli_main(["obs", str(run), "--phase", "eval", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model_calls"] == (STEPS + 1) * EVAL_CALLS


def identity(run: Path) -> Counter:
    """What a record is, without what depends on timing or the prefix cache."""
    with sqlite3.connect(run / "obs.sqlite") as db:
        return Counter(db.execute("SELECT kind, phase, train_step, task_id, json_extract(attributes, '$.\"x.domain\"'), "
                                  "input_tokens, output_tokens, finish_reason FROM records").fetchall())


def test_resume_drops_the_records_of_the_unfinished_step(straight, model_dir, tmp_path, monkeypatch):
    run, _ = straight
    killed = tmp_path / "killed"
    cfg = load_config_text(CONFIG.format(model=model_dir))
    save_state = RunDir.save_state

    def dies_before_step_1_is_done(self, state):  # step 1's metrics and records are written, its state not
        if state["step"] == 2:
            raise KeyboardInterrupt
        save_state(self, state)

    monkeypatch.setattr(RunDir, "save_state", dies_before_step_1_is_done)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, killed, log=lambda *_: None)
    monkeypatch.setattr(RunDir, "save_state", save_state)
    with sqlite3.connect(killed / "obs.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM records WHERE train_step = 1 AND phase = 'train'").fetchone()[0] \
            == PROMPTS * G  # the killed step's records reached the store
    notes: list[str] = []
    train(cfg, killed, resume=True, log=notes.append)
    assert any("obs.sqlite: removed" in n for n in notes)
    assert identity(killed) == identity(run)  # nothing doubled, nothing lost


def test_open_telemetry_receives_training_and_evaluation_records(straight):
    run, exporter = straight
    if exporter is None:
        pytest.skip("opentelemetry-sdk is not installed (pip install 'polyrl[otel]')")
    spans = exporter.get_finished_spans()
    stored = list(read_records(run))
    assert len(spans) == len(stored)
    phases = Counter(s.attributes.get(R.PHASE) for s in spans if s.name == "chat policy")
    assert phases == {"train": STEPS * PROMPTS * G, "eval": (STEPS + 1) * EVAL_CALLS}
    span = next(s for s in spans if s.attributes.get(R.PHASE) == "train")
    assert span.attributes[R.DOMAIN] in ("math", "code") and span.attributes[R.INPUT_TOKENS] > 0
    assert span.attributes["gen_ai.response.finish_reasons"] in (("stop",), ("length",))

    # and afterwards, from the store: one phase at a time
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from polyrl.obs.otel import OTelRecorder, export_store

    later, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(later))
    assert export_store(run, OTelRecorder(provider), phase="eval") == len(list(read_records(run, phase="eval")))
    assert {s.attributes[R.PHASE] for s in later.get_finished_spans()} == {"eval"}


def test_a_store_from_before_phases_still_reads(tmp_path):
    path = tmp_path / "obs.sqlite"
    with sqlite3.connect(path) as db:  # the schema before train_step and phase
        db.execute("CREATE TABLE records (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, name TEXT NOT NULL, "
                   "trace_id TEXT NOT NULL, task_id TEXT, step INTEGER, start_time REAL, duration_s REAL, model TEXT, "
                   "input_tokens INTEGER, cached_tokens INTEGER, output_tokens INTEGER, ttft_s REAL, "
                   "finish_reason TEXT, tool_name TEXT, error_type TEXT, attributes TEXT NOT NULL)")
        db.execute("INSERT INTO records (kind, name, trace_id, attributes) VALUES ('model', 'chat m', 't', '{}')")
    assert read_phases(path) == [""] and len(list(read_records(path, phase=""))) == 1  # readers do not migrate
    assert list(read_records(path, phase="train")) == []
    with ObsStore(path) as store:  # a writer adds the columns
        store.record(R.stamped([R.event("t2", None, None, "x")], **{R.PHASE: "eval"})[0])
    assert read_phases(path) == ["eval", ""]
