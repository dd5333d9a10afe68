"""Peer for bench/bench_continuous.py: Stable-Baselines3 TD3 or SAC on Pendulum-v1, timed
to a target greedy return with the same evaluation protocol as pal_hpc.  Runs in
.venv-peers (bench/install_peers.sh installs stable-baselines3 there), never in the
project's .venv.

    .venv-peers/bin/python bench/peer_sb3_continuous.py --algo td3 --seed 0 \\
        [--total-steps 40000] [--target -200] [--eval-every 2000]

Hyperparameters: rl-baselines3-zoo's hyperparams/td3.yml and sac.yml entries for
Pendulum-v1, one environment:
  td3: gamma 0.98, buffer_size 200000, learning_starts 10000, normal action noise
       std 0.1, learning_rate 1e-3, net_arch [400, 300], train_freq 1,
       gradient_steps 1; SB3 defaults for the rest (batch_size 256, tau 0.005,
       policy_delay 2, target_policy_noise 0.2, target_noise_clip 0.5).
  sac: learning_rate 1e-3; SB3 defaults for the rest (buffer_size 1e6,
       learning_starts 100, batch_size 256, tau 0.005, gamma 0.99, ent_coef auto,
       net_arch [256, 256], train_freq 1, gradient_steps 1).
The zoo trains both for 2e4 steps; here training runs until the target or
--total-steps.  Neither zoo entry schedules anything by the total, so nothing is
rescaled.

Evaluation, as pal_hpc's (pal_hpc/runtime/evaluation.py): every --eval-every env steps,
--eval-episodes (10) episodes of the deterministic policy (deterministic=True: the
actor's output for TD3, the squashed mean for SAC) on fresh environment instances,
separate from the training env, episode i seeded seed + 10**6 + env_steps + i
(PERIODIC_SEED), all stepped with one batched forward pass per step; training stops at
the first evaluation whose mean reaches --target.  If the target was not hit, one
final evaluation (seeded seed + 2 * 10**6, FINAL_SEED) runs after the last step and
counts as a hit at the final step count.

torch.set_num_threads(1): each pal_hpc rank runs torch with one intra-op thread
(Config.torch_threads = 1), so SB3 gets one as well.

time_to_target_s is wall time from just before model.learn() (the model and its replay
buffer are already built, as pal_hpc's clock starts after its setup barrier) to the end
of the evaluation that reached the target; time_to_target_excl_eval_s is the same minus
the time spent in every evaluation up to and including that one (pal_hpc's summary
field of the same name), which is what bench_continuous.py compares.

stdout: one JSON line {"peer": "sb3-td3"|"sb3-sac", "seed", "steps_to_target",
"time_to_target_s", "time_to_target_excl_eval_s", "best_eval_return", "env_steps",
"wall_s", "evaluations", ...} (the *_to_target fields are null when the target was
not reached); everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

# pal_hpc/runtime/evaluation.py's seeds (this script cannot import pal_hpc: other venv).
PERIODIC_SEED = 10**6
FINAL_SEED = 2 * 10**6


def evaluate(model, env_id: str, episodes: int, seed: int) -> list[float]:
    """Deterministic-policy returns of `episodes` episodes on fresh environments
    (batched predict).  A model trained in a VecNormalize sees the observations
    normalized with its training statistics, as in training."""
    import gymnasium as gym
    import numpy as np

    normalize = getattr(model.get_env(), "normalize_obs", lambda o: o)
    envs = [gym.make(env_id) for _ in range(episodes)]
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    returns = np.zeros(episodes)
    live = np.ones(episodes, bool)
    while live.any():
        actions, _ = model.predict(normalize(obs), deterministic=True)   # in the bounds
        for i in np.flatnonzero(live):
            o, r, terminated, truncated, _ = envs[i].step(actions[i])
            returns[i] += r
            obs[i] = o
            if terminated or truncated:
                live[i] = False
    for env in envs:
        env.close()
    return returns.tolist()


def build(algo: str, env, seed: int):
    """The SB3 model with the zoo's Pendulum-v1 hyperparameters."""
    import numpy as np
    from stable_baselines3 import SAC, TD3
    from stable_baselines3.common.noise import NormalActionNoise

    if algo == "td3":
        n = env.action_space.shape[0]
        return TD3("MlpPolicy", env, gamma=0.98, buffer_size=200_000, learning_starts=10_000,
                   action_noise=NormalActionNoise(mean=np.zeros(n), sigma=0.1 * np.ones(n)),
                   learning_rate=1e-3, policy_kwargs=dict(net_arch=[400, 300]),
                   train_freq=1, gradient_steps=1, seed=seed, device="cpu", verbose=0)
    return SAC("MlpPolicy", env, learning_rate=1e-3, seed=seed, device="cpu", verbose=0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algo", choices=("td3", "sac"), default="td3")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--env", default="Pendulum-v1")
    ap.add_argument("--total-steps", type=int, default=40_000)
    ap.add_argument("--target", type=float, default=-200.0)
    ap.add_argument("--eval-every", type=int, default=2_000)
    ap.add_argument("--eval-episodes", type=int, default=10)
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
    import torch

    torch.set_num_threads(1)
    model = build(args.algo, gym.make(args.env), args.seed)

    return {"peer": f"sb3-{args.algo}", "algo": args.algo, "seed": args.seed,
            "env": args.env, "target": args.target, **learn_to_target(model, args)}


def learn_to_target(model, args) -> dict:
    """`model.learn` with a greedy evaluation (`args.eval_episodes` episodes) each time
    the step counter passes a multiple of `args.eval_every`, stopping once the mean
    reaches `args.target` (or after `args.total_steps`, with a final evaluation).
    Returns the time and env steps to the target, with and without evaluation time."""
    import stable_baselines3
    import torch
    from stable_baselines3.common.callbacks import BaseCallback

    evals: list[dict] = []
    state = {"hit": None, "t0": 0.0, "next": args.eval_every}

    def record(steps: int, seed: int) -> None:
        t0 = time.perf_counter()
        returns = evaluate(model, args.env, args.eval_episodes, seed)
        now = time.perf_counter()
        mean = sum(returns) / len(returns)
        rec = {"env_steps": steps, "wall_s": round(now - state["t0"], 3),
               "mean_return": mean, "episodes": len(returns), "eval_s": round(now - t0, 3)}
        evals.append(rec)
        print(f"[{rec['wall_s']:8.1f}s] eval  steps {steps:>9,}  greedy return {mean:8.1f} "
              f"over {len(returns)} episodes", file=sys.stderr, flush=True)
        if state["hit"] is None and mean >= args.target:
            state["hit"] = rec

    class EvalToTarget(BaseCallback):
        """Greedy evaluation when the counter passes a multiple of eval_every (a vector
        env advances it by n_envs per call); stops at the target."""

        def _on_step(self) -> bool:
            steps = self.num_timesteps
            if steps < state["next"]:
                return True
            state["next"] = (steps // args.eval_every + 1) * args.eval_every
            record(steps, args.seed + PERIODIC_SEED + steps)
            return state["hit"] is None

    state["t0"] = time.perf_counter()
    model.learn(total_timesteps=args.total_steps, callback=EvalToTarget())
    steps = int(model.num_timesteps)
    if state["hit"] is None and (not evals or evals[-1]["env_steps"] != steps):
        record(steps, args.seed + FINAL_SEED)
    wall = time.perf_counter() - state["t0"]
    hit = state["hit"]
    excl = None
    if hit:
        eval_s = sum(e["eval_s"] for e in evals if e["env_steps"] <= hit["env_steps"])
        excl = round(hit["wall_s"] - eval_s, 3)
    return {
        "steps_to_target": hit["env_steps"] if hit else None,
        "time_to_target_s": hit["wall_s"] if hit else None,
        "time_to_target_excl_eval_s": excl,
        "best_eval_return": max(e["mean_return"] for e in evals) if evals else None,
        "env_steps": steps, "updates": int(model._n_updates), "wall_s": round(wall, 3),
        "torch_threads": torch.get_num_threads(),
        "sb3_version": stable_baselines3.__version__, "evaluations": evals,
    }


if __name__ == "__main__":
    sys.exit(main())
