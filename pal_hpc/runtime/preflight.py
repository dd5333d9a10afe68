"""Checks before anything big is allocated: will the replay windows fit this host?"""

from __future__ import annotations

import os

from mpi4py import MPI

from pal_hpc.cluster.collectives import on_rank0
from pal_hpc.config import ConfigError
from pal_hpc.replay import SharedReplay


def available_memory() -> tuple[int, str]:
    """Bytes this node can still give a shared-memory window, and where that limit is:
    the smaller of MemAvailable and the free space of /dev/shm (MPICH's windows live
    there, and containers often give it far less than the machine has)."""
    limits = []
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    limits.append((int(line.split()[1]) * 1024, "MemAvailable"))
    except OSError:
        pass
    try:
        st = os.statvfs("/dev/shm")
        limits.append((st.f_bavail * st.f_frsize, "free space in /dev/shm"))
    except OSError:
        pass
    return min(limits) if limits else (1 << 62, "unknown")


# The replay window may take at most this share of what the node has free: actors,
# learners, torch and the page cache need the rest.
MAX_REPLAY_SHARE = 0.8


def check_replay_fits(world: MPI.Comm, node: MPI.Comm, spec: dict, cfg, regions: int) -> None:
    """Refuse, before allocating, replay windows larger than the host can hold (an Atari
    buffer at the default capacity can ask for more than the whole machine).  Collective
    over `world`; virtual nodes on one host add up."""
    try:
        need = SharedReplay.window_nbytes(spec, cfg.replay_capacity, regions=regions,
                                          fanout=cfg.fanout)
    except (ValueError, OverflowError, MemoryError) as exc:
        raise ConfigError(f"replay_capacity: {cfg.replay_capacity:,} transitions cannot be "
                          f"laid out ({exc}); lower --replay-capacity") from None

    host = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    try:
        windows = host.allreduce(1 if node.Get_rank() == 0 else 0)

        def check():
            free, where = available_memory()
            if need * windows > MAX_REPLAY_SHARE * free:
                per = need / cfg.replay_capacity
                fits = int(MAX_REPLAY_SHARE * free / windows / per)
                raise ConfigError(
                    f"replay_capacity: {cfg.replay_capacity:,} transitions of {per:,.0f} B "
                    f"need {need / 2**30:,.2f} GiB of shared memory per node"
                    + (f" ({windows} replay buffers on this host)" if windows > 1 else "")
                    + f", but this host has {free / 2**30:,.2f} GiB free ({where}); lower "
                    f"--replay-capacity to at most {fits:,}")
        on_rank0(host, check)
    finally:
        host.Free()
