"""Pure-numpy K-ary sum/min tree: the test oracle for `KSumTree`, and a baseline.

It keeps the same semantics as the native tree (float32 leaves, float64 inner
sums, the same descent rule) but recomputes every touched inner node from its
children instead of propagating deltas, so its sums are exact up to one
rounding per level.  Everything is vectorised over the batch, which also makes
it a fair "plain numpy" baseline for the benchmarks (fanout=2 is a binary tree).
"""

from __future__ import annotations

import numbers

import numpy as np

_F32_MAX = float(np.finfo(np.float32).max)


class ReferenceSumTree:
    """Numpy K-ary sum tree with a min-positive tree over `capacity` leaves."""

    def __init__(self, capacity: int, fanout: int = 16):
        if isinstance(capacity, bool) or not isinstance(capacity, numbers.Integral):
            raise TypeError(f"capacity must be an integer, got {type(capacity).__name__}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if fanout < 2 or fanout & (fanout - 1):
            raise ValueError(f"fanout must be a power of two >= 2, got {fanout}")
        self.capacity = int(capacity)
        self.fanout = int(fanout)
        k = self.fanout
        size = -(-self.capacity // k) * k
        self.leaves = np.zeros(size, np.float32)
        self.sums: list[np.ndarray] = []   # level 1 .. root
        self.mins: list[np.ndarray] = []
        while True:
            parents = size // k
            if parents <= 1:
                self.sums.append(np.zeros(1, np.float64))
                self.mins.append(np.full(1, np.inf, np.float32))
                break
            size = -(-parents // k) * k
            self.sums.append(np.zeros(size, np.float64))
            self.mins.append(np.full(size, np.inf, np.float32))

    # -- queries -----------------------------------------------------------
    def total(self) -> float:
        """Sum of all priorities."""
        return float(self.sums[-1][0])

    def min(self) -> float:
        """Smallest positive priority, or 0.0 when all are zero."""
        m = float(self.mins[-1][0])
        return 0.0 if np.isinf(m) else m

    def get(self, indices):
        """Priorities (float32) at `indices`."""
        scalar = np.ndim(indices) == 0
        idx = self._indices(np.atleast_1d(indices))
        out = self.leaves[idx]
        return float(out[0]) if scalar else out

    # -- updates -----------------------------------------------------------
    def update(self, indices, priorities) -> None:
        """Set priorities; the last occurrence of a repeated index wins."""
        idx = self._indices(np.atleast_1d(indices))
        pr = np.asarray(priorities, dtype=np.float64)
        if pr.ndim == 0:
            pr = np.full(idx.shape, pr)
        if pr.shape != idx.shape:
            raise ValueError(f"priorities shape {pr.shape} does not match indices shape {idx.shape}")
        bad = np.flatnonzero(~((pr >= 0) & (pr <= _F32_MAX)))
        if bad.size:
            raise ValueError(f"priorities[{bad[0]}] = {pr[bad[0]]!r} is not a finite, "
                             f"non-negative float32 value")
        self.leaves[idx] = pr.astype(np.float32)
        k = self.fanout
        nodes = idx
        below_sum, below_min = self.leaves, None
        for level_sum, level_min in zip(self.sums, self.mins):
            nodes = np.unique(nodes // k)
            groups = nodes[:, None] * k + np.arange(k)
            children = below_sum[groups].astype(np.float64)
            if below_min is None:   # leaves: a zero priority is "no minimum"
                child_min = np.where(children > 0, children, np.inf).astype(np.float32)
            else:
                child_min = below_min[groups]
            level_sum[nodes] = _sequential_sum(children)
            level_min[nodes] = child_min.min(axis=1)
            below_sum, below_min = level_sum, level_min

    # -- sampling ----------------------------------------------------------
    def find(self, prefix_masses):
        """Leaf index whose prefix interval holds each mass (same rule as KSumTree)."""
        scalar = np.ndim(prefix_masses) == 0
        mass = np.array(np.atleast_1d(prefix_masses), dtype=np.float64)
        if not np.all((mass >= 0) & np.isfinite(mass)):
            raise ValueError("prefix masses must be finite and non-negative")
        if mass.size and not self.total() > 0:
            raise ValueError("cannot sample: every priority in the tree is zero")
        k = self.fanout
        node = np.zeros(mass.shape, np.int64)
        levels = [lv for lv in reversed(self.sums[:-1])] + [self.leaves]
        for level in levels:
            children = level[node[:, None] * k + np.arange(k)].astype(np.float64)
            # The native scan, vectorised over the batch: skip non-positive
            # children, take the first whose mass exceeds what is left,
            # subtracting the ones passed in order.
            picked = np.full(mass.shape, -1, np.int64)
            last = np.full(mass.shape, -1, np.int64)
            for j in range(k):
                v = children[:, j]
                open_ = (picked < 0) & (v > 0)
                last[open_] = j
                hit = open_ & (mass < v)
                picked[hit] = j
                skip = open_ & ~hit
                mass[skip] -= v[skip]
            miss = picked < 0
            if np.any(last[miss] < 0):
                raise ValueError("cannot sample: descent reached an empty subtree")
            # Past the group's end (rounding): the last positive child.
            picked[miss] = last[miss]
            mass[miss] = children[miss, last[miss]]
            node = node * k + picked
        return int(node[0]) if scalar else node

    def sample(self, batch_size: int, rng=None):
        """Stratified proportional sample of `batch_size` leaf indices."""
        if not isinstance(rng, np.random.Generator):
            rng = np.random.default_rng(rng)
        total = self.total()
        if not total > 0:
            raise ValueError("cannot sample: every priority in the tree is zero")
        u = rng.random(batch_size)
        return self.find((np.arange(batch_size) + u) * (total / batch_size))

    def _indices(self, idx: np.ndarray) -> np.ndarray:
        if idx.dtype.kind not in "iu":
            raise TypeError(f"indices must be integers, got dtype {idx.dtype}")
        idx = idx.astype(np.int64, copy=False)
        bad = np.flatnonzero((idx < 0) | (idx >= self.capacity))
        if bad.size:
            raise IndexError(f"indices[{bad[0]}] = {idx[bad[0]]} is out of range "
                             f"[0, {self.capacity})")
        return idx


def _sequential_sum(groups: np.ndarray) -> np.ndarray:
    """Row sums added left to right, as the native code does on a fresh node."""
    acc = np.zeros(groups.shape[0], np.float64)
    for j in range(groups.shape[1]):
        acc += groups[:, j]
    return acc
