"""How much bf16 changes a trained DQN's Q-values: the checkpoint's online network plays
the env greedily (epsilon 0.05) for --states observations, then scores them in fp32,
under bf16 autocast as the learner runs it (the last layer in fp32, nets.output_linear),
and with every layer in bf16 (how the learner ran before output_linear).  Printed: the
Q-values' scale, the median action gap (best minus second best, fp32), each variant's
mean and 99th-percentile error against fp32, and how often it picks the same greedy
action.

    python bench/q_precision.py /work/runs/dqn-pong-s0/checkpoints/step_0000245096.h5
    python bench/q_precision.py CHECKPOINT --env ALE/Pong-v5 --states 3000
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import h5py
import numpy as np
import torch
import torch.nn.functional as F

from pal_hpc.algos.dqn import DQN, DQNConfig
from pal_hpc.envs.make import is_atari, make_env
from pal_hpc.runtime.threads import limit_threads


def load(path: Path, env_id: str):
    env = make_env(env_id, 0)
    cfg = DQNConfig(**(DQN.atari_defaults if is_atari(env_id) else {}))
    algo = DQN(env.observation_space, env.action_space, cfg)
    with h5py.File(path, "r") as f:
        if "algo/online" not in f:
            raise SystemExit(f"{path}: no algo/online group: not a DQN checkpoint")
        state = {k: torch.as_tensor(f["algo/online/" + k][()]) for k in f["algo/online"]}
    algo.online.load_state_dict(state)
    return env, algo.online


def play(env, net, states: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    seen = []
    for _ in range(states):
        seen.append(obs)
        with torch.no_grad():
            greedy = int(net(torch.as_tensor(obs[None])).argmax())
        action = greedy if rng.random() > 0.05 else int(rng.integers(env.action_space.n))
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            obs, _ = env.reset()
    return torch.as_tensor(np.stack(seen))


def all_bf16(net, x):
    """The forward with the heads in bf16 too (the learner before output_linear)."""
    z = net.trunk(x)
    if not net.dueling:
        return F.linear(z, net.head.weight, net.head.bias)
    adv = F.linear(z, net.advantage.weight, net.advantage.bias)
    return F.linear(z, net.value.weight, net.value.bias) + adv - adv.mean(1, keepdim=True)


def scored(fn, x: torch.Tensor, bf16: bool) -> torch.Tensor:
    out = []
    with torch.no_grad():
        for i in range(0, len(x), 256):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                out.append(fn(x[i:i + 256]).float())
    return torch.cat(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--env", default="ALE/Pong-v5")
    ap.add_argument("--states", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    limit_threads(1)        # torch's threads and numpy's OpenBLAS, as the ranks
    env, net = load(args.checkpoint, args.env)
    x = play(env, net, args.states, args.seed)
    q32 = scored(net, x, False)
    top = q32.sort(dim=1, descending=True).values
    report = {"states": len(x), "q_abs_mean": float(q32.abs().mean()),
              "action_gap_median": float((top[:, 0] - top[:, 1]).median())}
    for name, fn in (("bf16, last layer fp32", net),
                     ("bf16, every layer", lambda b: all_bf16(net, b))):
        q = scored(fn, x, True)
        err = (q - q32).abs()
        report[name] = {"err_mean": float(err.mean()), "err_p99": float(err.quantile(0.99)),
                        "same_greedy_action": float((q.argmax(1) == q32.argmax(1)).float().mean())}
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{args.checkpoint.name}: {report['states']} states of {args.env}; |Q| mean "
          f"{report['q_abs_mean']:.4f}, median action gap {report['action_gap_median']:.5f}")
    for name in ("bf16, last layer fp32", "bf16, every layer"):
        r = report[name]
        print(f"  {name:<22} error mean {r['err_mean']:.5f}, p99 {r['err_p99']:.5f}; "
              f"same greedy action as fp32 on {r['same_greedy_action']:.1%} of states")
    return 0


if __name__ == "__main__":
    sys.exit(main())
