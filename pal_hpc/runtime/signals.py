"""SIGTERM and SIGUSR1 -- what SLURM sends before a time limit or a preemption -- and
a first SIGINT (Ctrl-C: hydra's mpiexec forwards it to every rank) ask the job to
checkpoint at its next safe point and stop.  The handler only records the request;
the run loop acts on it, so a rank that gets the signal twice (SLURM signals every
process of a job step, and a launcher may forward the same signal) still checkpoints
once.  A second SIGINT to a rank stops the job at once, without a checkpoint.  (A
second Ctrl-C to hydra's mpiexec never reaches the ranks: mpiexec kills them itself
and exits 255.)

A job stopped this way with its budget (steps, wall time, target) not used up exits
with `WORK_LEFT_EXIT` on every rank, so a batch script can tell "resume me" from
"done" (0) and from a failure (anything else); see jobs/*.sbatch.
"""

from __future__ import annotations

import signal

requested: str = ""
HARD_STOP_EXIT = 128 + signal.SIGINT
# EX_TEMPFAIL (sysexits.h): stopped early on a signal, checkpointed, work left; resume
# (--resume auto) to continue.
WORK_LEFT_EXIT = 75
_interrupts = 0


def _handler(signum, frame) -> None:
    global requested
    requested = requested or signal.Signals(signum).name   # the first one names the stop


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
