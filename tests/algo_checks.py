"""Helpers the algorithm test files share (test_ddpg.py, test_td3.py, the batch-split
tests and tests/mpi/learner_split_check.py)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from pal_hpc.algos.dqn import DQN, DQNConfig
from pal_hpc.algos.sac import SAC, SACConfig
from pal_hpc.algos.td3 import TD3, TD3Config


def update(algo, u: int, batch: dict) -> None:
    """One full update on one learner (no Allreduce)."""
    for phase in algo.phases(u):
        out = np.zeros(algo.phase_size(phase), np.float32)
        algo.compute_gradients(phase, batch, out)
        algo.apply_gradients(phase, out)


def mlp_np(mlp, x: np.ndarray) -> np.ndarray:
    """A nets.MLP evaluated in float64 numpy."""
    layers = list(mlp.layers)
    for i, layer in enumerate(layers):
        x = x @ layer.weight.detach().double().numpy().T + layer.bias.detach().double().numpy()
        if i < len(layers) - 1:
            x = np.maximum(x, 0.0)
    return x


BOX3 = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
BOX2 = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


def make_split_algo(name: str, seed: int = 0):
    """A small DQN, TD3 or SAC (TD3's delayed actor runs on odd updates)."""
    if name == "dqn":
        return DQN(BOX3, gym.spaces.Discrete(3), DQNConfig(hidden=[16, 16], target_update=2),
                   seed=seed)
    if name == "td3":
        return TD3(BOX3, BOX2, TD3Config(hidden=[16, 16]), seed=seed)
    return SAC(BOX3, BOX2, SACConfig(hidden=[16, 16]), seed=seed)


def make_split_batch(name: str, rng: np.random.Generator, b: int) -> dict:
    """A random loss batch with the documented dtypes."""
    action = (rng.integers(0, 3, b) if name == "dqn"
              else rng.uniform(-1, 1, (b, 2)).astype(np.float32))
    return {"obs": rng.standard_normal((b, 3)).astype(np.float32), "action": action,
            "reward": rng.standard_normal(b).astype(np.float32),
            "next_obs": rng.standard_normal((b, 3)).astype(np.float32),
            "discount": (0.98 * (rng.random(b) > 0.2)).astype(np.float32),
            "weights": rng.uniform(0.1, 1.0, b).astype(np.float32)}
