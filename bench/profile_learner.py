"""Where a learner update's time goes, on this machine, outside MPI.

Times the calls Learner.step makes -- replay.sample, then for each update phase
compute_gradients (into a send buffer, metrics off as on 9 of 10 updates) and
apply_gradients (target updates included), and replay.update_priorities after the
phase that returns priorities -- on a replay shaped like CartPole's (DQN) or
Pendulum's (DDPG, TD3, SAC), of Atari frames (`--image`: DQN's Nature CNN), or of a
MinAtar game's frames (`--minatar Breakout`: DQN at `--minatar-preset paper`, batch 32,
centered RMSProp, the MinAtar network), one torch thread, denormals flushed as in the
runtime.  `--precision both` runs fp32 and bf16 on the same batches and prints the
ratio.  A profiling aid for the learner's
step cost, not a comparison with a peer (bench_train.py is that, end to end).

    python bench/profile_learner.py [--algo dqn|ddpg|td3|sac] [--batch N] [--hidden ...]
        [--precision fp32|bf16|both] [--image | --minatar GAME] [--device cpu|cuda]
        [--iters 2000]

Batch and widths default to the algorithm's run defaults (DQN 64 and [256, 256],
TD3/DDPG 256 and [400, 300], SAC 256 and [256, 256]).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from pal_hpc.algos import ALGOS
from pal_hpc.config import Config
from pal_hpc.io.provenance import describe_cpu
from pal_hpc.replay import SharedReplay
from pal_hpc.runtime.threads import limit_threads
from pal_hpc.runtime.nstep import transition_spec

FRAMES = (4, 84, 84)


def make_replay(algo_name: str, image: bool, n: int, rng: np.random.Generator,
                frames: gym.Space | None = None, n_actions: int = 6):
    """A replay of n random transitions and the spaces they come from (`frames`: DQN
    on that uint8 frame space, with `n_actions`)."""
    if frames is not None:
        image = True
    if algo_name == "dqn":
        shape = frames.shape if frames is not None else FRAMES if image else (4,)
        obs_space = (gym.spaces.Box(0, 255, shape, np.uint8) if image
                     else gym.spaces.Box(-np.inf, np.inf, shape, np.float32))
        act_space = gym.spaces.Discrete(n_actions if image else 2)
        act_shape, act_dtype = (), np.int64
        action = rng.integers(0, act_space.n, n)
    else:
        shape = (3,)
        obs_space = gym.spaces.Box(-np.inf, np.inf, shape, np.float32)
        act_space, act_shape, act_dtype = gym.spaces.Box(-1, 1, (1,), np.float32), (1,), np.float32
        action = rng.uniform(-1, 1, (n, 1)).astype(np.float32)
    dtype = np.uint8 if image else np.float32
    rb = SharedReplay(transition_spec(shape, dtype, act_shape, act_dtype), max(n, 1024))

    def obs():
        return (rng.integers(0, 256, (n, *shape), dtype=np.uint8) if image
                else rng.normal(size=(n, *shape)).astype(np.float32))

    rb.add(0, {"obs": obs(), "action": action, "reward": np.ones(n, np.float32),
               "next_obs": obs(), "discount": np.full(n, 0.97, np.float32)})
    return rb, obs_space, act_space


def profile(algo, rb, batch: int, iters: int, seed: int = 0) -> dict:
    """Seconds per update spent in each call (summed over phases), after a warm-up."""
    rng = np.random.default_rng(seed)
    warmup = min(50, max(1, iters // 5))
    parts = {"sample": 0.0, "compute_gradients": 0.0, "update_priorities": 0.0,
             "apply_gradients": 0.0}
    sends = {p: np.zeros(algo.phase_size(p), np.float32)
             for u in range(4) for p in algo.phases(u)}
    for i in range(iters + warmup):
        if i == warmup:
            parts = dict.fromkeys(parts, 0.0)
        t0 = time.perf_counter()
        b = rb.sample(batch, rng=rng)
        parts["sample"] += time.perf_counter() - t0
        for phase in algo.phases(i):
            t0 = time.perf_counter()
            _, prio = algo.compute_gradients(phase, b, sends[phase], metrics=(i % 10 == 9))
            t1 = time.perf_counter()
            if prio is not None:
                rb.update_priorities(b["indices"], prio, b["tickets"])
            t2 = time.perf_counter()
            algo.apply_gradients(phase, sends[phase])
            if algo_device(algo).type == "cuda":
                torch.cuda.synchronize()
            t3 = time.perf_counter()
            parts["compute_gradients"] += t1 - t0
            parts["update_priorities"] += t2 - t1
            parts["apply_gradients"] += t3 - t2
    return {k: v / iters for k, v in parts.items()}


def algo_device(algo) -> torch.device:
    return getattr(algo, "device", torch.device("cpu"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algo", choices=("dqn", "ddpg", "td3", "sac"), default="dqn")
    ap.add_argument("--batch", type=int, default=0, help="0 = the algorithm's run default")
    ap.add_argument("--hidden", type=int, nargs="+", default=None)
    ap.add_argument("--precision", choices=("fp32", "bf16", "both"), default="fp32")
    ap.add_argument("--image", action="store_true", help="DQN on 4x84x84 frames (Nature CNN)")
    ap.add_argument("--minatar", metavar="GAME", default=None,
                    help="DQN on MinAtar/GAME-v1's frames at --minatar-preset paper")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; best kept")
    ap.add_argument("--json", type=Path, help="also write {precision: {part: seconds per "
                    "update, \"total\": ...}} here (bench_continuous.py --ceiling reads it)")
    args = ap.parse_args()
    limit_threads(args.threads)       # torch's threads and numpy's OpenBLAS, as the ranks
    torch.set_flush_denormal(True)
    Algo = ALGOS[args.algo]
    batch = args.batch or Config(algo=args.algo, **Algo.run_defaults).batch_size
    base = Algo.Config()
    frames, n_actions = None, 6
    if args.minatar:
        if args.algo != "dqn" or args.image:
            ap.error("--minatar profiles DQN (--algo dqn), without --image")
        from pal_hpc.config_io import load_config
        from pal_hpc.envs import make_env
        env_id = f"MinAtar/{args.minatar}-v1"
        run = load_config(["--algo", "dqn", "--env", env_id])
        env = make_env(env_id, 0)
        frames, n_actions = env.observation_space, int(env.action_space.n)
        env.close()
        base, batch = run.algo_config, args.batch or run.batch_size
    image = args.image or frames is not None
    rb, obs_space, act_space = make_replay(args.algo, args.image, 2_000 if image else 50_000,
                                           np.random.default_rng(0), frames, n_actions)
    precisions = ("fp32", "bf16") if args.precision == "both" else (args.precision,)
    algos = {}
    for precision in precisions:
        over = {"precision": precision}
        if args.hidden:
            over["hidden"] = args.hidden
        cfg = dataclasses.replace(base, **over)
        algos[precision] = Algo(obs_space, act_space, cfg, device=args.device)
    # The precisions take turns, `--rounds` times, and each keeps its fastest round: on
    # a shared machine the load changes between rounds, not between neighbours.
    best: dict[str, dict] = {}
    for r in range(args.rounds):
        for precision, algo in algos.items():
            parts = profile(algo, rb, batch, max(1, args.iters // args.rounds), seed=r)
            if precision not in best or sum(parts.values()) < sum(best[precision].values()):
                best[precision] = parts
    totals = {}
    print(f"CPU: {describe_cpu()}")
    for precision, parts in best.items():
        total = totals[precision] = sum(parts.values())
        cfg = algos[precision].config
        n = getattr(algos[precision], "num_params", 0)
        print(f"{args.algo} learner update, {precision}, batch {batch}, hidden {cfg.hidden}"
              f"{', Nature CNN' if args.image else ''}"
              f"{f', MinAtar {args.minatar} {frames.shape}' if frames is not None else ''}, "
              f"{args.device}, "
              f"{args.threads} thread(s), best of {args.rounds} rounds of "
              f"{max(1, args.iters // args.rounds)} updates" + (f", {n:,} parameters" if n else ""))
        for k, v in parts.items():
            print(f"  {k:<18} {v * 1e6:9.1f} us  {v / total:5.1%}")
        print(f"  {'total':<18} {total * 1e6:9.1f} us  = {1 / total:,.0f} updates/s")
    if args.json:
        args.json.write_text(json.dumps({p: {**parts, "total": totals[p]}
                                         for p, parts in best.items()}))
    if len(totals) == 2:
        print(f"bf16 / fp32 time per update: {totals['bf16'] / totals['fp32']:.2f} "
              f"({'bf16 faster' if totals['bf16'] < totals['fp32'] else 'fp32 faster'})")


if __name__ == "__main__":
    main()
