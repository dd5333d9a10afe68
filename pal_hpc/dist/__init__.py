"""Distribution over MPI: node communicators, shared-memory windows, roles, weights."""

from pal_hpc.dist.topology import (RankRole, Topology, assign_roles, build_topology,
                                   node_sizes_for, pick_device, uneven_nodes_note)
from pal_hpc.dist.window import SharedBuffer, allocate_shared, node_comm

__all__ = ["RankRole", "SharedBuffer", "Topology", "allocate_shared", "assign_roles",
           "build_topology", "node_comm", "node_sizes_for", "pick_device",
           "uneven_nodes_note"]
