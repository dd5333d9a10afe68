"""Learner: sample -> gradients -> average over every learner -> step -> priorities.

`Learner.step()` never blocks: it is a small state machine driven by the rank's
main loop.  When the rate limit allows, it samples its node's replay, computes
gradients and posts a non-blocking Allreduce of [gradient | contributors | stop
vote | pause vote] over all learners (every node); a later call that finds the
reduction complete applies the averaged gradient.  Because the votes travel
inside the same reduction, all learners take exactly the same steps and stop --
or pause for a checkpoint -- after the same one, and a learner that has no data
yet still joins a reduction that ends the run or pauses it.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI


# Loss metrics (loss, q_mean, td_abs_mean, grad_norm) are computed on every
# METRICS_EVERY-th update only -- the ones the metrics log records.
METRICS_EVERY = 10


class Learner:
    """One learner rank: the algorithm's maths driven over MPI and the shared replay."""

    def __init__(self, cfg, algo, replay, learners_comm, weights=None, node_learners: int = 1,
                 rng: np.random.Generator | None = None):
        self.cfg = cfg
        self.algo = algo
        self.replay = replay
        self.comm = learners_comm
        self.weights = weights               # this node's WeightStore if we publish, else None
        self.node_learners = node_learners
        self.rng = rng if rng is not None else np.random.default_rng(cfg.seed)
        self.updates = 0
        self.done = False
        self.metrics: dict[str, float] = {}
        self.busy_seconds = 0.0
        self.sample_times: list[float] = []     # seconds per replay.sample, for telemetry
        n = algo.num_params
        self.paused = False                  # stopped after a pause vote, until resumed
        self._send = np.zeros(n + 3, np.float32)
        # A lone learner reduces with itself: receive where it sent, no copy.
        self._recv = self._send if self.comm.Get_size() == 1 else np.zeros(n + 3, np.float32)
        self._req = None
        self._stop_posted = False
        if self.weights is not None:
            self.weights.publish(self.algo.get_flat_params())

    def ready(self) -> bool:
        """Rate limit (learner side): enough data, and no more sampled from this node's
        replay than replay_ratio times what was inserted."""
        inserted = self.replay.inserted()
        if inserted < self.cfg.learning_starts:
            return False
        return self.replay.sampled() + self.cfg.batch_size <= self.cfg.replay_ratio * inserted

    def step(self, stopping: bool, progress: float, pause: bool = False) -> bool:
        """Advance; True if it did work.  `progress` in [0, 1] anneals beta; `pause`
        asks every learner to stop after the same step (for a checkpoint)."""
        if self.done or self.paused:
            return False
        if self._req is not None:
            if not self._req.Test():
                return False
            self._req = None
            self._finish()
            return True
        if stopping or pause:
            self._send[:] = 0.0
            self._send[-2 if stopping else -1] = 1.0
            self._post()
            return True
        if not self.ready():
            return False
        t0 = time.perf_counter()
        beta = self.cfg.per_beta + (1.0 - self.cfg.per_beta) * min(1.0, progress)
        batch = self.replay.sample(self.cfg.batch_size, beta=beta, rng=self.rng)
        self.sample_times.append(time.perf_counter() - t0)
        want = (self.updates + 1) % METRICS_EVERY == 0
        _, metrics, priorities = self.algo.compute_gradients(batch, out=self._send[:-3],
                                                             metrics=want)
        self.replay.update_priorities(batch["indices"], priorities, batch["tickets"])
        if want:
            self.metrics = metrics
        self._send[-3:] = (1.0, 0.0, 0.0)
        self.busy_seconds += time.perf_counter() - t0
        self._post()
        return True

    def _post(self) -> None:
        if self.comm.Get_size() == 1:
            self._finish()              # _recv is _send
        else:
            self._req = self.comm.Iallreduce(self._send, self._recv, op=MPI.SUM)

    def _finish(self) -> None:
        t0 = time.perf_counter()
        contributors, stop, pause = (float(v) for v in self._recv[-3:])
        if contributors > 0:
            self.algo.apply_gradients(self._recv[:-3], scale=1.0 / contributors)
            self.updates += 1
            if self.updates % self.cfg.target_update == 0:
                self.algo.sync_target()
            if self.weights is not None and self.updates % self.cfg.publish_every == 0:
                self.weights.publish(self.algo.get_flat_params())
        if stop > 0:
            self.done = True
            if self.weights is not None:
                self.weights.publish(self.algo.get_flat_params())
        elif pause > 0:
            self.paused = True
        self.busy_seconds += time.perf_counter() - t0
