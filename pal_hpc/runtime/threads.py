"""A rank's compute threads: torch's intra-op pool and the BLAS numpy links.

Each rank of a job is one of several processes sharing the node's cores, so its
libraries should not each start a thread per core.  torch has `set_num_threads`; numpy's
OpenBLAS starts one thread per core at import unless OPENBLAS_NUM_THREADS or
OMP_NUM_THREADS was set first, and a plain `mpiexec python -m pal_hpc.main` sets
neither.  The small networks' numpy gradients (DQN, PAAC, PPO on the CPU) then ran their
matrix products on two threads of a 2-core machine, one of them on the core the actor
rank needs: DQN on MinAtar Breakout at `-n 2` made 46,464 env steps in 90 s with
OpenBLAS's default against 56,288 with one thread (Zen 4 EPYC).

`limit_threads(n)` sets both at run time: OpenBLAS through its own
`openblas_set_num_threads`, found in the libraries this process has loaded (numpy's
wheel carries it under a `scipy_openblas` prefix).
"""

from __future__ import annotations

import ctypes
import os

# (setter, getter) names across OpenBLAS builds: numpy's and scipy's wheels (64-bit
# integers, prefixed), and a plain build.
_OPENBLAS = (("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
             ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
             ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
             ("openblas_set_num_threads", "openblas_get_num_threads"))


def _loaded_openblas() -> list[str]:
    """Paths of the OpenBLAS libraries mapped into this process (Linux; [] elsewhere)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(maxsplit=5)[-1].strip() for line in maps
                     if "openblas" in line.lower()}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.isfile(p))


def openblas_threads() -> dict[str, int]:
    """{library path: its thread count} for each OpenBLAS loaded here."""
    out = {}
    for path in _loaded_openblas():
        lib = ctypes.CDLL(path)
        for _, getter in _OPENBLAS:
            if hasattr(lib, getter):
                out[path] = int(getattr(lib, getter)())
                break
    return out


def limit_threads(n: int, torch: bool = True) -> list[str]:
    """torch's intra-op threads (unless `torch` is False: a rank that never imports
    it) and every loaded OpenBLAS's threads to `n`; returns the OpenBLAS libraries it
    set."""
    if torch:
        import torch as _torch   # here: the planner imports this module before it needs torch

        _torch.set_num_threads(n)
    done = []
    for path in _loaded_openblas():
        lib = ctypes.CDLL(path)
        for setter, _ in _OPENBLAS:
            if hasattr(lib, setter):
                getattr(lib, setter)(ctypes.c_int(n))
                done.append(path)
                break
    return done
