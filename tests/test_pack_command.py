"""`polyrl pack NAME --levels L ...`: a pack of chosen difficulty levels, and one-line errors
for levels a domain does not have."""

from __future__ import annotations

import json

import pytest

from polyrl.cli import main


@pytest.mark.parametrize("domain,levels", [("math", ["2"]), ("ops", ["1", "2"])])
def test_levels_pick_the_tasks_difficulty(tmp_path, domain, levels):
    path = tmp_path / "p.jsonl"
    assert main(["pack", domain, "-n", "12", "--levels", *levels, "-o", str(path)]) == 0
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 12 and {str(line["difficulty"]) for line in lines} == set(levels)


def test_without_levels_every_level_comes(tmp_path):
    path = tmp_path / "p.jsonl"
    assert main(["pack", "math", "-n", "40", "-o", str(path)]) == 0
    assert {json.loads(line)["difficulty"] for line in path.read_text().splitlines()} == {1, 2, 3, 4}


@pytest.mark.parametrize("argv,message", [
    (["pack", "math", "--levels", "0"], "argument --levels: must be at least 1, got 0"),
    (["pack", "math", "--levels", "one"], "argument --levels: 'one' is not an integer"),
    (["pack", "math", "--levels", "2", "9"], "polyrl pack: math with --levels 2 9: "),
    (["pack", "alignment", "--levels", "1"], "polyrl pack: alignment has no difficulty levels; leave out --levels"),
    (["pack", "humaneval", "--levels", "1"], "polyrl pack: humaneval has no difficulty levels; leave out --levels"),
])
def test_levels_a_domain_does_not_have_are_one_line_errors(capsys, argv, message):
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's usage errors
        code = exit_.code
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == "" and message in captured.err and len(captured.err.strip().splitlines()) == 1
