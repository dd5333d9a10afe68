"""The actor side of the algorithm contract (`pal_hpc.algos.base`), without torch:
`Policy`, what an actor rank runs.  A policy in numpy (DQN's on vector observations,
`pal_hpc.algos.dqn_acting`) lets an actor rank that is not a learner start without
importing torch at all (`AlgoSpec.numpy_policy`)."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class Policy(ABC):
    """What an actor runs: `act` on a batch of observations, with exploration.

    Parameters come from the learners' published flat vector (`set_flat_params`);
    a policy never learns."""

    @property
    @abstractmethod
    def num_params(self) -> int:
        """Length of the flat vector `set_flat_params` takes."""

    @abstractmethod
    def set_flat_params(self, flat: np.ndarray) -> None:
        """Load the parameters the learners published (a copy; never aliased)."""

    @abstractmethod
    def act(self, obs: np.ndarray, rng: np.random.Generator, global_steps: float,
            deterministic: bool = False) -> np.ndarray:
        """Actions for a batch of observations (B, *obs_shape), in the env's action
        space (Discrete: int64 (B,); Box: float32 (B, act_dim) in [-1, 1], which the
        runtime's environments take).  `global_steps` (env steps of the whole job)
        drives exploration schedules; `deterministic` is the evaluation policy
        (greedy, or the mean action)."""


__all__ = ["Policy"]
