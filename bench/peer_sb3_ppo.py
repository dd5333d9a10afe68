"""Peer for bench/bench_ppo.py: Stable-Baselines3 PPO with the hyperparameters of
CleanRL's ppo.py on CartPole-v1, of its ppo_continuous_action.py on a Box-action env
such as Hopper-v4 and of its ppo_atari.py on an Atari id such as ALE/Pong-v5
(pal_hpc's --algo ppo defaults for the three families).  Runs in .venv-peers when it has
stable_baselines3, else in the project's .venv (which installs requirements-sb3.txt);
it never imports pal_hpc.  Two modes:

    python bench/peer_sb3_ppo.py target --seed 0 [--total-steps 500000] [--target 475]
        [--eval-every 10000] [--eval-episodes 10]
    python bench/peer_sb3_ppo.py throughput [--env ALE/Pong-v5] [--steps 100000]
        [--warmup-steps N] [--vec dummy|subproc]

Hyperparameters, as SB3 arguments: 4 environments in a DummyVecEnv (make_vec_env;
--vec), n_steps 128, batch_size 128 (4 minibatches of the 512-step batch), n_epochs 4,
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

Atari (an id whose observation is an image; ppo_atari.py): 8 environments, each built
by bench/peer_sb3_a2c.py's make_atari with pal_hpc's Atari preprocessing (the game with
frameskip=1 and v5's sticky actions, AtariPreprocessing: 4 frames a step, 1..30
no-ops, 84x84 grayscale uint8; FrameStackObservation(4) -> (4, 84, 84) uint8, channels
first), plus what pal_hpc's PPO adds for this family: the episode ends on a life lost
(its atari_terminal_on_life_loss; Pong has no lives) and rewards are clipped to their
sign (its clip_rewards auto) by a TransformReward.  "CnnPolicy": SB3's NatureCNN (conv
32 8x8/4, 64 4x4/2, 64 3x3/1, dense 512, frames / 255) shared by linear policy and value
heads, orthogonal init, Adam eps 1e-5 -- CleanRL's Agent.  n_steps 128, batch_size 256
(4 minibatches of the 1,024-step round), n_epochs 4, learning_rate 2.5e-4 annealed,
clip_range 0.1, clip_range_vf 0.1, ent_coef 0.01, vf_coef 0.25, the rest as above.
Only the throughput mode runs Atari.

--vec: the environments in a DummyVecEnv (default; stepped one after the other in this
process, as CleanRL's SyncVectorEnv) or a SubprocVecEnv (a process each).

target: the greedy evaluations of bench/peer_sb3_continuous.py (`learn_to_target`,
pal_hpc's protocol and seeds).  throughput: `learn` for --warmup-steps + --steps env
steps, no evaluation; env steps per second of the whole loop (stepping, acting,
updates), clocked from the first rollout that starts at or after --warmup-steps (default
one round on Atari, 1,024 steps, to leave torch's first calls out; 0 elsewhere) to the
end of learn().  torch runs one thread.  stdout: one JSON line; everything else goes to
stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import time

from peer_sb3_a2c import make_atari
from peer_sb3_continuous import learn_to_target

N_ENVS = 4
ATARI_ENVS = 8


@functools.cache
def is_image(env_id: str) -> bool:
    """Whether `env_id`'s observations are images (the Atari family)."""
    import gymnasium as gym

    with contextlib.suppress(ImportError):
        import ale_py

        gym.register_envs(ale_py)
    with gym.make(env_id) as probe:
        return len(probe.observation_space.shape) == 3


def atari_thunk(env_id: str, seed: int):
    """make_atari's environment as pal_hpc's PPO sees it: episodes end on a life lost,
    rewards clipped to their sign."""
    make = make_atari(env_id, seed)

    def thunk():
        import gymnasium as gym
        import numpy as np

        env = make()
        assert isinstance(env.env, gym.wrappers.AtariPreprocessing)
        env.env.terminal_on_life_loss = True
        return gym.wrappers.TransformReward(env, np.sign)
    return thunk


def model_for(env_id: str, seed: int, vec: str = "dummy"):
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    import gymnasium as gym
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

    torch.set_num_threads(1)
    vec_cls = SubprocVecEnv if vec == "subproc" else DummyVecEnv
    common = dict(gamma=0.99, gae_lambda=0.95, normalize_advantage=True, vf_coef=0.25,
                  max_grad_norm=0.5, seed=seed, device="cpu", verbose=0)
    if is_image(env_id):
        env = vec_cls([atari_thunk(env_id, seed + i) for i in range(ATARI_ENVS)])
        return PPO("CnnPolicy", env, n_steps=128, batch_size=256, n_epochs=4,
                   learning_rate=lambda remaining: 2.5e-4 * remaining, clip_range=0.1,
                   clip_range_vf=0.1, ent_coef=0.01, **common)
    common.update(clip_range=0.2, clip_range_vf=0.2)
    with gym.make(env_id) as probe:
        box = isinstance(probe.action_space, gym.spaces.Box)
    if box:
        env = VecNormalize(make_vec_env(env_id, n_envs=1, seed=seed, vec_env_cls=vec_cls),
                           norm_obs=True, norm_reward=True, clip_obs=10.0,
                           clip_reward=10.0, gamma=0.99)
        return PPO("MlpPolicy", env, n_steps=2048, batch_size=64, n_epochs=10,
                   learning_rate=lambda remaining: 3e-4 * remaining, ent_coef=0.0,
                   **common)
    env = make_vec_env(env_id, n_envs=N_ENVS, seed=seed, vec_env_cls=vec_cls)
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
    from stable_baselines3.common.callbacks import BaseCallback

    model = model_for(args.env, args.seed, args.vec)
    if args.warmup_steps is None:
        args.warmup_steps = model.n_steps * model.n_envs if is_image(args.env) else 0
    state: dict = {"t0": None, "s0": None}

    class Clock(BaseCallback):
        """Starts the clock at the first rollout from --warmup-steps on."""

        def _on_rollout_start(self) -> None:
            if state["t0"] is None and self.num_timesteps >= args.warmup_steps:
                state["t0"], state["s0"] = time.perf_counter(), self.num_timesteps

        def _on_step(self) -> bool:
            return True

    model.learn(total_timesteps=args.warmup_steps + args.steps, callback=Clock())
    seconds = time.perf_counter() - state["t0"]
    steps = int(model.num_timesteps) - state["s0"]
    model.get_env().close()
    return {"peer": "sb3-ppo", "env": args.env, "vec": args.vec,
            "warmup_steps": state["s0"], "env_steps": steps, "seconds": round(seconds, 3),
            "env_steps_per_s": steps / seconds, "sb3_version": stable_baselines3.__version__}


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
    p.add_argument("--warmup-steps", type=int,
                   help="env steps before the clock starts (default: one round on Atari, "
                        "else 0)")
    p.add_argument("--vec", choices=("dummy", "subproc"), default="dummy",
                   help="DummyVecEnv (CleanRL's SyncVectorEnv) or SubprocVecEnv")
    args = ap.parse_args()
    if args.mode == "target" and is_image(args.env):
        ap.error(f"target: not for {args.env} (image observations: hours on a CPU); "
                 "use throughput")
    real_stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        result = run_target(args) if args.mode == "target" else run_throughput(args)
    print(json.dumps(result), file=real_stdout, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
