"""PPO on CartPole-v1: pal_hpc's --algo ppo beside Stable-Baselines3's PPO with the same
hyperparameters (CleanRL's ppo.py: bench/peer_sb3_ppo.py lists them as SB3 arguments),
both sides in this one run, one run at a time.

1. Time to target, seeds 0..K-1: up to --total-steps (500k, CleanRL's) env steps, a
   greedy evaluation (--eval-episodes 10 episodes on fresh environments seeded
   seed + 10**6 + env steps + i) each time the step counter first reaches a multiple of
   --eval-every (10k), stop at the first whose mean reaches --target (475).  The time
   is `time_to_target_excl_eval_s` on both sides: from the start of training to that
   evaluation, minus the time spent evaluating.  A seed that did not get there counts
   as +infinity in the median.
2. Throughput: env steps per second of the whole training loop (stepping, acting,
   updates; no evaluation) over --throughput-steps env steps, one run each.

The goal (issue 36): at least 2x SB3 on the median time to target.

    python bench/bench_ppo.py [--seeds 5] [--nps 1] [--json OUT]
    python bench/bench_ppo.py --quick        # 2 seeds, 100k steps
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pal_hpc.cluster.launch import mpi_env, pal_main
from to_target import ROOT, fmt, ratio, reached, run_seeds, tail

TIME_KEY = "time_to_target_excl_eval_s"
PEER = "sb3-ppo"
GOAL = 2.0


def peer_python() -> Path | None:
    """.venv-peers' python when it has stable_baselines3, else .venv's, else None."""
    for venv in (".venv-peers", ".venv"):
        py = ROOT / venv / "bin" / "python"
        if py.exists() and subprocess.run([str(py), "-c", "import stable_baselines3"],
                                          capture_output=True, timeout=120).returncode == 0:
            return py
    return None


def run_peer(py: Path, args: list[str], timeout: float) -> dict:
    out = subprocess.run([str(py), str(ROOT / "bench" / "peer_sb3_ppo.py"), *args],
                         capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"exit {out.returncode}: {tail(out.stderr)}")
    return json.loads(lines[-1])


def run_ours(np_: int, args, run_dir: Path, *flags: str) -> dict:
    cmd = pal_main(np_, "--algo", "ppo", "--env", "CartPole-v1", "--run-dir", str(run_dir),
                   "--progress-every", "1000", *flags)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                         env=mpi_env(), cwd=ROOT)
    summary = run_dir / "summary.json"
    if out.returncode != 0 or not summary.exists():
        raise RuntimeError(f"exit {out.returncode}: {tail(out.stderr or out.stdout)}")
    return json.loads(summary.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--nps", default="1", help="comma-separated mpiexec -n values")
    ap.add_argument("--total-steps", type=int, default=500_000)
    ap.add_argument("--target", type=float, default=475.0)
    ap.add_argument("--eval-every", type=int, default=10_000)
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--throughput-steps", type=int, default=100_000)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--quick", action="store_true", help="2 seeds, 100k steps")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.total_steps, args.throughput_steps = 2, 100_000, 50_000
    nps = [int(x) for x in args.nps.split(",") if x.strip()]
    seeds = list(range(args.seeds))
    py = None if args.no_peer else peer_python()
    print(f"PPO CartPole-v1, CleanRL's ppo.py settings on both sides: time to a greedy "
          f"mean of {args.target:g} excluding evaluation (every {args.eval_every:,} steps, "
          f"{args.eval_episodes} episodes), at most {args.total_steps:,} env steps, seeds "
          f"{seeds}; {os.cpu_count()} cores, one run at a time", flush=True)
    print(f"peer: Stable-Baselines3 PPO via {py.relative_to(ROOT)}" if py else
          "peer: none (no python with stable_baselines3)", flush=True)
    ours = {f"pal_hpc -n {n}": n for n in nps}
    configs = list(ours) + ([PEER] if py else [])
    errors: list[str] = []
    target_flags = ["--total-steps", str(args.total_steps), "--target-return",
                    str(args.target), "--eval-every", str(args.eval_every),
                    "--eval-episodes", str(args.eval_episodes)]

    with tempfile.TemporaryDirectory(prefix="bench_ppo-") as tmp:
        def run_one(cfg: str, seed: int) -> dict:
            if cfg == PEER:
                return run_peer(py, ["target", "--seed", str(seed), "--total-steps",
                                     str(args.total_steps), "--target", str(args.target),
                                     "--eval-every", str(args.eval_every),
                                     "--eval-episodes", str(args.eval_episodes)], args.timeout)
            return run_ours(ours[cfg], args, Path(tmp) / f"{cfg[-1]}-{seed}",
                            "--seed", str(seed), *target_flags)

        records = run_seeds(configs, seeds, run_one, TIME_KEY, errors, width=14)
        rates = {}
        for cfg in configs:
            try:
                if cfg == PEER:
                    rec = run_peer(py, ["throughput", "--steps", str(args.throughput_steps)],
                                   args.timeout)
                    rates[cfg] = rec["env_steps_per_s"]
                else:
                    rec = run_ours(ours[cfg], args, Path(tmp) / f"tp-{cfg[-1]}",
                                   "--total-steps", str(args.throughput_steps),
                                   "--eval-every", "0", "--eval-episodes", "1")
                    t = rec["master_time"]
                    # The loop's wall time without the final evaluation and checkpoint.
                    rates[cfg] = rec["env_steps"] / (t["wall_s"] * (1 - t["evaluation"]
                                                                    - t["checkpoint"]))
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                errors.append(f"{cfg} throughput: {exc}")
                rates[cfg] = math.nan

    med = {}
    print(f"\nPPO CartPole-v1, seconds to target excl. evaluation (env steps), "
          f"target {args.target:g}")
    for cfg in configs:
        times = [reached(records[cfg][s], TIME_KEY) for s in seeds]
        steps = [reached(records[cfg][s], "steps_to_target") for s in seeds]
        med[cfg] = {"time": statistics.median(times), "steps": statistics.median(steps),
                    "reached": sum(not math.isinf(t) for t in times),
                    "times": times, "steps_list": steps}
    for cfg in configs:
        times, steps = med[cfg]["times"], med[cfg]["steps_list"]
        row = "".join(f"{fmt(t, '.1f'):>8} ({fmt(s, ',.0f'):>7})" for t, s in zip(times, steps))
        col = "" if not py or cfg == PEER else \
            f"  SB3/ours {ratio(med[PEER]['time'], med[cfg]['time'])}"
        print(f"  {cfg:<14}{row}  median {fmt(med[cfg]['time'], '.1f')} s, "
              f"{fmt(med[cfg]['steps'], ',.0f')} steps, reached "
              f"{med[cfg]['reached']}/{len(seeds)}{col}")
    print(f"\nenv steps/s of the whole training loop ({args.throughput_steps:,} steps)")
    for cfg in configs:
        col = ("" if not py or cfg == PEER or math.isnan(rates[cfg])
               else f"  ours/SB3 {rates[cfg] / rates[PEER]:.2f}x")
        print(f"  {cfg:<14}{fmt(rates[cfg], ',.0f'):>10}{col}")
    goal = {}
    if py:
        for cfg in ours:
            p, o = med[PEER]["time"], med[cfg]["time"]
            speed = None if math.isinf(p) or math.isinf(o) else p / o
            goal[cfg] = {"speedup": speed, "met": speed is not None and speed >= GOAL}
            print(f"goal, {cfg} vs SB3 PPO: >= {GOAL:g}x on the median time to target "
                  f"({'n/a' if speed is None else f'{speed:.2f}x'}): "
                  f"{'MET' if goal[cfg]['met'] else 'NOT MET'}")
    if errors:
        print(f"{len(errors)} run(s) failed (see stderr): " + "; ".join(errors))
    if args.json:
        def enc(v):
            if isinstance(v, list):
                return [enc(x) for x in v]
            return None if isinstance(v, float) and not math.isfinite(v) else v

        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "seeds": seeds, "total_steps": args.total_steps, "target": args.target,
            "runs": {c: {str(s): records[c][s] for s in seeds} for c in configs},
            "medians": {c: {k: enc(v) for k, v in med[c].items()} for c in configs},
            "env_steps_per_s": {c: enc(v) for c, v in rates.items()},
            "goal": goal, "errors": errors}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
