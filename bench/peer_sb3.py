"""Peer for bench/bench_train.py: Stable-Baselines3 DQN on CartPole-v1, timed to a target
greedy return with the same evaluation protocol as pal_hpc.  Runs in .venv-peers
(bench/install_peers.sh installs stable-baselines3 there), never in the project's .venv.

    .venv-peers/bin/python bench/peer_sb3.py --seed 0 [--total-steps 100000] [--target 475]

Hyperparameters: rl-baselines3-zoo's hyperparams/dqn.yml entry for CartPole-v1:
learning_rate 2.3e-3, batch_size 64, buffer_size 100000, learning_starts 1000,
gamma 0.99, target_update_interval 10, train_freq 256, gradient_steps 128,
exploration_final_eps 0.04, policy_kwargs net_arch [256, 256], one environment,
n_timesteps 5e4, exploration_fraction 0.16.  SB3 applies exploration_fraction to the
total passed to learn(); the zoo's 0.16 of 5e4 means epsilon decays over the first 8000
env steps.  This script trains for up to --total-steps (1e5 by default, like pal_hpc's
runs) and keeps that same 8000-step decay: it passes exploration_fraction =
0.16 * 5e4 / total_steps (0.08 for 1e5).  --exploration-steps changes the 8000.

Evaluation, as pal_hpc's (pal_hpc/runtime/actor.py: evaluate): every --eval-every env
steps, --eval-episodes (10) episodes of the greedy policy (deterministic=True) on fresh
environment instances, separate from the training env, episode i seeded
seed + 10**6 + env_steps + i, all stepped with one batched forward pass per step; the
mean return is compared with --target and training stops as soon as it is reached.
If the target was not hit, one final evaluation (seeded seed + 2 * 10**6) runs after the
last step, as pal_hpc does, and counts as a hit at the final step count.

torch.set_num_threads(1): each pal_hpc rank runs torch with one intra-op thread
(Config.torch_threads = 1), so SB3 gets one as well.

time_to_target_s is wall time from just before model.learn() (the model and its replay
buffer are already built, as pal_hpc's clock starts after its setup barrier) to the end
of the evaluation that reached the target, evaluation time included, as in pal_hpc.

stdout: one JSON line {"peer": "sb3-dqn", "seed", "steps_to_target", "time_to_target_s",
"best_eval_return", "env_steps", "wall_s", ...} (steps_to_target and time_to_target_s
are null when the target was not reached); everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

ZOO_TIMESTEPS = 50_000
ZOO_EXPLORATION_FRACTION = 0.16


def evaluate(model, env_id: str, episodes: int, seed: int) -> list[float]:
    """Greedy returns of `episodes` episodes on fresh environments (batched predict)."""
    import gymnasium as gym
    import numpy as np

    envs = [gym.make(env_id) for _ in range(episodes)]
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    returns = np.zeros(episodes)
    live = np.ones(episodes, bool)
    while live.any():
        actions, _ = model.predict(obs, deterministic=True)
        for i in np.flatnonzero(live):
            o, r, terminated, truncated, _ = envs[i].step(int(actions[i]))
            returns[i] += r
            obs[i] = o
            if terminated or truncated:
                live[i] = False
    for env in envs:
        env.close()
    return returns.tolist()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--total-steps", type=int, default=100_000)
    ap.add_argument("--target", type=float, default=475.0)
    ap.add_argument("--eval-every", type=int, default=5_000)
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--exploration-steps", type=int,
                    default=int(ZOO_EXPLORATION_FRACTION * ZOO_TIMESTEPS),
                    help="env steps of linear epsilon decay (zoo: 0.16 * 5e4 = 8000)")
    args = ap.parse_args()
    if args.total_steps < 1 or args.eval_every < 1 or args.eval_episodes < 1:
        ap.error("--total-steps, --eval-every and --eval-episodes must be >= 1")

    # Anything SB3 or torch prints goes to stderr; stdout carries the one JSON line.
    real_stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        result = run(args)
    print(json.dumps(result), file=real_stdout, flush=True)
    return 0


def run(args) -> dict:
    import gymnasium as gym
    import stable_baselines3
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(1)
    fraction = min(1.0, args.exploration_steps / args.total_steps)
    model = DQN(
        "MlpPolicy", gym.make(args.env),
        learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1_000,
        gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
        exploration_fraction=fraction, exploration_final_eps=0.04,
        policy_kwargs=dict(net_arch=[256, 256]),
        seed=args.seed, device="cpu", verbose=0)

    evals: list[dict] = []
    state = {"hit": None, "t0": 0.0}

    def record(steps: int, returns: list[float]) -> dict:
        mean = sum(returns) / len(returns)
        rec = {"env_steps": steps, "wall_s": round(time.perf_counter() - state["t0"], 3),
               "mean_return": mean, "episodes": len(returns)}
        evals.append(rec)
        print(f"[{rec['wall_s']:8.1f}s] eval  steps {steps:>9,}  greedy return {mean:8.1f} "
              f"over {len(returns)} episodes", file=sys.stderr, flush=True)
        if state["hit"] is None and mean >= args.target:
            state["hit"] = rec
        return rec

    class EvalToTarget(BaseCallback):
        """Greedy evaluation every eval_every env steps; stops training at the target."""

        def _on_step(self) -> bool:
            steps = self.num_timesteps
            if steps % args.eval_every:
                return True
            returns = evaluate(self.model, args.env, args.eval_episodes,
                               seed=args.seed + 10**6 + steps)
            record(steps, returns)
            return state["hit"] is None

    state["t0"] = time.perf_counter()
    model.learn(total_timesteps=args.total_steps, callback=EvalToTarget())
    steps = int(model.num_timesteps)
    if state["hit"] is None and (not evals or evals[-1]["env_steps"] != steps):
        record(steps, evaluate(model, args.env, args.eval_episodes, seed=args.seed + 2 * 10**6))
    wall = time.perf_counter() - state["t0"]
    hit = state["hit"]
    return {
        "peer": "sb3-dqn", "seed": args.seed, "env": args.env, "target": args.target,
        "steps_to_target": hit["env_steps"] if hit else None,
        "time_to_target_s": hit["wall_s"] if hit else None,
        "best_eval_return": max(e["mean_return"] for e in evals) if evals else None,
        "env_steps": steps, "updates": int(model._n_updates), "wall_s": round(wall, 3),
        "exploration_fraction": fraction, "torch_threads": torch.get_num_threads(),
        "sb3_version": stable_baselines3.__version__, "evaluations": evals,
    }


if __name__ == "__main__":
    sys.exit(main())
