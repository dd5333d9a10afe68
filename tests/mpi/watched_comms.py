"""Communicators derived from the watched COMM_WORLD, under mpiexec.

`members`: every way of deriving one (Dup, a Dup's Dup, Split, Split_type, Create,
Create_group) gives a WatchedComm that knows its members' world ranks; prints one
line per rank.  `frozen-dup`: rank 1 freezes itself (SIGSTOP, its probe responder
with it) while the others wait in a barrier on a Dup of the world, with a deadline of
the argument's seconds: the job must end naming rank 1 as lost."""

import os
import signal
import sys

from mpi4py import MPI

from pal_hpc.cluster import deadline
from pal_hpc.cluster.collectives import wait_all
from pal_hpc.cluster.watched import WatchedComm


def members(comm) -> tuple:
    world, group = MPI.COMM_WORLD.Get_group(), comm.Get_group()
    try:
        return tuple(MPI.Group.Translate_ranks(group, range(group.Get_size()), world))
    finally:
        group.Free()
        world.Free()


def check_members(world) -> None:
    rank = world.Get_rank()
    dup = world.Dup()
    made = {"Dup": dup, "Dup.Dup": dup.Dup(), "Split": world.Split(rank % 2, rank),
            "Split_type": world.Split_type(MPI.COMM_TYPE_SHARED),
            "Create": world.Create(world.Get_group().Incl(list(range(0, world.Get_size(), 2))))}
    made["Split.Dup"] = made["Split"].Dup()
    made["Create_group"] = world.Create_group(world.Get_group().Excl([0])) \
        if world.Get_size() > 1 and rank != 0 else None
    for name, comm in made.items():
        if comm is None or comm == MPI.COMM_NULL:
            continue
        assert isinstance(comm, WatchedComm), (name, type(comm))
        assert comm._world_ranks == members(comm), (name, comm._world_ranks, members(comm))
        assert rank in comm._world_ranks, (name, comm._world_ranks)
    print(f"rank {rank}: {len(made)} derived communicators know their members", flush=True)


def frozen_dup(world, timeout: float) -> None:
    dup = world.Dup()
    if world.Get_rank() == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    wait_all(dup)
    print(f"rank {world.Get_rank()}: the barrier completed", flush=True)


if __name__ == "__main__":
    mode, timeout = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 30.0
    comm_world = deadline.start(timeout)
    if mode == "members":
        check_members(comm_world)
    else:
        frozen_dup(comm_world, timeout)
    deadline.stop()
