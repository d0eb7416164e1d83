"""`polyrl report`: the HTML page of a real (tiny) training run and of an evaluation directory,
checked for content, for being self-contained, and in headless Chromium (no console errors,
plots drawn where the page puts them)."""

from __future__ import annotations

import html
import io
import json
import re
from pathlib import Path

import pytest

from polyrl.cli import main as cli_main
from polyrl.config import load_config_text
from polyrl.report.build import write_report
from polyrl.report.eval_data import read_eval
from polyrl.rewards import registry
from polyrl.train.loop import train
from tests.browser import chromium, open_page
from tests.helpers import random_model_dir

RUN_CONFIG = """
seed: 3
curriculum: capability_curve
rl_tasks:
  - {{domain: math, reward: length_parity, weight: 0.6}}
  - {{domain: code, reward: length_parity, weight: 0.4, kl_coef: 0.01}}
model: {{path: {model}}}
engine: {{max_tokens: 12}}
trainer: {{steps: 4, prompts_per_step: 4, group_size: 4, lr: 1.0e-3, overlong: none, checkpoint_every: 100,
          max_minutes: 30}}
eval: {{every: 2, heldout_per_domain: 4, samples: 2}}
"""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A real run: 4 steps of a random tiny model on two domains, curriculum and KL on."""
    registry._VERIFIERS.setdefault("length_parity", "tests.helpers:ParityVerifier")
    tmp = tmp_path_factory.mktemp("report-run")
    cfg = load_config_text(RUN_CONFIG.format(model=random_model_dir(tmp / "model")))
    train(cfg, tmp / "run", log=lambda *_: None)
    return tmp / "run"


MODELS = ["builtin:tiny", "openai:http://localhost:8000/v1#served"]


def eval_rows() -> list[dict]:
    """Two models on six tasks of each tag, with every shape of attribution polyrl eval may write."""
    rows = []
    for k in range(18):
        tag = ("typical", "edge", "failure_mode")[k % 3]
        for m, model in enumerate(MODELS):
            success = (k + m) % 3 != 0
            attribution = None
            if not success:  # the shape polyrl/evals/document.py writes; a bare label is read too
                attribution = ("capability" if k % 2 else
                               {"label": "engineering", "tested": True, "flipped": True,
                                "evidence": [{"kind": "tool_result_truncated",
                                              "detail": "tool result truncated at 2000 chars", "limits": {}}]})
            rows.append({"id": f"task-{k}", "model": model, "success": success, "reward": 1.0 if success else 0.0,
                         "attribution": attribution, "tag": tag, "tokens_in": 100 + k, "tokens_out": 20 + m,
                         "latency_s": 0.5 + 0.1 * k, "stop_reason": "answer" if success else "budget",
                         "cached_tokens": 40, "model_calls": 2,
                         "budget": {"limit": 400, "spent": 120, "exhausted": not success}})
    return rows


@pytest.fixture
def eval_dir(tmp_path) -> Path:
    """An evaluation directory shaped as `polyrl eval -o DIR` writes it (results.json, tasks.jsonl)."""
    d = tmp_path / "eval"
    d.mkdir()
    rows = eval_rows()
    models = [{"model": m, "success_rate": 12 / 18, "success_ci95": [0.44, 0.84], "cost_per_success": 0.0012,
               "stop_reasons": {"answer": 12, "budget": 6}, "attribution": {"flip_rate": 0.5, "tested": 3}}
              for m in MODELS]
    summary = {"models": MODELS, "best": MODELS[0], "by_tag": {"typical": {MODELS[0]: 0.0, MODELS[1]: 1.0}},
               "comparisons": [{"a": MODELS[0], "b": MODELS[1], "tasks": 18, "both": 6, "only_a": 6, "only_b": 6,
                                "neither": 0, "p_value": 1.0, "differ": []}],
               "attribution": {"failures": 12, "tested": 6, "flipped": 3, "flip_rate": 0.5}}
    (d / "results.json").write_text(json.dumps({"suite": {"path": "suite.jsonl"}, "models": models, "tasks": rows,
                                                "summary": summary}))
    hostile = "<script>alert('x')</script> & </details>"
    (d / "tasks.jsonl").write_text("".join(
        json.dumps({"id": r["id"], "model": r["model"], "trajectory": [{"role": "user", "content": hostile},
                                                                        {"role": "assistant", "content": "42"}],
                    "rerun_trajectory": None})
        + "\n" for r in rows))
    return d


def self_contained(page: str) -> None:
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)\s*=\s*["'](?!data:|#)""", page), "the page refers to another file"
    assert "@import" not in page and "url(http" not in page


# ---------------------------------------------------------------- content


def test_run_report_shows_every_section(run_dir):
    out = write_report(run_dir)
    assert out == run_dir / "report.html"
    page = out.read_text()
    self_contained(page)
    plots = set(re.findall(r'data-plot="(\w+)"', page))
    assert {"reward", "length", "weights", "kl", "speed", "budget"} <= plots
    assert page.count("<svg") == len(re.findall(r'data-plot="', page))
    for heading in ("Held-out accuracy", "Reward", "Curriculum", "KL", "Speed", "Budget", "Per-call records"):
        assert f"<h2>{heading}" in page
    # the curriculum's reasons and the KL controller's, as the metrics recorded them
    reasons = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])["weight_reasons"]
    assert all(html.escape(r) in page for r in reasons.values())
    assert "fixed coefficient" in page or "vs target" in page
    # the per-call table keeps training and evaluation apart
    assert re.search(r"<th>train</th><th>eval</th>", page)


def test_run_report_reads_heldout_points_at_the_steps_they_measured(run_dir):
    from polyrl.report.run_data import read_run

    run = read_run(run_dir)
    assert run.steps == [0, 1, 2, 3]
    # before (0), the in-training evaluation after step 1 (measures step 2), after (4)
    assert [s for s, _ in run.heldout["math"]] == [0, 2, 4]
    assert run.budget == {"steps": 4.0, "max_minutes": 30.0, "max_rollout_tokens": None}
    assert set(run.obs) == {"train", "eval"} and run.obs["train"].model_calls == 4 * 4 * 4


def test_eval_report_table_tags_and_drill_down(eval_dir):
    out = write_report(eval_dir, eval_dir / "elsewhere" / "page.html")
    page = out.read_text()
    self_contained(page)
    ev = read_eval(eval_dir)
    assert ev.models == MODELS and ev.tags == ["typical", "edge", "failure_mode"]
    figures = ev.per_model()
    assert figures[MODELS[0]]["successes"] == 12 and figures[MODELS[1]]["successes"] == 12
    counts = ev.by_tag()[MODELS[0]]
    # model 0 fails tasks 0, 3, 6, 9, 12, 15 (all "typical"): odd k capability, even k engineering
    assert counts["typical"] == {"tasks": 6, "success": 0, "engineering": 3, "capability": 3, "other": 0}
    assert counts["edge"]["success"] == 6
    assert {"success", "attribution"} <= set(re.findall(r'data-plot="(\w+)"', page))
    assert page.count("<details>") == 18
    assert "attribution.flip_rate" in page and "success_ci95" in page and "[0.440, 0.840]" in page
    assert "stop_reasons.budget" in page and "cost_per_success" in page
    assert re.search(r"<td>only_a</td>|<th>only_a</th>", page)  # the paired comparison's 2x2 counts
    assert "tool result truncated at 2000 chars" in page  # the evidence of an engineering label
    assert "<script>alert" not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "12 of 18 task(s) are solved by some models" in page


def test_report_command_and_its_errors(run_dir, eval_dir, tmp_path, capsys):
    assert cli_main(["report", str(eval_dir)]) == 0
    assert capsys.readouterr().out.strip() == str(eval_dir / "report.html")
    (tmp_path / "empty").mkdir()
    for bad, says in ((tmp_path / "empty", "is neither a run directory"), (tmp_path / "nowhere", "does not exist"),
                      (eval_dir / "results.json", "is a file")):
        assert cli_main(["report", str(bad)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("polyrl report: ") and says in err
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "results.json").write_text('{"models": []}')
    assert cli_main(["report", str(tmp_path / "broken")]) == 2
    assert 'a "tasks" list' in capsys.readouterr().err


def test_train_prints_the_report_path_and_a_failure_is_a_warning(run_dir, monkeypatch, capsys):
    from polyrl.commands import train as train_command

    (run_dir / "report.html").unlink(missing_ok=True)
    train_command.write_report(run_dir)
    assert capsys.readouterr().out.strip() == f"report: {run_dir / 'report.html'}"
    assert (run_dir / "report.html").exists()

    def broken(_):
        raise ValueError("no plots today")

    monkeypatch.setattr("polyrl.report.build.write_report", broken)
    train_command.write_report(run_dir)  # returns: the run is not failed by its report
    err = capsys.readouterr().err
    assert "warning: the report was not written (ValueError: no plots today)" in err


def test_polyrl_train_ends_with_the_report_line(tmp_path, capsys):
    registry._VERIFIERS.setdefault("length_parity", "tests.helpers:ParityVerifier")
    text = RUN_CONFIG.format(model=random_model_dir(tmp_path / "model")).replace("steps: 4", "steps: 1")
    (tmp_path / "run.yaml").write_text(text)
    assert cli_main(["train", str(tmp_path / "run.yaml"), "--run-dir", str(tmp_path / "run")]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"report: {tmp_path / 'run' / 'report.html'}" and (tmp_path / "run" / "report.html").is_file()


# ---------------------------------------------------------------- in a browser


def drawn(png: bytes, box: dict[str, float]) -> tuple[float, int]:
    """Share of non-white pixels inside `box`, and how many distinct colours it holds."""
    import numpy as np
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    crop = image.crop((int(box["x"]), int(box["y"]), int(box["x"] + box["width"]), int(box["y"] + box["height"])))
    pixels = np.asarray(crop).reshape(-1, 3)  # (H * W, 3)
    return float((pixels.min(axis=1) < 235).mean()), len(np.unique(pixels, axis=0))


@pytest.mark.skipif(chromium() is None, reason="chromium is not installed (bash scripts/setup.sh test installs it)")
@pytest.mark.parametrize("kind", ["run", "eval"])
def test_report_opens_in_chromium_without_errors_and_shows_its_plots(kind, run_dir, eval_dir, tmp_path):
    page_file = write_report(run_dir if kind == "run" else eval_dir, tmp_path / f"{kind}.html")
    page = open_page(page_file, tmp_path / "profile")
    assert page.errors == []
    plots = len(re.findall(r'data-plot="', page_file.read_text()))
    assert len(page.boxes) == plots >= 2
    (tmp_path / f"{kind}.png").write_bytes(page.png)
    for box in page.boxes:
        assert box["width"] > 300 and box["height"] > 150  # laid out, not collapsed
        share, colours = drawn(page.png, box)
        assert share > 0.03 and colours > 20, (box, share, colours)  # axes, lines, text: not a blank box
