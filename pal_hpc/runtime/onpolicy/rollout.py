"""A master's round of experience: the rollout arrays, and the environments' seeds."""

from __future__ import annotations

import numpy as np


def env_seed(seed: int, node: int, index: int, start_update: int) -> int:
    """Seed of environment `index` of `node`; a resumed run (start_update > 0) plays
    other episodes than the run it continues."""
    return int(np.random.SeedSequence([seed, node, index, start_update]).generate_state(1)[0])


class Rollout:
    """One round's arrays, laid out as the algorithm's `compute_gradients` /
    `begin_update` take them (`pal_hpc.algos.paac.loss` describes the layout), with
    the algorithm's per-step extras (`rollout_fields`: PPO's log-probs and values)."""

    def __init__(self, t_max: int, n: int, obs_shape: tuple, obs_dtype,
                 action_shape: tuple = (), action_dtype=np.int64,
                 extras: dict[str, tuple[tuple, object]] | None = None):
        self.obs = np.zeros((t_max + 1, n, *obs_shape), obs_dtype)
        self.action = np.zeros((t_max, n, *action_shape), action_dtype)
        self.reward = np.zeros((t_max, n), np.float32)
        self.terminated = np.zeros((t_max, n), bool)
        self.truncated = np.zeros((t_max, n), bool)
        self.valid = np.zeros((t_max, n), bool)
        self.extras = {name: np.zeros((t_max, n, *shape), dtype)
                       for name, (shape, dtype) in (extras or {}).items()}

    def batch(self) -> dict[str, np.ndarray]:
        return {"obs": self.obs, "action": self.action, "reward": self.reward,
                "terminated": self.terminated, "truncated": self.truncated,
                "valid": self.valid, **self.extras}
