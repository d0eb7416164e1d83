"""The run directory: what a run leaves behind, and how a stopped run picks up again.

    run_dir/
      config.yaml          resolved run file (every field)
      metrics.jsonl        one line per step: per-domain reward, KL, entropy, length, ...
      trajectories.jsonl   every sample: prompt, completion, token ids, logprobs, reward
                           with its details, weight version (enough to re-score it)
      executions.jsonl     every code execution, replayable (`polyrl replay RUN_DIR ID`);
                           blobs/ holds the program text they share
      flags.jsonl          suspicious reward patterns (train/monitor.py); a quarantine
                           list that rl_tasks[].quarantine can name (domains/quarantine.py)
      obs.sqlite           agent model calls, tool calls, budget events (`polyrl obs RUN_DIR`)
      eval/before.json     held-out evaluation of the base model
      eval/after.json      ... and of the trained one
      state/state.pt       latest training state: policy, optimizer, step, curriculum, clock
      checkpoints/step-N/  Hugging Face model directories; final/ at the end

The state is written after each step's lines (atomically, via rename). On resume, lines
of steps at or past the saved step are dropped, so a run killed mid-step loses at most
that step and never double-counts it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def trajectories(self) -> Path:
        return self.path / "trajectories.jsonl"

    @property
    def flags(self) -> Path:
        return self.path / "flags.jsonl"

    @property
    def executions(self) -> Path:
        return self.path / "executions.jsonl"

    @property
    def state(self) -> Path:
        return self.path / "state" / "state.pt"

    def eval_file(self, name: str) -> Path:
        return self.path / "eval" / f"{name}.json"

    def create(self, config_yaml: str) -> None:
        if self.state.exists():
            raise FileExistsError(f"{self.path} already holds a run; continue it with "
                                  f"`polyrl train --resume {self.path}` or choose another run_dir")
        self.path.mkdir(parents=True, exist_ok=True)
        self.config.write_text(config_yaml)
        for f in (self.metrics, self.trajectories):
            f.write_text("")

    def append(self, file: Path, records: list[dict[str, Any]]) -> None:
        with open(file, "a") as fh:
            for r in records:
                fh.write(json.dumps(r, separators=(",", ":")) + "\n")

    def write_json(self, file: Path, data: Any) -> None:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, file)

    def read_json(self, file: Path) -> Any:
        return json.loads(file.read_text()) if file.exists() else None

    def save_state(self, state: dict[str, Any]) -> None:
        self.state.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.state)

    def load_state(self) -> dict[str, Any] | None:
        return torch.load(self.state, weights_only=False) if self.state.exists() else None

    def truncate_after(self, step: int) -> None:
        """Drop metric, trajectory and flag lines of steps >= step (a step that did not finish)."""
        for file in (self.metrics, self.trajectories, self.flags):
            if not file.exists():
                continue
            kept = [line for line in file.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", -1) < step]
            file.write_text("".join(line + "\n" for line in kept))

    def checkpoint_dir(self, name: str) -> Path:
        return self.path / "checkpoints" / name

    def copy_tokenizer(self, model_dir: Path, target: Path) -> None:
        for name in TOKENIZER_FILES:
            if (model_dir / name).exists():
                shutil.copy(model_dir / name, target / name)
