"""Run under mpiexec -n 2: 100k Atari frames (84x84x4 uint8) in one node-shared
SharedReplay.  Rank 0 fills the whole buffer, rank 1 (or rank 0 alone with -n 1)
samples and checks every frame against the slot it came from."""

import sys
import time

import numpy as np
from mpi4py import MPI

from pal_hpc.cluster import node_comm
from pal_hpc.replay import SharedReplay

CAPACITY = 100_000
SPEC = {"obs": ((84, 84, 4), np.uint8), "action": ((), np.int64), "reward": ((), np.float32),
        "done": ((), np.bool_)}


def main():
    world = MPI.COMM_WORLD
    node = node_comm(world)
    rank, size = world.Get_rank(), world.Get_size()
    ok = True
    with SharedReplay(SPEC, CAPACITY, comm=node, regions=1) as rb:
        if rank == 0:
            frame = np.zeros((250, 84, 84, 4), np.uint8)
            for start in range(0, CAPACITY, 250):
                seq = np.arange(start, start + 250)
                frame[:, 0, 0, :] = (seq[:, None] >> np.array([0, 8, 16, 24])) & 0xFF
                frame[:, 83, 83, 3] = seq % 251
                rb.add(0, {"obs": frame, "action": seq, "reward": seq.astype(np.float32),
                           "done": seq % 2 == 0})
        req = world.Ibarrier()
        while not req.Test():
            time.sleep(0.001)
        if rank == size - 1:
            ok &= rb.size() == CAPACITY
            rng = np.random.default_rng(0)
            for _ in range(32):
                s = rb.sample(64, rng=rng)
                obs = s["obs"].astype(np.int64)
                stamp = (obs[:, 0, 0, :] << np.array([0, 8, 16, 24])).sum(axis=1)
                ok &= bool(np.array_equal(stamp, s["indices"]))
                ok &= bool(np.array_equal(s["action"], s["indices"]))
                ok &= bool(np.array_equal(obs[:, 83, 83, 3], s["indices"] % 251))
            gib = rb.bytes_per_transition * CAPACITY / 2**30
            print(f"atari capacity={CAPACITY} bytes_per_transition={rb.bytes_per_transition:.0f} "
                  f"node_memory_gib={gib:.2f}", flush=True)
    ok_all = world.allreduce(ok, op=MPI.LAND)
    if rank == 0:
        print(f"ranks={size} ok={ok_all}", flush=True)
    node.Free()
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
