"""The long-context evaluation: the sweep's tasks, the effective length, `polyrl context
extend` and `polyrl context eval` end to end."""

from __future__ import annotations

import json
import re

import pytest

from polyrl.agent.model import ModelReply, Usage
from polyrl.cli import main
from polyrl.domains.longctx import KINDS, LongContextDomain
from polyrl.evals.context_sweep import effective_length, run_sweep, sweep_tasks
from polyrl.evals.limits import EvalLimits
from polyrl.models.loading import load_policy
from polyrl.models.tokenizer import Tokenizer
from tests.helpers import small_trained_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return small_trained_model_dir(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return Tokenizer.from_dir(model_dir)


def test_effective_length_is_where_accuracy_first_falls_below_80_percent_of_the_shortest():
    assert effective_length({256: 0.5, 512: 0.45, 1024: 0.4, 2048: 0.39, 4096: 0.5}) == 1024  # 0.39 < 0.4
    assert effective_length({256: 1.0, 512: 1.0}) == 512
    assert effective_length({256: 0.5, 512: 0.1, 1024: 0.5}) == 256  # must *stay* above: no return after a fall
    assert effective_length({256: 0.0, 512: 0.0}) is None  # no baseline to hold
    assert effective_length({256: None, 512: 0.5, 1024: 0.4}) == 1024  # a kind that does not fit at 256
    assert effective_length({}) is None


def test_the_needle_control_is_drawn_only_when_named(tokenizer):
    default = LongContextDomain(levels=(1,), tokens=512, tokenizer=tokenizer).sample("heldout", 24, 0)
    assert {t.data["kind"] for t in default} <= set(KINDS)
    needles = LongContextDomain(levels=(1,), kinds=("needle",), tokens=512, tokenizer=tokenizer).sample("heldout", 3, 0)
    for task in needles:
        code = re.search(r"The access code of (\S+) is (\d+)\.", task.prompt)
        assert code and code.group(2) == task.answer and f"access code of {code.group(1)}?" in task.prompt
        assert task.data["tokens"] <= 512


def test_every_length_asks_the_same_questions_and_a_kind_that_does_not_fit_has_no_cell(tokenizer):
    cells = sweep_tasks(tokenizer, [256, 1024], per_cell=2, kinds=("consistency", "needle"))
    by = {(c.length, c.kind): c for c in cells}
    assert by[(256, "consistency")].skipped == "does not fit" and not by[(256, "consistency")].tasks
    for kind in ("needle",):
        short, long = by[(256, kind)].tasks, by[(1024, kind)].tasks
        assert [t.task.data["question_id"] for t in short] == [t.task.data["question_id"] for t in long]
        assert all(t.task.data["tokens"] <= 256 for t in short)
        assert all(700 < t.task.data["tokens"] <= 1024 for t in long)
    with pytest.raises(ValueError, match="increasing"):
        sweep_tasks(tokenizer, [512, 256], per_cell=1)


class _ReadsUpTo:
    """A chat model that answers correctly exactly when the prompt has at most `limit` tokens."""

    name, provider, tool_format, tools_style = "reads-up-to", "test", "text", "compact"

    def __init__(self, tokenizer, answers, limit, window):
        self.tokenizer, self.answers, self.limit, self.context_window = tokenizer, answers, limit, window

    def count_tokens(self, messages, tools):
        return len(self.tokenizer.encode(messages[-1]["content"]))

    def complete(self, request):
        prompt = request.messages[-1]["content"]
        n = self.count_tokens(request.messages, None)
        text = f"\\boxed{{{self.answers[prompt] if n <= self.limit else 0}}}"
        return ModelReply(text, [], {"role": "assistant", "content": text}, Usage(n, 0, 5), model=self.name)


class _Adapter:
    spec, kind = "reads-up-to", "test"

    def __init__(self, model):
        self.model, self.context_window = model, model.context_window

    def chat_model(self, context_window):
        return self.model

    def close(self):
        pass


def test_a_model_that_reads_600_tokens_has_an_effective_length_of_512(tokenizer):
    cells = sweep_tasks(tokenizer, [256, 512, 1024], per_cell=2, kinds=("needle", "code_calls", "consistency"))
    answers = {t.task.prompt: t.task.answer for c in cells for t in c.tasks}
    result = run_sweep(_Adapter(_ReadsUpTo(tokenizer, answers, limit=600, window=4096)), cells, EvalLimits(max_tokens=8))
    assert result["common_kinds"] == ["needle", "code_calls"]  # consistency does not fit at 256
    assert result["overall"] == {"256": 1.0, "512": 1.0, "1024": 0.0}
    assert result["effective_length"] == 512
    assert result["effective_length_by_kind"]["consistency"] == 512  # from its own shortest length
    assert result["accuracy"]["consistency"]["256"] is None
    # a window of 700 tokens: the 1024-token prompts are not sent, and count as failures
    small = run_sweep(_Adapter(_ReadsUpTo(tokenizer, answers, limit=10_000, window=700)), cells, EvalLimits(max_tokens=8))
    assert small["accuracy"]["needle"]["1024"] == {"tasks": 2, "successes": 0, "accuracy": 0.0, "overflow": 2}
    assert small["effective_length"] == 512


def test_extend_writes_a_longer_window_that_loads(model_dir, tmp_path, capsys):
    out = tmp_path / "long"
    assert main(["context", "extend", str(model_dir), "-o", str(out), "--rope", "yarn", "--factor", "4"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["max_position_embeddings"] == 2048
    assert config["rope_scaling"] == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}
    model, _ = load_policy(out, "float32")
    assert model.cfg.max_position_embeddings == 2048 and model.cfg.rope_scaling.rope_type == "yarn"
    assert json.loads((model_dir / "config.json").read_text())["max_position_embeddings"] == 512  # original untouched
    capsys.readouterr()
    assert main(["context", "extend", str(out), "-o", str(tmp_path / "again"), "--factor", "2"]) == 2
    assert "already has rope_scaling" in capsys.readouterr().err
    assert main(["context", "extend", str(model_dir), "-o", str(out), "--factor", "2"]) == 2  # not empty
    assert main(["context", "extend", str(model_dir), "-o", str(tmp_path / "x"), "--factor", "0.5"]) == 2


def test_eval_prints_one_document_for_each_model(model_dir, tmp_path, capsys):
    long = tmp_path / "long"
    assert main(["context", "extend", str(model_dir), "-o", str(long), "--factor", "4"]) == 0
    capsys.readouterr()
    out = tmp_path / "sweep.json"
    assert main(["context", "eval", "--model", str(model_dir), "--model", str(long), "--lengths", "256,1024",
                 "--per-cell", "1", "--kinds", "needle,code_calls", "--json", "--quiet", "-o", str(out)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads(out.read_text())
    base, extended = doc["models"]
    assert base["lengths"] == [256, 1024] and base["kinds"] == ["needle", "code_calls"]
    assert base["accuracy"]["needle"]["1024"]["overflow"] == 1  # 1024 tokens do not fit a 512-token window
    assert extended["accuracy"]["needle"]["1024"]["overflow"] == 0


def test_eval_refuses_bad_input_in_one_line(model_dir, capsys):
    for argv, message in ((["--lengths", "256,abc"], "integers"), (["--lengths", "512,256"], "increasing"),
                          (["--kinds", "needle,nope"], "kinds"), (["--model", "builtin:nope"], "unknown built-in")):
        models = [] if "--model" in argv else ["--model", str(model_dir)]
        assert main(["context", "eval", *models, *argv, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
