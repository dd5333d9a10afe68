"""n-step returns for one environment at a time."""

from __future__ import annotations

from collections import deque

import numpy as np

from pal_hpc.replay.frames import FrameStack


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

    def push(self, obs, action, reward, next_obs, terminated: bool, truncated: bool,
             with_k: bool = False) -> list[tuple]:
        """Record one step; returns the transitions that became complete (with
        `with_k`, each tuple ends with k, the steps from obs_t to next_obs)."""
        self._steps.append((obs, action, float(reward)))
        out = []
        if terminated or truncated:
            while self._steps:
                out.append(self._emit(next_obs, terminated, with_k))
        elif len(self._steps) == self.n:
            out.append(self._emit(next_obs, False, with_k))
        return out

    def _emit(self, next_obs, terminated: bool, with_k: bool) -> tuple:
        ret, g = 0.0, 1.0
        for _, _, r in self._steps:
            ret += g * r
            g *= self.gamma
        k = len(self._steps)
        obs, action, _ = self._steps.popleft()
        out = (obs, action, ret, next_obs, 0.0 if terminated else g)
        return out + (k,) if with_k else out

    def clear(self) -> None:
        """Drop a partial episode."""
        self._steps.clear()


class FrameRows:
    """Rows for a FrameStackReplay stream from one environment's steps.

    Each observation obs_t (a stack, oldest frame first) becomes one row holding
    its newest frame obs_t[-1] and its n-step transition (action, return,
    discount, k = steps to the successor), emitted when the transition is
    complete; an episode's end adds a row with its final observation's newest
    frame (k = 0), so the true final observation of a truncated or terminated
    episode is kept.  Rows are (frame, action, return, discount, k, episode_start)."""

    def __init__(self, n: int, gamma: float):
        self.nstep = NStep(n, gamma)
        self.start = True

    def push(self, obs, action, reward, next_obs, terminated: bool, truncated: bool
             ) -> list[tuple]:
        """Record one step; returns the rows that became complete, in stream order."""
        # A copy: the caller reuses its observation arrays.
        done = self.nstep.push((np.array(obs[-1]), self.start), action, reward, None, terminated,
                               truncated, with_k=True)
        rows = [(frame, a, ret, disc, k, start) for (frame, start), a, ret, _, disc, k in done]
        self.start = False
        if terminated or truncated:
            rows.append((np.array(next_obs[-1]), np.zeros_like(action), 0.0, 0.0, 0, False))
            self.start = True
        return rows

    def clear(self) -> None:
        """Drop a partial episode (the next push starts a new one)."""
        self.nstep.clear()
        self.start = True


def transition_spec(obs_shape: tuple, obs_dtype=np.float32, action_shape: tuple = (),
                    action_dtype=np.int64, frame_stack: bool = False) -> dict:
    """The SharedReplay spec of the transitions actors write (the one copy: tests and
    benchmarks use it too).  The defaults describe a discrete action.  With
    `frame_stack`, obs (stack, *frame) becomes a FrameStack field (each frame stored
    once, next_obs rebuilt from it): a FrameStackReplay's spec."""
    if frame_stack:
        return {
            "obs": FrameStack(tuple(obs_shape[1:]), np.dtype(obs_dtype), int(obs_shape[0])),
            "action": (tuple(action_shape), np.dtype(action_dtype)),
            "reward": ((), np.dtype(np.float32)),
            "discount": ((), np.dtype(np.float32)),
        }
    return {
        "obs": (tuple(obs_shape), np.dtype(obs_dtype)),
        "action": (tuple(action_shape), np.dtype(action_dtype)),
        "reward": ((), np.dtype(np.float32)),
        "next_obs": (tuple(obs_shape), np.dtype(obs_dtype)),
        "discount": ((), np.dtype(np.float32)),
    }
