"""Checks before anything big is allocated: will the replay windows fit this host?"""

from __future__ import annotations

import os

import numpy as np

from mpi4py import MPI

from pal_hpc.cluster.collectives import on_rank0
from pal_hpc.config import ConfigError
from pal_hpc.envs import is_atari
from pal_hpc.replay import FrameStackReplay, SharedReplay
from pal_hpc.runtime.nstep import transition_spec

# replay_capacity 0 ("auto", DQN's default on Atari ids): this many transitions when
# they fit in the node's free memory, else the most that fit.
AUTO_CAPACITY = 1_000_000


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


def replay_kind(cfg, obs: tuple, action: tuple, regions: int) -> tuple[type, dict, dict]:
    """(class, spec, extra constructor arguments) of the node replay: a FrameStackReplay
    (each frame stored once) for the stacked uint8 frames of Atari ids unless
    --no-frame-dedup, else a SharedReplay of whole transitions."""
    (shape, dtype), (ashape, adtype) = obs, action
    if (cfg.frame_dedup and len(shape) == 3 and dtype == np.uint8 and is_atari(cfg.env)):
        return (FrameStackReplay, transition_spec(shape, dtype, ashape, adtype, frame_stack=True),
                {"streams": cfg.envs_per_actor, "n_step": cfg.n_step})
    return SharedReplay, transition_spec(shape, dtype, ashape, adtype), {}


def make_replay(cfg, kind: tuple, node: MPI.Comm, regions: int):
    """The node's replay buffer (collective over `node`) at the checked capacity."""
    cls, spec, extra = kind
    return cls(spec, cfg.replay_capacity, comm=node, regions=regions, fanout=cfg.fanout,
               alpha=cfg.per_alpha, eps=cfg.per_eps, **extra)


def _nbytes(kind: tuple, capacity: int, regions: int, fanout: int) -> int:
    cls, spec, extra = kind
    return cls.window_nbytes(spec, capacity, regions=regions, fanout=fanout, **extra)


def resolve_capacity(world: MPI.Comm, node: MPI.Comm, kind: tuple, cfg, regions: int) -> None:
    """replay_capacity 0 (auto) becomes AUTO_CAPACITY, or the most transitions that fit in
    this host's free memory (MAX_REPLAY_SHARE of it, shared by its replay windows);
    the same value on every rank.  Collective over `world`."""
    if cfg.replay_capacity != 0:
        return
    host = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    try:
        windows = host.allreduce(1 if node.Get_rank() == 0 else 0)
        per = _nbytes(kind, AUTO_CAPACITY, regions, cfg.fanout) / AUTO_CAPACITY
        free, _ = available_memory()
        fits = int(MAX_REPLAY_SHARE * free / windows / per) if host.Get_rank() == 0 else 0
    finally:
        host.Free()
    fits = world.allreduce(fits, op=MPI.MAX)    # one host's answer everywhere
    cfg.replay_capacity = max(cfg.batch_size, cfg.learning_starts, min(AUTO_CAPACITY, fits))


def check_replay_fits(world: MPI.Comm, node: MPI.Comm, kind: tuple, cfg, regions: int) -> None:
    """Refuse, before allocating, replay windows larger than the host can hold (an Atari
    buffer at the default capacity can ask for more than the whole machine).  Collective
    over `world`; virtual nodes on one host add up."""
    try:
        need = _nbytes(kind, cfg.replay_capacity, regions, cfg.fanout)
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
