"""Job-wide counters and the stop signal, without blocking anyone.

Every rank keeps a small float64 vector of counters; about every `period`
seconds all ranks start a non-blocking Iallreduce (sum) of it over the whole
job and go on working, polling the request from their main loops.  Rank 0 reads
the sums to print progress and decide when to stop, and asks for the stop in
its next contribution; every rank sees the stop in the same round's result.
Cumulative counters (steps, updates) give totals; per-round deltas (episode
returns, evaluations) are zeroed once sent.

Every rank must start the same number of rounds, whatever its clock.  The
off-policy loop gets that from the stop itself: it travels in a round's result,
every rank sees it in the same round, and nobody starts another.  A loop that
stops by other means (PAAC's masters stop after an agreed update) cannot let each
rank's clock decide when a round starts -- one master would post a round the
other never matches, and hang at the end -- so it passes `start`, decided once and
shared with everyone (rank 0's `due()`, carried in its gradient Allreduce).
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

    def due(self) -> bool:
        """`period` seconds have passed since this rank started its last round."""
        return time.monotonic() - self._last_start >= self.period

    def poll(self, start: bool | None = None) -> bool:
        """Progress the current round and maybe start the next.  True when a round
        completed.

        `start=None`: the next round starts once the last one completed and `due()`
        holds on this rank's clock (safe only where the stop travels in the rounds, see
        the module docstring).  `start=True/False`: the caller decides, the same way on
        every rank; True waits for the round in flight (every rank has started it, so
        the wait is short) and then starts the next."""
        done = self._complete(wait=bool(start))
        if start is None:
            start = self._req is None and self.due()
        if start and not self.stopping:
            self._start()
        return done

    def exchange(self, wait) -> None:
        """One whole round now (the synchronous schedule's, once per round on every
        rank): start it and complete it, `wait(request)` doing the waiting."""
        self.finish()
        self._start()
        wait(self._req)
        self._take()

    def _start(self) -> None:
        self._send[:] = self.mine
        for slot in DELTAS:
            self.mine[slot] = 0.0
        self._req = self.comm.Iallreduce(self._send, self._recv, op=MPI.SUM)
        self._last_start = time.monotonic()

    def _complete(self, wait: bool) -> bool:
        if self._req is None:
            return False
        if wait:
            self.finish()
            return True
        if not self._req.Test():
            return False
        self._take()
        return True

    def _take(self) -> None:
        self._req = None
        self.total[:] = self._recv
        self.rounds += 1

    def finish(self, timeout: float = 120.0) -> None:
        """Wait (sleeping, not spinning) for the round in flight, if any."""
        deadline = time.monotonic() + timeout
        while self._req is not None:
            if self._req.Test():
                self._take()
                break
            if time.monotonic() > deadline:
                raise TimeoutError("a statistics round did not complete: a rank is stuck")
            time.sleep(0.001)
