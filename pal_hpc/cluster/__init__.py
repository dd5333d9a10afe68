"""The MPI cluster a job runs on: node communicators, shared-memory windows, roles
(topology) and the node's weight store.  It depends on nothing else in pal_hpc but the
config: the replay builds on its windows, never the other way round."""

from pal_hpc.cluster.topology import (RankRole, Topology, assign_roles, build_topology,
                                   node_sizes_for, pick_device, uneven_nodes_note)
from pal_hpc.cluster.window import SharedBuffer, allocate_shared, node_comm

__all__ = ["RankRole", "SharedBuffer", "Topology", "allocate_shared", "assign_roles",
           "build_topology", "node_comm", "node_sizes_for", "pick_device",
           "uneven_nodes_note"]
