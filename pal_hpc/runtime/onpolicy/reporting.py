"""What the masters report: rank 0's progress line, system rows, the metrics log and
the on-policy fields of `summary.json` (the off-policy side's Coordinator, Telemetry
and Summary do the rest)."""

from __future__ import annotations

import time

import numpy as np

from pal_hpc.envs.make import minatar_action_set_note
from pal_hpc.io.provenance import cpus_line
from pal_hpc.runtime.coordinator import Coordinator
from pal_hpc.runtime.onpolicy.layout import MASTER_ALONE_BELOW_S
from pal_hpc.runtime.telemetry import open_job_log, rss_mb

SYSTEM_EVERY = 2.0          # seconds between a master's system rows
# Where a master's wall time goes (seconds, summed); "busy" is forward + update.
# With overlap on, an update runs while the environments step, so "update" and the
# environments' stepping overlap and "env_wait" is what is left of the latter.
# With --async-update the gradient runs on a thread for a whole round; "update_join" is
# the main thread's wait for it at the round's end.
TIMES = ("forward", "update", "env_wait", "update_join", "allreduce_wait", "evaluation",
         "checkpoint")


class OnPolicyCoordinator(Coordinator):
    """Rank 0's coordinator, with a progress line that shows how the master spends its
    time instead of a replay fill."""

    def __init__(self, cfg, start, evals, telemetry, times):
        super().__init__(cfg, start, evals, telemetry)
        self.times = times               # rank 0's master time accounts (live dict)

    def progress(self, total: np.ndarray, now: float) -> None:
        wall = max(now - self.times["since"], 1e-9)
        frac = {k: self.times[k] / wall for k in TIMES}
        self._print_progress(total, now, f"master busy {frac['forward'] + frac['update']:4.0%} "
                                         f"(forward {frac['forward']:.0%}, update "
                                         f"{frac['update']:.0%}), envs {frac['env_wait']:.0%}")


class MasterReporting:
    """A part of `OnPolicyRun` (a mixin): what a master reports while it runs -- the
    start-up line, system rows, the metrics log, the summary's on-policy fields."""

    def _system_row(self, force: bool = False) -> None:
        now = time.monotonic()
        last, steps0, updates0 = self._sys_last
        if now - last < SYSTEM_EVERY and not force:
            return
        dt = max(now - last, 1e-9)
        self.telemetry.record("system", (
            now - self.start, self.world.Get_rank(), 3, (self.node_steps - steps0) / dt,
            (self.algo.updates - updates0) / dt, np.nan, np.nan, np.nan, np.nan, np.nan,
            rss_mb()))
        self._sys_last = (now, self.node_steps, self.algo.updates)

    def _announce(self) -> None:
        cfg = self.cfg
        print(f"pal_hpc: {cfg.algo} on {cfg.env}: {self.world.Get_size()} ranks, "
              f"{self.n_learners} node(s), each a master + environment workers "
              f"({' + '.join(str(e) for e in self.node_envs)} envs, of them "
              f"{' + '.join(str(m) for m in self.node_share)} stepped by the master(s), "
              f"{self.n_actors} worker ranks{self._idle_note()}); t_max {self.t_max}, "
              f"{self.steps_per_round:,} env steps per update, device {self.algo.device}",
              flush=True)
        if self.cpus:
            print(cpus_line(self.cpus), flush=True)
        if note := minatar_action_set_note(cfg.env):
            print(note, flush=True)

    def _idle_note(self) -> str:
        """Why worker ranks have nothing to step, for the start-up line."""
        if not self.idle_ranks:
            return ""
        why = ("--master-envs all" if self.step_s is None else
               f"--master-envs auto: a step of an env took {self.step_s * 1e6:.0f} us, "
               f"so the node's envs cost the master under "
               f"{MASTER_ALONE_BELOW_S * 1e3:g} ms a step")
        return f", {self.idle_ranks} of them idle ({why})"

    def _open_log(self):
        cfg = self.cfg
        layout = {"ranks": self.world.Get_size(), "nodes": self.n_learners,
                  "masters": self.n_learners, "env_workers": self.n_actors,
                  "num_envs": self.node_envs,
                  "roles": [[r.rank, r.node, int(r.local_rank > 0), int(r.local_rank == 0)]
                            for r in self.topo.roles]}
        return open_job_log(cfg, layout, self.hosts,
                            self.restored["wall_s"] if self.resumed_from else None,
                            self.streams, cpus=self.cpus)

    def _master_times(self) -> dict:
        wall = max(time.monotonic() - self.times["since"], 1e-9)
        out = {k: self.times[k] / wall for k in TIMES}
        out["busy"] = out["forward"] + out["update"]
        # Start-up, per-step bookkeeping (episode counters, copies), telemetry, counters.
        out["other"] = max(0.0, 1.0 - sum(out[k] for k in TIMES))
        out["wall_s"] = wall
        return out

    def _worker_busy_fraction(self) -> float | None:
        """The mean fraction of wall time rank 0's node's env workers spent stepping
        (None when the master steps the environments itself)."""
        busy = getattr(self, "worker_busy", None)
        if busy is None or not len(busy):
            return None
        wall = max(time.monotonic() - self.times["since"], 1e-9)
        return round(float(busy.mean()) / wall, 4)

    def _summary_extra(self) -> dict:
        return {"masters": self.n_learners, "env_workers": self.n_actors,
                "num_envs": self.node_envs, "master_envs": self.node_share,
                "idle_ranks": self.idle_ranks, "env_step_s": self.step_s,
                "t_max": self.t_max,
                "steps_per_update": self.steps_per_round,
                "master_time": {k: round(v, 4) for k, v in self._master_times().items()},
                "env_worker_busy": self._worker_busy_fraction(),
                "note": "actors = environment worker ranks, learners = masters (one per node)"}
