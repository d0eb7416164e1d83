"""A discrete-event model of the RL pipeline: synchronous against max_staleness K = 1, 2, 4.

    .venv/bin/python bench/pipeline_model.py --run-dir RUN_DIR [--measured 1=1.45,2=1.52,4=1.55]
    .venv/bin/python bench/pipeline_model.py --rollout 0.233 --reward 0.096 --update 0.198 [--sync 0.01]
        [--update-one-core 0.30] [--reward-one-core 0.12] [--measured 1=0.93,2=0.91 --fit-contention 1]
        [--preset long-tail] [--json]

Calibration: the phase times of a synchronous run (trainer.max_staleness 0), per step:
given on the command line, or the medians over a run directory's metrics.jsonl lines
("time": {"rollout", "reward", "update"[, "sync"]}; the first --warmup steps left out),
with the sequences per step and their mean length from the lines' engine counters and
the engine workers, slots and max_tokens from the run's config.yaml when present. How
well the trainer and the reward role use the machine's cores (Amdahl's p) comes from
their times on one core (--update-one-core, --reward-one-core: a synchronous run with
torch and the sandbox pool on one core), else p = 0.5 is assumed. --measured prints the
model's error against measured 1-machine speed-ups (bench/pipeline.py).

What is simulated (pure Python, heapq; `Spec` and `simulate` in bench/pipeline_sim.py):

- roles: generation engines, a reward role, a trainer; steps flow rollout -> reward ->
  update -> weight sync (the new version is published when the sync ends). A step's
  sequences may start once the published version v >= step - K (K = 0: the synchronous
  loop); this is the pipeline's admission rule, so no trained sample is more than K
  versions behind, and the queues between roles hold at most K + 1 steps.
- generation at sequence level: each step is `sequences` sequences in groups of
  `group_size` (a group goes to one engine, the least loaded, as engine/parallel.py's
  router does), lengths drawn per step from a lognormal distribution (mean, cv, capped at
  max_tokens; the same draws for every K). An engine runs up to `slots` sequences at once;
  all its running sequences advance one token per decode step, and a decode step takes
  tau0 * (f + (1 - f) * b / slots) for b running sequences: f = 0 is compute-bound (time
  per token constant: batch size buys nothing), f = 1 memory-bound (a step costs the same
  for 1 or `slots` sequences). tau0 is solved so that the synchronous rollout takes the
  measured time.
- reward and update are one task per step each, in step order, one at a time.

Resources, and the assumptions that come with them (printed beside the predictions):

- 1 machine (the measured one): every role shares its `accelerators` cores, and the
  operating system shares them out in proportion to demand (processor sharing). A role's
  demand is the cores it keeps busy on average when alone: 1 for an engine worker,
  a(cores) = 1 / ((1 - p) + p / cores) for the trainer and the reward role (Amdahl, p =
  --update-parallel / --reward-parallel). While the demands of the active roles sum to d >
  cores, each runs at speed cores / d, times (1 - contention): what sharing costs beyond
  the split itself (caches, oversubscribed threads; --contention C, or --fit-contention K
  to fit it to the measured speed-up at one K and test it on the others). So overlap pays off as far as the phases leave
  cores idle (p < 1, the generation tail, the gaps between phases); with every core busy
  in every phase it would not pay at all.
- N accelerators (8, 64, 512): weak scaling of the measured step, N / accelerators copies
  of it: sequences per step and engines grow with N, an engine's speed stays the
  measured one. Synchronous: every role in turn on all N (colocated), reward on host CPUs
  (the accelerators idle meanwhile), update time t_update * (1 + comm * log2(N / A0))
  (all-reduce), and an in-place weight load of --sync seconds. Asynchronous: g accelerators
  generate, N - g train (the best g on a grid), the update takes t_update * N / (N - g) *
  (1 + comm * log2((N - g) / A0)), and every version is broadcast in --cluster-sync
  seconds (default: 2% of the synchronous step), during which generation pauses.
- not modelled: evaluation (the scheduler runs it beside training at its share),
  multi-turn agent episodes (each model call is a sequence), prefix-cache effects of
  staleness, the off-policy correction's effect on learning (the model counts time per
  step, not score per second), failures and stragglers beyond the length tail.

Published anchors (async / sync wall-clock, each on its own setup; research/async_rl.md):
AReaL 2.77x (1.5B, 16 nodes), verl fully_async 2.35x-2.67x (7B, 128 GPUs), ROLL Flash 2.24x
(RLVR). `--preset long-tail` also prints the model for a workload of their kind: long-tailed
reasoning lengths on memory-bound GPU decode; its parameters are assumptions, listed. There
most of the predicted gain is fuller engines (the synchronous loop leaves each engine 64
sequences and their tail; the pipeline keeps fewer engines full), so it moves with
decode_fixed, sequences per engine and length_cv more than with anything else.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its simulation, bench/pipeline_sim.py

from pipeline_sim import Result, Spec, amdahl, simulate  # noqa: E402

ANCHORS = {"AReaL": "2.77x", "verl fully_async": "2.35x-2.67x", "ROLL Flash": "2.24x"}
STALENESS = (0, 1, 2, 4)
SCALES = (8, 64, 512)


# ---- the workload, calibrated from one synchronous run -------------------------------------------


@dataclass(frozen=True)
class Workload:
    """One synchronous step as measured on the reference machine, and the shape of its work."""

    rollout_s: float
    reward_s: float
    update_s: float
    sync_s: float = 0.0
    """in-place weight load per version in the synchronous loop (seconds)"""
    accelerators: int = 2
    """cores (or accelerators) of the machine the times were measured on"""
    engines: int = 2
    """engine workers that generated the rollout there"""
    slots: int = 256
    """sequences an engine runs at once (engine.native.max_num_seqs)"""
    sequences: int = 128
    """sequences per step (prompts x group size; agent domains: model calls)"""
    group_size: int = 8
    mean_tokens: float = 40.0
    length_cv: float = 0.6
    """coefficient of variation of completion lengths (lognormal)"""
    max_tokens: int = 96
    decode_fixed: float = 0.07
    """f: share of a full decode step that does not grow with the batch (0 compute-bound, 1 memory-bound);
    0.07 fits the tiny model's CPU engine rows in BENCHMARKS.md (dp, B=16 and 64: ~1.1 ms + 0.053 ms/sequence)"""
    update_parallel: float = 0.5
    """p of the update on the reference cores (Amdahl)"""
    reward_parallel: float = 0.5
    """p of the reward role on the reference cores (Amdahl)"""
    contention: float = 0.0
    """1 machine: the share of speed every role loses while their demand exceeds the cores
    (cache and thread oversubscription; fitted with --fit-contention)"""

    @property
    def sync_step_s(self) -> float:
        return self.rollout_s + self.reward_s + self.update_s + self.sync_s


# ---- from a workload to specs: calibration, one machine, clusters ------------------------------------


def draw_lengths(w: Workload, steps: int, copies: int = 1, seed: int = 0) -> tuple[tuple[int, ...], ...]:
    """Completion lengths per step: `copies` x w.sequences lognormal draws (mean, cv), capped."""
    sigma2 = math.log(1 + w.length_cv ** 2)
    mu = math.log(w.mean_tokens) - sigma2 / 2
    out = []
    for step in range(steps):
        rng = random.Random(f"{seed}/{step}/{copies}")
        out.append(tuple(min(w.max_tokens, max(1, round(rng.lognormvariate(mu, math.sqrt(sigma2)))))
                         for _ in range(w.sequences * copies)))
    return tuple(out)


def calibrate_tau0(w: Workload, lengths) -> float:
    """Seconds of a full decode step such that the synchronous rollout takes w.rollout_s on the
    measured machine (the simulation is linear in tau0 when only generation runs)."""
    unit = Spec(w.engines, w.slots, 1.0, w.decode_fixed, lengths, w.group_size, 0.0, 0.0, 0.0, 0,
                cores=w.accelerators)
    return w.rollout_s / simulate(unit).rollout_s


def one_machine(w: Workload, k: int, lengths, tau0: float) -> Spec:
    """The measured machine: every role shares its cores (processor sharing)."""
    return Spec(w.engines, w.slots, tau0, w.decode_fixed, lengths, w.group_size, w.reward_s, w.update_s, w.sync_s, k,
                cores=w.accelerators, update_parallel=w.update_parallel, reward_parallel=w.reward_parallel,
                contention=w.contention)


@dataclass(frozen=True)
class ClusterAssumptions:
    comm: float = 0.05
    """update time grows by this fraction per doubling of the trainer's accelerators (all-reduce)"""
    broadcast_s: float | None = None
    """weight broadcast per version in split layouts; None = 2% of the synchronous step"""

    def broadcast(self, w: Workload) -> float:
        return 0.02 * w.sync_step_s if self.broadcast_s is None else self.broadcast_s


def cluster(w: Workload, n: int, k: int, gen: int, lengths, tau0: float, a: ClusterAssumptions) -> Spec:
    """n accelerators, weak scaling of the measured step; K = 0 colocated, K > 0 split gen / n - gen."""
    per_engine = w.accelerators / w.engines  # accelerators per engine, as measured
    if k == 0:
        engines, update = max(1, round(n / per_engine)), w.update_s * (1 + a.comm * math.log2(max(1, n / w.accelerators)))
        return Spec(engines, w.slots, tau0, w.decode_fixed, lengths, w.group_size, w.reward_s, update, w.sync_s, 0)
    train = n - gen
    update = w.update_s * n / train * (1 + a.comm * math.log2(max(1, train / w.accelerators)))
    return Spec(max(1, round(gen / per_engine)), w.slots, tau0, w.decode_fixed, lengths, w.group_size, w.reward_s,
                update, a.broadcast(w), k)


def best_split(w: Workload, n: int, k: int, lengths, tau0: float, a: ClusterAssumptions) -> tuple[int, Result]:
    """The generation share of n with the shortest step: a search over a grid of n / 8 (n >= 8)."""
    unit = max(1, n // 8)
    grid = list(range(unit, n, unit))
    cache: dict[int, Result] = {}

    def at(i: int) -> float:
        g = grid[i]
        if g not in cache:
            cache[g] = simulate(cluster(w, n, k, g, lengths, tau0, a))
        return cache[g].step_s

    lo, hi = 0, len(grid) - 1  # ternary search: step time is unimodal in the split (one role or the other limits)
    while hi - lo > 2:
        m1, m2 = lo + (hi - lo) // 3, hi - (hi - lo) // 3
        if at(m1) <= at(m2):
            hi = m2
        else:
            lo = m1
    i = min(range(lo, hi + 1), key=at)
    return grid[i], cache[grid[i]]


def fit_contention(w: Workload, k: int, measured: float, steps: int = 24, seed: int = 0) -> float:
    """The contention at which the 1-machine speed-up at staleness k equals `measured` (bisection
    over [0, 0.9]; 0 when even no contention predicts less)."""
    lengths = draw_lengths(w, steps, 1, seed)
    tau0 = calibrate_tau0(w, lengths)
    sync = simulate(one_machine(w, 0, lengths, tau0)).step_s

    def speedup(c: float) -> float:
        return sync / simulate(one_machine(replace(w, contention=c), k, lengths, tau0)).step_s

    lo, hi = 0.0, 0.9
    if speedup(lo) <= measured:
        return 0.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if speedup(mid) > measured else (lo, mid)
    return (lo + hi) / 2


def predict(w: Workload, a: ClusterAssumptions, steps: int = 24, scales=SCALES, seed: int = 0,
            machine: bool = True) -> dict:
    """Step times and speed-ups for the measured machine (machine=True) and each cluster size."""
    lengths = draw_lengths(w, steps, 1, seed)
    tau0 = calibrate_tau0(w, lengths)
    rows = {}
    if machine:
        base = {k: simulate(one_machine(w, k, lengths, tau0)) for k in STALENESS}
        rows["1 machine"] = {"accelerators": w.accelerators, "K": {
            k: {"step_s": r.step_s, "speedup": base[0].step_s / r.step_s, "gen_busy": r.gen_busy}
            for k, r in base.items()}}
    for n in scales:
        copies = max(1, round(n / w.accelerators))
        big = draw_lengths(w, steps, copies, seed)
        sync = simulate(cluster(w, n, 0, n, big, tau0, a))
        row = {0: {"step_s": sync.step_s, "speedup": 1.0, "gen_busy": sync.gen_busy, "gen": n}}
        for k in STALENESS[1:]:
            gen, r = best_split(w, n, k, big, tau0, a)
            row[k] = {"step_s": r.step_s, "speedup": sync.step_s / r.step_s, "gen_busy": r.gen_busy, "gen": gen}
        rows[f"{n} accelerators"] = {"accelerators": n, "K": row}
    return {"tau0": tau0, "rows": rows}


# ---- calibration input -------------------------------------------------------------------------------


def from_run_dir(run_dir: Path, warmup: int) -> dict:
    """Workload fields from a synchronous run's metrics.jsonl (medians after the warm-up) and config.yaml."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    lines = [x for x in lines if "time" in x][warmup:]
    if not lines:
        raise SystemExit(f"{run_dir}/metrics.jsonl: no step lines after the {warmup} warm-up steps")
    med = statistics.median
    fields = {"rollout_s": med([x["time"]["rollout"] for x in lines]),
              "reward_s": med([x["time"]["reward"] for x in lines]),
              "update_s": med([x["time"]["update"] for x in lines])}
    syncs = [x["time"].get("sync", x.get("weight_sync_s")) for x in lines]
    if all(s is not None for s in syncs):
        fields["sync_s"] = med(syncs)
    engine = [x["engine"] for x in lines if x.get("engine", {}).get("requests")]
    if engine:
        fields["sequences"] = round(med([e["requests"] for e in engine]))
        fields["mean_tokens"] = med([(e["decode_tokens"] + e["requests"]) / e["requests"] for e in engine])
    config = run_dir / "config.yaml"
    if config.exists():
        import yaml  # only for a run directory's config

        cfg = yaml.safe_load(config.read_text()) or {}
        if (cfg.get("trainer") or {}).get("max_staleness", 0):
            raise SystemExit(f"{config}: trainer.max_staleness > 0; calibrate from a synchronous run (0)")
        native = (cfg.get("engine") or {}).get("native") or {}
        fields["engines"] = native.get("workers", 1)
        fields["slots"] = native.get("max_num_seqs", 256)
        fields["group_size"] = (cfg.get("trainer") or {}).get("group_size", 8)
        tokens = [(cfg.get("engine") or {}).get("max_tokens", 64)]
        tokens += [t["max_tokens"] for t in cfg.get("rl_tasks") or [] if t.get("max_tokens")]
        fields["max_tokens"] = max(tokens)
    return fields


PRESETS = {
    "long-tail": Workload(
        # the regime of the anchors' papers, not a measurement: generation 70% of a synchronous
        # step, reward 5%, update 25%; lengths lognormal cv 1.0 capped at 8x the mean (long
        # reasoning chains); memory-bound decode (f = 0.8); 64 sequences per engine of 256 slots
        rollout_s=70.0, reward_s=5.0, update_s=25.0, sync_s=0.0, accelerators=8, engines=8, slots=256,
        sequences=512, group_size=16, mean_tokens=1000.0, length_cv=1.0, max_tokens=8000, decode_fixed=0.8,
        update_parallel=0.95, reward_parallel=0.5),
}


# ---- the report -------------------------------------------------------------------------------------


def assumptions(w: Workload, a: ClusterAssumptions) -> list[str]:
    return [
        f"measured step (sync): rollout {w.rollout_s:.4g} s, reward {w.reward_s:.4g} s, update {w.update_s:.4g} s, "
        f"weight load {w.sync_s:.4g} s, on {w.accelerators} cores/accelerators",
        f"generation: {w.sequences} sequences/step in groups of {w.group_size}, {w.engines} engines x {w.slots} slots, "
        f"lengths lognormal mean {w.mean_tokens:.4g} cv {w.length_cv:g} capped at {w.max_tokens}",
        f"decode step = tau0 * ({w.decode_fixed:g} + {1 - w.decode_fixed:g} * running/slots); tau0 fitted to the "
        "measured rollout",
        f"1 machine: roles share the cores by demand (engine worker 1 core; update and reward Amdahl "
        f"p = {w.update_parallel:g}, {w.reward_parallel:g}: they keep {amdahl(w.accelerators, w.update_parallel):.2f} "
        f"and {amdahl(w.accelerators, w.reward_parallel):.2f} cores busy)",
        f"clusters: weak scaling (N/{w.accelerators} copies of the step); sync colocated, reward on host CPUs; "
        f"async split gen/train (best of a grid of N/8); update x (1 + {a.comm:g} log2(n/{w.accelerators})); "
        f"weight broadcast {a.broadcast(w):.4g} s/version, generation paused meanwhile",
        "staleness: a step's sequences start once version >= step - K; reward and update one step at a time",
        "not modelled: evaluation, agent turns, prefix-cache effects, learning per sample",
    ]


def table(result: dict) -> list[str]:
    out = [f"{'':>18} {'sync s/step':>12} " + " ".join(f"{'K=' + str(k):>14}" for k in STALENESS[1:])]
    for name, row in result["rows"].items():
        ks = row["K"]
        cells = []
        for k in STALENESS[1:]:
            split = f" g{ks[k]['gen']}" if "gen" in ks[k] else ""
            cells.append(f"{ks[k]['speedup']:>6.2f}x{split:>7}")
        out.append(f"{name:>18} {ks[0]['step_s']:>12.4g} " + " ".join(f"{c:>14}" for c in cells))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run-dir", type=Path, help="a synchronous run's directory (metrics.jsonl, config.yaml)")
    ap.add_argument("--warmup", type=int, default=5, help="metrics lines left out at the start")
    for name in ("rollout", "reward", "update", "sync"):
        ap.add_argument(f"--{name}", type=float, help=f"measured {name} seconds per step (overrides the run dir)")
    for f in ("accelerators", "engines", "slots", "sequences", "group_size", "max_tokens"):
        ap.add_argument(f"--{f.replace('_', '-')}", type=int)
    for f in ("mean_tokens", "length_cv", "decode_fixed", "update_parallel", "reward_parallel"):
        ap.add_argument(f"--{f.replace('_', '-')}", type=float)
    ap.add_argument("--update-one-core", type=float, help="update seconds per step on one core: sets --update-parallel")
    ap.add_argument("--reward-one-core", type=float, help="reward seconds per step on one core: sets --reward-parallel")
    ap.add_argument("--comm", type=float, default=0.05, help="update slow-down per doubling of trainer accelerators")
    ap.add_argument("--cluster-sync", type=float, help="weight broadcast seconds per version on a cluster")
    ap.add_argument("--steps", type=int, default=24, help="steps simulated per configuration (the first and last quarter are left out)")
    ap.add_argument("--preset", choices=sorted(PRESETS), help="also model a preset workload (the anchors' regime)")
    ap.add_argument("--measured", help="measured 1-machine speed-ups to compare, e.g. 1=1.45,2=1.52,4=1.55")
    ap.add_argument("--contention", type=float, help="1 machine: speed lost while the roles' demand exceeds the cores")
    ap.add_argument("--fit-contention", type=int, metavar="K",
                    help="fit --contention to the measured speed-up at this K (in --measured); the others test it")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    fields = from_run_dir(args.run_dir, args.warmup) if args.run_dir else {}
    for name in ("rollout", "reward", "update", "sync"):
        if getattr(args, name) is not None:
            fields[f"{name}_s"] = getattr(args, name)
    for f in ("accelerators", "engines", "slots", "sequences", "group_size", "max_tokens", "mean_tokens", "length_cv",
              "decode_fixed", "update_parallel", "reward_parallel", "contention"):
        if getattr(args, f) is not None:
            fields[f] = getattr(args, f)
    missing = [f for f in ("rollout_s", "reward_s", "update_s") if f not in fields]
    if missing:
        ap.error(f"give --run-dir or --rollout, --reward and --update (missing {', '.join(missing)})")
    cores = fields.get("accelerators", Workload.accelerators)
    for role in ("update", "reward"):
        one = getattr(args, f"{role}_one_core")
        if one is not None:  # Amdahl: t(A) = t(1) * ((1 - p) + p / A)
            fields[f"{role}_parallel"] = min(1.0, max(0.0, (1 - fields[f"{role}_s"] / one) / (1 - 1 / cores)))
    a = ClusterAssumptions(args.comm, args.cluster_sync)
    measured = {int(k): float(v) for k, v in (part.split("=") for part in args.measured.split(","))} \
        if args.measured else {}
    if args.fit_contention is not None:
        if args.fit_contention not in measured:
            ap.error(f"--fit-contention {args.fit_contention} needs a measured speed-up at K={args.fit_contention}")
        fields["contention"] = fit_contention(Workload(**fields), args.fit_contention, measured[args.fit_contention],
                                              args.steps)
    workloads = {"measured": Workload(**fields)}
    if args.preset:
        workloads[args.preset] = PRESETS[args.preset]
    report = {}
    for name, w in workloads.items():
        result = predict(w, a, args.steps, machine=name == "measured")  # a preset's GPUs are not time-shared
        report[name] = {"workload": asdict(w), "assumptions": assumptions(w, a), **result}
        if args.json:
            continue
        print(f"== {name} workload ==")
        print("assumptions:")
        print("\n".join(f"  - {line}" for line in assumptions(w, a)))
        print("predicted speed-up over the synchronous loop (g = accelerators generating):")
        print("\n".join(table(result)))
        ideal = w.sync_step_s / max(w.rollout_s, w.update_s, w.reward_s)
        print(f"  overlap alone, each phase at its measured efficiency (sum / max of phases): {ideal:.2f}x; "
              "beyond it: fuller engines (the tail, larger batches)")
        if name == "measured" and measured:
            if args.fit_contention is not None:
                print(f"  contention {w.contention:.3f}, fitted to the measured K={args.fit_contention}; "
                      "the other K test it")
            for k, value in measured.items():
                pred = result["rows"]["1 machine"]["K"][k]["speedup"]
                fitted = " (fitted)" if k == args.fit_contention else ""
                print(f"  1 machine K={k}: measured {value:.2f}x, predicted {pred:.2f}x, "
                      f"error {100 * (pred / value - 1):+.1f}%{fitted}")
        print()
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        print("published anchors (async/sync wall-clock, their own setups): "
              + ", ".join(f"{k} {v}" for k, v in ANCHORS.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
