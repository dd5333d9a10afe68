"""Where a learner update's time goes, on this machine, outside MPI.

Times the calls Learner.step makes -- replay.sample, DQN.compute_gradients("q", ...)
(into a send buffer, metrics off as on 9 of 10 updates), replay.update_priorities and
DQN.apply_gradients("q", ...) (target syncs included) -- on a CartPole-sized replay, one torch thread, denormals
flushed as in the runtime.  A profiling aid for the learner's step cost, not a
comparison with a peer (bench_train.py is that, end to end).

    python bench/profile_learner.py [--batch 64] [--hidden 256 256] [--iters 2000]
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
import torch

from pal_hpc.algos.dqn import DQN, DQNConfig
from pal_hpc.replay import SharedReplay
from pal_hpc.runtime.nstep import transition_spec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)

    rb = SharedReplay(transition_spec((4,)), 100_000)
    rng = np.random.default_rng(0)
    n = 50_000
    rb.add(0, {"obs": rng.normal(size=(n, 4)).astype(np.float32), "action": rng.integers(0, 2, n),
               "reward": np.ones(n, np.float32), "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
               "discount": np.full(n, 0.97, np.float32)})
    algo = DQN(gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2),
               DQNConfig(hidden=args.hidden))
    (phase,) = algo.phases(0)
    send = np.zeros(algo.phase_size(phase), np.float32)
    parts = {"sample": 0.0, "compute_gradients": 0.0, "update_priorities": 0.0,
             "apply_gradients": 0.0}
    warmup = 100
    for i in range(args.iters + warmup):
        if i == warmup:
            parts = dict.fromkeys(parts, 0.0)
        t0 = time.perf_counter()
        batch = rb.sample(args.batch, rng=rng)
        t1 = time.perf_counter()
        _, prio = algo.compute_gradients(phase, batch, send, metrics=(i % 10 == 9))
        t2 = time.perf_counter()
        rb.update_priorities(batch["indices"], prio, batch["tickets"])
        t3 = time.perf_counter()
        algo.apply_gradients(phase, send)
        t4 = time.perf_counter()
        for k, dt in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            parts[k] += dt
    total = sum(parts.values())
    print(f"learner update, batch {args.batch}, hidden {args.hidden}, "
          f"{algo.num_params:,} parameters, {args.threads} thread(s), {args.iters} updates")
    for k, v in parts.items():
        print(f"  {k:<18} {v / args.iters * 1e6:8.1f} us  {v / total:5.1%}")
    print(f"  {'total':<18} {total / args.iters * 1e6:8.1f} us  = {args.iters / total:,.0f} updates/s")


if __name__ == "__main__":
    main()
