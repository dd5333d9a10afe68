"""Ending the whole job from one rank, without waiting for any other.

A rank that cannot go on must not wait in a collective that its peers may never
reach: a configuration error found on the learners only (`--device cuda` without
a GPU) used to leave them in a barrier the actors never joined, and the job hung.
`reject` waits for the others only for a few seconds and only in a non-blocking
barrier on a communicator nothing else uses; `abort_job` ends the job with
MPI_Abort, whose code hydra's mpiexec returns as its own exit status.
"""

from __future__ import annotations

import os
import sys
import time
from typing import NoReturn

GRACE_S = 5.0     # how far apart ranks that all reject may arrive and still print once
FORWARD_S = 0.3   # lets the launcher forward this rank's last words before the abort


class JobError(RuntimeError):
    """The job cannot finish as asked (its final checkpoint could not be written, say).
    Raised identically on every rank once the job is wound down, so the entry point
    prints the message once and exits with `status`, without tracebacks."""

    status = 1


def say(message: str) -> None:
    """Write `message` (if any) to stderr at once, as one line or block."""
    if message:
        sys.stderr.write(message.rstrip("\n") + "\n")
        sys.stderr.flush()


def abort_job(code: int, message: str = "") -> NoReturn:
    """Print `message` from this rank, then end every rank of the job with exit `code`.

    Before MPI is up (or after it is down) only this process can end: it exits.
    """
    say(message)
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        time.sleep(FORWARD_S)
        mpi.COMM_WORLD.Abort(code)
    os._exit(code)


def reject(comm, message: str, code: int = 2, grace: float = GRACE_S) -> NoReturn:
    """End the job because this rank found `message` (e.g. a bad configuration).

    If every rank of `comm` calls this within `grace` seconds -- the same error found
    everywhere -- rank 0 alone prints `message`.  Otherwise this rank prints its own
    and aborts: the ranks that did not arrive are busy elsewhere, perhaps waiting in a
    collective for this one.  `comm` must be used for nothing else (a `Dup` of the
    world made at start-up), so that only another `reject` can match its barrier.
    """
    req = comm.Ibarrier()
    deadline = time.monotonic() + grace
    while not req.Test():
        if time.monotonic() > deadline:
            abort_job(code, message)
        time.sleep(0.002)
    if comm.Get_rank() == 0:
        abort_job(code, message)
    time.sleep(grace)           # rank 0 is ending the job; this is only a fallback
    abort_job(code)


def injected_fault_after(rank: int) -> float | None:
    """PAL_HPC_INJECT_FAULT="RANK:SECONDS" makes that rank raise after that long in the
    loop: how the tests prove that one failing rank ends the whole job."""
    spec = os.environ.get("PAL_HPC_INJECT_FAULT", "")
    if not spec:
        return None
    target, _, after = spec.partition(":")
    return float(after or 0) if int(target) == rank else None


_stalled = False


def stall_once(rank: int) -> None:
    """PAL_HPC_INJECT_STALL="RANK:SECONDS" makes that rank sleep that long, once, the
    first time it calls this: how the tests make one rank slower than the others on
    purpose, so that a collective that depends on a rank's own clock mismatches every
    time instead of once in a while."""
    global _stalled
    spec = os.environ.get("PAL_HPC_INJECT_STALL", "")
    if _stalled or not spec:
        return
    target, _, seconds = spec.partition(":")
    if int(target) == rank:
        _stalled = True
        time.sleep(float(seconds or 0))
