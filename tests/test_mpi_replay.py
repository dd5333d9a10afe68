"""SharedReplay in a real MPI shared window: concurrent writers and samplers under mpiexec."""

import pytest

from conftest import ROOT

pytestmark = pytest.mark.mpi

STRESS = ROOT / "tests/mpi/replay_stress.py"


@pytest.mark.parametrize("nprocs,writers", [(1, 1), (4, 3), (4, 2), (4, 1)])
def test_invariants_under_concurrent_writers_and_samplers(mpi, nprocs, writers):
    proc = mpi(nprocs, STRESS, "--writers", str(writers), "--seconds", "3", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ranks={nprocs} writers={writers} " in proc.stdout
    assert "ok=True" in proc.stdout, proc.stdout + proc.stderr


def test_checker_catches_a_torn_read(mpi):
    """One sampled row is corrupted on purpose: the script must notice and fail."""
    proc = mpi(2, STRESS, "--writers", "1", "--seconds", "1", "--self-test-tear", timeout=120)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "torn read" in proc.stdout, proc.stdout + proc.stderr
    assert "ok=False" in proc.stdout


FRAMES = ROOT / "tests/mpi/frame_replay_stress.py"


@pytest.mark.parametrize("nprocs,writers,capacity", [(1, 1, 3000), (4, 2, 3000), (3, 1, 300)])
def test_frame_stacks_exact_under_concurrent_writers_and_samplers(mpi, nprocs, writers, capacity):
    """Invariant 7: stacks never torn, never across episodes, windows whole, stale
    tickets dropped -- with a buffer small enough to be overwritten many times over."""
    proc = mpi(nprocs, FRAMES, "--writers", str(writers), "--seconds", "3",
               "--capacity", str(capacity), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ranks={nprocs} writers={writers} ok=True" in proc.stdout, proc.stdout + proc.stderr


def test_frame_checker_catches_a_torn_frame(mpi):
    proc = mpi(2, FRAMES, "--writers", "1", "--seconds", "1", "--self-test-tear", timeout=120)
    assert proc.returncode != 0 and "torn or foreign frame" in proc.stdout, \
        proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("nprocs", [1, 2])
def test_hundred_thousand_atari_frames_fit(mpi, nprocs):
    """100k 84x84x4 uint8 frames (2.6 GiB) live once per node and sample back intact."""
    proc = mpi(nprocs, ROOT / "tests/mpi/replay_atari.py", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ranks={nprocs} ok=True" in proc.stdout
