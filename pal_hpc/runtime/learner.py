"""Learner: sample -> per phase: gradient, average over every learner, step -> priorities.

`Learner.step()` never blocks: it is a small state machine driven by the rank's
main loop.  When the rate limit allows, it samples its node's replay and runs the
algorithm's update phases for this update (`algo.phases(u)`: DQN has one, TD3 a
critic phase and, every other update, an actor phase).  Each phase computes its
gradient into one flat buffer and posts a non-blocking Allreduce of it over all
learners (every node); a later call that finds the reduction complete applies the
averaged gradient and starts the next phase.  The first phase's buffer also
carries [rows | stop vote | pause vote]: because the votes travel inside the
reduction, all learners take exactly the same steps and stop -- or pause for a
checkpoint -- after the same one, and a learner that has no data yet still joins a
reduction that ends the run or pauses it.

Strong scaling (`--learner-batch split`, the default): `--batch-size` B is the global
batch of one update.  Learner i of L samples its share b_i (`batch_shares`: shares
differ by at most one) and sends b_i times its mean gradient, with b_i in the rows
slot; the sum divided by the summed rows is then the mean gradient over the union
of the shares -- one update with L learners is one learner's update on the union,
L times cheaper per learner.  A learner that votes sends zeros and 0 rows, so the
update is the mean over the rows actually sampled.

Importance weights.  The replay returns them normalised by its buffer-wide minimum
priority (the largest weight any slot could have), so a row's weight does not depend
on how the batch was split.  `--per-weights batch` (the default) then divides the
first phase's gradient -- the TD loss, the one the weights enter, linearly -- by the
largest weight in the whole update's batch: a MAX reduction of one number, posted
beside the first phase's gradient sum, so each update's largest weight is 1 however
the batch is split, and one stored transition with a near-zero priority cannot
shrink every update (see `pal_hpc.config`'s per_weights).  With several nodes each
node's replay has its own minimum (as it has its own distribution).

`--learner-batch full` is the behaviour before: every learner samples a whole batch
and the update averages the L batches (1 row-weight each).
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from pal_hpc.options import ConfigError


# Loss metrics (loss, q_mean, td_abs_mean, grad_norm) are computed on every
# METRICS_EVERY-th update only -- the ones the metrics log records.
METRICS_EVERY = 10
# Where a learner's wall time goes (seconds, summed; `Learner.profile`): its own calls,
# the Allreduce from post to completion, the time the rate limit held it back, and
# -- filled in by the rank's loop -- its sleeps.
PROFILE_PARTS = ("sample", "gradients", "priorities", "reduce", "apply", "publish",
                 "rate_limited", "sleep_idle", "sleep_reducing")
# Metrics of the weighted loss, in the replay's weights when computed: divided by the
# update's largest weight under --per-weights batch, as the gradient is.
WEIGHTED_METRICS = ("loss", "critic_loss", "grad_norm")


def batch_shares(batch: int, learners: int) -> list[int]:
    """`batch` rows split among `learners`, as equal as integers allow (the first
    batch % learners shares are one larger)."""
    q, r = divmod(batch, learners)
    return [q + (i < r) for i in range(learners)]


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
        self.attempts = 0                    # updates ended, applied or not (all voted)
        self.done = False
        # --schedule sync: no rate limit (the rounds pace the run), a learner whose node
        # has too little data sends zero rows, and priorities wait in `stashed` until
        # the schedule writes them in a fixed order (pal_hpc.runtime.sync_schedule).
        self.sync = cfg.schedule == "sync"
        self.stashed: list[tuple] = []
        self.metrics: dict[str, float] = {}
        n_learners, index = learners_comm.Get_size(), learners_comm.Get_rank()
        if cfg.learner_batch == "split":
            if cfg.batch_size < n_learners:
                raise ConfigError(f"batch_size: {cfg.batch_size} rows cannot be split among "
                                  f"{n_learners} learners (use at least one row per learner, "
                                  f"or --learner-batch full)")
            shares = batch_shares(cfg.batch_size, n_learners)
            self.share = shares[index]           # rows this learner samples per update
            algo.set_rows(sum(shares[:index]), cfg.batch_size)
            # The gradient's weight in the sum: its rows (1 for a lone learner, whose
            # mean gradient is the update's: no rescaling, no rounding).
            self._weight = float(self.share) if n_learners > 1 else 1.0
        else:
            self.share, self._weight = cfg.batch_size, 1.0
        self.busy_seconds = 0.0
        self.profile = dict.fromkeys(PROFILE_PARTS, 0.0)
        self._posted = 0.0                   # when the reduction in flight was posted
        self._held_since = None              # when the rate limit began holding us back
        self.sample_times: list[float] = []     # seconds per replay.sample, for telemetry
        self.paused = False                  # stopped after a pause vote, until resumed
        n = max(algo.phase_size(p) for u in range(8) for p in algo.phases(u))
        self._send = np.zeros(n + 3, np.float32)
        # A lone learner reduces with itself: receive where it sent, no copy.
        self._recv = self._send if self.comm.Get_size() == 1 else np.zeros(n + 3, np.float32)
        self._req = None
        # --per-weights batch: the update's largest importance weight, MAX-reduced
        # beside the first phase's gradient (a voting learner sends 0).
        self._batch_norm = cfg.per_weights == "batch"
        self._wmax_send = np.zeros(1, np.float64)
        self._wmax_recv = self._wmax_send if self.comm.Get_size() == 1 else np.zeros(1, np.float64)
        self._req_max = None
        self._phase, self._first, self._n = "", False, 0   # the reduction in flight
        self._todo: list[str] = []           # phases of this update still to run
        self._voting = False                 # this update: zeros and a vote, no batch
        self._rows = 0.0                     # the update's summed row weights
        self._votes = (False, False)
        self._batch: dict | None = None
        self._want_metrics = False
        if self.weights is not None:
            self.weights.publish(self.algo.policy_params())

    @property
    def reducing(self) -> bool:
        """A phase's Allreduce is in flight: it only progresses while this rank polls."""
        return self._req is not None

    def ready(self) -> bool:
        """Rate limit (learner side): enough data, and no more sampled from this node's
        replay than replay_ratio times what was inserted."""
        inserted = self.replay.inserted()
        if inserted < max(self.cfg.learning_starts, 1):
            return False
        if self.sync:
            return True
        return self.replay.sampled() + self.share <= self.cfg.replay_ratio * inserted

    def step(self, stopping: bool, progress: float, pause: bool = False) -> bool:
        """Advance; True if it did work.  `progress` in [0, 1] anneals beta; `pause`
        asks every learner to stop after the same step (for a checkpoint)."""
        if self.done or self.paused:
            return False
        if self._req is not None:
            if not self._req.Test():
                return False
            if self._req_max is not None:
                if not self._req_max.Test():
                    return False
                self._req_max = None
            self._req = None
            self.profile["reduce"] += time.perf_counter() - self._posted
            self._finish()
            if self._todo:
                # The update's next phase at once: a loop turn (and the sleep the
                # reduction's wait may bring) between phases is pure latency.
                self._run_phase(self._todo.pop(0), first=False)
            return True
        if self._todo:                       # the next phase of the update under way
            self._run_phase(self._todo.pop(0), first=False)
            return True
        if stopping or pause:
            # A vote: this learner sampled nothing, so it sends zeros through this
            # update's phases; the others' gradients still reach it (and it applies
            # them) so that every learner keeps the same parameters.
            self._voting = True
            self._todo = list(self.algo.phases(self.updates))
            self._run_phase(self._todo.pop(0), first=True,
                            votes=(0.0, 1.0, 0.0) if stopping else (0.0, 0.0, 1.0))
            return True
        if self.sync and not self.ready():
            # Too little data on this node: zero rows into the same reductions.
            self._voting = True
            self._todo = list(self.algo.phases(self.updates))
            self._run_phase(self._todo.pop(0), first=True, votes=(0.0, 0.0, 0.0))
            return True
        if not self.ready():
            if self._held_since is None:
                self._held_since = time.perf_counter()
            return False
        t0 = time.perf_counter()
        if self._held_since is not None:
            self.profile["rate_limited"] += t0 - self._held_since
            self._held_since = None
        beta = self.cfg.per_beta + (1.0 - self.cfg.per_beta) * min(1.0, progress)
        self._batch = self.replay.sample(self.share, beta=beta, rng=self.rng)
        self.sample_times.append(time.perf_counter() - t0)
        self.profile["sample"] += self.sample_times[-1]
        self._want_metrics = (self.updates + 1) % METRICS_EVERY == 0
        if self._want_metrics:
            self.metrics = {}
        self._voting = False
        self._todo = list(self.algo.phases(self.updates))
        self.busy_seconds += time.perf_counter() - t0
        self._run_phase(self._todo.pop(0), first=True, votes=(self._weight, 0.0, 0.0))
        return True

    def _run_phase(self, phase: str, first: bool, votes=(0.0, 0.0, 0.0)) -> None:
        """Compute `phase`'s gradient (zeros when voting) and post its reduction; the
        first phase of an update carries [rows | stop | pause]."""
        t0 = time.perf_counter()
        n = self.algo.phase_size(phase)
        if self._voting:
            self._send[:n] = 0.0
        else:
            metrics, priorities = self.algo.compute_gradients(
                phase, self._batch, out=self._send[:n], metrics=self._want_metrics)
            if self._weight != 1.0:
                np.multiply(self._send[:n], np.float32(self._weight), out=self._send[:n])
            t1 = time.perf_counter()
            self.profile["gradients"] += t1 - t0
            if priorities is not None and self.sync:
                self.stashed.append((self._batch["indices"], priorities,
                                     self._batch["tickets"]))
            elif priorities is not None:
                self.replay.update_priorities(self._batch["indices"], priorities,
                                              self._batch["tickets"])
                self.profile["priorities"] += time.perf_counter() - t1
            if self._want_metrics:
                self.metrics.update(metrics)
        self._send[-3:] = votes
        self._phase, self._first, self._n = phase, first, n
        if first and self._batch_norm:
            self._wmax_send[0] = 0.0 if self._voting else float(self._batch["weights"].max())
        self.busy_seconds += time.perf_counter() - t0
        if self.comm.Get_size() == 1:
            self._finish()              # _recv is _send
        else:
            self._req = self.comm.Iallreduce(self._send, self._recv, op=MPI.SUM)
            if first and self._batch_norm:
                self._req_max = self.comm.Iallreduce(self._wmax_send, self._wmax_recv,
                                                     op=MPI.MAX)
            self._posted = time.perf_counter()

    def _finish(self) -> None:
        t0 = time.perf_counter()
        if self._first:
            rows, stop, pause = (float(v) for v in self._recv[-3:])
            self._rows, self._votes = rows, (stop > 0, pause > 0)
            if rows == 0:                    # every learner voted: no update
                self._todo = []
                self._end_update(applied=False)
                return
            wmax = float(self._wmax_recv[0]) if self._batch_norm else 1.0
            wmax = wmax if wmax > 0 else 1.0
            if self._want_metrics and not self._voting and wmax != 1.0:
                for key in WEIGHTED_METRICS:
                    if key in self.metrics:
                        self.metrics[key] /= wmax
            # The first phase's loss is the importance-weighted one (the contract).
            scale = 1.0 / (self._rows * wmax)
        else:
            scale = 1.0 / self._rows
        self.algo.apply_gradients(self._phase, self._recv[:self._n], scale=scale)
        t1 = time.perf_counter()
        self.profile["apply"] += t1 - t0
        if not self._todo:
            self._end_update(applied=True)
            self.profile["publish"] += time.perf_counter() - t1
        self.busy_seconds += time.perf_counter() - t0

    def _end_update(self, applied: bool) -> None:
        """All phases of an update are applied (or none was): count it, publish, and
        act on the votes that travelled with its first phase."""
        self._batch = None
        self.attempts += 1
        if applied:
            self.updates += 1
            if (self.weights is not None and not self.sync
                    and self.updates % self.cfg.publish_every == 0):
                self.weights.publish(self.algo.policy_params())
        stop, pause = self._votes
        if stop:
            self.done = True
            if self.weights is not None:
                self.weights.publish(self.algo.policy_params())
        elif pause:
            self.paused = True
