"""Peer for bench/bench_ppo.py: Stable-Baselines3 PPO with the hyperparameters of
CleanRL's ppo.py on CartPole-v1 and of its ppo_continuous_action.py on a Box-action env
such as Hopper-v4 (pal_hpc's --algo ppo defaults for the two families).  Runs in
.venv-peers when it has stable_baselines3, else in the project's .venv (which installs
requirements-sb3.txt); it never imports pal_hpc.  Two modes:

    python bench/peer_sb3_ppo.py target --seed 0 [--total-steps 500000] [--target 475]
        [--eval-every 10000] [--eval-episodes 10]
    python bench/peer_sb3_ppo.py throughput [--steps 100000]

Hyperparameters, as SB3 arguments: 4 environments in a DummyVecEnv (make_vec_env),
n_steps 128, batch_size 128 (4 minibatches of the 512-step batch), n_epochs 4,
learning_rate 2.5e-4 annealed linearly to 0 (a schedule of progress_remaining, as
CleanRL's), gamma 0.99, gae_lambda 0.95, clip_range 0.2, clip_range_vf 0.2,
normalize_advantage True, ent_coef 0.01, vf_coef 0.25 (SB3's value loss is mean((R -
V)^2), CleanRL's 0.5 mean(...) with vf_coef 0.5), max_grad_norm 0.5; SB3's defaults for
the rest: separate tanh MLPs [64, 64] with orthogonal init, Adam eps 1e-5.  One
difference stays: SB3 clips the value prediction (mse of R and the clipped V), CleanRL
takes the larger of the clipped and unclipped losses.

Box actions (ppo_continuous_action.py): 1 environment (DummyVecEnv) in a VecNormalize
(observations and rewards, gamma 0.99, both clipped to +-10: CleanRL's
NormalizeObservation, NormalizeReward and their clips), n_steps 2048, batch_size 64 (32
minibatches), n_epochs 10, learning_rate 3e-4 annealed, ent_coef 0, the rest as above;
SB3's Gaussian policy with log std 0 and separate tanh MLPs [64, 64] is CleanRL's
Agent.  SB3 clips the sampled action to the bounds as CleanRL's ClipAction does.  The
greedy evaluations normalize observations with the training statistics.

target: the greedy evaluations of bench/peer_sb3_continuous.py (`learn_to_target`,
pal_hpc's protocol and seeds).  throughput: `learn` for --steps env steps, no
evaluation; env steps per second of the whole loop (stepping, acting, updates).
torch runs one thread.  stdout: one JSON line; everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

from peer_sb3_continuous import learn_to_target

N_ENVS = 4


def model_for(env_id: str, seed: int):
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    import gymnasium as gym
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)
    common = dict(gamma=0.99, gae_lambda=0.95, clip_range=0.2, clip_range_vf=0.2,
                  normalize_advantage=True, vf_coef=0.25, max_grad_norm=0.5, seed=seed,
                  device="cpu", verbose=0)
    with gym.make(env_id) as probe:
        box = isinstance(probe.action_space, gym.spaces.Box)
    if box:
        env = VecNormalize(make_vec_env(env_id, n_envs=1, seed=seed), norm_obs=True,
                           norm_reward=True, clip_obs=10.0, clip_reward=10.0, gamma=0.99)
        return PPO("MlpPolicy", env, n_steps=2048, batch_size=64, n_epochs=10,
                   learning_rate=lambda remaining: 3e-4 * remaining, ent_coef=0.0,
                   **common)
    env = make_vec_env(env_id, n_envs=N_ENVS, seed=seed)
    return PPO("MlpPolicy", env, n_steps=128, batch_size=128, n_epochs=4,
               learning_rate=lambda remaining: 2.5e-4 * remaining, ent_coef=0.01,
               **common)


def run_target(args) -> dict:
    model = model_for(args.env, args.seed)
    result = learn_to_target(model, args)
    model.get_env().close()
    return {"peer": "sb3-ppo", "seed": args.seed, "env": args.env, "target": args.target,
            **result}


def run_throughput(args) -> dict:
    import stable_baselines3

    model = model_for(args.env, args.seed)
    t0 = time.perf_counter()
    model.learn(total_timesteps=args.steps)
    seconds = time.perf_counter() - t0
    steps = int(model.num_timesteps)
    return {"peer": "sb3-ppo", "env": args.env, "env_steps": steps,
            "seconds": round(seconds, 3), "env_steps_per_s": steps / seconds,
            "sb3_version": stable_baselines3.__version__}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("target", help="to a greedy mean return")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--env", default="CartPole-v1")
    t.add_argument("--total-steps", type=int, default=500_000)
    t.add_argument("--target", type=float, default=475.0)
    t.add_argument("--eval-every", type=int, default=10_000)
    t.add_argument("--eval-episodes", type=int, default=10)
    p = sub.add_parser("throughput", help="env steps/s of the whole training loop")
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=100_000)
    args = ap.parse_args()
    real_stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        result = run_target(args) if args.mode == "target" else run_throughput(args)
    print(json.dumps(result), file=real_stdout, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
