"""The tree inside a real MPI shared-memory window, under mpiexec with 1 and 3 ranks."""

import pytest

from conftest import ROOT

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("nprocs", [1, 3])
def test_tree_in_shared_window(mpi, nprocs):
    proc = mpi(nprocs, ROOT / "tests/mpi/ksumtree_window.py", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ranks={nprocs} ok=True" in proc.stdout


