"""Where a PAAC round's master time goes on a small env: acting (through numpy and
through torch), the gradient and the step, for one network on a batch like CartPole's,
one torch thread.

A round of t_max steps on n_e envs costs the master t_max acts, one gradient and one
step (plus the envs, when it steps them: `bench/bench_master_share.py`).  On networks
this small, torch's fixed cost per operation is most of each; this shows how much.

    python bench/profile_paac_act.py [--envs 8] [--hidden 64 64] [--activation tanh]
        [--shared-torso] [--repeats 3000]
    python bench/profile_paac_act.py --env ALE/Pong-v5 --envs 32 --shared-torso --repeats 60
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from pal_hpc.algos.paac import PAAC, PAACConfig
from pal_hpc.envs import make_env
from pal_hpc.runtime.threads import limit_threads


def per_call_us(fn, repeats: int) -> float:
    for _ in range(min(200, repeats)):
        fn()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--envs", type=int, default=8, help="environments (the batch acted on)")
    ap.add_argument("--t-max", type=int, default=5)
    ap.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    ap.add_argument("--activation", default="tanh", choices=["tanh", "relu"])
    ap.add_argument("--shared-torso", action="store_true",
                    help="one torso for policy and value (the zoo's A2C has two)")
    ap.add_argument("--repeats", type=int, default=3000)
    args = ap.parse_args()
    limit_threads(1)        # torch's threads and numpy's OpenBLAS, as the ranks
    env = make_env(args.env, 0)
    cfg = PAACConfig(hidden=args.hidden, activation=args.activation,
                     shared_torso=args.shared_torso)
    algo = PAAC(env.observation_space, env.action_space, cfg)
    rng = np.random.default_rng(0)
    t, n = args.t_max, args.envs
    space = env.observation_space

    def observations(*lead):
        if space.dtype == np.uint8:                  # frames
            return rng.integers(0, 256, size=(*lead, *space.shape), dtype=np.uint8)
        return rng.normal(size=(*lead, *space.shape)).astype(np.float32)

    obs = observations(n)
    batch = {"obs": observations(t + 1, n),
             "action": rng.integers(0, env.action_space.n, size=(t, n)),
             "reward": np.ones((t, n), np.float32),
             "terminated": np.zeros((t, n), bool), "truncated": np.zeros((t, n), bool),
             "valid": np.ones((t, n), bool)}
    out = np.zeros(algo.num_params, np.float32)
    rows = [
        ("act (as the runtime does)", per_call_us(lambda: algo.act(obs, rng), args.repeats)),
        ("act (torch)", per_call_us(lambda: algo._act_torch(obs, rng), args.repeats)),
        ("gradient", per_call_us(lambda: algo.compute_gradients("ac", batch, out),
                                 max(1, args.repeats // 3))),
        ("step (clip + RMSProp)", per_call_us(lambda: algo.apply_gradients("ac", out),
                                              max(1, args.repeats // 3))),
    ]
    net = (f"{cfg.cnn} CNN" if space.dtype == np.uint8
           else f"MLP {args.hidden} {args.activation}")
    print(f"PAAC on {args.env}: {n} envs, t_max {t}, {net}, "
          f"{'shared' if args.shared_torso else 'separate'} torsos, "
          f"{algo.num_params:,} parameters, 1 torch thread")
    for name, us in rows:
        print(f"  {name:32s} {us:8.1f} us")
    act_np, act_torch, grad, step = (us for _, us in rows)
    print(f"  a round's master compute: {t} acts + gradient + step = "
          f"{(t * act_np + grad + step) / 1e3:.2f} ms (with torch acting "
          f"{(t * act_torch + grad + step) / 1e3:.2f} ms), envs not included")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
