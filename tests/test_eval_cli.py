"""`polyrl eval` and `polyrl suite` end to end on the built-in model: the document's shape,
-o DIR, two candidates compared, and every way the command refuses (exit 2, one line)."""

from __future__ import annotations

import json
import tempfile

import pytest

import polyrl.evals.session as session
from polyrl.cli import main
from polyrl.evals.models import ModelError, _local_dir
from polyrl.models.loading import resolve_model_dir
from polyrl.obs.records import DOMAIN, OUTPUT_TOKENS, PHASE
from polyrl.obs.store import read_records
from tests.helpers import builtin_tiny_as_small

TASK_KEYS = {"id", "model", "tag", "domain", "verifier", "agent", "line", "success", "reward", "status", "answer",
             "expected", "tokens_in", "tokens_out", "cached_tokens", "model_calls", "tool_calls", "tool_errors",
             "latency_s", "budget", "stop_reason", "cost", "attribution"}
MODEL_KEYS = {"model", "kind", "context_window", "tasks", "successes", "success_rate", "success_ci95", "mean_reward",
              "tokens_in", "tokens_out", "cached_tokens", "model_calls", "tokens_per_success", "tokens_per_step",
              "latency_p50_s", "latency_p95_s", "cost", "cost_per_success", "budget_exhausted", "budget_exhausted_ids", "stop_reasons",
              "by_tag", "attribution"}
WORLD = {"items": {"pen": {"price": 12, "stock": 3}, "cup": {"price": 7, "stock": 5}}, "notes": {}}


@pytest.fixture(scope="module", autouse=True)
def small_builtin(tmp_path_factory):
    """builtin:tiny names the small test recipe's model in this module: the command's handling of
    a built-in name is what is tested, and the full model takes minutes to build on a clean machine."""
    with builtin_tiny_as_small(tmp_path_factory.mktemp("cache")):
        yield


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    lines = [
        {"id": "pen", "domain": "agent", "prompt": "What is the price of a pen?", "answer": "12",
         "verifier": "success_minus_cost", "world": WORLD, "metadata": {"tag": "typical"}},
        {"id": "sum", "domain": "math", "prompt": "What is 3 + 4?", "answer": "7", "metadata": {"tag": "typical"}},
        {"id": "long", "domain": "math", "prompt": "Order 1: Ada bought 3 pens.\n" * 30 + "How many pens?",
         "answer": "90", "metadata": {"tag": "failure_mode", "limits": {"max_tokens": 16}}},
        {"id": "code", "domain": "code", "prompt": "Write a Python function f(x) with:\nf(1) == 2\nf(2) == 4",
         "entry_point": "f", "tests": [{"args": [1], "expected": 2}, {"args": [3], "expected": 6}],
         "metadata": {"tag": "edge"}},
    ]
    path = tmp_path_factory.mktemp("cli") / "suite.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.fixture(scope="module")
def two_models(suite, tmp_path_factory):
    """One evaluation of the suite on builtin:tiny and on the same weights by directory."""
    out = tmp_path_factory.mktemp("out") / "eval"
    tiny_dir = str(resolve_model_dir("builtin:tiny", log=lambda m: None))
    import contextlib
    import io

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["eval", str(suite), "--model", "builtin:tiny", "--model", tiny_dir, "--json", "--quiet",
                     "-o", str(out), "--max-tokens", "48"])
    assert code == 0
    return json.loads(stdout.getvalue()), out, tiny_dir


def test_the_document_has_the_fields_the_issue_lists(two_models):
    doc, _, tiny_dir = two_models
    assert set(doc) == {"suite", "limits", "models", "tasks", "summary"}
    assert [m["model"] for m in doc["models"]] == ["builtin:tiny", tiny_dir]
    assert doc["models"][0]["kind"] == "builtin" and doc["models"][1]["kind"] == "hf"
    assert len(doc["tasks"]) == 8 and all(set(t) == TASK_KEYS for t in doc["tasks"])
    for m in doc["models"]:
        assert set(m) == MODEL_KEYS and m["tasks"] == 4 and m["context_window"] == 512
        assert set(m["by_tag"]) == {"typical", "edge", "failure_mode"}
        assert m["cost"] == 0.0  # no price card: local models cost nothing
        low, high = m["success_ci95"]
        assert 0 <= low <= m["success_rate"] <= high <= 1
    long = next(t for t in doc["tasks"] if t["id"] == "long")
    assert long["stop_reason"] == "context_overflow" and not long["success"]
    assert long["attribution"]["evidence"][0]["kind"] == "prompt_overflow" and long["attribution"]["tested"]
    pen = next(t for t in doc["tasks"] if t["id"] == "pen")
    assert pen["agent"] and pen["model_calls"] >= 1 and pen["tokens_in"] > 0
    for t in doc["tasks"]:
        assert (t["attribution"] is None) == t["success"]


def test_the_same_weights_twice_agree_on_every_task(two_models):
    doc, _, tiny_dir = two_models
    (c,) = doc["summary"]["comparisons"]
    assert (c["a"], c["b"], c["tasks"]) == ("builtin:tiny", tiny_dir, 4)
    assert c["only_a"] == c["only_b"] == 0 and c["p_value"] == 1.0 and c["differ"] == []
    assert set(doc["summary"]["by_tag"]) == {"typical", "edge", "failure_mode"}


def test_out_dir_holds_the_document_and_the_trajectories(two_models):
    doc, out, _ = two_models
    assert json.loads((out / "results.json").read_text()) == doc
    lines = [json.loads(x) for x in (out / "tasks.jsonl").read_text().splitlines()]
    assert [(x["id"], x["model"]) for x in lines] == [(t["id"], t["model"]) for t in doc["tasks"]]
    pen = lines[0]["trajectory"]
    assert pen["steps"] and pen["messages"][0]["role"] == "system"  # the whole episode, every call
    long = next(x for x in lines if x["id"] == "long")
    assert long["rerun_trajectory"] is not None  # the attribution re-run is kept too
    assert sorted(p.name for p in out.iterdir()) == ["obs.sqlite", "results.json", "tasks.jsonl"]  # no temporaries


def test_out_dir_holds_every_call_as_an_eval_record(two_models, capsys):
    doc, out, tiny_dir = two_models
    recs = list(read_records(out / "obs.sqlite"))
    assert recs and {r.attributes[PHASE] for r in recs} == {"eval"}
    episodes = [r for r in recs if r.kind == "episode" and not r.attributes.get("x.eval.rerun")]
    assert sorted((r.attributes["x.eval.model"], r.task_id) for r in episodes) == \
        sorted((t["model"], t["id"]) for t in doc["tasks"])
    calls = [r for r in recs if r.kind == "model" and not r.attributes.get("x.eval.rerun")]
    for model in ("builtin:tiny", tiny_dir):  # the document's token counts are the records' sums
        figures = next(m for m in doc["models"] if m["model"] == model)
        mine = [r for r in calls if r.attributes["x.eval.model"] == model]
        assert len(mine) == figures["model_calls"]
        assert sum(r.attributes[OUTPUT_TOKENS] for r in mine) == figures["tokens_out"]
    assert {r.attributes[DOMAIN] for r in calls} == {"agent", "math", "code"}
    assert any(r.kind == "tool" for r in recs)  # the agent task's tool calls
    assert main(["obs", str(out), "--phase", "eval"]) == 0
    assert "model calls" in capsys.readouterr().out


def test_text_output_shows_the_table_tags_and_attribution(suite, capsys):
    assert main(["eval", str(suite), "--model", "builtin:tiny", "--id", "sum", "--id", "long", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "builtin:tiny" in out and "success by tag" in out and "failures (engineering" in out
    assert "suite " in out and ": 2 tasks" in out


def _refused(capsys, argv, message):
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse refuses by exiting
        code = stop.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    return err


def test_a_suite_that_cannot_be_read_exits_2(suite, tmp_path, capsys):
    _refused(capsys, ["eval", str(tmp_path / "nope.jsonl"), "--model", "builtin:tiny"], "cannot read suite")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "domain": "math", "prompt": "x"}\n')
    _refused(capsys, ["eval", str(bad), "--model", "builtin:tiny"], f"{bad}:1: field 'answer' is missing")
    _refused(capsys, ["eval", str(suite), "--model", "builtin:tiny", "--id", "nope"], "no task with id 'nope'")


def test_a_model_that_cannot_be_read_exits_2_and_writes_nothing(suite, tmp_path, capsys):
    out = tmp_path / "never"
    _refused(capsys, ["eval", str(suite), "--model", str(tmp_path / "missing"), "-o", str(out)], "no such directory")
    _refused(capsys, ["eval", str(suite), "--model", "builtin:nope", "-o", str(out)], "unknown built-in model")
    _refused(capsys, ["eval", str(suite), "--model", "openai:http://127.0.0.1:9/v1#m", "-o", str(out)],
             "cannot reach http://127.0.0.1:9/v1")
    _refused(capsys, ["eval", str(suite), "--model", "openai:localhost#m"], "expected openai:BASE_URL#MODEL")
    _refused(capsys, ["eval", str(suite), "--model", "builtin:tiny", "--model", "builtin:tiny"], "given twice")
    empty = tmp_path / "empty_model"
    empty.mkdir()
    _refused(capsys, ["eval", str(suite), "--model", str(empty)], "not a model (no config.json) nor a run directory")
    assert not out.exists()


def test_other_refusals_exit_2(suite, tmp_path, capsys):
    prices = tmp_path / "prices.yaml"
    prices.write_text("models: [1, 2]\n")
    _refused(capsys, ["eval", str(suite), "--model", "builtin:tiny", "--prices", str(prices)], "price card")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    _refused(capsys, ["eval", str(suite), "--model", "builtin:tiny", "-o", str(a_file)], "is a file")
    _refused(capsys, ["eval", str(suite), "--model", "builtin:tiny", "--budget", "0"], "must be at least 1")


def test_run_directories_resolve_to_their_last_checkpoint(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    with pytest.raises(ModelError, match="no checkpoint yet"):
        _local_dir(str(run))
    for step in ("step-2", "step-10"):
        (run / "checkpoints" / step).mkdir()
        (run / "checkpoints" / step / "config.json").write_text("{}")
    assert _local_dir(str(run)) == ("checkpoint", run / "checkpoints" / "step-10")
    (run / "checkpoints" / "final").mkdir()
    (run / "checkpoints" / "final" / "config.json").write_text("{}")
    assert _local_dir(str(run)) == ("checkpoint", run / "checkpoints" / "final")


def test_a_run_that_breaks_midway_leaves_nothing_half_written(suite, tmp_path, monkeypatch, capsys):
    out = tmp_path / "eval"
    out.mkdir()
    (out / "results.json").write_text('{"old": true}')
    real = session.run_task
    calls = []

    def breaks_on_the_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("the machine caught fire")
        return real(*args, **kwargs)

    monkeypatch.setattr(session, "run_task", breaks_on_the_second)
    crashes = tmp_path / "tmp"
    crashes.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(crashes))  # the traceback's file, not the machine's /tmp
    assert main(["eval", str(suite), "--model", "builtin:tiny", "-o", str(out), "--quiet", "--id", "sum",
                 "--id", "pen"]) == 1
    assert "internal error: RuntimeError: the machine caught fire" in capsys.readouterr().err
    assert len(list(crashes.glob("polyrl-crash-*.txt"))) == 1
    assert sorted(p.name for p in out.iterdir()) == ["results.json"]
    assert (out / "results.json").read_text() == '{"old": true}'
