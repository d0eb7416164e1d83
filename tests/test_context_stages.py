"""Staged context extension (polyrl/train/context_stages.py, context_schedule.py), its packing
attention, the teacher-forced answer accuracy, and `polyrl context train`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from polyrl.evals.answer_accuracy import answer_accuracy
from polyrl.domains.longctx import LongContextDomain
from polyrl.models.attention import DocumentCausalAttention, SegmentedCausalAttention
from polyrl.models.hf_io import load_pretrained
from polyrl.models.tokenizer import Tokenizer
from polyrl.train.context_schedule import Schedule, ScheduleError, Stage, load_schedule
from polyrl.train.context_stages import Document, apply_config, pack_rows, stage_config, train_stages
from tests.helpers import small_trained_model_dir, tiny_model

ORIGINAL = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
            "max_position_embeddings": 512, "rope_theta": 10000.0}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_trained_model_dir(tmp_path_factory.mktemp("cache"))


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "stages.yaml"
    path.write_text(text)
    return path


# ---------------------------------------------------------------- the schedule file

def test_a_schedule_file_loads_with_its_defaults(tmp_path: Path) -> None:
    s = load_schedule(_write(tmp_path, "stages:\n  - {max_length: 512, rope: none, tokens: 1000}\n"
                                       "  - {max_length: 2048, tokens: 500}\n"))
    assert [st.max_length for st in s.stages] == [512, 2048] and s.stages[1].rope == "yarn"
    assert s.model == "builtin:tiny" and s.eval.lengths[-1] == 8192


@pytest.mark.parametrize("text, expected", [
    ("stages:\n  - {max_length: 2048, tokens: 10}\n  - {max_length: 512, tokens: 10}\n", "must not shrink"),
    ("stages:\n  - {max_length: 512, rope: none, factor: 2, tokens: 10}\n", "rope: none has no factor"),
    ("kinds: [haystack]\nstages:\n  - {max_length: 512, tokens: 10}\n", "choose from"),
    ("stages:\n  - {max_length: 512, tokens: 0}\n", ":2: stages[0].tokens"),
    ("stages:\n  - {max_length: 512, tokens: 10, lenght: 3}\n", "lenght"),
    ("stages:\n  - {max_length: 512, rope: none, tokens: 10, level: 5}\n", "stages[0].level"),
    ("stages: []\n", "stages"),
    ("eval: {lengths: [1024, 512]}\nstages:\n  - {max_length: 512, tokens: 10}\n", "increasing"),
    ("- just a list\n", "expected a mapping"),
])
def test_a_bad_schedule_is_one_line_naming_the_field(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ScheduleError) as err:
        load_schedule(_write(tmp_path, text))
    assert expected in str(err.value) and str(tmp_path / "stages.yaml") in str(err.value)
    assert len(str(err.value).splitlines()) == 1


def test_a_stage_level_sets_its_training_documents_level(model_dir: Path) -> None:
    """A stage with `level: 0` draws its training documents at level 0; a stage that names no
    level draws at the schedule's."""
    from polyrl.train.context_stages import DocumentStream

    schedule = Schedule(model=str(model_dir), kinds=("consistency",), level=1,
                        stages=(Stage(max_length=512, rope="none", tokens=10, level=0),
                                Stage(max_length=512, rope="none", tokens=10)))
    tokenizer = Tokenizer.from_dir(model_dir)
    for index, level in ((0, 0), (1, 1)):
        stream = DocumentStream(schedule, schedule.stages[index], index, tokenizer)
        stream.next()
        drawn = [t.difficulty for queue in stream.pending.values() for t in queue]
        assert drawn and set(drawn) == {level}


def test_a_stage_scales_the_original_config() -> None:
    assert stage_config(ORIGINAL, Stage(max_length=512, rope="none", tokens=1)) == ORIGINAL
    with pytest.raises(ValueError, match="exceeds the model's window"):
        stage_config(ORIGINAL, Stage(max_length=1024, rope="none", tokens=1))
    with pytest.raises(ValueError, match="fits the model's window"):
        stage_config(ORIGINAL, Stage(max_length=512, rope="yarn", tokens=1))
    yarn = stage_config(ORIGINAL, Stage(max_length=2048, rope="yarn", tokens=1))
    assert yarn["max_position_embeddings"] == 2048
    assert yarn["rope_scaling"] == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}
    assert stage_config(ORIGINAL, Stage(max_length=2048, rope="linear", factor=16, tokens=1))["max_position_embeddings"] == 8192


def test_a_new_stage_changes_the_positions_and_keeps_the_weights() -> None:
    model = tiny_model(64, seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.arange(1, 40)[None]
    short = model(ids)
    cfg = apply_config(model, stage_config(model.cfg.to_hf_dict(), Stage(max_length=4 * model.cfg.max_position_embeddings,
                                                                          rope="linear", tokens=1)))
    assert cfg.rope_scaling is not None and model.cfg is cfg
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not torch.allclose(model(ids), short)


# ---------------------------------------------------------------- packing

def test_segmented_attention_equals_the_document_mask_in_values_and_gradients() -> None:
    torch.manual_seed(0)
    lengths = [5, 9, 2]
    q = torch.randn(1, 4, sum(lengths), 8, requires_grad=True)
    k = torch.randn(1, 2, sum(lengths), 8, requires_grad=True)
    v = torch.randn(1, 2, sum(lengths), 8, requires_grad=True)
    documents = torch.tensor([[i for i, n in enumerate(lengths) for _ in range(n)]])
    outs, grads = [], []
    for backend in (SegmentedCausalAttention(lengths), DocumentCausalAttention(documents)):
        out = backend.attend(0, q, k, v)
        (g,) = torch.autograd.grad((out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum(), [q])
        outs.append(out.detach())
        grads.append(g)
    torch.testing.assert_close(outs[0], outs[1], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-5)


def test_packing_keeps_every_document_within_rows_of_the_stage_length() -> None:
    docs = [Document(list(range(n)), [False] * n) for n in (300, 200, 120, 500, 90, 10)]
    rows = pack_rows(docs, 512)
    assert sorted(len(d.ids) for r in rows for d in r) == sorted(len(d.ids) for d in docs)
    assert all(sum(len(d.ids) for d in r) <= 512 for r in rows) and len(rows) == 3
    with pytest.raises(ValueError, match="longer than the row"):
        pack_rows([Document(list(range(600)), [False] * 600)], 512)


# ---------------------------------------------------------------- training and scoring

def test_training_lowers_the_answer_loss_and_a_run_resumes_at_its_first_unsaved_stage(model_dir: Path,
                                                                                     tmp_path: Path) -> None:
    schedule = Schedule(model=str(model_dir), kinds=("needle",), batch_tokens=1024, lr=3e-3, warmup_steps=2,
                        stages=(Stage(max_length=512, rope="none", tokens=30_000),
                                Stage(max_length=1024, rope="yarn", tokens=6_000)),
                        eval={"lengths": (512, 1024), "per_length": 6})
    base, _ = load_pretrained(model_dir)
    tokenizer = Tokenizer.from_dir(model_dir)
    tasks = LongContextDomain(levels=(1,), kinds=("needle",), tokens=460, tokenizer=tokenizer).sample("heldout", 6, 0)
    before = answer_accuracy(base, tokenizer, tasks)

    out = tmp_path / "run"
    records = train_stages(schedule, out, log=lambda m: None)
    assert [r["stage"] for r in records] == [1, 2]
    assert records[0]["lengths"]["512"]["answer_nll"] < before["answer_nll"] - 0.5
    # stage 1's window is 512: the 1024-token questions do not fit it
    assert records[0]["lengths"]["1024"]["overflow"] == 6 and records[1]["lengths"]["1024"]["overflow"] == 0
    final = json.loads((out / "final" / "config.json").read_text())
    assert final["max_position_embeddings"] == 1024 and final["rope_scaling"]["rope_type"] == "yarn"
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {s["stage"] for s in steps} == {1, 2} and steps[-1]["tokens_total"] >= 36_000

    # a run stopped inside stage 2: its saved stage 1 is kept, stage 2 trained again from its start
    shutil.rmtree(out / "stage-2")
    (out / "eval.jsonl").write_text((out / "eval.jsonl").read_text().splitlines()[0] + "\n")
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"stage": 2, "step": 99, "to')  # a torn line
    first = [s for s in steps if s["stage"] == 1]
    messages: list[str] = []
    again = train_stages(schedule, out, log=messages.append)
    assert any("resuming after stage 1" in m for m in messages)
    resumed = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [s for s in resumed if s["stage"] == 1] == first
    assert [s["step"] for s in resumed if s["stage"] == 2] == [s["step"] for s in steps if s["stage"] == 2]
    assert [r["stage"] for r in again] == [1, 2] and again[0] == records[0]


def test_answer_accuracy_counts_a_prompt_past_the_window_as_overflow(model_dir: Path) -> None:
    model, _ = load_pretrained(model_dir)
    tokenizer = Tokenizer.from_dir(model_dir)
    tasks = LongContextDomain(levels=(1,), kinds=("needle",), tokens=600, tokenizer=tokenizer).sample("heldout", 2, 0)
    got = answer_accuracy(model, tokenizer, tasks)
    assert got == {"tasks": 2, "accuracy": 0.0, "overflow": 2, "answer_nll": None}


def test_the_command_refuses_an_existing_directory_and_a_bad_file(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "x").write_text("")
    ok = _write(tmp_path, "stages:\n  - {max_length: 512, rope: none, tokens: 10}\n")
    got = subprocess.run([sys.executable, "-m", "polyrl.cli", "context", "train", str(ok), "-o", str(tmp_path / "run")],
                         capture_output=True, text=True)
    assert got.returncode == 2 and "--resume" in got.stderr and len(got.stderr.strip().splitlines()) == 1
    bad = _write(tmp_path, "stages:\n  - {max_length: 512, tokens: -1}\n")
    got = subprocess.run([sys.executable, "-m", "polyrl.cli", "context", "train", str(bad), "-o", str(tmp_path / "new")],
                         capture_output=True, text=True)
    assert got.returncode == 2 and "stages[0].tokens" in got.stderr and not (tmp_path / "new").exists()


def test_the_built_in_schedule_loads_and_ends_at_8k() -> None:
    from importlib.resources import as_file, files

    with as_file(files("polyrl") / "configs" / "context_stages.yaml") as path:
        schedule = load_schedule(path)
    assert schedule.stages[0].rope == "none" and schedule.stages[-1].max_length == 8192
    assert stage_config(json.loads(json.dumps(ORIGINAL)), schedule.stages[-1])["max_position_embeddings"] == 8192
