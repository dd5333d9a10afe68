"""Weights the learners publish and the actors on the same node pull, in place.

One small shared window per node: a version counter (a seqlock) and the flat
float32 parameter vector.  The node's first learner publishes every few steps;
actors check the version (one atomic load, no MPI call) and copy the vector
only when it changed, retrying if a publication overlapped the copy, so they
never run torn weights.
"""

from __future__ import annotations

import time

import numpy as np

from pal_hpc.cluster._seqlock import seqlock_publish, seqlock_read, seqlock_version
from pal_hpc.cluster.window import aligned_bytes, allocate_shared

_HEADER = 64  # the counter lives alone on its cache line


class WeightStore:
    """Seqlocked flat parameter vector shared by the ranks of a node (or private)."""

    def __init__(self, n_params: int, comm=None):
        if n_params < 1:
            raise ValueError(f"n_params must be >= 1, got {n_params}")
        self.n_params = int(n_params)
        nbytes = _HEADER + 4 * self.n_params
        if comm is None:
            self._shared = None
            mem = aligned_bytes(nbytes)
        else:
            self._shared = allocate_shared(comm, nbytes)
            mem = self._shared.array
            if comm.Get_rank() == 0:
                mem[:_HEADER] = 0
            comm.Barrier()
        self._seq = mem[:8].view(np.uint64)
        self._data = mem[_HEADER:nbytes]

    def version(self) -> int:
        """0 until the first publication, then grows with every one."""
        return int(seqlock_version(self._seq))

    def publish(self, flat: np.ndarray) -> int:
        """Write a new parameter vector (one writer per node); returns its version."""
        flat = np.ascontiguousarray(flat, dtype=np.float32)
        if flat.size != self.n_params:
            raise ValueError(f"publish: got {flat.size} parameters, the store holds {self.n_params}")
        return int(seqlock_publish(self._seq, self._data, flat.view(np.uint8)))

    def read(self, out: np.ndarray, timeout: float = 30.0) -> int:
        """Copy the current parameters into `out` (float32, n_params); returns the version."""
        if out.dtype != np.float32 or out.size != self.n_params or not out.flags.c_contiguous:
            raise ValueError(f"read: out must be a contiguous float32 array of {self.n_params}")
        deadline = time.monotonic() + timeout
        view = out.view(np.uint8)
        tries = 0
        while True:
            v = seqlock_read(self._seq, view, self._data)
            if v:
                return int(v)
            tries += 1
            if time.monotonic() > deadline:
                raise TimeoutError("no weights were published within "
                                   f"{timeout:.0f} s (is a learner running on this node?)")
            # A publication overlapped the copy: retry at once a few times (the writer is
            # usually done), then back off so a descheduled writer can finish.
            if tries > 8:
                time.sleep(0.0002)

    def free(self) -> None:
        """Release the window (collective over the node communicator)."""
        if self._shared is not None:
            self._seq = self._data = None
            self._shared.free()
            self._shared = None
