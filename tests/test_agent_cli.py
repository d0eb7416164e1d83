"""`polyrl agent` on a random tiny model, then `polyrl obs` on what it wrote."""

import json

from polyrl.cli import main as cli_main
from polyrl.domains.agent import AgentDomain
from tests.helpers import random_model_dir


def test_agent_then_obs(tmp_path, capsys):
    model_dir = random_model_dir(tmp_path / "model")
    run_dir = tmp_path / "run"
    code = cli_main(["agent", "--model", str(model_dir), "--generate", "2", "--max-steps", "2", "--max-tokens", "8",
                     "--budget", "2000", "--run-dir", str(run_dir), "--json"])
    assert code == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert len(summary["episodes"]) == 2 and summary["run_dir"] == str(run_dir)
    assert "step 0 act" in captured.err  # the live view
    episodes = [json.loads(line) for line in (run_dir / "agent_episodes.jsonl").read_text().splitlines()]
    assert [e["task_id"] for e in episodes] == [t.id for t in AgentDomain().sample("heldout", 2, 0)]
    assert all("messages" in e and "reward" in e for e in episodes)

    assert cli_main(["obs", str(run_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model_calls"] == sum(len(e["steps"]) for e in episodes)
    assert report["scored_episodes"] == 2


def test_agent_pack_and_bad_input(tmp_path, capsys):
    task = AgentDomain().sample("train", 1, 0)[0]
    pack = tmp_path / "pack.jsonl"
    line = {"id": "a1", "domain": "agent", "prompt": task.prompt, "answer": task.answer,
            "verifier": "success_minus_cost", "world": task.data["world"]}
    pack.write_text(json.dumps(line) + "\n")
    model_dir = random_model_dir(tmp_path / "model")
    assert cli_main(["agent", str(pack), "--id", "a1", "--model", str(model_dir), "--max-steps", "1",
                     "--max-tokens", "4", "--run-dir", str(tmp_path / "run"), "--quiet"]) == 0
    assert "0/1 succeeded" in capsys.readouterr().out
    assert cli_main(["agent", "--levels", "9", "--model", str(model_dir), "--run-dir", str(tmp_path / "r2")]) == 2
    assert "levels" in capsys.readouterr().err
