"""SIGTERM and SIGUSR1 -- what SLURM sends before a time limit or a preemption -- and
a first SIGINT (Ctrl-C: hydra's mpiexec forwards it to every rank) ask the job to
checkpoint at its next safe point and exit 0.  The handler only records the request;
the run loop acts on it.  A second SIGINT to a rank stops the job at once, without a
checkpoint.  (A second Ctrl-C to hydra's mpiexec never reaches the ranks: mpiexec kills
them itself and exits 255.)"""

from __future__ import annotations

import signal

requested: str = ""
HARD_STOP_EXIT = 128 + signal.SIGINT
_interrupts = 0


def _handler(signum, frame) -> None:
    global requested
    requested = signal.Signals(signum).name


def _interrupt(signum, frame) -> None:
    global _interrupts
    _interrupts += 1
    if _interrupts == 1:
        _handler(signum, frame)
        return
    from pal_hpc.runtime.abort import abort_job

    abort_job(HARD_STOP_EXIT, "pal_hpc: second SIGINT: stopping now, without a checkpoint")


def install() -> None:
    """Route SIGTERM, SIGUSR1 and a first SIGINT to the request flag (once per process,
    as early as possible: a Ctrl-C during start-up then raises no KeyboardInterrupt)."""
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, _handler)
    signal.signal(signal.SIGINT, _interrupt)
