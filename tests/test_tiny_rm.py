"""The tiny reward models' build: members built side by side in processes have the weights
they get when built one after another here."""

from pathlib import Path

from polyrl.builtin import tiny_rm
from polyrl.builtin.tiny_rm import TinyRMRecipe, ensure_tiny_reward_models

SMALL = TinyRMRecipe(vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
                     steps=64, batch_size=16, heldout_pairs=64)  # 1,024 pairs: worth a process each


def test_members_built_side_by_side_equal_members_built_one_after_another(tmp_path, monkeypatch):
    assert SMALL.steps * SMALL.batch_size >= tiny_rm.PARALLEL_PAIRS
    lines: list[str] = []
    side_by_side = ensure_tiny_reward_models(SMALL, members=2, log=lines.append, root=tmp_path / "a")
    assert any("side by side" in line for line in lines)
    assert sum("held-out pair accuracy" in line for line in lines) == 2  # the workers' lines reach the log

    monkeypatch.setattr(tiny_rm, "PARALLEL_PAIRS", 10**9)
    lines.clear()
    here = ensure_tiny_reward_models(SMALL, members=2, log=lines.append, root=tmp_path / "b")
    assert not any("side by side" in line for line in lines)
    assert [p.name for p in side_by_side] == [p.name for p in here]
    for a, b in zip(side_by_side, here):
        assert (Path(a) / "model.safetensors").read_bytes() == (Path(b) / "model.safetensors").read_bytes()

    lines.clear()
    assert ensure_tiny_reward_models(SMALL, members=2, log=lines.append, root=tmp_path / "a") == side_by_side
    assert lines == []  # cached: nothing built, no process started
