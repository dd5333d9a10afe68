"""A barrier of a node's ranks on futex words in the node's shared memory.

MPI's Ibarrier among ranks that sleep between polls moves one hop at a time: each of
its rounds of messages goes out only when a rank calls Test, so a barrier of three
sleeping ranks waits up to a back-off interval per hop, and the waiting ranks' polls
take the cores from the ranks that work (ranks outnumber cores here).  On one node
the barrier needs no messages: every rank counts itself in on one shared word, the
last one opens the barrier by bumping a generation word, and the others sleep on that
word in the kernel (a futex) until it changes -- no polling while they wait, and the
wake-up comes with the last arrival.  `cython/lockstep_core.h` has the protocol.

Used by `--schedule sync` for the node's actors' turns at the replay and to gather the
node's ranks before a round's end.  Like an MPI
collective, every rank of the node calls `wait` the same number of times.  It is
node-local: a lost host is the deadline's to notice on the job-wide operations
(`cluster.deadline`), a dead rank of the node the launcher's; a wait that outlasts
`timeout` raises.
"""

from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI

from pal_hpc.cluster.window import allocate_shared
from pal_hpc.envs import _lockstep as core

CHECK_NS = 50_000_000        # a waiter returns to Python this often (signals, timeout)


class NodeBarrier:
    """A barrier of the ranks of `comm`, a shared-memory (node) communicator.
    Construction and `free` are collective over `comm`."""

    def __init__(self, comm: MPI.Comm, timeout: float = 600.0):
        self.size = comm.Get_size()
        self.timeout = float(timeout)
        self.shared = allocate_shared(comm, core.CONTROL_BYTES)
        self.ctl = self.shared.array.view(np.uint32)
        if comm.Get_rank() == 0:
            self.ctl[:] = 0
        comm.Barrier()                       # zeroed before anyone arrives
        # Spin only where every rank of the node has a core of its own: a spinning
        # waiter takes the core the rank it waits for needs.
        spare = self.size <= len(os.sched_getaffinity(0))
        self.spin_ns = 20_000 if spare else 0
        self.yield_ns = 100_000 if spare else 20_000

    def wait(self) -> None:
        """Return once every rank of the node has called `wait` as often as this one."""
        gen, opened = core.barrier_arrive(self.ctl, self.size)
        if opened:
            return
        deadline = time.monotonic() + self.timeout
        while not core.barrier_wait(self.ctl, gen, self.spin_ns, self.yield_ns, CHECK_NS):
            if time.monotonic() > deadline:
                raise TimeoutError(f"a node barrier of {self.size} ranks did not open within "
                                   f"{self.timeout:.0f} s: a rank of the node is stuck")

    def free(self) -> None:
        """Release the shared words (collective over the node)."""
        self.ctl = np.empty(0, np.uint32)
        self.shared.free()
