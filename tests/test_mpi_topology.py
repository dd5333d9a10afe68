"""The topology under real mpiexec: roles, node and learner communicators, shared windows."""

import pytest

from conftest import ROOT

pytestmark = pytest.mark.mpi

SCRIPT = ROOT / "tests/mpi/topology_check.py"


@pytest.mark.parametrize("nprocs, args, summary", [
    (1, [], "nodes=1 learners=1 actors=1"),                             # solo
    (4, [], "nodes=1 learners=1 actors=3"),                             # auto
    (4, ["--learners-per-node", "2"], "nodes=1 learners=2 actors=2"),
    (4, ["--ranks-per-node", "2"], "nodes=2 learners=2 actors=2"),      # virtual nodes
    (3, ["--ranks-per-node", "2"], "nodes=2 learners=2 actors=2"),      # 2 + 1 (solo)
])
def test_topology_under_mpiexec(mpi, nprocs, args, summary):
    proc = mpi(nprocs, SCRIPT, *args, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ranks={nprocs} {summary} ok=True" in proc.stdout, proc.stdout + proc.stderr


def test_topology_over_a_reordered_world(mpi):
    proc = mpi(3, SCRIPT, "--ranks-per-node", "2", env={"TOPOLOGY_CHECK_REVERSED": "1"},
               timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ranks=3 nodes=2 learners=2 actors=2 ok=True" in proc.stdout, proc.stdout


def test_bad_layout_fails_every_rank_naming_the_field(mpi):
    proc = mpi(2, SCRIPT, "--learners-per-node", "2", timeout=120)
    assert proc.returncode != 0
    assert "learners_per_node: 2 learners + 1 actor need 3 ranks per node" in proc.stderr
