"""`python -m pal_hpc.main`: the job entry point.

Training (actor and learner roles) is not built yet; this entry point reports the
MPI layout it was started with and the native replay core it found, so that
`make run` already checks the whole stack (venv, MPICH, mpi4py, the Cython build)
on every rank.
"""

from __future__ import annotations

import argparse
import sys

from mpi4py import MPI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pal_hpc.main",
        description="pal_hpc job entry point (currently: report the MPI layout and exit).")
    parser.parse_args(argv)

    from pal_hpc.dist import node_comm
    from pal_hpc.replay import KSumTree, max_threads

    world = MPI.COMM_WORLD
    node = node_comm(world)
    nodes = world.allreduce(1 if node.Get_rank() == 0 else 0)
    hosts = world.gather(MPI.Get_processor_name(), root=0)
    if world.Get_rank() == 0:
        print(f"pal_hpc: {world.Get_size()} ranks on {nodes} node(s) "
              f"({', '.join(sorted(set(hosts)))}); MPI: {MPI.Get_library_version().splitlines()[0]}")
        print(f"pal_hpc: native KSumTree ok (2^20 leaves, K=16: "
              f"{KSumTree.nbytes(1 << 20, 16) / 2**20:.1f} MiB), OpenMP threads: {max_threads()}")
        print("pal_hpc: training (actors + learners) is not implemented yet; nothing to run.")
    node.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
