"""Collectives that never busy-wait, and errors found on one rank raised on all."""

from __future__ import annotations

import time

from mpi4py import MPI

from pal_hpc.cluster.watched import blocked
from pal_hpc.config import ConfigError


def wait_all(comm: MPI.Comm, timeout: float = 600.0) -> None:
    """A barrier that sleeps instead of busy-polling."""
    req = comm.Ibarrier()
    deadline = time.monotonic() + timeout
    with blocked(req):            # to peers' probes this rank waits (cluster.deadline)
        while not req.Test():
            if time.monotonic() > deadline:
                raise TimeoutError("barrier timed out: a rank is stuck")
            time.sleep(0.001)


def on_rank0(comm: MPI.Comm, fn):
    """Run `fn` on rank 0 of `comm`; a ConfigError it raises is raised on every rank
    (identically, so the job rejects it once).  Returns fn's result on rank 0."""
    result = err = None
    if comm.Get_rank() == 0:
        try:
            result = fn()
        except ConfigError as exc:
            err = str(exc)
    err = comm.bcast(err, root=0)
    if err:
        raise ConfigError(err)
    return result


def gather_hosts(comm: MPI.Comm) -> tuple[list[str] | None, dict[str, str] | None]:
    """One gather: on rank 0, every rank's host (MPI's processor name) in rank order and
    {host: its CPU, `describe_cpu()` there}; (None, None) on the other ranks."""
    from pal_hpc.io.provenance import describe_cpu

    got = comm.gather((MPI.Get_processor_name(), describe_cpu()), root=0)
    if got is None:
        return None, None
    return [host for host, _ in got], dict(got)
