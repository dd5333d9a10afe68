"""Evaluation: episodes of the deterministic policy (greedy, or the mean action) on
fresh environments, seeded apart from the actors' so they never share an episode."""

from __future__ import annotations

import numpy as np

from pal_hpc.envs import make_env

# Seeds of evaluation environments: cfg.seed + these, clear of the actors' seeds.
PERIODIC_SEED = 10**6      # + the env step of the evaluation
FINAL_SEED = 2 * 10**6


def evaluate(cfg, policy, episodes: int, seed: int) -> np.ndarray:
    """Returns of `episodes` episodes of the deterministic policy (greedy, or the mean
    action) on fresh environments, with batched forward passes."""
    envs = [make_env(cfg.env, seed + i) for i in range(episodes)]
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    returns = np.zeros(episodes)
    live = np.ones(episodes, bool)
    rng = np.random.default_rng(seed)
    while live.any():
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
