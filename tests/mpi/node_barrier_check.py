"""NodeBarrier (pal_hpc.cluster.node_barrier) under mpiexec, every rank on this node.

`turns N`: N rounds in which the ranks take turns, one barrier between turns, at a
read-modify-write of shared counters (no atomics: only the barrier orders them), and
each checks after the round's last barrier what every rank wrote in it (then one
more barrier, before the next round's writes).  Rank 0
prints the counters.  `timeout`: rank 1 never arrives; rank 0's wait must raise
within its timeout."""

import sys
import time

import numpy as np
from mpi4py import MPI

from pal_hpc.cluster.node_barrier import NodeBarrier
from pal_hpc.cluster.window import allocate_shared, node_comm


def turns(node, rounds: int) -> None:
    rank, size = node.Get_rank(), node.Get_size()
    barrier = NodeBarrier(node, timeout=60)
    shared = allocate_shared(node, 8 * (2 + size))
    words = shared.array.view(np.int64)
    if rank == 0:
        words[:] = 0
    node.Barrier()
    rng = np.random.default_rng(rank)
    for r in range(rounds):
        for turn in range(size):
            if turn == rank:
                # Not atomic: a turn that overlapped another's would lose an increment.
                before = int(words[0])
                if rng.random() < 0.01:
                    time.sleep(0.001)           # a slow turn now and then
                words[0] = before + 1
                words[1] = words[1] + rank + 1
                words[2 + rank] = r
            barrier.wait()
        seen = words[2:].copy()
        assert (seen == r).all(), (rank, r, seen)
        barrier.wait()                         # everyone has looked: the next round
    if rank == 0:
        print(f"counters {int(words[0])} {int(words[1])}", flush=True)
    node.Barrier()
    shared.free()
    barrier.free()


def timeout(node) -> None:
    barrier = NodeBarrier(node, timeout=1.0)
    if node.Get_rank() == 0:
        t0 = time.monotonic()
        try:
            barrier.wait()
        except TimeoutError as exc:
            print(f"raised after {time.monotonic() - t0:.1f} s: {exc}", flush=True)
    node.Barrier()
    barrier.free()


if __name__ == "__main__":
    node = node_comm(MPI.COMM_WORLD)
    if sys.argv[1] == "turns":
        turns(node, int(sys.argv[2]))
    else:
        timeout(node)
