"""Run under mpiexec: rank 0 publishes weight vectors while the other ranks of
the node pull them; every pulled vector must be one whole publication (all its
entries carry the same stamp) and versions must never go backwards."""

import sys
import time

import numpy as np
from mpi4py import MPI

from pal_hpc.cluster import node_comm
from pal_hpc.cluster.weights import WeightStore

N = 200_003


def main():
    world = MPI.COMM_WORLD
    node = node_comm(world)
    rank = node.Get_rank()
    store = WeightStore(N, comm=node)
    ok = True
    reads = 0
    deadline = time.monotonic() + 2.0
    if rank == 0:
        stamp = 0
        while time.monotonic() < deadline:
            stamp += 1
            store.publish(np.full(N, stamp, np.float32))
            time.sleep(0.0002)          # learners publish every few updates, not back to back
    else:
        out = np.empty(N, np.float32)
        last = 0
        while time.monotonic() < deadline:
            if store.version() == 0:
                time.sleep(0.0001)
                continue
            v = store.read(out)
            ok &= bool(np.all(out == out[0])) and v >= last and v % 2 == 0
            last = v
            reads += 1
    req = world.Ibarrier()
    while not req.Test():
        time.sleep(0.001)
    total_reads = world.allreduce(reads)
    ok_all = world.allreduce(ok, op=MPI.LAND)
    if world.Get_size() > 1:
        ok_all = ok_all and total_reads > 100
    if world.Get_rank() == 0:
        print(f"ranks={world.Get_size()} reads={total_reads} ok={ok_all}", flush=True)
    store.free()
    node.Free()
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
