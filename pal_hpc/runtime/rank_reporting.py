"""What a rank of an off-policy job reports while it runs (`RankRun`'s part, a mixin):
the start-up lines, the job log it opens, its system rows (throughput, replay fill,
latencies, memory) and a learner's time per update by part (`learner_profile` in the
summary)."""

from __future__ import annotations

import time

from pal_hpc.envs.make import minatar_action_set_note
from pal_hpc.io.provenance import cpus_line
from pal_hpc.runtime.telemetry import open_job_log, percentile_ms, rss_mb


class RankReporting:
    """The reporting methods of `RankRun` (see the module docstring)."""

    def _announce(self) -> None:
        cfg, topo = self.cfg, self.topo
        print(f"pal_hpc: {cfg.algo} on {cfg.env}: {self.world.Get_size()} ranks, "
              f"{topo.n_nodes} node(s), {self.n_actors} actors x {cfg.envs_per_actor} envs, "
              f"{self.n_learners} learners; replay {self.replay.capacity:,} per node "
              f"({self.replay.bytes_per_transition:.0f} B/transition, "
              f"{self.replay.nbytes / 2**30:.2f} GiB per node"
              + (", frames stored once" if self.actor_frames() else "") + ")", flush=True)
        if self.cpus:
            print(cpus_line(self.cpus), flush=True)
        if note := minatar_action_set_note(cfg.env):
            print(note, flush=True)

    def _open_log(self):
        cfg, topo = self.cfg, self.topo
        layout = {"ranks": self.world.Get_size(), "nodes": topo.n_nodes,
                  "actors": self.n_actors, "learners": self.n_learners,
                  "roles": [[r.rank, r.node, int(r.is_actor), int(r.is_learner)] for r in topo.roles]}
        return open_job_log(cfg, layout, self.hosts,
                            self.restored["wall_s"] if self.resumed_from else None,
                            self.streams, cpus=self.cpus)

    def _system_row(self, force: bool = False) -> None:
        """About every 2 s (and once at the end): this rank's throughput, replay fill,
        latencies and memory."""
        now = time.monotonic()
        last, steps0, updates0 = self._sys_last
        if now - last < 2.0 and not force:
            return
        steps = self.actor.steps if self.actor is not None else 0
        updates = self.learner.updates if self.learner is not None else 0
        ins = self.actor.insert_times if self.actor is not None else []
        smp = self.learner.sample_times if self.learner is not None else []
        role = (1 if self.me.is_actor else 0) + (2 if self.me.is_learner else 0)
        self.telemetry.record("system", (
            now - self.start, self.world.Get_rank(), role, (steps - steps0) / (now - last),
            (updates - updates0) / (now - last), self.replay.size() / self.replay.capacity,
            percentile_ms(smp, 50), percentile_ms(smp, 99), percentile_ms(ins, 50),
            percentile_ms(ins, 99), rss_mb()))
        ins.clear()
        smp.clear()
        self._sys_last = (now, steps, updates)

    def _learner_profile(self) -> dict:
        """This learner's wall time per update by part, in ms, over the updates of this
        process (`profile_updates`: a resumed run's restored ones are not its work); {}
        on an actor.  "reduce" runs from an Allreduce's post to its completion, so it
        holds "sleep_reducing" (and the rank's other work meanwhile); "loop_other" is the
        rest of the wall."""
        lrn = self.learner
        since, base = getattr(self, "_profile_from", None) or (self.start, 0)
        updates = lrn.updates - base if lrn is not None else 0
        if updates <= 0:
            return {}
        wall = time.monotonic() - since
        out = {k: 1e3 * v / updates for k, v in lrn.profile.items()}
        out["loop_other"] = (1e3 * wall / updates - sum(out.values())
                             + out["sleep_reducing"])
        out["wall_per_update"] = 1e3 * wall / updates
        self.profile_updates = updates
        return {k: round(v, 4) for k, v in out.items()}
