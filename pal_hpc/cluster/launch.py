"""Launching MPI jobs from Python (tests, benchmarks): the venv's mpiexec, the right
environment, `python -m mpi4py` so that an uncaught exception aborts the whole job."""

from __future__ import annotations

import os
import sys
from pathlib import Path

MPIEXEC = Path(sys.executable).with_name("mpiexec")


def mpi_env(base: dict | None = None, **extra: str) -> dict:
    """The environment for ranks here: one OpenMP/torch thread each, and MPICH yielding
    instead of busy-polling (ranks often outnumber cores).  `extra` wins."""
    env = dict(os.environ if base is None else base)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
    env.update(extra)
    return env


def mpiexec(nprocs: int, *args: str) -> list[str]:
    """`mpiexec -n N python -m mpi4py ARGS` with the venv's mpiexec and interpreter
    (ARGS: a script and its arguments, or "-m", a module, ...)."""
    if not MPIEXEC.exists():
        raise RuntimeError(f"mpiexec not found next to {sys.executable}; run `make install`")
    return [str(MPIEXEC), "-n", str(nprocs), sys.executable, "-m", "mpi4py", *map(str, args)]


def pal_main(nprocs: int, *flags: str) -> list[str]:
    """`mpiexec -n N python -m mpi4py -m pal_hpc.main FLAGS`."""
    return mpiexec(nprocs, "-m", "pal_hpc.main", *flags)
