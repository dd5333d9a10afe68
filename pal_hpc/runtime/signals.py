"""SIGTERM and SIGUSR1 -- what SLURM sends before a time limit or a preemption --
ask the job to checkpoint at its next safe point and exit 0.  The handler only
records the request; the run loop acts on it."""

from __future__ import annotations

import signal

requested: str = ""


def _handler(signum, frame) -> None:
    global requested
    requested = signal.Signals(signum).name


def install() -> None:
    """Route SIGTERM and SIGUSR1 to the request flag (call once per process)."""
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, _handler)
