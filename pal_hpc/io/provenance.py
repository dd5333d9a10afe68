"""What ran, where, with what: the root attributes of a run's metrics log."""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import h5py

from pal_hpc.io.attrs import clean_text

VERSIONED_PACKAGES = ("numpy", "torch", "gymnasium", "h5py", "mpi4py")


def _git_commit() -> str:
    """HEAD of the checkout the package runs from, or "" (installed copy, no git)."""
    try:
        res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return ""
    return res.stdout.strip() if res.returncode == 0 else ""


def _versions() -> dict[str, str]:
    """Versions of the stack, from package metadata (importing torch would take seconds)."""
    import pal_hpc

    versions = {"python": platform.python_version()}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = ""
    versions["hdf5"] = h5py.version.hdf5_version
    versions["pal_hpc"] = pal_hpc.__version__
    return versions


def run_attributes(cfg_dict: dict, layout: dict, hosts: list, mpi_library: str) -> dict:
    """The root attributes the runtime gives `MetricsLog`: what ran, where, with what.

    The text that comes from outside (the MPI library's version string, which ends in
    a NUL under Open MPI; host names; git's output) is cleaned to what HDF5 stores."""
    return {
        "config": cfg_dict,
        "versions": _versions(),
        "mpi_library": clean_text(mpi_library),
        "layout": layout,
        "hosts": [clean_text(str(host)) for host in hosts],
        "start_time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_commit": clean_text(_git_commit()),
    }
