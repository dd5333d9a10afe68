"""On-policy training (PAAC): one master per node drives the node's environments in
lockstep; the masters of all nodes average their gradients with one Allreduce.

On each (real or virtual) node, node rank 0 is the *master*: it holds the algorithm
(on CUDA when asked and present), runs one batched forward pass per step, and after
t_max steps computes the round's gradient.  The node's other ranks are *environment
workers*: `LockstepVectorEnv.attach` turns them into servers of their share of the
node's `num_envs` environments, stepped through the node's shared window, until the
master closes the vector env.  The masters form their own communicator: each update
they sum their gradients with one Allreduce (its tail carries rank 0's stop,
checkpoint and counter-round votes, so every master stops, checkpoints and starts a
round of the job-wide counters after the same update) and take the same RMSProp step,
so their parameters stay bit-identical.

    round k:  for t < t_max: forward(s_t) -> actions -> step_async ... step_wait
              (overlap on: the update of round k-1 runs inside round k's first step;
              --async-update: round k-1's gradient runs on a thread through all of
              round k, which acts with the same parameters, and is applied at its end)
              gradient -> Allreduce over masters -> apply

The budget (--total-steps) is counted in whole rounds of every node, so every master
knows alone when the run ends; the learning rate anneals on the same count.  What the
off-policy runtime offers holds here: the progress line, the HDF5 metrics log (episode
rows from every environment's episode ends -- `actor` is the environment's global
index --, learner rows with PAAC's metrics, greedy evaluations on rank 0, system rows
from the masters), checkpoints and resume (parameters, optimizer, counters and the
masters' sampling RNGs are restored exactly; the environments start new episodes,
seeded apart from the first run's), SIGTERM/SIGUSR1, `summary.json` and
`python -m pal_hpc.analyze`.  The summary adds how the masters spent their wall
time (`master_time`): forward passes, updates, waiting for the environments, waiting
for the other masters, evaluations.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import h5py
import numpy as np
import torch
from mpi4py import MPI

from pal_hpc.algos import ALGOS
from pal_hpc.algos.paac import resolve_num_envs
from pal_hpc.cluster.collectives import on_rank0, wait_all
from pal_hpc.cluster.topology import pick_device
from pal_hpc.config import ConfigError, config_to_dict
from pal_hpc.envs import LockstepVectorEnv, make_env
from pal_hpc.io import checkpoint as ckpt
from pal_hpc.io.rundir import claim_run_dir
from pal_hpc.io.schema import streams_for
from pal_hpc.runtime import signals
from pal_hpc.runtime import stats as S
from pal_hpc.runtime.abort import JobError, injected_fault_after, stall_once
from pal_hpc.runtime.checkpointing import Checkpointing
from pal_hpc.runtime.coordinator import Coordinator
from pal_hpc.runtime.evaluation import FINAL_SEED, PERIODIC_SEED, evaluate
from pal_hpc.runtime.summary import Summary, _write_json
from pal_hpc.runtime.telemetry import Telemetry, open_job_log, rss_mb

METRICS_EVERY = 10          # learner rows: every 10th update
SYSTEM_EVERY = 2.0          # seconds between a master's system rows
# Where a master's wall time goes (seconds, summed); "busy" is forward + update.
# With overlap on, an update runs while the environments step, so "update" and the
# environments' stepping overlap and "env_wait" is what is left of the latter.
# With --async-update the gradient runs on a thread for a whole round; "update_join" is
# the main thread's wait for it at the round's end.
TIMES = ("forward", "update", "env_wait", "update_join", "allreduce_wait", "evaluation",
         "checkpoint")
# Rank 0's votes in the tail of each update's Allreduce: the masters act on them after
# the same update.  "counters" starts a round of the job-wide counters (StatsRounds): a
# master's own clock must not decide it, or one master posts a round the others never
# match and the run hangs at its end.
VOTES = ("stop", "checkpoint", "counters")


def check_flags(cfg) -> None:
    """Run-wide flags that mean nothing to the on-policy runtime and would mislead."""
    for name in ("actors_per_node", "learners_per_node"):
        if getattr(cfg, name) != 0:
            raise ConfigError(f"{name}: --algo {cfg.algo} runs one master per node and makes "
                              f"the node's other ranks environment workers; leave it 0, "
                              f"got {getattr(cfg, name)!r}")


def env_seed(seed: int, node: int, index: int, start_update: int) -> int:
    """Seed of environment `index` of `node`; a resumed run (start_update > 0) plays
    other episodes than the run it continues."""
    return int(np.random.SeedSequence([seed, node, index, start_update]).generate_state(1)[0])


class Rollout:
    """One round's arrays, laid out as `PAAC.compute_gradients` takes them."""

    def __init__(self, t_max: int, n: int, obs_shape: tuple, obs_dtype):
        self.obs = np.zeros((t_max + 1, n, *obs_shape), obs_dtype)
        self.action = np.zeros((t_max, n), np.int64)
        self.reward = np.zeros((t_max, n), np.float32)
        self.terminated = np.zeros((t_max, n), bool)
        self.truncated = np.zeros((t_max, n), bool)
        self.valid = np.zeros((t_max, n), bool)

    def batch(self) -> dict[str, np.ndarray]:
        return {"obs": self.obs, "action": self.action, "reward": self.reward,
                "terminated": self.terminated, "truncated": self.truncated,
                "valid": self.valid}


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


class OnPolicyRun(Checkpointing, Summary):
    """One rank of an on-policy job: a node's master, or one of its environment workers."""

    def __init__(self, cfg, topo):
        check_flags(cfg)
        self.cfg, self.topo = cfg, topo
        self.world = world = topo.world
        self.node = topo.node
        self.node_index = topo.me.node
        self.is_master = self.node.Get_rank() == 0
        self.run_dir_lock = on_rank0(world, lambda: claim_run_dir(
            cfg.resolved_run_dir(), cfg.resume, cfg.overwrite))
        torch.set_num_threads(cfg.torch_threads)
        torch.set_flush_denormal(True)
        Algo = self.algo_class = ALGOS[cfg.algo]
        acfg = cfg.algo_config
        probe = make_env(cfg.env, cfg.seed, terminal_on_life_loss=cfg.atari_terminal_on_life_loss)
        obs_space, act_space = probe.observation_space, probe.action_space
        probe.close()
        Algo.check_env(cfg.env, obs_space, act_space)
        # Every rank computes every node's share from the same layout: they agree.
        sizes = topo.node_sizes
        self.node_envs = [resolve_num_envs(acfg.num_envs, size - 1) for size in sizes]
        self.num_envs = self.node_envs[self.node_index]
        self.env_offset = sum(self.node_envs[:self.node_index])
        self.steps_per_round = acfg.t_max * sum(self.node_envs)
        self.n_learners = len(sizes)                 # the masters (Summary's names)
        self.n_actors = sum(sizes) - len(sizes)      # the environment workers
        device = pick_device(cfg.device, 0)          # on every rank: errors reach all
        self.masters = world.Split(0 if self.is_master else MPI.UNDEFINED, key=world.Get_rank())
        self.hosts = world.gather(MPI.Get_processor_name(), root=0)

        self.learner = None              # what Checkpointing's helpers look for
        self.algo = None
        self.pruner = ckpt.Pruner(cfg.resolved_run_dir(), cfg.keep_checkpoints)
        self.last_good = ""
        self.resumed_from = ""
        self.restored: dict = {}
        self.start_digest = ""
        self.start_replay_size = 0
        self.exit_status = 0
        self.coord = None
        self.start = 0.0
        self.rounds = 0                  # whole rounds of every node: the budget's count
        self.node_steps = 0              # env steps of this node's environments
        self.next_eval = cfg.eval_every if cfg.eval_every > 0 else float("inf")
        self.times = {k: 0.0 for k in TIMES}
        self._checkpoint_asked = False   # rank 0: vote for a checkpoint in the next update
        self.rng = np.random.default_rng([cfg.seed, 2, self.node_index])
        if self.is_master:
            self.algo = Algo(obs_space, act_space, acfg, device=device, seed=cfg.seed,
                             gamma=cfg.gamma)
            self.stats = S.StatsRounds(self.masters.Dup())
            self.streams = streams_for(Algo.metric_names)
            self.telemetry = Telemetry(self.masters.Dup(), streams=self.streams)
            self.ckpt_comm = self.masters.Dup()
            n = self.algo.num_params
            self._send = np.zeros(n + len(VOTES), np.float32)
            self._recv = (self._send if self.masters.Get_size() == 1
                          else np.zeros(n + len(VOTES), np.float32))
        self.obs_space = obs_space
        found = world.bcast(on_rank0(world, self._find_checkpoint) if cfg.resume else None,
                            root=0)
        if found is not None:
            on_rank0(world, lambda: self._check_fits_file(found))
            if self.is_master:
                self._restore(found)
            self.resumed_from = found
        if self.is_master:
            self.start_digest = self.algo.digest()

    # -- the job -----------------------------------------------------------------------
    def run(self) -> None:
        cfg = self.cfg
        start_update = self.algo.updates if self.is_master else 0
        start_update = self.node.bcast(start_update, root=0)
        env_fns = [functools.partial(make_env, cfg.env,
                                     env_seed(cfg.seed, self.node_index, i, start_update),
                                     terminal_on_life_loss=cfg.atari_terminal_on_life_loss)
                   for i in range(self.num_envs)]
        wait_all(self.world)
        vec = LockstepVectorEnv.attach(self.node, env_fns, copy=False)
        if self.is_master:
            try:
                self._master(vec, start_update)
            finally:
                if vec.num_workers:     # how busy this node's env workers were
                    self.worker_busy = vec.worker_busy_seconds().copy()
                vec.close()             # the workers return from `attach`
        self._wind_down()

    def _master(self, vec, start_update: int) -> None:
        cfg, algo = self.cfg, self.algo
        acfg = cfg.algo_config
        self.start = time.monotonic() - self.restored.get("wall_s", 0.0)
        self.times["since"] = time.monotonic()
        self._sys_last = (time.monotonic(), self.node_steps, algo.updates)
        if self.world.Get_rank() == 0:
            self.telemetry.log = self._open_log()
            self.coord = OnPolicyCoordinator(cfg, self.start, self.restored.get("evals"),
                                             self.telemetry, self.times)
            self._announce()
        fault_after = injected_fault_after(self.world.Get_rank())
        t_max, n = acfg.t_max, self.num_envs
        shape = self.obs_space.shape
        dtype = np.uint8 if self.obs_space.dtype == np.uint8 else np.float32
        rollouts = [Rollout(t_max, n, shape, dtype) for _ in range(2)]
        seeds = [env_seed(cfg.seed, self.node_index, i, start_update) for i in range(n)]
        obs, _ = vec.reset(seed=seeds)
        rollouts[0].obs[0] = obs
        self._prev_done = np.zeros(n, bool)       # an env whose next step is a reset step
        self._ep_ret, self._ep_len = np.zeros(n), np.zeros(n, np.int64)
        pending = None                  # a finished rollout whose update is still to come
        lagged = acfg.async_update      # its gradient runs on a thread for a whole round
        worker = ThreadPoolExecutor(1, thread_name_prefix="paac-update") if lagged else None
        cur = 0
        perf = time.perf_counter
        try:
            while True:
                if fault_after is not None and time.monotonic() - self.start > fault_after:
                    raise RuntimeError(f"injected fault on rank {self.world.Get_rank()} "
                                       f"(PAL_HPC_INJECT_FAULT)")
                ro = rollouts[cur]
                votes = None
                grad = None
                for t in range(t_max):
                    t0 = perf()
                    actions = algo.act(ro.obs[t], self.rng)
                    self.times["forward"] += perf() - t0
                    vec.step_async(actions)
                    if pending is not None and lagged:   # learn during the whole round
                        grad = worker.submit(self._gradient, pending)
                        pending = None
                    elif pending is not None:            # overlap: learn while envs step
                        votes = self._update(pending)
                        pending = None
                    t0 = perf()
                    result = vec.step_wait()
                    self.times["env_wait"] += perf() - t0
                    self._record(ro, t, actions, *result[:4])
                    if votes is not None and votes[0]:
                        break                             # stop: this round is not learned
                if grad is not None:                      # the same parameters acted: now step
                    t0 = perf()
                    done = grad.result()
                    self.times["update_join"] += perf() - t0
                    votes = self._finish_update(*done)
                if votes is not None and votes[0]:
                    break
                if votes is not None and votes[1]:
                    self._mid_run_checkpoint()
                self.rounds += 1
                done_steps = self.rounds * self.steps_per_round + self.restored.get("global_base", 0)
                algo.set_progress(min(1.0, done_steps / cfg.total_steps))
                last = done_steps >= cfg.total_steps
                nxt = rollouts[1 - cur]
                nxt.obs[0] = ro.obs[t_max]
                pending, cur = ro, 1 - cur
                if last or not acfg.overlap:
                    votes = self._update(pending)
                    pending = None
                    if votes[1] and not (votes[0] or last):
                        self._mid_run_checkpoint()
                    if votes[0] or last:
                        break
                self._between_rounds(done_steps, counters=votes is not None and votes[2])
        finally:
            if worker is not None:
                worker.shutdown(wait=True)

    def _record(self, ro: Rollout, t: int, actions, obs, rew, term, trunc) -> None:
        """Step t of the round into the rollout; episodes that ended into the counters.
        The step after an episode's end is the environment's reset step (next-step
        autoreset): not valid, and no part of any episode."""
        np.copyto(ro.obs[t + 1], obs)        # `obs` is the shared batch: copy it now
        ro.action[t], ro.reward[t] = actions, rew
        ro.terminated[t], ro.truncated[t] = term, trunc
        valid = ~self._prev_done
        ro.valid[t] = valid
        ended = term | trunc
        self._prev_done = ended
        self.node_steps += len(actions)
        self._ep_ret += np.where(valid, rew, 0.0)
        self._ep_len += valid
        if ended.any():
            self._episodes_ended(np.flatnonzero(ended & valid))

    def _episodes_ended(self, envs: np.ndarray) -> None:
        now = time.monotonic() - self.start
        step = int(self._global_steps())
        for i in envs:
            ret, length = float(self._ep_ret[i]), int(self._ep_len[i])
            self.telemetry.record("episodes", (step, now, self.env_offset + int(i), ret, length))
            self.stats.add(S.EPISODES, 1)
            self.stats.add(S.RETURN_SUM, ret)
            self.stats.add(S.RETURN_COUNT, 1)
        self._ep_ret[envs] = 0.0
        self._ep_len[envs] = 0

    def _global_steps(self) -> int:
        return self.rounds * self.steps_per_round + self.restored.get("global_base", 0)

    def _update(self, rollout: Rollout) -> tuple[bool, ...]:
        """The round's gradient, summed over the masters with one Allreduce (rank 0's
        votes in its tail), averaged and applied.  Returns the votes (`VOTES`)."""
        return self._finish_update(*self._gradient(rollout))

    def _gradient(self, rollout: Rollout) -> tuple[dict, bool, float]:
        """The round's gradient into the send buffer: (metrics, whether they are wanted,
        seconds).  Reads the parameters only, so it may run on the update thread while
        the main thread acts with the same parameters (--async-update)."""
        t0 = time.perf_counter()
        want = (self.algo.updates + 1) % METRICS_EVERY == 0 and self.world.Get_rank() == 0
        metrics, _ = self.algo.compute_gradients("ac", rollout.batch(),
                                                 out=self._send[:self.algo.num_params],
                                                 metrics=want)
        return metrics, want, time.perf_counter() - t0

    def _finish_update(self, metrics: dict, want: bool, seconds: float) -> tuple[bool, ...]:
        """Votes into the send buffer's tail, the Allreduce, the averaged step."""
        algo = self.algo
        perf = time.perf_counter
        n = algo.num_params
        self._send[n:] = self._votes()
        t1 = perf()
        if self._recv is not self._send:
            req = self.masters.Iallreduce(self._send, self._recv, op=MPI.SUM)
            while not req.Test():
                time.sleep(2e-5)          # ranks may outnumber cores: yield
        t2 = perf()
        algo.apply_gradients("ac", self._recv[:n], scale=1.0 / self.masters.Get_size())
        self.times["update"] += seconds + (perf() - t2)
        self.times["allreduce_wait"] += t2 - t1
        if want:
            self.telemetry.record("learner", (
                algo.updates, time.monotonic() - self.start, self._global_steps(),
                *[metrics.get(name, np.nan) for name in self.algo_class.metric_names]))
        return tuple(bool(v > 0) for v in self._recv[n:])             # VOTES

    def _votes(self) -> tuple[float, float, float]:
        coord = self.coord
        if coord is None:
            return 0.0, 0.0, 0.0
        return (1.0 if coord.stop_reason else 0.0,
                1.0 if self._checkpoint_asked else 0.0,
                1.0 if self.stats.due() else 0.0)

    def _between_rounds(self, global_steps: int, counters: bool) -> None:
        """Counters, the coordinator, evaluations, telemetry: once per round.  A round of
        the job-wide counters starts where the masters agreed (`counters`, rank 0's
        vote), never on a master's own clock."""
        cfg, stats = self.cfg, self.stats
        stats.set(S.ENV_STEPS, self.node_steps)
        if self.world.Get_rank() == 0:
            stats.set(S.UPDATES, self.algo.updates)
        if signals.requested and not stats.mine[S.PREEMPT]:
            stats.set(S.PREEMPT, 1)          # rank 0 votes the stop; all checkpoint then
        # One evaluation per counter round: the coordinator reads the sums of a round.
        if (self.world.Get_rank() == 0 and global_steps >= self.next_eval
                and stats.mine[S.EVAL_COUNT] == 0):
            t0 = time.perf_counter()
            policy = self.algo.make_policy()
            returns = evaluate(cfg, policy, cfg.eval_episodes,
                               seed=cfg.seed + PERIODIC_SEED + int(global_steps))
            stats.add(S.EVAL_SUM, returns.sum())
            stats.add(S.EVAL_SUMSQ, (returns ** 2).sum())
            stats.add(S.EVAL_COUNT, len(returns))
            stats.add(S.EVAL_STEP, global_steps)
            stats.add(S.EVAL_SECONDS, time.perf_counter() - t0)
            self.times["evaluation"] += time.perf_counter() - t0
            self.next_eval = (global_steps // cfg.eval_every + 1) * cfg.eval_every
        stall_once(self.world.Get_rank())
        if stats.poll(start=counters) and self.coord is not None and not self.coord.stop_reason:
            if not self.coord.observe(stats.total) and self.coord.checkpoint_due():
                self._checkpoint_asked = True
        self._system_row()
        self.telemetry.poll()

    def _mid_run_checkpoint(self) -> None:
        t0 = time.perf_counter()
        self._checkpoint_asked = False
        totals = np.zeros(S.SIZE)
        self.ckpt_comm.Allreduce(self.stats.mine, totals, op=MPI.SUM)
        self._checkpoint(totals)
        self.times["checkpoint"] += time.perf_counter() - t0

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
        acfg = cfg.algo_config
        print(f"pal_hpc: {cfg.algo} on {cfg.env}: {self.world.Get_size()} ranks, "
              f"{self.n_learners} node(s), each a master + environment workers "
              f"({' + '.join(str(e) for e in self.node_envs)} envs, {self.n_actors} worker "
              f"ranks); t_max {acfg.t_max}, {self.steps_per_round:,} env steps per update, "
              f"device {self.algo.device}", flush=True)

    def _open_log(self):
        cfg = self.cfg
        layout = {"ranks": self.world.Get_size(), "nodes": self.n_learners,
                  "masters": self.n_learners, "env_workers": self.n_actors,
                  "num_envs": self.node_envs,
                  "roles": [[r.rank, r.node, int(r.local_rank > 0), int(r.local_rank == 0)]
                            for r in self.topo.roles]}
        return open_job_log(cfg, layout, self.hosts,
                            self.restored["wall_s"] if self.resumed_from else None,
                            self.streams)

    # -- the end -----------------------------------------------------------------------
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
            if world.Get_rank() == 0:
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
        digests = [d for d in world.gather(digest, root=0) or [] if d]
        summary = None
        if self.coord is not None:
            summary = self._summary(totals, final_eval, len(set(digests)) == 1, checkpoint)
            summary.update(self._summary_extra())
            _write_json(Path(cfg.resolved_run_dir()) / "summary.json", summary)
            t = summary["master_time"]
            print(f"paac: master time: busy {t['busy']:.1%} (forward {t['forward']:.1%}, "
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
        acfg = self.cfg.algo_config
        return {"masters": self.n_learners, "env_workers": self.n_actors,
                "num_envs": self.node_envs, "t_max": acfg.t_max,
                "steps_per_update": self.steps_per_round,
                "master_time": {k: round(v, 4) for k, v in self._master_times().items()},
                "env_worker_busy": self._worker_busy_fraction(),
                "note": "actors = environment worker ranks, learners = masters (one per node)"}

    # -- checkpoints -------------------------------------------------------------------
    def _checkpoint(self, totals: np.ndarray) -> str | None:
        """Collective over the masters: rank 0 writes the main file (no replay).
        Returns its path on every master, or None when it could not be written."""
        comm = self.ckpt_comm
        algo = self.algo
        state = {"rank": self.world.Get_rank(), "node_steps": self.node_steps,
                 "stats": self.stats.mine.tolist(),
                 "np_rng": json.dumps(self.rng.bit_generator.state),
                 "torch_rng": torch.get_rng_state().numpy(),
                 "next_eval": float(self.next_eval)}
        gathered = comm.gather(state, root=0)
        written = None
        if comm.Get_rank() == 0:
            main = ckpt.main_path(self.cfg.resolved_run_dir(), algo.updates)
            try:
                ckpt.write_atomic(main, lambda f: self._fill(f, totals, gathered),
                                  in_memory=True)
                written = str(main)
                self._after_checkpoint(main)
            except OSError as exc:
                print(f"pal_hpc: error: checkpoint at update {algo.updates} not written: "
                      f"{exc}; the newest checkpoint is still {self.last_good or 'none'}",
                      file=sys.stderr, flush=True)
        return comm.bcast(written, root=0)

    def _fill(self, f: h5py.File, totals: np.ndarray, states: list) -> None:
        cfg, algo = self.cfg, self.algo
        a = f.attrs
        a["format"] = ckpt.FORMAT_VERSION
        a["updates"] = algo.updates
        a["env_steps"] = int(totals[S.ENV_STEPS])
        a["global_steps"] = self._global_steps()
        a["wall_s"] = time.monotonic() - self.start
        a["config"] = json.dumps(config_to_dict(cfg))
        a["layout"] = json.dumps(self.topo.node_sizes)
        a["num_envs"] = json.dumps(self.node_envs)
        a["evals"] = json.dumps(self.coord.evals if self.coord is not None else [])
        a["replay_files"] = json.dumps({})
        a["params_digest"] = algo.digest()
        a["algo_signature"] = json.dumps(algo.signature())
        ckpt.save_tree(f.create_group("algo"), algo.state_dict())
        ranks = f.create_group("ranks")
        for st in states:
            g = ranks.create_group(f"rank_{st['rank']}")
            g.create_dataset("torch_rng", data=st["torch_rng"])
            g.attrs["node_steps"] = st["node_steps"]
            g.attrs["stats"] = json.dumps(st["stats"])
            g.attrs["np_rng"] = st["np_rng"]
            g.attrs["next_eval"] = st["next_eval"]

    def _check_fits_file(self, path: str) -> None:
        """Rank 0: refuse, naming the field, a checkpoint this job cannot continue."""
        with h5py.File(path, "r") as f:
            attrs = {k: f.attrs[k] for k in f.attrs}
        saved = json.loads(attrs["config"])
        sig = json.loads(attrs.get("algo_signature", "{}"))
        if saved.get("algo") != self.cfg.algo:
            raise ConfigError(f"algo: the checkpoint was trained with {saved.get('algo')!r}, "
                              f"this run asks for {self.cfg.algo!r}")
        if saved.get("env") != self.cfg.env:
            raise ConfigError(f"env: the checkpoint was trained with {saved.get('env')!r}, "
                              f"this run asks for {self.cfg.env!r}")
        mine = json.loads(json.dumps(self.algo.signature()))
        for name, then in sig.items():
            if mine.get(name) != then:
                raise ConfigError(f"{name}: the checkpoint was trained with {then!r}, this "
                                  f"run asks for {mine.get(name)!r}; resuming would change "
                                  f"shapes")
        layout = json.loads(attrs["layout"])
        if layout != self.topo.node_sizes or json.loads(attrs["num_envs"]) != self.node_envs:
            raise ConfigError(f"ranks_per_node: the checkpoint was written by nodes of "
                              f"{layout} ranks with {json.loads(attrs['num_envs'])} "
                              f"environments; this run has {self.topo.node_sizes} with "
                              f"{self.node_envs}")

    def _restore(self, path: str) -> None:
        """A master: parameters, optimizer, counters and RNG states from `path`."""
        with h5py.File(path, "r") as f:
            self.algo.load_state_dict(ckpt.load_tree(f["algo"]))
            g = f[f"ranks/rank_{self.world.Get_rank()}"]
            saved = json.loads(g.attrs["stats"])[:S.SIZE]
            self.stats.mine[:len(saved)] = saved
            for slot in (S.PREEMPT, S.STOP, S.CHECKPOINTS):
                self.stats.mine[slot] = 0.0
            torch.set_rng_state(torch.from_numpy(np.array(g["torch_rng"][()])))
            self.rng.bit_generator.state = json.loads(g.attrs["np_rng"])
            self.node_steps = int(g.attrs["node_steps"])
            self.next_eval = float(g.attrs["next_eval"])
            self.restored = {"wall_s": float(f.attrs["wall_s"]),
                             "evals": json.loads(f.attrs["evals"]),
                             "global_base": int(f.attrs["global_steps"])}
        # Until the first stats round, the totals are the checkpoint's.
        self.masters.Allreduce(self.stats.mine, self.stats.total, op=MPI.SUM)
        if self.world.Get_rank() == 0:
            print(f"pal_hpc: resumed from {path} (update {self.algo.updates}, "
                  f"{self.restored['global_base']:,} env steps)", flush=True)


def train_on_policy(cfg, topo) -> int:
    """Run an on-policy job on this rank; returns the job's exit status (the same on
    every rank; see `runtime.run.train`)."""
    job = OnPolicyRun(cfg, topo)
    job.run()
    return job.exit_status
