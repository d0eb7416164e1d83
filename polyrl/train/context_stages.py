"""Staged context extension: train a model through a schedule of longer windows.

    schedule = load_schedule("stages.yaml")          # context_schedule.py
    train_stages(schedule, Path("runs/tiny-8k"))     # stage-1/, stage-2/, ... final/

Each stage sets the RoPE scaling of its window on the original model's config (none, or
linear / dynamic / yarn / llama3 by a factor), keeps the weights the last stage ended with,
and fine-tunes on long-dependency documents of the long-context domain's train split
(assembled to the model's own token counts): a share `short_share` of them at random lengths
up to the stage's window, the rest at the window. Documents are packed into rows of at most
`max_length` tokens, each attending only to itself with positions from 0
(SegmentedCausalAttention: no (T, T) mask, one causal kernel call per document). The loss is
the mean over the answers' tokens plus `prompt_loss_weight` times the mean over the documents'
tokens, over a step of `batch_tokens` tokens: two means, so that an answer weighs the same in a
document of 8k tokens as in one of 500 (a loss per token would drown it in the document).

After every stage the model is saved (a Hugging Face directory with the stage's
rope_scaling) and scored on held-out questions at each `eval.lengths` (answer_accuracy.py),
so the schedule's curve over lengths can be compared with one jump to the final window and
with scaling alone (bench/context_stages.py). A stage already saved is not trained again:
a run that stops (Ctrl-C, a crash) resumes at the first stage not saved.

Files: metrics.jsonl (one line per step), eval.jsonl (one line per stage), stage-K/ (the
model after stage K), final/ (the last stage's model).

Out of scope: several processes (context parallelism is train/context_parallel.py and runs
one sequence at a time), resuming inside a stage.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from polyrl.domains.longctx import MIN_TOKENS, LongContextDomain
from polyrl.evals.answer_accuracy import answer_accuracy, reference_tokens
from polyrl.models.attention import SegmentedCausalAttention
from polyrl.models.config import ModelConfig
from polyrl.models.context_extension import scaled_config
from polyrl.models.hf_io import load_pretrained, save_pretrained
from polyrl.models.loading import resolve_model_dir
from polyrl.models.rope import Rotary
from polyrl.models.tokenizer import Tokenizer
from polyrl.models.transformer import Transformer
from polyrl.train.context_schedule import Schedule, Stage
from polyrl.types import Task

_TEMPLATE_SLACK = 48
"""Tokens the chat template and the answer add to a document's prompt."""
_SHORTEST = 256
"""Shortest training document: the evidence of a level-1 question fits it, of every kind."""
_DRAW = 16
"""Documents drawn per length bucket at a time."""


@dataclass
class Document:
    ids: list[int]
    answer: list[bool]
    """Which tokens are the answer's (the reply and its end of turn); the rest are the document's."""


def stage_config(original: dict, stage: Stage) -> dict:
    """config.json of the stage: the original's, with the stage's window and RoPE scaling."""
    window = int(original.get("max_position_embeddings", 2048))
    if stage.rope == "none":
        if stage.max_length > window:
            raise ValueError(f"a stage of {stage.max_length} tokens with rope: none exceeds the model's "
                             f"window of {window}; give it a RoPE scaling")
        return dict(original)
    factor = stage.factor or stage.max_length / window
    if factor <= 1:
        raise ValueError(f"a stage of {stage.max_length} tokens fits the model's window of {window}; "
                         "use rope: none or a factor above 1")
    return scaled_config(original, stage.rope, factor)


def apply_config(model: Transformer, config: dict) -> ModelConfig:
    """Give `model` (weights kept) the positions of `config`."""
    cfg = ModelConfig.from_hf_dict(config)
    model.cfg = cfg
    model.rope = Rotary(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings)
    return cfg


class DocumentStream:
    """Training documents of one stage, endless: (question, document) pairs of the train split,
    drawn in chunks per length bucket."""

    def __init__(self, schedule: Schedule, stage: Stage, index: int, tokenizer: Tokenizer):
        self.schedule, self.stage, self.index, self.tokenizer = schedule, stage, index, tokenizer
        top = stage.max_length - _TEMPLATE_SLACK
        if top < MIN_TOKENS:
            raise ValueError(f"stage {index + 1}: max_length {stage.max_length} leaves no room for a document")
        low = min(top, max(_SHORTEST, top // 8))
        self.buckets = sorted({top, *(int(low * (top / low) ** (k / 3)) for k in range(3))})
        self.rng = random.Random(f"stage|{schedule.seed}|{index}")
        self.pending: dict[int, list[Task]] = {}
        self.chunks = 0

    def next(self) -> Document:
        s = self.schedule
        length = self.buckets[-1] if self.rng.random() >= s.short_share else self.rng.choice(self.buckets)
        queue = self.pending.setdefault(length, [])
        if not queue:
            self.chunks += 1
            level = s.level if self.stage.level is None else self.stage.level
            domain = LongContextDomain(levels=(level,), kinds=s.kinds, tokens=length, tokenizer=self.tokenizer)
            try:
                queue.extend(domain.sample("train", _DRAW, seed=hash_seed(s.seed, self.index, length, self.chunks)))
            except ValueError as err:  # a kind whose evidence alone is longer than this bucket
                if "too short" not in str(err) or length == self.buckets[-1]:
                    raise
                self.buckets.remove(length)
                return self.next()
            self.rng.shuffle(queue)
        return encode(queue.pop(), self.tokenizer)


def hash_seed(*parts: object) -> int:
    return random.Random("|".join(map(str, parts))).randrange(2**31)


def encode(task: Task, tokenizer: Tokenizer) -> Document:
    segment = reference_tokens(task, tokenizer)
    return Document(segment.token_ids, [bool(m) for m in segment.loss_mask])


def pack_rows(docs: list[Document], max_length: int) -> list[list[Document]]:
    """First-fit decreasing: rows of at most `max_length` tokens."""
    rows: list[list[Document]] = []
    room: list[int] = []
    for doc in sorted(docs, key=lambda d: -len(d.ids)):
        if len(doc.ids) > max_length:
            raise ValueError(f"a document of {len(doc.ids)} tokens is longer than the row ({max_length})")
        k = next((i for i, r in enumerate(room) if r >= len(doc.ids)), None)
        if k is None:
            rows.append([doc])
            room.append(max_length - len(doc.ids))
        else:
            rows[k].append(doc)
            room[k] -= len(doc.ids)
    return rows


def row_loss(model: Transformer, row: list[Document], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(answer tokens' NLL sum, document tokens' NLL sum) of one packed row; a document's first
    token is predicted by nothing and counts in neither."""
    ids = torch.tensor([[t for d in row for t in d.ids]], device=device)
    positions = torch.cat([torch.arange(len(d.ids)) for d in row])[None].to(device)
    answer = torch.tensor([a for d in row for a in [False, *d.answer[1:]]], device=device)
    first = torch.tensor([k == 0 for d in row for k in range(len(d.ids))], device=device)
    logits = model(ids, positions, SegmentedCausalAttention([len(d.ids) for d in row]))[0]
    nll = F.cross_entropy(logits[:-1], ids[0, 1:], reduction="none")  # position i predicts token i + 1
    answer, document = answer[1:], ~(answer[1:] | first[1:])
    return nll[answer].sum(), nll[document].sum()


def token_counts(docs: list[Document]) -> tuple[int, int]:
    """(answer tokens, document tokens) that a step's loss averages over."""
    answer = sum(sum(d.answer[1:]) for d in docs)
    return answer, sum(len(d.ids) - 1 for d in docs) - answer


def train_stages(schedule: Schedule, out: Path, log: Callable[[str], None] = print,
                 progress: Callable[[int, int, str], None] | None = None) -> list[dict]:
    """Run the schedule into `out`; the per-stage evaluation records (also in eval.jsonl)."""
    out.mkdir(parents=True, exist_ok=True)
    source = resolve_model_dir(schedule.model, log=log)
    original = json.loads((source / "config.json").read_text())
    tokenizer = Tokenizer.from_dir(source)
    device = torch.device("cpu")
    torch.manual_seed(schedule.seed)
    done = _saved_stages(out, len(schedule.stages))
    start_dir = out / f"stage-{done}" if done else source
    model, _ = load_pretrained(start_dir, device=device)
    model.train()
    records = _keep(out / "eval.jsonl", done)
    _keep(out / "metrics.jsonl", done)  # a stage cut short is trained again from its start
    if done:
        log(f"resuming after stage {done} of {len(schedule.stages)} (saved in {start_dir})")
    total_tokens = sum(s.tokens for s in schedule.stages)
    seen = sum(s.tokens for s in schedule.stages[:done])
    for index in range(done, len(schedule.stages)):
        stage = schedule.stages[index]
        config = stage_config(original, stage)
        apply_config(model, config)
        seen = _train_stage(model, schedule, stage, index, tokenizer, device, out, seen, total_tokens, progress)
        model.eval()
        record = {"stage": index + 1, "max_length": stage.max_length, "rope": stage.rope,
                  "factor": (config.get("rope_scaling") or {}).get("factor"),
                  "tokens_total": seen, **evaluate(model, tokenizer, schedule)}
        model.train()
        _save(model, config, source, out / f"stage-{index + 1}")
        with open(out / "eval.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        records.append(record)
        log(f"stage {index + 1}: {stage.max_length} tokens ({stage.rope}), answer accuracy by length "
            + ", ".join(f"{n}: {c['accuracy']:.2f}" for n, c in record["lengths"].items()))
    final = out / "final"
    if final.exists():
        shutil.rmtree(final)
    shutil.copytree(out / f"stage-{len(schedule.stages)}", final)
    return records


def evaluate(model: Transformer, tokenizer: Tokenizer, schedule: Schedule) -> dict:
    cells = {}
    for length in schedule.eval.lengths:
        domain = LongContextDomain(levels=(schedule.level,), kinds=schedule.kinds,
                                   tokens=max(MIN_TOKENS, length - _TEMPLATE_SLACK), tokenizer=tokenizer)
        tasks = domain.sample("heldout", schedule.eval.per_length, seed=schedule.seed)
        cells[str(length)] = answer_accuracy(model, tokenizer, tasks)
    return {"lengths": cells}


def _train_stage(model: Transformer, schedule: Schedule, stage: Stage, index: int, tokenizer: Tokenizer,
                 device: torch.device, out: Path, seen: int, total: int,
                 progress: Callable[[int, int, str], None] | None) -> int:
    stream = DocumentStream(schedule, stage, index, tokenizer)
    lr, batch_tokens = stage.lr or schedule.lr, stage.batch_tokens or schedule.batch_tokens
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    trained, step = 0, 0
    with open(out / "metrics.jsonl", "a", encoding="utf-8") as metrics:
        while trained < stage.tokens:
            start = time.perf_counter()
            docs, size = [], 0
            while size < min(batch_tokens, stage.tokens - trained):
                doc = stream.next()
                docs.append(doc)
                size += len(doc.ids)
            step += 1
            for group in opt.param_groups:
                group["lr"] = lr * min(1.0, step / max(1, schedule.warmup_steps))
            rows = pack_rows(docs, stage.max_length)
            n_answer, n_document = token_counts(docs)
            opt.zero_grad(set_to_none=True)
            answer_sum = document_sum = 0.0
            for row in rows:
                answer, document = row_loss(model, row, device)
                loss = answer / max(1, n_answer) + schedule.prompt_loss_weight * document / max(1, n_document)
                loss.backward()
                answer_sum += float(answer.detach())
                document_sum += float(document.detach())
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
            opt.step()
            trained += size
            seen += size
            line = {"stage": index + 1, "step": step, "tokens": size, "tokens_total": seen, "rows": len(rows),
                    "documents": len(docs), "answer_loss": round(answer_sum / max(1, n_answer), 5),
                    "document_loss": round(document_sum / max(1, n_document), 5), "grad_norm": round(grad_norm, 4),
                    "seconds": round(time.perf_counter() - start, 3)}
            metrics.write(json.dumps(line) + "\n")
            metrics.flush()
            if progress is not None:
                progress(seen, total, f"stage {index + 1} answer loss {line['answer_loss']:.3f}")
    return seen


def _save(model: Transformer, config: dict, source: Path, target: Path) -> None:
    tmp = target.with_name(target.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for path in source.iterdir():  # tokenizer and generation files
        if path.is_file() and path.name not in ("config.json", "model.safetensors") and not path.name.startswith("model-"):
            shutil.copy2(path, tmp / path.name)
    save_pretrained(model, ModelConfig.from_hf_dict(config), tmp)
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)


def _saved_stages(out: Path, n: int) -> int:
    done = 0
    while done < n and (out / f"stage-{done + 1}" / "config.json").is_file():
        done += 1
    return done


def _keep(path: Path, stages: int) -> list[dict]:
    """The lines of `path` from the first `stages` stages; the rest (and a torn tail) removed."""
    kept = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                break
            if record.get("stage", stages + 1) <= stages:
                kept.append(record)
        path.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
    return kept
