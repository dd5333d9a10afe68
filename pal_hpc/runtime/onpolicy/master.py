"""An on-policy job's rank: a node's master (the rollout loop, update scheduling and
the gradient Allreduce with its votes), or one of its environment workers."""

from __future__ import annotations

import functools
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from mpi4py import MPI

from pal_hpc.algos.registry import SPECS
from pal_hpc.cluster.collectives import gather_hosts, on_rank0, wait_all
from pal_hpc.cluster.topology import pick_device
from pal_hpc.config import AUTO, ConfigError
from pal_hpc.envs import LockstepVectorEnv, make_env
from pal_hpc.io import checkpoint as ckpt
from pal_hpc.io.rundir import claim_run_dir
from pal_hpc.io.tensorboard import check_tensorboard_dir, open_mirror
from pal_hpc.io.schema import streams_for
from pal_hpc.runtime import signals
from pal_hpc.runtime import stats as S
from pal_hpc.runtime.abort import injected_fault_after, stall_once
from pal_hpc.runtime.imports import torch_algorithm
from pal_hpc.runtime.evaluation import PERIODIC_SEED, evaluate
from pal_hpc.runtime.onpolicy.checkpoints import MasterCheckpointing
from pal_hpc.runtime.onpolicy.layout import host_crowded, node_layout, step_seconds
from pal_hpc.runtime.onpolicy.reporting import TIMES, MasterReporting, OnPolicyCoordinator
from pal_hpc.runtime.onpolicy.rollout import Rollout, env_seed
from pal_hpc.runtime.onpolicy.update import MasterUpdates
from pal_hpc.runtime.onpolicy.wind_down import WindDown
from pal_hpc.runtime.summary import Summary
from pal_hpc.runtime.telemetry import Telemetry
from pal_hpc.runtime.threads import limit_threads


def check_flags(cfg) -> None:
    """Run-wide flags that mean nothing to the on-policy runtime and would mislead."""
    for name in ("actors_per_node", "learners_per_node"):
        if getattr(cfg, name) != 0:
            raise ConfigError(f"{name}: --algo {cfg.algo} runs one master per node and makes "
                              f"the node's other ranks environment workers; leave it 0, "
                              f"got {getattr(cfg, name)!r}")


class OnPolicyRun(MasterUpdates, MasterCheckpointing, MasterReporting, WindDown, Summary):
    """One rank of an on-policy job: a node's master, or one of its environment workers."""

    def __init__(self, cfg, topo):
        check_flags(cfg)
        self.cfg, self.topo = cfg, topo
        self.world = world = topo.world
        self.node = topo.node
        self.node_index = topo.me.node
        self.is_master = self.node.Get_rank() == 0
        self.run_dir_lock = on_rank0(world, lambda: claim_run_dir(
            cfg.resolved_run_dir(), cfg.resume, cfg.overwrite,
            check_tensorboard_dir if cfg.tensorboard else None))
        # The masters hold the algorithm (torch); the environment workers never import
        # torch (2.6 CPU-s and ~160 MB a rank less), and wait for the masters' import
        # asleep, not in a collective MPICH would spin in.
        spec = SPECS[cfg.algo]
        self.algo_class = torch_algorithm(cfg.algo) if self.is_master else spec
        limit_threads(cfg.torch_threads, torch=self.is_master)   # and numpy's BLAS
        wait_all(world)
        acfg = cfg.algo_config
        probe = make_env(cfg.env, cfg.seed, terminal_on_life_loss=cfg.atari_terminal_on_life_loss)
        obs_space, act_space = probe.observation_space, probe.action_space
        spec.check_env(cfg.env, obs_space, act_space)
        # Every rank computes every node's share from the same layout: they agree.
        sizes = topo.node_sizes
        auto = cfg.master_envs == AUTO and max(sizes) > 1
        crowded = world.bcast(host_crowded(world) if auto else False)
        self.step_s = world.bcast(step_seconds(probe) if auto and world.Get_rank() == 0
                                  else None)
        probe.close()
        layouts = [node_layout(acfg.num_envs, cfg.master_envs, size - 1, crowded, self.step_s)
                   for size in sizes]
        self.node_envs = [n for n, _ in layouts]
        self.node_share = [m for _, m in layouts]    # envs each node's master steps itself
        self.num_envs = self.node_envs[self.node_index]
        self.env_offset = sum(self.node_envs[:self.node_index])
        self.t_max = spec.rollout_steps(acfg)        # env steps of each env per round
        self.steps_per_round = self.t_max * sum(self.node_envs)
        self.n_learners = len(sizes)                 # the masters (Summary's names)
        self.n_actors = sum(sizes) - len(sizes)      # the environment workers
        # Ranks of nodes whose master steps every env (all, or auto's rule 1): idle.
        self.idle_ranks = sum(size - 1 for size, (n, m) in zip(sizes, layouts) if m == n)
        # The masters pick their device; an error there reaches every rank.
        device, err = None, None
        if self.is_master:
            try:
                device = pick_device(cfg.device, 0)
            except ConfigError as exc:
                err = str(exc)
        errors = [e for e in world.allgather(err) if e]
        if errors:
            raise ConfigError(errors[0])
        self.masters = world.Split(0 if self.is_master else MPI.UNDEFINED, key=world.Get_rank())
        self.hosts, self.cpus = gather_hosts(world)

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
            self.algo = self.algo_class(obs_space, act_space, acfg, device=device,
                                        seed=cfg.seed, gamma=cfg.gamma)
            self.stats = S.StatsRounds(self.masters.Dup())
            self.streams = streams_for(self.algo_class.metric_names)
            self.telemetry = Telemetry(self.masters.Dup(), streams=self.streams)
            self.ckpt_comm = self.masters.Dup()
            self._update_buffers()
        self.obs_space = obs_space
        found = world.bcast(on_rank0(world, self._find_checkpoint) if cfg.resume else None,
                            root=0)
        if found is not None:
            on_rank0(world, lambda: self._check_fits_file(found))
            if self.is_master:
                self._restore(found)
            self.resumed_from = found
            if cfg.eval_every <= 0:       # a resume may turn the periodic ones off
                self.next_eval = float("inf")
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
        share = self.node_share[self.node_index]
        alone = share == self.num_envs and self.node.Get_size() > 1   # --master-envs all
        if alone and not self.is_master:
            idle_until_done(self.node)     # the master steps every env of the node
        else:
            vec = LockstepVectorEnv.attach(MPI.COMM_SELF if alone else self.node, env_fns,
                                           copy=False, master_envs=share)
        if self.is_master:
            try:
                self._master(vec, start_update)
            finally:
                if vec.num_workers:     # how busy this node's env workers were
                    self.worker_busy = vec.worker_busy_seconds().copy()
                vec.close()             # the workers return from `attach`
                if alone:
                    idle_until_done(self.node)      # the idle ranks return
        self._wind_down()

    def _master(self, vec, start_update: int) -> None:
        cfg, algo = self.cfg, self.algo
        acfg = cfg.algo_config
        self.start = time.monotonic() - self.restored.get("wall_s", 0.0)
        self.times["since"] = time.monotonic()
        self._sys_last = (time.monotonic(), self.node_steps, algo.updates)
        if self.world.Get_rank() == 0:
            self.telemetry.log = self._open_log()
            self.telemetry.mirror = open_mirror(cfg, time.monotonic() - self.start)
            self.coord = OnPolicyCoordinator(cfg, self.start, self.restored.get("evals"),
                                             self.telemetry, self.times)
            self._announce()
        fault_after = injected_fault_after(self.world.Get_rank())
        t_max, n = self.t_max, self.num_envs
        shape = self.obs_space.shape
        dtype = np.uint8 if self.obs_space.dtype == np.uint8 else np.float32
        rollouts = [Rollout(t_max, n, shape, dtype, *algo.action_spec(), algo.rollout_fields())
                    for _ in range(2)]
        seeds = [env_seed(cfg.seed, self.node_index, i, start_update) for i in range(n)]
        obs, _ = vec.reset(seed=seeds)
        rollouts[0].obs[0] = obs
        self._prev_done = np.zeros(n, bool)       # an env whose next step is a reset step
        self._ep_ret, self._ep_len = np.zeros(n), np.zeros(n, np.int64)
        pending = None                  # a finished rollout whose update is still to come
        lagged = getattr(acfg, "async_update", False)   # the gradient on a thread, a round
        overlap = getattr(acfg, "overlap", False)
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
                    actions, extras = algo.rollout_act(ro.obs[t], self.rng)
                    for name, value in extras.items():
                        ro.extras[name][t] = value
                    self.times["forward"] += perf() - t0
                    vec.step_async(algo.env_actions(actions))
                    if pending is not None and lagged:   # learn during the whole round
                        grad = worker.submit(self._gradient, pending.batch(),
                                             self._metrics_wanted())
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
                    self._record_update(done[0], done[1])
                if votes is not None and votes[0]:
                    break
                if votes is not None and votes[1]:
                    self._mid_run_checkpoint()
                self.rounds += 1
                done_steps = self.rounds * self.steps_per_round + self.restored.get("global_base", 0)
                algo.set_progress(algo.anneal_progress(done_steps, cfg.total_steps))
                last = done_steps >= cfg.total_steps
                nxt = rollouts[1 - cur]
                nxt.obs[0] = ro.obs[t_max]
                pending, cur = ro, 1 - cur
                if last or not overlap:
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
            self.next_eval = ((global_steps // cfg.eval_every + 1) * cfg.eval_every
                              if cfg.eval_every > 0 else float("inf"))
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


def idle_until_done(node) -> None:
    """A node barrier its idle ranks wait in asleep (MPICH's blocking calls poll a
    core): they enter at the start, the master when its envs are closed.  A failure on
    the master ends the job through the abort path, not through this barrier.  No
    deadline: the master is on this host and busy for the whole run."""
    from pal_hpc.cluster.deadline import untimed

    with untimed():
        req = node.Ibarrier()
    while not req.Test():
        time.sleep(0.002)


def train_on_policy(cfg, topo) -> int:
    """Run an on-policy job on this rank; returns the job's exit status (the same on
    every rank; see `runtime.entry.train`)."""
    job = OnPolicyRun(cfg, topo)
    job.run()
    return job.exit_status
