"""Proportional prioritized replay (Schaul et al., 2016) on one private `KSumTree`:
the maths both framework adapters share, with no framework imported.

A slot's priority is p = raw + eps (raw: |TD error|, or whatever the caller passes);
the tree holds p ** alpha, so a slot is drawn with probability p_i^a / sum_j p_j^a, and
its importance weight, normalised by the largest one in the buffer as the PER paper
does, is (P_i / P_min) ** -beta = (p_i^a / min_j p_j^a) ** -beta.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from pal_hpc.replay import KSumTree

_F32_MAX = float(np.finfo(np.float32).max)


def check_priorities(values, name: str = "priorities") -> np.ndarray:
    """`values` as a float64 array, or the tree's ValueError naming the first bad one
    (negative, NaN, infinite or beyond float32), before anything is written."""
    arr = np.asarray(values)
    if arr.dtype.kind not in "fiub":
        raise TypeError(f"{name} must be real numbers, got dtype {arr.dtype}")
    arr = arr.astype(np.float64, copy=False)
    # NaN fails both comparisons; the index of the culprit is only looked for on failure.
    if not ((arr >= 0.0).all() and (arr <= _F32_MAX).all()):
        bad = np.flatnonzero(~((arr >= 0.0) & (arr <= _F32_MAX)))
        pos = np.unravel_index(bad[0], arr.shape) if arr.ndim > 1 else bad[0]
        raise ValueError(f"{name}[{pos}] = {float(arr.flat[bad[0]])!r} is not a finite, "
                         f"non-negative float32 value")
    return arr


def check_exponent(name: str, value) -> float:
    """`value` as a float, or ValueError naming `name` unless it is finite and >= 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


class ProportionalPriorities:
    """Priorities of `capacity` slots: a `KSumTree` of p ** alpha and the p themselves.

    Slots never given a priority hold 0 and are never drawn."""

    def __init__(self, capacity: int, alpha: float, eps: float, fanout: int = 16):
        self.alpha = check_exponent("alpha", alpha)
        self.eps = check_exponent("eps", eps)
        self.tree = KSumTree(capacity, fanout)   # the tree's own capacity/fanout errors
        self.capacity = int(capacity)
        self.fanout = int(fanout)
        # p = raw + eps per slot (0: never set); kept so alpha can change exactly and
        # priorities() needs no inversion of the tree's p ** alpha.
        self.p = np.zeros(self.capacity, np.float64)

    def set(self, indices, raw) -> np.ndarray:
        """Give `indices` the priorities raw + eps (raw >= 0, a scalar broadcasts).
        Raises before changing anything on a bad index or value; returns raw as float64."""
        raw = check_priorities(raw)
        idx = np.asarray(indices)
        if raw.ndim == 0:
            raw = np.full(idx.shape, float(raw))
        p = raw + self.eps
        self.tree.update(idx, p ** self.alpha)   # validates idx (IndexError) first
        self.p[idx] = p
        return raw

    def set_alpha(self, alpha: float) -> None:
        """Change alpha and re-raise every stored priority to it (exact: p is kept)."""
        alpha = check_exponent("alpha", alpha)
        if alpha == self.alpha:
            return
        self.alpha = alpha
        held = np.flatnonzero(self.p > 0)
        if held.size:
            self.tree.update(held, self.p[held] ** alpha)

    def clear(self) -> None:
        """Every slot back to priority 0."""
        self.tree = KSumTree(self.capacity, self.fanout)
        self.p[:] = 0.0

    def load(self, p) -> None:
        """Replace every slot's priority p (0 = empty) with `p`, e.g. from a checkpoint."""
        p = check_priorities(p, "p")
        if p.shape != (self.capacity,):
            raise ValueError(f"priorities have shape {p.shape}, expected ({self.capacity},)")
        tree = KSumTree(self.capacity, self.fanout)
        held = np.flatnonzero(p > 0)
        tree.update(held, p[held] ** self.alpha)
        self.tree, self.p = tree, p.copy()

    def __getstate__(self):
        # Pickles (SB3's save_replay_buffer, torchrl's copies) hold p; the native tree,
        # which cannot be pickled, is rebuilt from it.
        return {"capacity": self.capacity, "alpha": self.alpha, "eps": self.eps,
                "fanout": self.fanout, "p": self.p}

    def __setstate__(self, state):
        self.__init__(state["capacity"], state["alpha"], state["eps"], state["fanout"])
        self.load(state["p"])

    def sample(self, u: np.ndarray, beta: float, stratified: bool
               ) -> tuple[np.ndarray, np.ndarray]:
        """Slots for uniforms `u` in [0, 1) (one per draw) and their importance weights
        (P_i / P_min) ** -beta as float32.  `stratified` puts draw i in the i-th of
        len(u) equal slices of the mass (PER paper); otherwise draws are i.i.d."""
        beta = check_exponent("beta", beta)
        total = self.tree.total()
        if not total > 0.0:
            raise ValueError("cannot sample: every priority in the tree is zero "
                             "(nothing has been added yet)")
        n = u.shape[0]
        masses = (np.arange(n) + u) * (total / n) if stratified else u * total
        idx = self.tree.find(masses)
        leaf = self.tree.get(idx).astype(np.float64)
        weights = (leaf / float(self.tree.min())) ** -beta
        return idx, weights.astype(np.float32)
