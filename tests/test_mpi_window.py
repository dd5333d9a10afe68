"""Node shared memory under mpiexec: the tree inside a real MPI shared-memory window
(1 and 3 ranks), and the node barrier on futex words in such a window (1, 4 and 6
ranks: oversubscribed, where its waiters must sleep rather than spin)."""

import pytest

from conftest import ROOT

pytestmark = pytest.mark.mpi

BARRIER = ROOT / "tests/mpi/node_barrier_check.py"


@pytest.mark.parametrize("nprocs", [1, 3])
def test_tree_in_shared_window(mpi, nprocs):
    proc = mpi(nprocs, ROOT / "tests/mpi/ksumtree_window.py", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ranks={nprocs} ok=True" in proc.stdout


@pytest.mark.parametrize("nprocs", [1, 4, 6])
def test_the_node_barrier_orders_turns_and_shows_each_turns_writes(mpi, nprocs):
    """300 rounds of turns at unsynchronized read-modify-writes of shared counters,
    one barrier between turns: an overlap of two turns would lose an increment, and
    every rank checks every other rank's write of the round after its last barrier.
    (A barrier that returned at once fails it.)"""
    rounds = 300
    proc = mpi(nprocs, BARRIER, "turns", str(rounds), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert f"counters {rounds * nprocs} {rounds * nprocs * (nprocs + 1) // 2}" in proc.stdout


def test_a_node_barrier_a_rank_never_reaches_raises_after_its_timeout(mpi):
    proc = mpi(2, BARRIER, "timeout", timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "did not open within 1 s: a rank of the node is stuck" in proc.stdout
    waited = float(proc.stdout.split("raised after ")[1].split(" s")[0])
    assert 0.9 <= waited < 10, proc.stdout
