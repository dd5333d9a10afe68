"""A master's update: the algorithm's round table gathered from every master, then its
steps, each one Allreduce of [gradient | the step's sums | rank 0's votes] over the
masters (`pal_hpc.algos.onpolicy` is the contract)."""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

# Rank 0's votes in the tail of each update's Allreduce: the masters act on them after
# the same update.  "counters" starts a round of the job-wide counters (StatsRounds): a
# master's own clock must not decide it, or one master posts a round the others never
# match and the run hangs at its end.
VOTES = ("stop", "checkpoint", "counters")


class MasterUpdates:
    """A part of `OnPolicyRun` (a mixin): the round's update on a master."""

    def _update_buffers(self) -> None:
        n = self.algo.num_params + self.algo.update_sums + len(VOTES)
        self._send = np.zeros(n, np.float32)
        self._recv = self._send if self.masters.Get_size() == 1 else np.zeros(n, np.float32)

    def _metrics_wanted(self) -> bool:
        every = self.algo_class.metrics_every
        return (self.algo.updates + 1) % every == 0 and self.world.Get_rank() == 0

    def _update(self, rollout) -> tuple[bool, ...]:
        """The round's update: the algorithm's table gathered from every master (when
        it has one), then each of its steps (`_gradient`, `_finish_update`).  Returns
        the votes (`VOTES`) of the last step."""
        algo = self.algo
        perf = time.perf_counter
        batch = rollout.batch()
        want = self._metrics_wanted()
        t0 = perf()
        mine = algo.begin_update(batch)
        gathered = None
        if mine is not None:
            t1 = perf()
            gathered = [mine] if self._recv is self._send else self.masters.allgather(mine)
            wait = perf() - t1
            self.times["allreduce_wait"] += wait
            t0 += wait
        self.times["update"] += perf() - t0
        metrics, votes = {}, (False,) * len(VOTES)
        for step in algo.update_plan(batch, gathered, self.masters.Get_rank()):
            metrics, _, seconds = self._gradient(step, want)
            votes = self._finish_update(metrics, want, seconds)
        self._record_update(algo.round_metrics(metrics) if want else {}, want)
        return votes

    def _gradient(self, batch: dict, want: bool) -> tuple[dict, bool, float]:
        """One step's gradient into the send buffer: (metrics, whether they are
        wanted, seconds).  Reads the parameters only, so it may run on the update
        thread while the main thread acts with the same parameters (--async-update)."""
        t0 = time.perf_counter()
        metrics, _ = self.algo.compute_gradients(self.algo.phase, batch,
                                                 out=self._send[:self.algo.num_params],
                                                 metrics=want)
        return metrics, want, time.perf_counter() - t0

    def _finish_update(self, metrics: dict, want: bool, seconds: float) -> tuple[bool, ...]:
        """The step's sums and the votes into the send buffer's tail, the Allreduce,
        the step."""
        algo = self.algo
        perf = time.perf_counter
        n, s = algo.num_params, algo.update_sums
        if s:
            self._send[n:n + s] = algo.step_sums()
        self._send[n + s:] = self._votes()
        t1 = perf()
        if self._recv is not self._send:
            req = self.masters.Iallreduce(self._send, self._recv, op=MPI.SUM)
            while not req.Test():
                time.sleep(2e-5)          # ranks may outnumber cores: yield
        t2 = perf()
        algo.apply_gradients(algo.phase, self._recv[:n],
                             scale=algo.grad_scale(self.masters.Get_size()))
        if s:
            algo.after_step(self._recv[n:n + s])
        self.times["update"] += seconds + (perf() - t2)
        self.times["allreduce_wait"] += t2 - t1
        return tuple(bool(v > 0) for v in self._recv[n + s:])             # VOTES

    def _record_update(self, metrics: dict, want: bool) -> None:
        if want:
            self.telemetry.record("learner", (
                self.algo.updates, time.monotonic() - self.start, self._global_steps(),
                *[metrics.get(name, np.nan) for name in self.algo_class.metric_names]))

    def _votes(self) -> tuple[float, float, float]:
        coord = self.coord
        if coord is None:
            return 0.0, 0.0, 0.0
        return (1.0 if coord.stop_reason else 0.0,
                1.0 if self._checkpoint_asked else 0.0,
                1.0 if self.stats.due() else 0.0)
