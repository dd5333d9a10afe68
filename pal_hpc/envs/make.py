"""Building gymnasium environments by id (Atari ids included when ale-py is present)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from pal_hpc.config import ConfigError

_registered_ale = False


def make_env(env_id: str, seed: int) -> gym.Env:
    """A seeded environment; raises ConfigError (a ValueError) naming the id if it is
    unknown or unsupported, so the job rejects it like any bad flag.  A Box action
    space is rescaled to [-1, 1]: every algorithm acts in that range.  Whether the
    spaces suit the algorithm is the algorithm's `check_env`."""
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
    if isinstance(env.action_space, gym.spaces.Box):
        space = env.action_space
        if not (np.isfinite(space.low).all() and np.isfinite(space.high).all()):
            env.close()
            raise ConfigError(f"env: {env_id}'s action space {space} is unbounded; "
                              f"continuous actions are scaled from [-1, 1] to its bounds")
        # Algorithms act in [-1, 1] (tanh policies); the env gets its own bounds.
        ones = np.ones(space.shape, np.float32)     # float32 bounds: no precision warning
        env = gym.wrappers.RescaleAction(env, -ones, ones)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env


def action_info(env: gym.Env) -> tuple[tuple, np.dtype]:
    """Action shape and the dtype the replay stores it in (int64 index or float32)."""
    space = env.action_space
    if isinstance(space, gym.spaces.Discrete):
        return (), np.dtype(np.int64)
    return tuple(space.shape), np.dtype(np.float32)


def obs_info(env: gym.Env) -> tuple[tuple, np.dtype]:
    """Observation shape and the dtype the replay stores it in."""
    space = env.observation_space
    dtype = np.uint8 if space.dtype == np.uint8 else np.float32
    return tuple(space.shape), np.dtype(dtype)
