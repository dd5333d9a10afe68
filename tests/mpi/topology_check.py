"""Run under mpiexec (flags as for pal_hpc.main, e.g. --ranks-per-node 2): build the
topology from a Config and check it on every rank against the pure `assign_roles`.

Each rank checks its role, its node communicator, a shared window on that (possibly
virtual) node, and the learners communicator; pass/fail is combined over all ranks and
rank 0 prints `ranks=N nodes=.. learners=.. actors=.. ok=True|False`.
With TOPOLOGY_CHECK_REVERSED=1 the topology is built over a copy of COMM_WORLD with
the ranks in reverse order, to show nothing assumes `world` is COMM_WORLD.
"""

import os
import sys

import numpy as np
from mpi4py import MPI

from pal_hpc.config_io import load_config
from pal_hpc.cluster import allocate_shared
from pal_hpc.cluster.topology import assign_roles, build_topology, node_sizes_for


def main():
    cfg = load_config(sys.argv[1:])
    world = MPI.COMM_WORLD
    if os.environ.get("TOPOLOGY_CHECK_REVERSED") == "1":
        world = world.Split(0, key=world.Get_size() - 1 - world.Get_rank())
    rank, size = world.Get_rank(), world.Get_size()
    topo = build_topology(world, cfg)
    me, node = topo.me, topo.node
    checks = {}

    # mpiexec here starts every rank on this one host, so the nodes are contiguous ranges.
    hosts = set(world.allgather(MPI.Get_processor_name()))
    sizes = node_sizes_for(size, cfg.ranks_per_node) if cfg.ranks_per_node else [size]
    expected = assign_roles(size, sizes, cfg.actors_per_node, cfg.learners_per_node)
    checks["one host"] = len(hosts) == 1
    checks["roles"] = topo.roles == expected and me == expected[rank] and me.rank == rank
    checks["n_nodes"] = topo.n_nodes == len(sizes)
    checks["node comm"] = (node.Get_size() == me.node_size and node.Get_rank() == me.local_rank)
    checks["same node"] = set(node.allgather(me.node)) == {me.node}
    checks["node members"] = node.allgather(rank) == [
        r.rank for r in expected if r.node == me.node]

    # The node comm must be a shared-memory comm: every rank writes its slot, all read all.
    shared = allocate_shared(node, 8 * node.Get_size())
    slots = shared.array.view(np.int64)
    slots[node.Get_rank()] = 1000 + rank
    node.Barrier()
    checks["shared window"] = slots.tolist() == [1000 + r for r in node.allgather(rank)]
    node.Barrier()
    del slots
    shared.free()

    n_learners = sum(r.is_learner for r in expected)
    if me.is_learner:
        learners = topo.learners
        checks["learners comm"] = (learners != MPI.COMM_NULL
                                   and learners.Get_size() == n_learners
                                   and learners.Get_rank() == me.learner_index
                                   and learners.allreduce(1) == n_learners)
    else:
        checks["learners comm"] = topo.learners == MPI.COMM_NULL

    failed = [name for name, ok in checks.items() if not ok]
    if failed:
        print(f"rank {rank}: failed {failed}; me={me}", flush=True)
    ok_all = world.allreduce(not failed, op=MPI.LAND)
    if rank == 0:
        print(f"ranks={size} nodes={topo.n_nodes} learners={topo.n_learners} "
              f"actors={topo.n_actors} ok={ok_all}")
    topo.free()
    topo.free()  # idempotent
    if world != MPI.COMM_WORLD:
        world.Free()
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
