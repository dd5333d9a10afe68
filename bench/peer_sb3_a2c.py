"""Peer for bench/bench_paac.py and bench/bench_paac_atari.py: Stable-Baselines3 A2C.
Runs in .venv-peers (bench/install_peers.sh installs stable-baselines3 there), never in
the project's .venv.  Two modes:

    .venv-peers/bin/python bench/peer_sb3_a2c.py target --seed 0 \\
        [--total-steps 500000] [--target 475] [--eval-every 10000] [--eval-episodes 10]
    .venv-peers/bin/python bench/peer_sb3_a2c.py throughput --num-envs 32 \\
        [--env ALE/Pong-v5] [--cnn nips] [--warmup-steps 4000] [--steps 16000]

target: A2C on CartPole-v1 with rl-baselines3-zoo's hyperparams/a2c.yml entry, which
sets only n_envs 8, n_timesteps 5e5, policy MlpPolicy and ent_coef 0.0; everything else
is SB3 2.x's A2C default: learning_rate 7e-4 (constant), n_steps 5, gamma 0.99,
gae_lambda 1.0 (plain n-step returns), vf_coef 0.5, max_grad_norm 0.5, RMSprop (torch's,
alpha 0.99, eps 1e-5), normalize_advantage False, separate pi/vf MLPs [64, 64] with tanh
and orthogonal init.  The zoo steps its 8 environments in a DummyVecEnv (make_vec_env),
as here.  Evaluation as pal_hpc's (pal_hpc/runtime/evaluation.py), by
peer_sb3_continuous.evaluate: when the step counter first reaches a multiple of
--eval-every (SB3 counts 8 steps at a time), --eval-episodes episodes of the greedy
policy (deterministic=True: the arg-max action) on fresh environments seeded
seed + 10**6 + env_steps + i, one batched forward pass per step; training stops at the
first evaluation whose mean reaches --target; without a hit, one final evaluation
(seed + 2 * 10**6) after the last step.  time_to_target_s runs from just before
model.learn() to the end of the hitting evaluation; time_to_target_excl_eval_s is the
same minus every evaluation's time up to it (pal_hpc's summary field of the same name).

throughput: A2C CnnPolicy on an Atari id with --num-envs environments in a
SubprocVecEnv, each built with exactly the gymnasium wrappers pal_hpc's
`pal_hpc.envs.make.atari_env` uses (this venv cannot import pal_hpc): the game made with
frameskip=1 (v5's sticky actions, p = 0.25, stay), AtariPreprocessing (frame_skip 4 with
max-pooling of the last two frames, 1..30 no-ops, 84x84 grayscale, uint8, no life-loss
terminal), FrameStackObservation(4) -> (4, 84, 84) uint8, channels first, which SB3
takes as an image without transposing.  The torso is pal_hpc's: --cnn nips (PAAC's
default: conv 16 8x8/4, conv 32 4x4/2, dense 256, ReLU; a features extractor below) or
--cnn nature (SB3's own NatureCNN, which is pal_hpc's nature torso); both scale frames
by 1/255 and share the torso between the policy and value heads, as PAAC does.  Other
hyperparameters: the zoo's atari entry (ent_coef 0.01, vf_coef 0.25, RMSpropTFLike eps
1e-5) with SB3's n_steps 5 = PAAC's t_max.  The clock starts at the first rollout that
begins at or after --warmup-steps env steps and stops when learn() returns after
--warmup-steps + --steps, so it covers stepping, forward passes and updates alike.

torch.set_num_threads(1) in both modes: each pal_hpc rank runs torch with one thread.

stdout: one JSON line (fields per mode, below); everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

# Evaluation exactly as bench/peer_sb3_continuous.py does it (same seeds, same batching).
from peer_sb3_continuous import learn_to_target


def make_atari(env_id: str, seed: int):
    """A thunk for SubprocVecEnv: pal_hpc's atari_env preprocessing, seeded."""
    def thunk():
        import ale_py
        import gymnasium as gym

        gym.register_envs(ale_py)
        env = gym.make(env_id, frameskip=1)
        env = gym.wrappers.AtariPreprocessing(
            env, noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=False,
            grayscale_obs=True, scale_obs=False)
        env = gym.wrappers.FrameStackObservation(env, 4)
        env.reset(seed=seed)
        env.action_space.seed(seed)
        return env
    return thunk


def nips_extractor():
    """pal_hpc's NIPS torso (pal_hpc/algos/cnn.py) as an SB3 features extractor."""
    import torch
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
    from torch import nn

    class NipsCNN(BaseFeaturesExtractor):
        """Mnih et al. 2013: conv 16 8x8/4, conv 32 4x4/2, dense 256, ReLU after each."""

        def __init__(self, observation_space, features_dim: int = 256):
            super().__init__(observation_space, features_dim)
            channels = observation_space.shape[0]
            self.convs = nn.Sequential(nn.Conv2d(channels, 16, 8, 4), nn.ReLU(),
                                       nn.Conv2d(16, 32, 4, 2), nn.ReLU(), nn.Flatten())
            with torch.no_grad():
                n = self.convs(torch.zeros(1, *observation_space.shape)).shape[1]
            self.dense = nn.Sequential(nn.Linear(n, features_dim), nn.ReLU())

        def forward(self, obs):
            # SB3's policy has already scaled uint8 frames to [0, 1] (normalize_images).
            return self.dense(self.convs(obs))

    return NipsCNN


def run_target(args) -> dict:
    import torch
    from stable_baselines3 import A2C
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)
    env = make_vec_env(args.env, n_envs=8, seed=args.seed)    # DummyVecEnv, as the zoo
    model = A2C("MlpPolicy", env, ent_coef=0.0, seed=args.seed, device="cpu", verbose=0)

    result = learn_to_target(model, args)
    env.close()
    return {"peer": "sb3-a2c", "seed": args.seed, "env": args.env, "target": args.target,
            **result}


def run_throughput(args) -> dict:
    import stable_baselines3
    import torch
    from stable_baselines3 import A2C
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike
    from stable_baselines3.common.vec_env import SubprocVecEnv

    torch.set_num_threads(1)
    env = SubprocVecEnv([make_atari(args.env, args.seed + i) for i in range(args.num_envs)])
    policy_kwargs = dict(optimizer_class=RMSpropTFLike, optimizer_kwargs=dict(eps=1e-5))
    if args.cnn == "nips":
        # net_arch [] as SB3 sets for NatureCNN: linear pi and v heads on the torso, as
        # PAAC's (without it SB3 adds [64, 64] MLPs for a custom extractor).
        policy_kwargs.update(features_extractor_class=nips_extractor(),
                             features_extractor_kwargs=dict(features_dim=256), net_arch=[])
    model = A2C("CnnPolicy", env, n_steps=5, ent_coef=0.01, vf_coef=0.25,
                policy_kwargs=policy_kwargs, seed=args.seed, device="cpu", verbose=0)
    state: dict = {"t0": None, "s0": None}

    class Clock(BaseCallback):
        """Starts the clock at the first rollout from --warmup-steps on."""

        def _on_rollout_start(self) -> None:
            if state["t0"] is None and self.num_timesteps >= args.warmup_steps:
                state["t0"], state["s0"] = time.perf_counter(), self.num_timesteps

        def _on_step(self) -> bool:
            return True

    model.learn(total_timesteps=args.warmup_steps + args.steps, callback=Clock())
    t1, s1 = time.perf_counter(), int(model.num_timesteps)
    env.close()
    measured = s1 - state["s0"]
    seconds = t1 - state["t0"]
    params = sum(p.numel() for p in model.policy.parameters())
    return {
        "peer": "sb3-a2c", "env": args.env, "num_envs": args.num_envs, "cnn": args.cnn,
        "warmup_steps": state["s0"], "measured_steps": measured,
        "measured_s": round(seconds, 3), "env_steps_per_s": measured / seconds,
        "updates": int(model._n_updates), "params": params,
        "torch_threads": torch.get_num_threads(),
        "sb3_version": stable_baselines3.__version__,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("target", help="CartPole-v1 to a greedy mean return")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--env", default="CartPole-v1")
    t.add_argument("--total-steps", type=int, default=500_000)
    t.add_argument("--target", type=float, default=475.0)
    t.add_argument("--eval-every", type=int, default=10_000)
    t.add_argument("--eval-episodes", type=int, default=10)
    p = sub.add_parser("throughput", help="Atari env steps/s of the whole training loop")
    p.add_argument("--env", default="ALE/Pong-v5")
    p.add_argument("--num-envs", type=int, default=32)
    p.add_argument("--cnn", choices=("nips", "nature"), default="nips")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-steps", type=int, default=4_000)
    p.add_argument("--steps", type=int, default=16_000)
    args = ap.parse_args()
    if args.mode == "target" and min(args.total_steps, args.eval_every, args.eval_episodes) < 1:
        ap.error("--total-steps, --eval-every and --eval-episodes must be >= 1")
    if args.mode == "throughput" and (args.num_envs < 1 or args.steps < 1
                                      or args.warmup_steps < 0):
        ap.error("--num-envs and --steps must be >= 1, --warmup-steps >= 0")

    # Anything SB3 or torch prints goes to stderr; stdout carries the one JSON line.
    real_stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        result = run_target(args) if args.mode == "target" else run_throughput(args)
    print(json.dumps(result), file=real_stdout, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
