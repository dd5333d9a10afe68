"""The end of an on-policy job: last counters, final evaluation and checkpoint, summary."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

from pal_hpc.runtime import stats as S
from pal_hpc.runtime.abort import JobError
from pal_hpc.runtime.evaluation import FINAL_SEED, evaluate
from pal_hpc.runtime.summary import _write_json


class WindDown:
    """A part of `OnPolicyRun` (a mixin): the end of the job on every rank -- the last
    counters, the final evaluation and checkpoint, the summary, the communicators."""

    def _wind_down(self) -> None:
        world, cfg = self.world, self.cfg
        totals = np.zeros(S.SIZE)
        final_eval = np.zeros(2)
        checkpoint = None
        digest = ""
        if self.is_master:
            self.stats.set(S.ENV_STEPS, self.node_steps)
            if world.Get_rank() == 0:
                self.stats.set(S.UPDATES, self.algo.updates)
            self._system_row(force=True)
            self._last_stats_round()
            self.telemetry.close()
            # Rank 0 evaluates, unless a signal stopped the job with work left: then the
            # checkpoint goes first and alone (see the off-policy `RankRun._wind_down`).
            if world.Get_rank() == 0 and not self.coord.work_left:
                t0 = time.perf_counter()
                returns = evaluate(cfg, self.algo.make_policy(), cfg.eval_episodes,
                                   seed=cfg.seed + FINAL_SEED)
                final_eval[:] = returns.sum(), len(returns)
                self.times["evaluation"] += time.perf_counter() - t0
            digest = self.algo.digest()
            self.ckpt_comm.Allreduce(self.stats.mine, totals, op=MPI.SUM)
            t0 = time.perf_counter()
            checkpoint = self._checkpoint(totals)
            self.times["checkpoint"] += time.perf_counter() - t0
        gathered = world.gather((digest, "torch" in sys.modules), root=0) or []
        digests = [d for d, _ in gathered if d]
        self.torch_ranks = [rank for rank, (_, torch) in enumerate(gathered) if torch]
        summary = None
        if self.coord is not None:
            summary = self._summary(totals, final_eval, len(set(digests)) == 1, checkpoint)
            summary.update(self._summary_extra())
            _write_json(Path(cfg.resolved_run_dir()) / "summary.json", summary)
            t = summary["master_time"]
            print(f"{cfg.algo}: master time: busy {t['busy']:.1%} (forward {t['forward']:.1%}, "
                  f"update {t['update']:.1%}), waiting for environments {t['env_wait']:.1%}, "
                  f"for other masters {t['allreduce_wait']:.1%}, evaluating "
                  f"{t['evaluation']:.1%}; env workers busy "
                  f"{summary['env_worker_busy'] or 0:.1%}", flush=True)
        self.exit_status = world.bcast(summary["exit_status"] if summary else None, root=0)
        checkpoint = world.bcast(checkpoint, root=0)
        last_good = world.bcast(self.last_good, root=0)
        if self.is_master:
            self.telemetry.close_log()
            self.telemetry.comm.Free()
            self.stats.comm.Free()
            self.ckpt_comm.Free()
            self.masters.Free()
        if self.run_dir_lock is not None:
            self.run_dir_lock.release()
        if checkpoint is None:
            raise JobError(f"the final checkpoint could not be written (see the error "
                           f"above); the newest checkpoint on disk is {last_good or 'none'}")

    def _last_stats_round(self) -> None:
        """The masters' counters a last time, blocking: the evaluations and episodes not
        yet summed reach the coordinator (and the log) before the telemetry closes."""
        stats = self.stats
        rounds = stats.rounds
        stats.finish()
        if self.coord is not None and stats.rounds > rounds:
            self.coord.observe(stats.total)
        last = np.zeros(S.SIZE)
        stats.comm.Allreduce(stats.mine, last, op=MPI.SUM)
        for slot in S.DELTAS:
            stats.mine[slot] = 0.0
        if self.coord is not None:
            self.coord.observe(last)
