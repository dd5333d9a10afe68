"""Building gymnasium environments by id (Atari ids included when ale-py is present)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

_registered_ale = False


def make_env(env_id: str, seed: int) -> gym.Env:
    """A seeded environment; raises ValueError naming the id if it is unknown or unsupported."""
    global _registered_ale
    if not _registered_ale:
        try:
            import ale_py
            gym.register_envs(ale_py)
        except ImportError:
            pass
        _registered_ale = True
    try:
        env = gym.make(env_id)
    except gym.error.Error as exc:
        raise ValueError(f"env: cannot make {env_id!r}: {exc}") from None
    if not isinstance(env.action_space, gym.spaces.Discrete):
        raise ValueError(f"env: {env_id!r} has action space {env.action_space}; DQN needs Discrete")
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env


def obs_info(env: gym.Env) -> tuple[tuple, np.dtype]:
    """Observation shape and the dtype the replay stores it in."""
    space = env.observation_space
    dtype = np.uint8 if space.dtype == np.uint8 else np.float32
    return tuple(space.shape), np.dtype(dtype)
