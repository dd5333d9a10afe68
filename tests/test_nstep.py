"""n-step returns against a hand computation."""

import numpy as np
import pytest

from pal_hpc.runtime.nstep import NStep


def test_full_windows_then_termination():
    ns = NStep(3, 0.5)
    out = []
    for t in range(5):
        out += ns.push(t, t, 1.0, t + 1, terminated=(t == 4), truncated=False)
    # t=0,1 complete as full windows at t=2,3; the episode ends at t=4 and flushes 2,3,4.
    assert [o[0] for o in out] == [0, 1, 2, 3, 4]
    assert out[0] == (0, 0, 1 + 0.5 + 0.25, 3, 0.125)
    assert out[1] == (1, 1, 1.75, 4, 0.125)
    assert out[2] == (2, 2, 1.75, 5, 0.0)     # terminated: no bootstrap
    assert out[3] == (3, 3, 1.5, 5, 0.0)
    assert out[4] == (4, 4, 1.0, 5, 0.0)


def test_truncation_bootstraps():
    ns = NStep(3, 0.9)
    ns.push("a", 0, 1.0, "b", False, False)
    out = ns.push("b", 1, 2.0, "c", False, True)
    assert out[0][2:] == (1.0 + 0.9 * 2.0, "c", pytest.approx(0.81))
    assert out[1][2:] == (2.0, "c", pytest.approx(0.9))


def test_one_step_is_plain_td():
    ns = NStep(1, 0.99)
    assert ns.push(np.zeros(2), 1, 3.0, np.ones(2), False, False)[0][2:4][0] == 3.0
    with pytest.raises(ValueError):
        NStep(0, 0.99)
