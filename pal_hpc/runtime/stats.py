"""Job-wide counters and the stop signal, without blocking anyone.

Every rank keeps a small float64 vector of counters; about every `period`
seconds all ranks start a non-blocking Iallreduce (sum) of it over the whole
job and go on working, polling the request from their main loops.  Rank 0 reads
the sums to print progress and decide when to stop, and asks for the stop in
its next contribution; every rank sees the stop in the same round's result.
Cumulative counters (steps, updates) give totals; per-round deltas (episode
returns, evaluations) are zeroed once sent.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

# Slots of the vector (cumulative unless marked as a delta).
ENV_STEPS, EPISODES, RETURN_SUM, RETURN_COUNT, UPDATES, EVAL_SUM, EVAL_COUNT, EVAL_STEP, \
    STOP, REPLAY_SIZE, REPLAY_CAPACITY, LEARNER_SECONDS, PREEMPT, CHECKPOINTS, EVAL_SUMSQ, \
    EVAL_SECONDS = range(16)
SIZE = 16
DELTAS = (RETURN_SUM, RETURN_COUNT, EVAL_SUM, EVAL_COUNT, EVAL_STEP, EVAL_SUMSQ, EVAL_SECONDS)


class StatsRounds:
    """Periodic non-blocking sum of every rank's counters over `comm`."""

    def __init__(self, comm: MPI.Comm, period: float = 0.2):
        self.comm = comm
        self.period = period
        self.mine = np.zeros(SIZE)
        self.total = np.zeros(SIZE)          # the latest completed round's sums
        self.rounds = 0
        self._send = np.zeros(SIZE)
        self._recv = np.zeros(SIZE)
        self._req = None
        self._last_start = -np.inf

    @property
    def stopping(self) -> bool:
        """True once any rank asked to stop and the whole job has seen it."""
        return self.total[STOP] > 0

    def add(self, slot: int, value: float) -> None:
        self.mine[slot] += value

    def set(self, slot: int, value: float) -> None:
        self.mine[slot] = value

    def poll(self) -> bool:
        """Progress the current round; start the next when due.  True when a round completed."""
        done = False
        if self._req is not None and self._req.Test():
            self._req = None
            self.total[:] = self._recv
            self.rounds += 1
            done = True
        if self._req is None and not self.stopping:
            now = time.monotonic()
            if now - self._last_start >= self.period:
                self._send[:] = self.mine
                for slot in DELTAS:
                    self.mine[slot] = 0.0
                self._req = self.comm.Iallreduce(self._send, self._recv, op=MPI.SUM)
                self._last_start = now
        return done

    def finish(self, timeout: float = 120.0) -> None:
        """Wait (sleeping, not spinning) for the round in flight, if any."""
        deadline = time.monotonic() + timeout
        while self._req is not None:
            if self._req.Test():
                self._req = None
                self.total[:] = self._recv
                self.rounds += 1
                break
            if time.monotonic() > deadline:
                raise TimeoutError("a statistics round did not complete: a rank is stuck")
            time.sleep(0.001)
