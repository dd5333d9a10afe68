"""Building gymnasium environments by id (Atari ids included when ale-py is present)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from pal_hpc.config import ConfigError

_registered_ale = False


def make_env(env_id: str, seed: int) -> gym.Env:
    """A seeded environment; raises ConfigError (a ValueError) naming the id if it is
    unknown or unsupported, so the job rejects it like any bad flag."""
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
        raise ConfigError(f"env: cannot make {env_id!r}: {exc}") from None
    if not isinstance(env.action_space, gym.spaces.Discrete):
        env.close()
        raise ConfigError(f"env: dqn needs a Discrete action space; {env_id} has "
                          f"{env.action_space}")
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env


def obs_info(env: gym.Env) -> tuple[tuple, np.dtype]:
    """Observation shape and the dtype the replay stores it in."""
    space = env.observation_space
    dtype = np.uint8 if space.dtype == np.uint8 else np.float32
    return tuple(space.shape), np.dtype(dtype)
