"""One training job: every rank builds what its role needs and runs one loop (the
checkpoints are in `checkpointing`, the end-of-run summary in `summary`, rank 0's
decisions in `coordinator`, the log and system rows in `rank_reporting`).

A rank is an actor, a learner, or both (a node of one rank).  Its loop never
blocks in MPI: the actor steps its environments, the learner advances its
state machine, the job-wide counters progress in the background, and a rank
with nothing to do sleeps for a millisecond instead of spinning (ranks often
outnumber cores here).  Rank 0 also prints progress, decides when to stop and
writes the summary.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from mpi4py import MPI

from pal_hpc.algos.registry import SPECS
from pal_hpc.cluster.collectives import gather_hosts, on_rank0, wait_all
from pal_hpc.cluster.topology import pick_device
from pal_hpc.cluster.weights import WeightStore
from pal_hpc.io import checkpoint as ckpt
from pal_hpc.io.rundir import claim_run_dir
from pal_hpc.io.tensorboard import check_tensorboard_dir, open_mirror
from pal_hpc.io.schema import streams_for
from pal_hpc.runtime import signals
from pal_hpc.runtime import stats as S
from pal_hpc.runtime.abort import JobError, injected_fault_after, stall_once
from pal_hpc.runtime.actor import Actor
from pal_hpc.runtime.checkpointing import Checkpointing
from pal_hpc.runtime.coordinator import Coordinator
from pal_hpc.runtime.imports import torch_algorithm
from pal_hpc.envs import action_info, make_env, obs_info
from pal_hpc.runtime.evaluation import FINAL_SEED, PERIODIC_SEED, evaluate
from pal_hpc.runtime.learner import METRICS_EVERY, Learner
from pal_hpc.runtime.pacing import IDLE_SLEEP, REDUCING_SLEEP, tighten_timer_slack
from pal_hpc.runtime.preflight import (check_replay_fits, make_replay, replay_kind,
                                       resolve_capacity)
from pal_hpc.runtime.rank_reporting import RankReporting
from pal_hpc.runtime.summary import Summary
from pal_hpc.runtime.telemetry import Telemetry
from pal_hpc.runtime.threads import limit_threads


class RankRun(RankReporting, Checkpointing, Summary):
    """What one rank builds for its role(s), its loop, and the wind-down."""

    def __init__(self, cfg, topo):
        self.cfg, self.topo = cfg, topo
        self.world, me = topo.world, topo.me
        self.me = me
        # Before anything is allocated: the run directory is writable, not another
        # run's, and this job's alone (rank 0 holds its lock until the process ends).
        self.run_dir_lock = on_rank0(self.world, lambda: claim_run_dir(
            cfg.resolved_run_dir(), cfg.resume, cfg.overwrite,
            check_tensorboard_dir if cfg.tensorboard else None))
        tighten_timer_slack()
        spec = SPECS[cfg.algo]         # torch-free: the algorithm's class is imported below
        probe = make_env(cfg.env, cfg.seed)
        obs_space, act_space = probe.observation_space, probe.action_space
        spec.check_env(cfg.env, obs_space, act_space)
        obs, action = obs_info(probe), action_info(probe)
        probe.close()

        node_roles = [r for r in topo.roles if r.node == me.node]
        self.n_actors = sum(r.is_actor for r in topo.roles)
        self.n_learners = sum(r.is_learner for r in topo.roles)
        # A rank that is not a learner, of an algorithm that acts in numpy (DQN, DDPG,
        # TD3, SAC on vectors; DQN on MinAtar), never imports torch: 2.6 CPU-s and
        # ~160 MB a rank less.  Its parameters come with the node learner's first
        # publication, as every actor's do.
        np_policy = spec.numpy_policy(obs_space, act_space, cfg.algo_config,
                                      max(me.actor_index, 0), self.n_actors)
        self.uses_torch = me.is_learner or np_policy is None
        self.policy = np_policy if me.is_actor else None
        Algo = torch_algorithm(cfg.algo) if self.uses_torch else None
        limit_threads(cfg.torch_threads, torch=self.uses_torch)   # and numpy's BLAS
        # The ranks without torch wait here for those importing it, asleep: in the
        # blocking collectives below MPICH would spin (sched_yield) on the cores the
        # imports need, 2.5 s a rank.
        wait_all(self.world)
        regions = sum(r.is_actor for r in node_roles)
        kind = replay_kind(cfg, obs, action, regions)
        resolve_capacity(self.world, topo.node, kind, cfg, regions)
        check_replay_fits(self.world, topo.node, kind, cfg, regions)
        self.replay = make_replay(cfg, kind, topo.node, regions)

        self.algo_class = spec
        self.algo_signature = json.loads(json.dumps(
            spec.signature_of(obs_space, act_space, cfg.algo_config)))
        self.learner = self.actor = None
        if self.uses_torch:
            def make_algo(device):
                # Same seed everywhere: every rank starts from identical parameters.
                return Algo(obs_space, act_space, cfg.algo_config, device=device,
                            seed=cfg.seed)

            cpu_algo = make_algo("cpu")
            if me.is_actor and self.policy is None:       # no numpy policy: torch's
                self.policy = cpu_algo.make_policy(me.actor_index, self.n_actors)
            n_params = len(cpu_algo.policy_params())
        else:
            # Its parameters come with the node's learner's first publication (in the
            # learner's constructor; an actor first steps after `_begin`'s barrier).
            n_params = np_policy.num_params
        self.weights = WeightStore(n_params, comm=topo.node)
        if me.is_learner:
            device = pick_device(cfg.device, me.local_learner_index)
            algo = cpu_algo if device.type == "cpu" else make_algo(device)
            self.learner = Learner(cfg, algo, self.replay, topo.learners,
                                   weights=self.weights if me.local_learner_index == 0 else None,
                                   node_learners=sum(r.is_learner for r in node_roles),
                                   # Each learner samples its own stream, reproducibly.
                                   rng=np.random.default_rng([cfg.seed, 1, me.learner_index]))
        if me.is_actor:
            self.actor = Actor(cfg, self.policy, self.replay, me.local_actor_index, self.weights,
                               me.actor_index, self.n_actors)
        self.evaluator = me.is_actor and me.actor_index == 0
        self.stats = S.StatsRounds(self.world)
        if me.local_rank == 0:          # one rank per node reports the node's replay
            self.stats.set(S.REPLAY_CAPACITY, self.replay.capacity)
        self.next_eval = cfg.eval_every if cfg.eval_every > 0 else float("inf")
        self.steps_sent = 0             # this actor's steps counted in the last round
        self.checkpoints_done = 0       # mid-run checkpoints this rank took part in
        self.hosts, self.cpus = gather_hosts(self.world)
        self.streams = streams_for(spec.metric_names)
        self.telemetry = Telemetry(self.world.Dup(), streams=self.streams)
        self._sys_last = (time.monotonic(), 0, 0)
        self.ckpt_comm = self.world.Dup()   # checkpoint collectives never meet a stats round
        self.stop_asked = False
        self.exit_status = 0            # set at the wind-down (see `train`)
        self.coord = None
        self.start = 0.0
        self.restored: dict = {}        # wall time and evaluations of the run we resume
        self.pruner = ckpt.Pruner(cfg.resolved_run_dir(), cfg.keep_checkpoints)
        self.last_good = ""             # rank 0: the newest checkpoint known to verify
        self.resumed_from = ""
        self.start_digest = ""
        if cfg.resume:
            self._resume()
        if self.learner is not None:
            self.start_digest = self.learner.algo.digest()
        self.start_replay_size = self.replay.size()

    # -- the loop ------------------------------------------------------------
    def _begin(self) -> None:
        """Every rank at the start line: the totals so far, the clock, rank 0's log."""
        wait_all(self.world)
        if self.resumed_from:
            # Until the first stats round completes, the job-wide totals are the
            # checkpoint's: learner rows and schedules go on from there, not from 0.
            self.world.Allreduce(self.stats.mine, self.stats.total, op=MPI.SUM)
        self.start = time.monotonic() - self.restored.get("wall_s", 0.0)
        # The learner profile covers this process's loop: after a resume, its parts are
        # this process's seconds, so its wall and updates count from here too.
        self._profile_from = (time.monotonic(),
                              self.learner.updates if self.learner is not None else 0)
        # Rates count from here: after a resume, the restored counters are not this
        # run's work (they made the first throughput row spike).
        self._sys_last = (time.monotonic(),
                          self.actor.steps if self.actor is not None else 0,
                          self.learner.updates if self.learner is not None else 0)
        if self.world.Get_rank() == 0:
            self.telemetry.log = self._open_log()
            self.telemetry.mirror = open_mirror(self.cfg, time.monotonic() - self.start)
            self.coord = Coordinator(self.cfg, self.start, self.restored.get("evals"),
                                     self.telemetry)
            self._announce()
        self._fault_after = injected_fault_after(self.world.Get_rank())

    def _fault_check(self) -> None:
        """PAL_HPC_INJECT_FAULT (tests): raise once this rank's time has come."""
        if self._fault_after is not None and time.monotonic() - self.start > self._fault_after:
            raise RuntimeError(f"injected fault on rank {self.world.Get_rank()} "
                               f"(PAL_HPC_INJECT_FAULT)")

    def run(self) -> dict | None:
        """Train until the job stops; rank 0 returns the summary."""
        self._begin()
        while True:
            self._fault_check()
            did = self._act() | self._learn()
            self._exchange()
            self._system_row()
            self.telemetry.poll()
            if self._checkpoint_pending() and (self.learner is None or self.learner.paused):
                self._checkpoint(self._totals())
                self.checkpoints_done += 1
                if self.learner is not None:
                    self.learner.paused = False
                did = True
            if self.stats.stopping and (self.learner is None or self.learner.done):
                break
            if not did:
                # Idle: give the core to a rank that has work.  An Allreduce in flight
                # moves only while its learners poll it, so they poll it often (at a
                # 1 ms sleep, two learners' reduction of a 270 KB gradient took 5.5 ms).
                reducing = self.learner is not None and self.learner.reducing
                t0 = time.perf_counter()
                time.sleep(REDUCING_SLEEP if reducing else IDLE_SLEEP)
                if self.learner is not None:
                    self.learner.profile["sleep_reducing" if reducing else "sleep_idle"] += (
                        time.perf_counter() - t0)
        return self._wind_down()

    def _checkpoint_pending(self) -> bool:
        """Rank 0 asked for a mid-run checkpoint that this rank has not taken yet."""
        return (not self.stats.stopping
                and self.stats.total[S.CHECKPOINTS] > self.checkpoints_done)

    def _totals(self) -> np.ndarray:
        totals = np.zeros(S.SIZE)
        self.ckpt_comm.Allreduce(self.stats.mine, totals, op=MPI.SUM)
        return totals

    def _act(self) -> bool:
        actor, stats, cfg = self.actor, self.stats, self.cfg
        if actor is None or stats.stopping or not actor.may_insert():
            return False
        if self._checkpoint_pending():
            actor.flush()               # pause: the checkpoint needs a quiet buffer
            return False
        global_steps = stats.total[S.ENV_STEPS]
        if global_steps + (actor.steps - self.steps_sent) * self.n_actors >= cfg.total_steps:
            return False                 # this actor's share of the budget is spent
        actor.step(max(global_steps, actor.steps * self.n_actors))
        stats.set(S.ENV_STEPS, actor.steps)
        now = time.monotonic() - self.start
        # The job's env step at these episodes' end, estimated as the budget check above
        # does (the last round's total plus this actor's steps since, as if every actor
        # had taken as many), and never past the budget: rows from different actors stay
        # close to each other and within the run's count.
        ep_step = int(min(global_steps + (actor.steps - self.steps_sent) * self.n_actors,
                          cfg.total_steps))
        for ret, length in actor.drain_episodes():
            stats.add(S.EPISODES, 1)
            stats.add(S.RETURN_SUM, ret)
            stats.add(S.RETURN_COUNT, 1)
            self.telemetry.record("episodes", (ep_step, now, self.me.actor_index, ret, length))
        if self.evaluator and global_steps >= self.next_eval and stats.mine[S.EVAL_COUNT] == 0:
            actor.pull_weights()
            t0 = time.monotonic()
            returns = evaluate(cfg, self.policy, cfg.eval_episodes,
                               seed=cfg.seed + PERIODIC_SEED + int(global_steps))
            stats.add(S.EVAL_SUM, returns.sum())
            stats.add(S.EVAL_SUMSQ, (returns ** 2).sum())
            stats.add(S.EVAL_COUNT, len(returns))
            stats.add(S.EVAL_STEP, global_steps)
            stats.add(S.EVAL_SECONDS, time.monotonic() - t0)
            self.next_eval = (global_steps // cfg.eval_every + 1) * cfg.eval_every
        return True

    def _learn(self) -> bool:
        if self.learner is None:
            return False
        progress = min(1.0, self.stats.total[S.ENV_STEPS] / self.cfg.total_steps)
        before = self.learner.updates
        did = self.learner.step(self.stats.stopping, progress, pause=self._checkpoint_pending())
        self._learner_row(before)
        return did

    def _learner_row(self, before: int) -> None:
        """Learner 0: count its updates and log a metrics row every METRICS_EVERY."""
        if self.me.learner_index == 0:
            self.stats.set(S.UPDATES, self.learner.updates)
            u = self.learner.updates
            if u != before and u % METRICS_EVERY == 0 and self.learner.metrics:
                m = self.learner.metrics
                self.telemetry.record("learner", (
                    u, time.monotonic() - self.start, int(self.stats.total[S.ENV_STEPS]),
                    *[m.get(name, np.nan) for name in self.algo_class.metric_names]))

    def _exchange(self) -> None:
        stats = self.stats
        if signals.requested and not stats.mine[S.PREEMPT]:
            stats.set(S.PREEMPT, 1)     # checkpoint at the next safe point, then stop
        if self.me.local_rank == 0:
            stats.set(S.REPLAY_SIZE, self.replay.size())
        stall_once(self.world.Get_rank())
        if stats.poll():
            self.steps_sent = self.actor.steps if self.actor is not None else 0
            if self.coord is not None and not self.stop_asked and self.coord.observe(stats.total):
                stats.set(S.STOP, 1)
                self.stop_asked = True
            elif self.coord is not None and not self.stop_asked and self.coord.checkpoint_due():
                stats.add(S.CHECKPOINTS, 1)

    def actor_frames(self) -> bool:
        """Whether the replay stores each frame once (a FrameStackReplay)."""
        return hasattr(self.replay, "stack_name")

    # -- the end ---------------------------------------------------------------
    def _wind_down(self) -> dict | None:
        world, cfg = self.world, self.cfg
        if self.actor is not None:
            self.actor.flush()
        self._system_row(force=True)
        self.telemetry.close()
        self.stats.finish()
        wait_all(world)               # now every learner has published its final weights
        final_eval = np.zeros(2)
        # A job stopped by SIGTERM/SIGUSR1 with work left skips the final evaluation: a
        # preempted job has SLURM's KillWait (30 s by default) before SIGKILL, and an
        # Atari evaluation can take longer than that before the checkpoint below; the
        # run's final evaluation comes at its real end.
        if not world.bcast(bool(self.coord.work_left) if self.coord else None, root=0) \
                and self.evaluator:
            self.actor.pull_weights()
            returns = evaluate(cfg, self.policy, cfg.eval_episodes, seed=cfg.seed + FINAL_SEED)
            final_eval[:] = returns.sum(), len(returns)
        # Every learner must hold the same parameters: compare digests.
        digest = self.learner.algo.digest() if self.learner is not None else ""
        profile = self._learner_profile()
        mine = (digest, profile, self._rank_profile(), self.profile_updates if profile else 0,
                "torch" in sys.modules)
        gathered = world.gather(mine, root=0) or []
        digests = [g[0] for g in gathered if g[0]]
        self.final_digest = digests[0] if digests else ""
        self.learner_profiles = [g[1] for g in gathered if g[0]]
        self.rank_profiles = [g[2] for g in gathered if g[2]]
        self.profile_updates = max((g[3] for g in gathered), default=0)
        self.torch_ranks = [rank for rank, g in enumerate(gathered) if g[4]]
        totals = np.zeros(S.SIZE)
        world.Reduce(self.stats.mine, totals, op=MPI.SUM, root=0)
        world.Reduce(final_eval.copy(), final_eval, op=MPI.SUM, root=0)
        checkpoint = self._checkpoint(totals)
        summary = None
        if self.coord is not None:
            summary = self._summary(totals, final_eval, len(set(digests)) == 1, checkpoint)
        # Rank 0 alone knows why the job stopped; every rank exits with the same status
        # (hydra's mpiexec ORs the ranks' statuses together).
        self.exit_status = world.bcast(summary["exit_status"] if summary else None, root=0)
        if self.actor is not None:
            self.actor.close()
        wait_all(world)
        self.telemetry.close_log()
        self.telemetry.comm.Free()
        self.weights.free()
        self.replay.close()
        self.ckpt_comm.Free()
        if self.run_dir_lock is not None:
            self.run_dir_lock.release()
        if checkpoint is None:
            raise JobError(f"the final checkpoint could not be written (see the error "
                           f"above); the newest checkpoint on disk is "
                           f"{world.bcast(self.last_good, root=0) or 'none'}")
        return summary

    def _rank_profile(self) -> dict:
        """This rank's wall time by phase of its loop ({} where the schedule keeps none;
        `--schedule sync` keeps one per round)."""
        return {}
