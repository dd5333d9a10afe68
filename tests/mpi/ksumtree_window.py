"""Run under mpiexec: one KSumTree in an MPI shared window, used by every rank.

Rank 0 of the node initialises the tree in the window; the other ranks attach.
Ranks then take turns writing their own leaves (the tree is single-writer; the
concurrent protocol comes with SharedReplay), and every rank checks that it sees
every write and draws the same samples.  Pass/fail is combined over all ranks.
"""

import sys

import numpy as np
from mpi4py import MPI

from pal_hpc.cluster import allocate_shared, node_comm
from pal_hpc.replay import KSumTree

CAP, K = 100_003, 16


def main():
    world = MPI.COMM_WORLD
    node = node_comm(world)
    rank, size = node.Get_rank(), node.Get_size()
    shared = allocate_shared(node, KSumTree.nbytes(CAP, K))
    if rank == 0:
        KSumTree(CAP, K, buffer=shared.array)
    node.Barrier()
    tree = KSumTree.attach(shared.array, CAP, K)

    mine = np.arange(rank, CAP, size)
    for turn in range(size):
        if turn == rank:
            tree.update(mine, (mine % 97 + 1).astype(np.float64))
        node.Barrier()

    expected = (np.arange(CAP) % 97 + 1).astype(np.float64)
    ok = bool(np.array_equal(tree.get(np.arange(CAP)), expected.astype(np.float32)))
    ok &= abs(tree.total() - expected.sum()) <= 1e-9 * expected.sum()
    ok &= tree.min() == 1.0
    drawn = tree.sample(512, rng=42)
    all_drawn = node.allgather(drawn)
    ok &= all(np.array_equal(d, all_drawn[0]) for d in all_drawn)

    ok_all = world.allreduce(ok, op=MPI.LAND)
    if world.Get_rank() == 0:
        print(f"ranks={world.Get_size()} ok={ok_all}")
    del tree
    shared.free()
    node.Free()
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
