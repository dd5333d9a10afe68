"""Weight publication through the node's shared window: never torn, never older."""

import numpy as np
import pytest

from conftest import ROOT
from pal_hpc.cluster.weights import WeightStore

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("nprocs", [1, 3])
def test_weights_never_torn(mpi, nprocs):
    proc = mpi(nprocs, ROOT / "tests/mpi/weights_check.py", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ranks={nprocs} " in proc.stdout and "ok=True" in proc.stdout


def test_private_store_round_trip():
    store = WeightStore(10)
    assert store.version() == 0
    v = store.publish(np.arange(10))
    out = np.empty(10, np.float32)
    assert store.read(out) == v == 2
    np.testing.assert_array_equal(out, np.arange(10, dtype=np.float32))
    with pytest.raises(ValueError, match="10"):
        store.publish(np.zeros(9))
    with pytest.raises(ValueError):
        store.read(np.empty(10, np.float64))
