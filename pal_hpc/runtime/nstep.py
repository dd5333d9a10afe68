"""n-step returns for one environment at a time."""

from __future__ import annotations

from collections import deque

import numpy as np


class NStep:
    """Turns a stream of (obs, action, reward) into n-step transitions.

    Each transition is (obs_t, a_t, R, next_obs, discount) with
    R = r_t + g r_{t+1} + ... + g^(k-1) r_{t+k-1} and discount = g^k to apply to
    the bootstrap value of next_obs = obs_{t+k}; k = n except at the end of an
    episode.  discount is 0 when the episode terminated (no bootstrap), and g^k
    when it was truncated (the state still has a value).
    """

    def __init__(self, n: int, gamma: float):
        if n < 1:
            raise ValueError(f"n_step must be >= 1, got {n}")
        self.n = n
        self.gamma = gamma
        self._steps: deque = deque()

    def push(self, obs, action, reward, next_obs, terminated: bool, truncated: bool) -> list[tuple]:
        """Record one step; returns the transitions that became complete."""
        self._steps.append((obs, action, float(reward)))
        out = []
        if terminated or truncated:
            while self._steps:
                out.append(self._emit(next_obs, terminated))
        elif len(self._steps) == self.n:
            out.append(self._emit(next_obs, False))
        return out

    def _emit(self, next_obs, terminated: bool) -> tuple:
        ret, g = 0.0, 1.0
        for _, _, r in self._steps:
            ret += g * r
            g *= self.gamma
        obs, action, _ = self._steps.popleft()
        return obs, action, ret, next_obs, 0.0 if terminated else g

    def clear(self) -> None:
        """Drop a partial episode."""
        self._steps.clear()


def transition_spec(obs_shape: tuple, obs_dtype=np.float32, action_shape: tuple = (),
                    action_dtype=np.int64) -> dict:
    """The SharedReplay spec of the transitions actors write (the one copy: tests and
    benchmarks use it too).  The defaults describe a discrete action."""
    return {
        "obs": (tuple(obs_shape), np.dtype(obs_dtype)),
        "action": (tuple(action_shape), np.dtype(action_dtype)),
        "reward": ((), np.dtype(np.float32)),
        "next_obs": (tuple(obs_shape), np.dtype(obs_dtype)),
        "discount": ((), np.dtype(np.float32)),
    }
