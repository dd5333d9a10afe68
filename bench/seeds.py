"""Acceptance runs: an algorithm under `mpiexec -n NP`, several seeds, each stopping at
an evaluation mean of --target or at --total-steps.  Prints one row per seed and how
many reached the target.  The defaults are the acceptance criteria: DQN on CartPole-v1
to 475 within 100k steps; DDPG, TD3 and SAC on Pendulum-v1 to -200 within 40k.

    python bench/seeds.py [--algo dqn] [--seeds 5] [--np 4] [--total-steps N] [--target R]
    python bench/seeds.py --algo sac -- --lr 1e-3        # more pal_hpc.main flags after --
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from pal_hpc.cluster.launch import mpi_env, pal_main



_CONTINUOUS = {"env": "Pendulum-v1", "total_steps": 40_000, "target": -200.0,
               "eval_every": 2_000}
DEFAULTS = {"dqn": {"env": "CartPole-v1", "total_steps": 100_000, "target": 475.0,
                    "eval_every": 5_000},
            "ddpg": _CONTINUOUS, "td3": _CONTINUOUS, "sac": _CONTINUOUS}


def run_seed(seed: int, args, run_dir: Path) -> dict:
    cmd = pal_main(args.np, "--algo", args.algo, "--env", args.env, "--seed", str(seed), "--total-steps", str(args.total_steps),
           "--target-return", str(args.target), "--eval-every", str(args.eval_every),
           "--run-dir", str(run_dir), "--progress-every", "1000", *args.extra)
    env = mpi_env()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"seed {seed} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return json.loads((run_dir / "summary.json").read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algo", default="dqn", choices=sorted(DEFAULTS))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--env", help="default: CartPole-v1 for dqn, Pendulum-v1 for the others")
    ap.add_argument("--total-steps", type=int, help="default: 100k for dqn, 40k for the others")
    ap.add_argument("--target", type=float, help="default: 475 for dqn, -200 for the others")
    ap.add_argument("--eval-every", type=int, help="default: 5000 for dqn, 2000 for the others")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("extra", nargs="*", help="more pal_hpc.main flags (after --)")
    args = ap.parse_args()
    for key, value in DEFAULTS[args.algo].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    print(f"{args.algo} {args.env}, mpiexec -n {args.np}, target {args.target} within "
          f"{args.total_steps:,} env steps {' '.join(args.extra)}")
    print(f"{'seed':>4} {'reached':>7} {'steps_to_target':>15} {'time_to_target_s':>16} "
          f"{'best':>6} {'final':>6} {'env_steps':>9} {'updates':>7} {'wall_s':>7}")
    hits = 0
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            s = run_seed(seed, args, Path(tmp) / f"seed{seed}")
            hit = s["steps_to_target"] is not None and s["steps_to_target"] <= args.total_steps
            hits += hit
            fmt = lambda v, spec: format(v, spec) if v is not None else "-"
            print(f"{seed:>4} {'yes' if hit else 'no':>7} {fmt(s['steps_to_target'], '>15,')} "
                  f"{fmt(s['time_to_target_s'], '>16.1f')} {fmt(s['best_eval_return'], '>6.1f')} "
                  f"{fmt(s['final_eval_return'], '>6.1f')} {s['env_steps']:>9,} {s['updates']:>7,} "
                  f"{s['wall_s']:>7.1f}", flush=True)
    print(f"reached {args.target} in {hits} of {args.seeds} seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
