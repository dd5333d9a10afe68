"""Running mean and variance of observations and of discounted returns, merged from
every master's round by count-weighted moments.

Each round every master measures its own round's moments (count, mean, variance:
`moments`); the runtime gathers them, and every master folds them into its running
statistics in master order (`RunningMoments.merge`, the parallel-variance rule of Chan,
Golub and LeVeque), so all masters hold the same statistics to the bit.  The round's
own observations and rewards are normalized with the statistics of the round's start
(frozen for the round, the same on every master), and its moments enter after it.

The reward scale is that of gymnasium's NormalizeReward as CleanRL uses it: a per-env
discounted return G <- gamma G + r (set to 0 at an episode's end), whose running
variance scales the rewards, r / sqrt(var + 1e-8).
"""

from __future__ import annotations

import numpy as np

EPS = 1e-8          # inside the root, as gymnasium's wrappers
INITIAL_COUNT = 1e-4


def moments(x: np.ndarray) -> np.ndarray:
    """[count, mean..., var...] of the rows of `x` (N, *shape), float64 (count 0: the
    mean and variance are 0)."""
    x = np.asarray(x, np.float64).reshape(len(x), -1)
    if not len(x):
        return np.zeros(1 + 2 * x.shape[1])
    return np.concatenate([[len(x)], x.mean(axis=0), x.var(axis=0)])


class RunningMoments:
    """Count, mean and variance of everything merged so far (float64); starts at mean
    0, variance 1 and a tiny count, as gymnasium's RunningMeanStd."""

    def __init__(self, shape: tuple):
        self.shape = tuple(shape)
        self.count = INITIAL_COUNT
        self.mean = np.zeros(self.shape)
        self.var = np.ones(self.shape)

    def merge(self, m: np.ndarray) -> None:
        """Fold in a batch's `moments` (count-weighted)."""
        k = int(np.prod(self.shape, dtype=np.int64))
        count = float(m[0])
        if count == 0:
            return
        mean = m[1:1 + k].reshape(self.shape)
        var = m[1 + k:1 + 2 * k].reshape(self.shape)
        total = self.count + count
        delta = mean - self.mean
        m2 = self.var * self.count + var * count + delta ** 2 * self.count * count / total
        self.mean = self.mean + delta * count / total
        self.var = m2 / total
        self.count = total

    def normalize(self, x: np.ndarray, clip: float) -> np.ndarray:
        """(x - mean) / sqrt(var + 1e-8), clipped to +-clip, as float32."""
        out = (np.asarray(x, np.float64) - self.mean) / np.sqrt(self.var + EPS)
        return np.clip(out, -clip, clip).astype(np.float32)

    def state_dict(self) -> dict:
        return {"count": self.count, "mean": self.mean.copy(), "var": self.var.copy()}

    def load_state_dict(self, state: dict) -> None:
        mean, var = np.asarray(state["mean"], np.float64), np.asarray(state["var"], np.float64)
        if mean.shape != self.shape or var.shape != self.shape:
            raise ValueError(f"normalizer state of shape {mean.shape}, expected {self.shape}")
        self.count, self.mean, self.var = float(state["count"]), mean.copy(), var.copy()


def discounted_returns(carry: np.ndarray, reward: np.ndarray, valid: np.ndarray,
                       ended: np.ndarray, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """The per-env discounted returns G of a round's valid steps (the values whose
    variance scales the rewards), and the carry after the round.  `carry` (N,) is G
    before the round; rows are (T, N); G is 0 again after an episode's end."""
    g = np.array(carry, np.float64)
    out = []
    for t in range(len(reward)):
        v = valid[t]
        g = np.where(v, g * gamma + reward[t], g)
        out.append(g[v])
        g = np.where(ended[t], 0.0, g)
    return (np.concatenate(out) if out else np.zeros(0)), g
