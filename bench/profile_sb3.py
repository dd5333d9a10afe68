"""Where one Stable-Baselines3 DQN update's time goes (the peer side of
bench/profile_learner.py): runs in the venv SB3 is in (.venv-peers, else .venv; see
bench/to_target.sb3_python) and uses none of pal_hpc.

SB3's DQN with rl-baselines3-zoo's CartPole-v1 settings (as bench/peer_sb3.py) fills
its replay for --fill env steps, then (a) times model.train(gradient_steps=128,
batch_size=64) -- SB3's own update loop, the figure to compare -- and (b) replays the
same loop's steps one by one with SB3's own objects to split it: replay sample,
target forward (no grad), online forward + loss, backward, clip + Adam step; and the
rollout collection per env step (train_freq 256 steps between trainings).  One torch
thread, as pal_hpc's ranks.

    .venv-peers/bin/python bench/profile_sb3.py [--fill 5000] [--rounds 5]
    .venv-peers/bin/python bench/profile_sb3.py --algo td3|sac [--rounds 5]

--algo td3 or sac times SB3's TD3 / SAC with the zoo's Pendulum-v1 settings (as
bench/peer_sb3_continuous.py): model.train(gradient_steps=128, batch_size=256) per
gradient step, best of --rounds, and learn()'s wall per env step while it trains
(one env step and one gradient step each): the peer side of
`bench/profile_learner.py --algo td3|sac`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from stable_baselines3 import DQN, SAC, TD3
from stable_baselines3.common.noise import NormalActionNoise


def continuous(algo: str, rounds: int, out: Path | None = None) -> None:
    """SB3 TD3/SAC on Pendulum-v1 (the zoo's settings): time per gradient step."""
    if algo == "td3":
        model = TD3("MlpPolicy", "Pendulum-v1", learning_rate=1e-3, gamma=0.98,
                    buffer_size=200_000, learning_starts=1000, batch_size=256,
                    action_noise=NormalActionNoise(np.zeros(1), 0.1 * np.ones(1)),
                    policy_kwargs={"net_arch": [400, 300]}, seed=0, device="cpu")
    else:
        model = SAC("MlpPolicy", "Pendulum-v1", learning_rate=1e-3, batch_size=256,
                    learning_starts=1000, seed=0, device="cpu")
    model.learn(1000)                       # the random phase only: fills the replay
    t0 = time.perf_counter()
    model.learn(1000, reset_num_timesteps=False)    # 1 env step + 1 gradient step each
    per_step = (time.perf_counter() - t0) / 1000
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        model.train(gradient_steps=128, batch_size=256)
        best = min(best, (time.perf_counter() - t0) / 128)
    width = "[400, 300]" if algo == "td3" else "[256, 256]"
    print(f"SB3 {algo.upper()} Pendulum-v1 update (batch 256, {width}), 1 thread")
    print(f"  model.train(), per gradient step (best of {rounds} x 128): "
          f"{best * 1e3:6.2f} ms = {1 / best:,.0f} updates/s")
    print(f"  learn() wall per env step while training (one gradient step each): "
          f"{per_step * 1e3:6.2f} ms, of which collection {(per_step - best) * 1e3:.2f} ms")
    if out is not None:
        out.write_text(json.dumps({"train_per_step_s": best, "learn_per_env_step_s": per_step}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fill", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5, help="train() calls of 128 steps")
    ap.add_argument("--algo", default="dqn", choices=("dqn", "td3", "sac"))
    ap.add_argument("--json", type=Path, help="--algo td3|sac: also write the two figures "
                    "here (bench_continuous.py --ceiling reads them)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.algo != "dqn":
        continuous(args.algo, args.rounds, args.json)
        return
    model = DQN("MlpPolicy", "CartPole-v1", learning_rate=2.3e-3, batch_size=64,
                buffer_size=100_000, learning_starts=1000, gamma=0.99,
                target_update_interval=10, train_freq=256, gradient_steps=128,
                exploration_fraction=0.16, exploration_final_eps=0.04,
                policy_kwargs={"net_arch": [256, 256]}, seed=0, device="cpu")
    t0 = time.perf_counter()
    model.learn(args.fill)
    collect = (time.perf_counter() - t0) / args.fill      # includes its trainings
    best = float("inf")
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        model.train(gradient_steps=128, batch_size=64)
        best = min(best, (time.perf_counter() - t0) / 128)

    parts = dict.fromkeys(("sample", "target_forward", "forward_loss", "backward",
                           "clip_and_adam"), 0.0)
    q_net, target, opt = model.q_net, model.q_net_target, model.policy.optimizer
    n = 128 * args.rounds
    for _ in range(n):
        t = [time.perf_counter()]
        data = model.replay_buffer.sample(64, env=model._vec_normalize_env)
        t.append(time.perf_counter())
        with torch.no_grad():
            next_q = target(data.next_observations).max(dim=1).values.reshape(-1, 1)
            target_q = data.rewards + (1 - data.dones) * model.gamma * next_q
        t.append(time.perf_counter())
        q = torch.gather(q_net(data.observations), 1, data.actions.long())
        loss = F.smooth_l1_loss(q, target_q)
        t.append(time.perf_counter())
        opt.zero_grad()
        loss.backward()
        t.append(time.perf_counter())
        torch.nn.utils.clip_grad_norm_(model.policy.parameters(), model.max_grad_norm)
        opt.step()
        t.append(time.perf_counter())
        for k, a, b in zip(parts, t[:-1], t[1:]):
            parts[k] += b - a
    total = sum(parts.values())
    print(f"SB3 DQN CartPole-v1 update (batch 64, [256, 256]), 1 thread")
    print(f"  model.train(), per gradient step (best of {args.rounds} x 128): "
          f"{best * 1e6:8.1f} us = {1 / best:,.0f} updates/s")
    print(f"  its steps one by one ({n} updates):")
    for k, v in parts.items():
        print(f"    {k:<16} {v / n * 1e6:8.1f} us  {v / total:5.1%}")
    print(f"    {'total':<16} {total / n * 1e6:8.1f} us")
    print(f"  learn() wall per env step over the first {args.fill} (collection and its "
          f"0.5 updates/env step): {collect * 1e6:.1f} us")


if __name__ == "__main__":
    main()
