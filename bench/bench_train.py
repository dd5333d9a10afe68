"""Time to solve: DQN on CartPole-v1 under `mpiexec -n N` (N = 1, 2, 4) beside
Stable-Baselines3's DQN with rl-baselines3-zoo's tuned CartPole-v1 hyperparameters
(bench/peer_sb3.py, run in .venv-peers when it has stable_baselines3), seeds 0..K-1,
one run at a time.

Both sides use one protocol: up to --total-steps env steps (100k); every --eval-every
(5000) env steps a greedy evaluation, the mean return of --eval-episodes (10) episodes
on fresh environments; the run stops at the first evaluation whose mean reaches
--target (475); a final evaluation after the last step counts too.  Wall-clock to the
target runs from the start of training (after setup) to the end of that evaluation,
evaluation time included; torch uses one thread per process on both sides.

Per configuration the table shows each seed's wall-clock-to-target and steps-to-target,
the median over seeds and how many seeds reached the target.  A seed that did not
reach it (or whose run failed) counts as not reached: it enters the median as
+infinity, so the median is finite only when at least half the seeds reached the
target.  The last column is SB3's median / ours: above 1 means pal_hpc got there in
less wall-clock time (or fewer env steps).  A last line adds the conservative
comparison: SB3's fastest seed against our median.

    python bench/bench_train.py [--seeds 5] [--nps 1,2,4] [--json OUT]
    python bench/bench_train.py --quick     # smoke run: 1 seed, 20k steps, target 100
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
from to_target import fmt, peer_available, ratio, reached, run_peer_script, run_seeds, tail

ROOT = Path(__file__).resolve().parent.parent
PEER = "sb3-dqn"




def run_ours(np_: int, seed: int, args, run_dir: Path) -> dict:
    cmd = pal_main(np_, "--env", args.env, "--seed", str(seed), "--total-steps", str(args.total_steps),
           "--target-return", str(args.target), "--eval-every", str(args.eval_every),
           "--eval-episodes", str(args.eval_episodes), "--run-dir", str(run_dir),
           "--progress-every", "1000")
    env = mpi_env()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env,
                         cwd=ROOT)
    summary = run_dir / "summary.json"
    if out.returncode != 0 or not summary.exists():
        raise RuntimeError(f"exit {out.returncode}: {tail(out.stderr or out.stdout)}")
    return json.loads(summary.read_text())




def run_peer(seed: int, args) -> dict:
    return run_peer_script("peer_sb3.py", [
        "--seed", str(seed), "--env", args.env, "--total-steps", str(args.total_steps),
        "--target", str(args.target), "--eval-every", str(args.eval_every),
        "--eval-episodes", str(args.eval_episodes)], args.timeout)








def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5,
                    help="run seeds 0..K-1 (5: a median of 3 is one lucky or unlucky seed "
                         "away from a different answer)")
    ap.add_argument("--nps", default="1,2,4", help="comma-separated mpiexec -n values")
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--total-steps", type=int, default=100_000)
    ap.add_argument("--target", type=float, default=475.0)
    ap.add_argument("--eval-every", type=int, default=5_000)
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    ap.add_argument("--no-peer", action="store_true", help="skip Stable-Baselines3")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1 seed, 20000 steps, target 100")
    ap.add_argument("--json", type=Path, help="also write every run's record to this file")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.total_steps, args.target = 1, 20_000, 100.0
    nps = [int(x) for x in args.nps.split(",") if x.strip()]
    if args.seeds < 1 or not nps or min(nps) < 1:
        ap.error("--seeds and every --nps value must be >= 1")
    seeds = list(range(args.seeds))
    sb3 = None if args.no_peer else peer_available()

    configs = [f"pal_hpc -n {n}" for n in nps] + ([PEER] if sb3 else [])
    print(f"DQN {args.env}: time to a greedy mean return of {args.target:g} (eval every "
          f"{args.eval_every:,} steps, {args.eval_episodes} episodes), at most "
          f"{args.total_steps:,} env steps, seeds {seeds}; {os.cpu_count()} cores, "
          f"one run at a time", flush=True)
    if sb3:
        print(f"peer: Stable-Baselines3 {sb3} DQN, rl-baselines3-zoo CartPole-v1 "
              f"hyperparameters (bench/peer_sb3.py)", flush=True)
    elif not args.no_peer:
        print("peer: none (.venv-peers lacks stable_baselines3: `bash bench/install_peers.sh`)",
              flush=True)

    errors: list[str] = []

    def run_one(cfg: str, seed: int) -> dict:
        if cfg == PEER:
            return run_peer(seed, args)
        n = int(cfg.rsplit(" ", 1)[1])
        return run_ours(n, seed, args, Path(tmp) / f"np{n}-seed{seed}")

    with tempfile.TemporaryDirectory(prefix="bench_train-") as tmp:
        records = run_seeds(configs, seeds, run_one, "time_to_target_s", errors)

    medians = {}
    for cfg in configs:
        times = [reached(records[cfg][s], "time_to_target_s") for s in seeds]
        steps = [reached(records[cfg][s], "steps_to_target") for s in seeds]
        medians[cfg] = {"time": statistics.median(times), "steps": statistics.median(steps),
                        "times": times, "steps_list": steps,
                        "reached": sum(not math.isinf(t) for t in times)}

    for title, key, each, spec in (("wall-clock to target (s)", "time", "times", ".1f"),
                                   ("env steps to target", "steps", "steps_list", ",.0f")):
        print(f"\n{title}, target {args.target:g}")
        head = "".join(f"{'seed ' + str(s):>10}" for s in seeds)
        peer_col = f"{'SB3/ours':>10}" if sb3 else ""
        print(f"  {'config':<14}{head}{'median':>10}{'reached':>9}{peer_col}")
        for cfg in configs:
            m = medians[cfg]
            row = "".join(f"{fmt(v, spec):>10}" for v in m[each])
            col = ""
            if sb3:
                col = f"{'':>10}" if cfg == PEER else f"{ratio(medians[PEER][key], m[key]):>10}"
            hits = f"{m['reached']}/{len(seeds)}"
            print(f"  {cfg:<14}{row}{fmt(m[key], spec):>10}{hits:>9}{col}")
    print("\nnot reached ('-') counts as +inf in the median; SB3/ours > 1: pal_hpc is faster; "
          "'ours only' / 'SB3 only': only that side's median reached the target")
    if sb3:
        best = min(medians[PEER]["times"])
        print(f"conservative, SB3's fastest seed ({fmt(best, '.1f')} s) / our median: " + ", ".join(
            f"{c.replace('pal_hpc ', '')} {ratio(best, medians[c]['time'])}"
            for c in configs if c != PEER))
    if errors:
        print(f"{len(errors)} run(s) failed (see stderr); they count as not reached")

    if args.json:
        enc = lambda v: None if math.isinf(v) else v  # noqa: E731
        out = {"env": args.env, "target": args.target, "total_steps": args.total_steps,
               "eval_every": args.eval_every, "eval_episodes": args.eval_episodes,
               "seeds": seeds, "nps": nps, "cores": os.cpu_count(), "sb3_version": sb3,
               "runs": {c: {str(s): records[c][s] for s in seeds} for c in configs},
               "medians": {c: {"time_to_target_s": enc(medians[c]["time"]),
                               "steps_to_target": enc(medians[c]["steps"]),
                               "reached": medians[c]["reached"], "of": len(seeds)}
                           for c in configs},
               "ratios_sb3_over_ours": ({c: {k: (None if math.isinf(medians[c][k]) or
                                                 math.isinf(medians[PEER][k])
                                                 else medians[PEER][k] / medians[c][k])
                                             for k in ("time", "steps")}
                                         for c in configs if c != PEER} if sb3 else None),
               "errors": errors}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
