"""Evaluation: episodes of the deterministic policy (greedy, or the mean action) on
fresh environments, seeded apart from the actors' so they never share an episode."""

from __future__ import annotations

import numpy as np

from pal_hpc.envs import make_env

# Seeds of evaluation environments: cfg.seed + these, clear of the actors' seeds.
PERIODIC_SEED = 10**6      # + the env step of the evaluation
FINAL_SEED = 2 * 10**6

_cut_reported = False      # the first cut episode is reported, once a process


def evaluate(cfg, policy, episodes: int, seed: int) -> np.ndarray:
    """Returns of `episodes` episodes of the deterministic policy (greedy, or the mean
    action) on fresh environments, with batched forward passes.  An episode still
    running after `cfg.eval_max_steps` steps (0: no cap) is cut there and scored with
    the rewards it has; the first evaluation that cuts one says so (MinAtar's games
    have no time limit, and a greedy policy may never end one)."""
    global _cut_reported
    cap = cfg.eval_max_steps
    envs = [make_env(cfg.env, seed + i) for i in range(episodes)]
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    returns = np.zeros(episodes)
    live = np.ones(episodes, bool)
    rng = np.random.default_rng(seed)
    steps = 0
    while live.any():
        if cap and steps >= cap:
            if not _cut_reported:
                _cut_reported = True
                print(f"pal_hpc: evaluation: {int(live.sum())} of {episodes} episodes of "
                      f"{cfg.env} still running after eval_max_steps={cap} steps were "
                      f"cut there and scored so far (said once)", flush=True)
            break
        steps += 1
        actions = policy.act(obs, rng, float("inf"), deterministic=True)
        for i in np.flatnonzero(live):
            o, r, terminated, truncated, _ = envs[i].step(actions[i])
            returns[i] += r
            obs[i] = o
            if terminated or truncated:
                live[i] = False
    for env in envs:
        env.close()
    return returns
