"""No unbounded drift: the total stays equal to the exact sum of the leaves."""

import math

import numpy as np
import pytest

from pal_hpc.replay import KSumTree


@pytest.mark.slow
@pytest.mark.parametrize("fanout", [16, 2])
def test_total_after_ten_million_updates(fanout):
    cap = 2**20
    rng = np.random.default_rng(2024 + fanout)
    tree = KSumTree(cap, fanout)
    batch = 1 << 16
    scales = 10.0 ** np.arange(-3, 4)         # priorities over six decades
    for step in range(10_000_000 // batch + 1):
        idx = rng.integers(0, cap, batch)
        p = rng.random(batch) * scales[step % len(scales)]
        p[rng.random(batch) < 0.05] = 0.0
        tree.update(idx, p)
    leaves = tree.get(np.arange(cap)).astype(np.float64)
    exact = math.fsum(leaves)
    assert abs(tree.total() - exact) / exact <= 1e-5
    # Much tighter in practice (float64 inner sums): keep an eye on regressions.
    assert abs(tree.total() - exact) / exact <= 1e-9
    positive = leaves[leaves > 0]
    assert tree.min() == positive.min()
