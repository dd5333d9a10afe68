"""Distribution over MPI: node communicators and shared-memory windows."""

from pal_hpc.dist.window import SharedBuffer, allocate_shared, node_comm

__all__ = ["SharedBuffer", "allocate_shared", "node_comm"]
