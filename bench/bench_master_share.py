"""The master's share of LockstepVectorEnv: steps/s of N environments with W worker
processes while the caller steps m of them itself (`master_envs=m`), for several m,
beside W = 0 (the caller steps all N, no handoff).  The rule behind PAAC's
`--master-envs auto` comes from these numbers (docs/paac.md).

Random actions (one stream drawn up front).  Configurations are measured in turns,
--repeats rounds of all of them, --seconds each, and the median is printed: on a loaded
machine the turns spread the load over every configuration alike.

    python bench/bench_master_share.py [--env CartPole-v1] [--num-envs 32]
                                       [--workers 1,2,3] [--seconds 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import gymnasium as gym
import numpy as np

from pal_hpc.envs import LockstepVectorEnv, make_env


def shares(n: int, w: int) -> list[int]:
    """The smallest share, the equal split n/(W+1), half, and the most that leaves one
    env per worker, each moved to the nearest value that leaves the workers a multiple
    of W."""
    fits = [m for m in range(n - w + 1) if (n - m) % w == 0]
    out = []
    for want in (0, n / (w + 1), n / 2, n - w):
        m = min(fits, key=lambda m: (abs(m - want), m))
        if m not in out:
            out.append(m)
    return out


def measure(env_id: str, n: int, w: int, m: int, seconds: float) -> float:
    fns = [(lambda i=i: make_env(env_id, i)) for i in range(n)]
    with LockstepVectorEnv(fns, w, master_envs=m, copy=False) as env:
        env.reset(seed=0)
        space = env.action_space
        space.seed(0)
        actions = [space.sample() for _ in range(64)]
        for k in range(20):
            env.step(actions[k % 64])
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for k in range(16):
                env.step(actions[k])
            steps += 16
        return steps * n / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--num-envs", type=int, default=32)
    ap.add_argument("--workers", default="1,2,3")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    n = args.num_envs
    configs = [(0, n)] + [(w, m) for w in map(int, args.workers.split(","))
                          for m in shares(n, w)]
    rates: dict = {c: [] for c in configs}
    for _ in range(args.repeats):
        for w, m in configs:
            rates[(w, m)].append(measure(args.env, n, w, m, args.seconds))
    print(f"{args.env}, {n} envs, {os.cpu_count()} cores, median of {args.repeats} turns "
          f"of {args.seconds:g} s (a loaded machine makes these noisy)")
    print(f"  {'workers':>8}{'master':>8}{'env steps/s':>14}{'vs share 0':>12}")
    med = {c: statistics.median(r) for c, r in rates.items()}
    for w, m in configs:
        base = med.get((w, 0)) if w else None
        rel = f"{med[(w, m)] / base:.2f}x" if base else "-"
        print(f"  {w:>8}{m:>8}{med[(w, m)]:>14,.0f}{rel:>12}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{w} {m}": r for (w, m), r in rates.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
