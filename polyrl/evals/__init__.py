"""Evaluation of candidate models on a task suite: `polyrl eval` (polyrl/commands/eval.py).

    suite.py          a task pack read as a suite: tasks, tags, per-task limits
    limits.py         the limits a task runs under (tokens, steps, budget, window, tool results)
    models.py         model names -> adapters (builtin:tiny, HF dirs, run checkpoints, openai:URL#MODEL)
    runner.py         one task on one model: the agent loop or one call, graded by the task's verifier
    attribution.py    why a failure failed: evidence, the re-run with the limit lifted, the label
    session.py        every task on every model, with attribution re-runs and progress
    stats.py          Wilson intervals, exact McNemar tests, percentiles
    prices.py         the price card: cost per token of each model
    document.py       the results document (results.json, tasks.jsonl), written atomically
    example_suite.py  `polyrl suite example`: a business-shaped suite of 100+ tagged tasks
"""
