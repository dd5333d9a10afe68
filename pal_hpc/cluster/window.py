"""Node-local shared memory: one MPI window per node that every rank maps in place.

MPICH unlinks a window's /dev/shm file as soon as the node's ranks have mapped it, so
even a killed job leaks none (MPICH's own intranode file: see `runtime.lifeline`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mpi4py import MPI


def node_comm(comm: MPI.Comm = MPI.COMM_WORLD) -> MPI.Comm:
    """The ranks of `comm` that can share memory with this one (same node)."""
    return comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())


@dataclass
class SharedBuffer:
    """A byte array shared by all ranks of a node communicator, and its window.

    `array` is a writable uint8 numpy view whose first byte is `align`-aligned on
    every rank.  Keep this object alive while the memory is in use; `free()` is
    collective over the communicator that allocated it.
    """

    win: MPI.Win
    array: np.ndarray

    def free(self) -> None:
        """Release the window (collective)."""
        if self.win != MPI.WIN_NULL:
            self.array = np.empty(0, np.uint8)
            self.win.Free()


def aligned_bytes(nbytes: int, align: int = 64) -> np.ndarray:
    """A private zeroed uint8 array of `nbytes` whose first byte is `align`-aligned."""
    raw = np.zeros(nbytes + align, np.uint8)
    offset = (-raw.ctypes.data) % align
    return raw[offset:offset + nbytes]


def allocate_shared(comm: MPI.Comm, nbytes: int, align: int = 64) -> SharedBuffer:
    """Collectively allocate `nbytes` of node-shared memory; rank 0 of `comm` owns it.

    `comm` must be a shared-memory communicator (see `node_comm`).  The memory
    starts zeroed only where the MPI library zeroes it; callers initialise it.
    """
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    rank = comm.Get_rank()
    win = MPI.Win.Allocate_shared(nbytes + align if rank == 0 else 0, 1, comm=comm)
    try:
        mem, _ = win.Shared_query(0)
        raw = np.frombuffer(mem, dtype=np.uint8)
        # Rank 0 picks the offset; every rank maps the segment page-aligned, so the
        # same offset is aligned everywhere -- checked rather than assumed.
        offset = comm.bcast((-raw.ctypes.data) % align if rank == 0 else None, root=0)
        view = raw[offset:offset + nbytes]
        ok = view.ctypes.data % align == 0
        if not comm.allreduce(ok, op=MPI.LAND):
            raise RuntimeError(f"shared window is not {align}-byte aligned on every rank")
    except BaseException:
        win.Free()
        raise
    return SharedBuffer(win=win, array=view)
