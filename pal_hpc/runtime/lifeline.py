"""A rank never outlives its job: it dies with its launcher and leaves no files behind.

- When the process that started this rank dies (hydra's `hydra_pmi_proxy` or SLURM's
  `slurmstepd`, killed by an OOM killer, say), nothing tells the rank: it ran on as an
  orphan at full CPU, and mpiexec waited for it.  Linux's PR_SET_PDEATHSIG makes the
  kernel SIGKILL the rank the moment its parent exits, even inside a blocking MPI call.
- MPICH keeps its intranode segment (`/dev/shm/mpich_shm_*`, about 1 MB per local
  rank, made in MPI_Init) linked until MPI_Finalize, so every abort or kill leaked one.
  (The node windows of `cluster.window` are not the leak: MPICH unlinks those as soon as
  they are mapped.)  Once every rank of the node has mapped the segment its name is not
  needed, so unlinking it then frees the memory with the last rank, however it ends.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

# Set by the launchers that start ranks: hydra (PMI-1/2), PMIx, Open MPI, srun.
LAUNCHER_ENV = ("PMI_RANK", "PMI_FD", "PMI_PORT", "PMIX_RANK", "OMPI_COMM_WORLD_RANK",
                "SLURM_STEP_ID")
PR_SET_PDEATHSIG = 1                # from <linux/prctl.h>
ORPHANED_EXIT = 128 + signal.SIGKILL  # what the kernel's SIGKILL would have given
SEGMENT_PREFIX = "/dev/shm/mpich_"


def under_launcher(environ=os.environ) -> bool:
    """True when a process manager started this process (not a plain `python` run,
    whose parent is a shell that may go away while the run should carry on)."""
    return any(name in environ for name in LAUNCHER_ENV)


def tie_to_launcher() -> bool:
    """Have the kernel SIGKILL this rank when its launcher dies (Linux, under a launcher).

    Call first thing in a rank.  A launcher that died before the call is caught too:
    this process has then been handed to init (pid 1) and exits at once.  (A sub-reaper
    other than init would hide that early death; MPI_Init then fails instead.)
    Returns whether the tie is in place.
    """
    if not sys.platform.startswith("linux") or not under_launcher():
        return False
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return False
    if parent == 1 or os.getppid() != parent:
        os._exit(ORPHANED_EXIT)
    return True


def mapped_segments(maps: str = "/proc/self/maps", prefix: str = SEGMENT_PREFIX) -> list[str]:
    """Paths under `prefix` that this process maps and that still have a name, sorted."""
    found = set()
    with open(maps) as fh:
        for line in fh:
            parts = line.rstrip("\n").split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith(prefix) \
                    and not parts[5].endswith(" (deleted)"):
                found.add(parts[5])
    return sorted(found)


def unlink_node_segments(world) -> list[str]:
    """Unlink MPICH's shared-memory files once every rank of this node has mapped them.

    Collective over `world` (call it on every rank, right after MPI is up).  Returns the
    paths this rank mapped; a path another rank of the node unlinked first is fine.
    """
    from mpi4py import MPI

    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    try:
        node.Barrier()              # each rank of the node is past MPI_Init: all mapped it
        paths = mapped_segments() if os.path.exists("/proc/self/maps") else []
        for path in paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
    finally:
        node.Free()
    return paths
