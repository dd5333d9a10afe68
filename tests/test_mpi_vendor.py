"""Which MPI the venv runs, and the launcher flags and stop signal that follow from it
(MPICH's hydra, Open MPI's prterun, Intel MPI's hydra); one job under the venv's
mpiexec checks that the ranks load the library the launcher belongs to."""

from __future__ import annotations

import os
import re
import signal
import subprocess

import pytest

from conftest import VENDOR
from pal_hpc.cluster.launch import clear_stale_sessions, launcher_flags, mpi_vendor, stop_signal

VERSIONS = [
    ("MPICH Version:      5.0.2\nMPICH Release date: unreleased\n", "mpich"),
    ("HYDRA build details:\n    Version:   5.0.2\n", "mpich"),
    ("MVAPICH2 Version     :\t2.3.7\n", "mpich"),
    ("CRAY MPICH version 8.1.28.25 (ANL base 3.4a2)", "mpich"),
    ("Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11\x00",
     "openmpi"),
    ("mpiexec (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/", "openmpi"),
    ("prterun (PRRTE) 3.0.13", "openmpi"),
    ("Intel(R) MPI Library 2021.19 for Linux* OS\n", "impi"),
    ("Intel(R) MPI Library for Linux* OS, Version 2021.19 Build 20250908\n"
     "HYDRA build details:", "impi"),
    ("some other MPI 1.0", "unknown"),
]


@pytest.mark.parametrize("text, vendor", VERSIONS)
def test_vendor_from_library_or_launcher_version(text, vendor):
    assert mpi_vendor(text) == vendor


def test_open_mpi_gets_oversubscription_no_binding_and_root_flags_others_none():
    assert launcher_flags("openmpi", euid=0) == ["--oversubscribe", "--bind-to", "none",
                                                  "--allow-run-as-root"]
    assert launcher_flags("openmpi", euid=1000) == ["--oversubscribe", "--bind-to", "none"]
    for vendor in ("mpich", "impi", "unknown"):
        assert launcher_flags(vendor, euid=0) == []


def test_stop_signal_is_the_one_the_launcher_forwards():
    assert stop_signal("mpich") == stop_signal("impi") == signal.SIGTERM
    assert stop_signal("openmpi") == signal.SIGUSR1


def test_stale_open_mpi_sessions_are_cleared_live_ones_kept(tmp_path):
    """A killed launcher's `ompi.<pid>` would break a later launcher given its pid."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = tmp_path / f"ompi.{gone.pid}"
    (dead / "0").mkdir(parents=True)
    (dead / "pmix.vm.tool").write_text("")
    live = tmp_path / f"ompi.{os.getpid()}"
    live.mkdir()
    other = [tmp_path / "ompi.log", tmp_path / "ompi.vm.0"]
    other[0].write_text("")
    other[1].mkdir()
    assert clear_stale_sessions(tmp_path) == [dead]
    assert not dead.exists() and live.is_dir() and all(p.exists() for p in other)


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 3])
def test_ranks_load_the_launchers_mpi(mpi, nprocs):
    """mpi4py's wheel picks the MPI library it finds: the venv's, the launcher's own."""
    code = ("from mpi4py import MPI; from pal_hpc.cluster.launch import mpi_vendor; "
            "v = mpi_vendor(MPI.Get_library_version()); "
            "print(f'rank {MPI.COMM_WORLD.Get_rank()} of {MPI.COMM_WORLD.Get_size()}: {v};')")
    proc = mpi(nprocs, "-c", code, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert VENDOR in ("mpich", "openmpi", "impi"), VENDOR
    # (the ranks' lines may interleave)
    said = sorted(re.findall(r"rank (\d+) of (\d+): (\w+);", proc.stdout))
    assert said == [(str(r), str(nprocs), VENDOR) for r in range(nprocs)], proc.stdout
