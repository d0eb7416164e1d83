"""What a person watching `polyrl train` sees: a progress bar, one compact line per step
per domain, and a before/after table at the end. Output only; no state of the run."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from tqdm import tqdm


MAX_CURRICULUM_LINES = 20
"""A curriculum update prints the domains whose shares moved most, at most this many."""


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


class Display:
    def __init__(self, total: int, start: int, before: dict, log: Callable[[str], None]):
        # disable=None: a live bar on a terminal, none in logs (the per-step lines still print)
        self.bar = tqdm(total=total, initial=start, desc="train", unit="step", dynamic_ncols=True, disable=None)
        self.log = log
        self.last_eval = {d: r["accuracy"] for d, r in (before or {}).items()}

    def step(self, record: dict) -> None:
        for d, r in record.get("eval", {}).items():
            self.last_eval[d] = r["accuracy"]
        head = f"step {record['step'] + 1:>4}  {record['step_time']:5.2f}s  {record['tokens_per_s']:7.0f} tok/s"
        for i, (d, m) in enumerate(record["domains"].items()):
            held = self.last_eval.get(d)
            line = (f"{d:>10}  reward {m['reward']:.3f}  held-out {_fmt(held)}  kl {_fmt(m['kl'], '.4f')}  "
                    f"entropy {_fmt(m['entropy'], '.3f')}  len {m['response_length']:5.1f}  "
                    f"dropped {m['dropped_zero_variance']}/{m['groups']}")
            self.bar.write((head if i == 0 else " " * len(head)) + "  " + line)
        moved = record.get("curriculum_update")
        if moved:
            shown = sorted(moved["weights"], key=lambda d: -abs(moved["weights"][d] - record["weights"].get(d, 0)))
            for d in sorted(shown[:MAX_CURRICULUM_LINES]):
                w = moved["weights"][d]
                self.bar.write(f"  curriculum  {d:>10}  {record['weights'].get(d, 0):.3f} -> {w:.3f}  {moved['reasons'][d]}")
            if len(shown) > MAX_CURRICULUM_LINES:
                self.bar.write(f"  curriculum  and {len(shown) - MAX_CURRICULUM_LINES} more domains whose shares moved "
                               f"less (metrics.jsonl: curriculum_update)")
        reward = sum(m["reward"] for m in record["domains"].values()) / max(len(record["domains"]), 1)
        self.bar.set_postfix(reward=f"{reward:.3f}")
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()

    def summary(self, before: dict, after: dict, run_dir: Path, seconds: float) -> None:
        self.log("")
        self.log(f"held-out accuracy, before -> after ({seconds / 60:.1f} min of training)")
        self.log(f"  {'domain':<10} {'before':>8} {'after':>8} {'change':>8}   {'greedy before':>13} {'greedy after':>12}")
        for d in after:
            b, a = before[d]["accuracy"], after[d]["accuracy"]
            gb, ga = before[d].get("greedy_accuracy"), after[d].get("greedy_accuracy")
            self.log(f"  {d:<10} {b:>8.3f} {a:>8.3f} {a - b:>+8.3f}   {_fmt(gb):>13} {_fmt(ga):>12}")
        self.log(f"run directory: {run_dir}")
