"""`LockstepVectorEnv`: a gymnasium vector environment whose sub-environments step in
worker processes (or in the MPI ranks of a node) in lockstep, through shared memory.

A drop-in for `gymnasium.vector.AsyncVectorEnv`: the same spaces (any gymnasium space),
autoreset modes, infos, `reset_async`/`reset_wait`, `step_async`/`step_wait`,
`call`/`get_attr`/`set_attr`, `render`, errors and timeouts.  It differs in how a round
is handed over: the batch arrays live in shared memory that the workers write into, and
the turn passes through atomics and a futex (`pal_hpc.envs.lockstep_protocol`), never a
pipe, queue, pickle or message.  With the same seeds it yields exactly what
`SyncVectorEnv` yields, for any worker count.  The API's bookkeeping (which call is
pending, how results become a batch) is `pal_hpc.envs.lockstep_api`.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode, VectorEnv

from pal_hpc.envs.lockstep_api import LockstepAPI
from pal_hpc.envs.lockstep_errors import raise_failures
from pal_hpc.envs.lockstep_procs import (
    Memory, exit_reason, master_broadcast, pid_dead, start_workers, track, worker_cores,
)
from pal_hpc.envs.lockstep_protocol import (
    Backoff, Layout, LockstepError, Master, Views, check_master_envs,
)
from pal_hpc.envs.lockstep_share import EnvShare, SpaceCheck
from pal_hpc.envs.lockstep_spaces import SpacePlan, is_gymnasium_space

__all__ = ["LockstepVectorEnv", "LockstepError"]


class LockstepVectorEnv(LockstepAPI, VectorEnv):
    """Sub-environments stepped in lockstep by worker processes through shared memory.

    Args:
        env_fns: one callable per sub-environment, each returning a gymnasium Env.
        num_workers: worker processes (default: min(num_envs, usable cores)); env i goes
            to one worker, in contiguous blocks.  0 steps every env in this process.
        copy: return copies of the observations (True, as gymnasium does), or the shared
            batch arrays themselves, valid until the next step.
        context: multiprocessing start method ("fork" by default; "spawn" and
            "forkserver" pickle env_fns once at start-up with cloudpickle).
        autoreset_mode: gymnasium's AutoresetMode (NEXT_STEP, SAME_STEP or DISABLED).
        shared_memory: as in AsyncVectorEnv, True refuses spaces that are not gymnasium's
            own (their values' layout is unknown); False sends their values encoded.
            gymnasium's fixed-shape spaces live in shared arrays either way.
        daemon: worker processes are daemonic (True: an env cannot start processes).
        observation_mode: "same" only (every env must have env 0's spaces).
        info_bytes: room per worker for one round's encoded infos and variable-size
            observations before they spill to a memfd of the worker.
        backoff: how long waits spin and yield before sleeping (default: by cores).
        pin_workers: pin each worker to a core of its own (distinct physical cores
            first, away from the caller's core while there are enough others).
        master_envs: the "master share": envs [0, master_envs) are stepped by this
            process itself, inside `step_wait` (and `reset_wait`, `call_wait`, ...)
            while the workers step theirs; the workers share the rest.  For small envs
            the handoff, not the env, sets a round's time: the share steps envs with no
            handoff at all.  With num_workers=0 this process steps every env.
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], num_workers: int | None = None,
                 *, copy: bool = True, context: str | None = None,
                 autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
                 shared_memory: bool = True, daemon: bool = True,
                 observation_mode: str = "same", info_bytes: int = 1 << 16,
                 backoff: Backoff | None = None, pin_workers: bool = True,
                 master_envs: int = 0):
        super().__init__()
        self._init_state()
        env_fns = list(env_fns)
        n = len(env_fns)
        if n < 1:
            raise ValueError("env_fns: at least one environment is needed")
        if num_workers is None:
            left = n - master_envs if isinstance(master_envs, int) and 0 <= master_envs <= n \
                else n
            num_workers = min(left, len(os.sched_getaffinity(0)))
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or \
                not 0 <= num_workers <= n:
            raise ValueError(f"num_workers: {num_workers!r}; expected an int in [0, {n}] "
                             f"(at most one worker per environment)")
        master_envs = check_master_envs(master_envs, n, num_workers)
        if num_workers > n - master_envs:
            raise ValueError(f"num_workers: {num_workers} workers for the {n - master_envs} "
                             f"environments left after master_envs={master_envs}; every "
                             f"worker needs at least one")
        if observation_mode != "same":
            raise ValueError(f"observation_mode: {observation_mode!r}; LockstepVectorEnv "
                             f"supports 'same' only")
        self.env_fns, self.num_workers, self.copy = env_fns, num_workers, copy
        self.shared_memory = shared_memory
        self.autoreset_mode = AutoresetMode(autoreset_mode)

        probe = env_fns[0]()
        try:
            self._describe(probe, n)
        finally:
            if num_workers:
                probe.close()
        layout = self._layout(num_workers, info_bytes, master_envs)
        self._memory = Memory(layout.nbytes)
        self._views = Views(layout, self._memory.array())
        check = SpaceCheck(self.single_observation_space, self.single_action_space)
        if num_workers == 0:
            self._master = Master(self._views, Backoff(), lambda w: None)
            self._start_local([probe] + [fn() for fn in env_fns[1:]], check)
            return
        backoff = backoff or Backoff.for_processes(num_workers + 1)
        self._master = Master(self._views, backoff, self._process_dead)
        self._master.arm_startup()
        ctx = mp.get_context(context or "fork")
        cores = worker_cores(num_workers) if pin_workers else [None] * num_workers
        track(self)
        try:
            start_workers(self._procs, ctx, self._memory, layout, env_fns, backoff, cores,
                          daemon, "lockstep-worker", check)
            self._master.wait("start-up")
            failures = self._master.failures()
            if failures:
                raise_failures(failures, layout.ranges())
        except BaseException:
            self._shutdown()
            raise
        if master_envs:                 # built after the fork: no worker holds a copy
            try:
                envs = [fn() for fn in env_fns[:master_envs]]
            except BaseException:
                self._shutdown()
                raise
            self._start_local(envs, check)
        self._ready = True

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_id(cls, env_id: str, num_envs: int, num_workers: int | None = None,
                **make_kwargs: Any) -> "LockstepVectorEnv":
        """`num_envs` copies of `gymnasium.make(env_id, **make_kwargs)`."""
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs: {num_envs!r}; expected an int >= 1")
        if env_id.startswith("ALE/"):
            import ale_py
            gym.register_envs(ale_py)
        spec = gym.spec(env_id)          # unknown ids fail here, before any worker starts
        return cls([_Maker(spec.id, make_kwargs)] * num_envs, num_workers)

    @classmethod
    def attach(cls, comm, env_fns: Sequence[Callable[[], gym.Env]], *, copy: bool = True,
               info_bytes: int = 1 << 16, backoff: Backoff | None = None,
               master_envs: int = 0):
        """Collective over `comm`, a communicator of ranks on one node: rank 0 becomes the
        master and gets the vector env; every other rank becomes a worker, steps its share
        of `env_fns` (the same list on every rank) until the master closes the env, and
        then gets None.  With one rank the master steps every env itself; otherwise it
        steps envs [0, master_envs) (the same value on every rank) and the workers share
        the rest."""
        from pal_hpc.cluster.window import allocate_shared
        from pal_hpc.envs.lockstep_share import serve

        rank, size = comm.Get_rank(), comm.Get_size()
        env_fns = list(env_fns)
        n, workers = len(env_fns), size - 1
        if workers > n:
            raise ValueError(f"env_fns: {n} environments for {workers} worker ranks; "
                             f"every worker rank needs at least one")
        master_envs = check_master_envs(master_envs, n, workers)
        self, envs = None, []

        def build():                     # rank 0: the master's envs and the layout
            nonlocal self
            try:
                self = cls.__new__(cls)
                VectorEnv.__init__(self)
                self._init_state()
                self.env_fns, self.num_workers, self.copy = env_fns, workers, copy
                self.shared_memory, self.autoreset_mode = True, AutoresetMode.NEXT_STEP
                for fn in env_fns[:max(master_envs, 1)]:
                    envs.append(fn())
                self._describe(envs[0], n)
                if not master_envs:
                    envs[0].close()
                return (self._layout(workers, info_bytes, master_envs),
                        (self.single_observation_space, self.single_action_space))
            except BaseException:
                for env in envs:
                    env.close()
                raise

        layout, spaces = master_broadcast(comm, build, "LockstepVectorEnv.attach")
        backoff = backoff or Backoff.for_processes(size)
        shared = allocate_shared(comm, layout.nbytes)
        views = Views(layout, shared.array)
        if rank == 0:
            self._views, self._free = views, shared.free
            self._master = Master(views, backoff, lambda w: pid_dead(self._master.pids()[w]))
            self._master.arm_startup()
            comm.bcast(os.getpid(), root=0)
            if workers == 0:
                self._start_local(envs, SpaceCheck(*spaces))
                return self
            track(self)
            self._master.wait("start-up")
            failures = self._master.failures()
            if failures:
                for env in envs if master_envs else ():
                    env.close()
                self._shutdown()
                raise_failures(failures, layout.ranges())
            if master_envs:
                self._start_local(envs, SpaceCheck(*spaces))
            self._ready = True
            return self
        master_pid = comm.bcast(None, root=0)
        lo, hi = layout.ranges()[rank - 1]
        serve(views, rank - 1, env_fns[lo:hi], backoff, lambda: pid_dead(master_pid) is None,
              SpaceCheck(*spaces))
        views.close()
        del views
        shared.free()
        return None

    def _init_state(self) -> None:
        self._ready = False
        self._procs: list = []
        self._memory = self._share = self._free = self._views = self._master = None
        self._state, self._orphan, self._local = "default", None, None
        self._local_op = None             # the command the master's share runs in the wait

    def _describe(self, env: gym.Env, n: int) -> None:
        self.num_envs = n
        self.metadata = dict(env.metadata)
        self.metadata["autoreset_mode"] = self.autoreset_mode
        self.render_mode = env.render_mode
        self.single_observation_space = env.observation_space
        self.single_action_space = env.action_space
        self._obs_plan = SpacePlan(env.observation_space, n)
        self._act_plan = SpacePlan(env.action_space, n)
        self.observation_space = self._obs_plan.batched
        self.action_space = self._act_plan.batched
        for what, space in (("observation", env.observation_space),
                            ("action", env.action_space)):
            if self.shared_memory and not is_gymnasium_space(space):
                raise ValueError(f"LockstepVectorEnv(shared_memory=True): the {what} space "
                                 f"{space} is not one of gymnasium's, so the layout of its "
                                 f"values is unknown; pass shared_memory=False to send them "
                                 f"in the lockstep binary encoding (plain data only)")

    def _layout(self, workers: int, info_bytes: int, master_envs: int) -> Layout:
        self.master_envs = master_envs
        return Layout(num_envs=self.num_envs, num_workers=workers,
                      obs_leaves=self._obs_plan.leaves, act_leaves=self._act_plan.leaves,
                      autoreset=self.autoreset_mode.value, info_bytes=info_bytes,
                      master_envs=master_envs if workers else 0)

    def _start_local(self, envs: list, check: SpaceCheck) -> None:
        """This process steps envs [0, len(envs)) itself, through the same views: all of
        them with no workers, the master's share beside them."""
        try:
            for i, env in enumerate(envs):
                check(i, env)
        except BaseException:
            for env in envs:
                env.close()
            self._shutdown()
            raise
        self._share = EnvShare(envs, 0, self._views)
        self._ready = True

    def _process_dead(self, w: int) -> str | None:
        why = exit_reason(self._procs[w])
        return None if why is None else f"(pid {self._procs[w].pid}) {why}"

    @property
    def worker_pids(self) -> list[int]:
        """The pids of the worker processes (or ranks)."""
        return [p.pid for p in self._procs] if self._procs else self._master.pids()

    def worker_busy_seconds(self):
        """Seconds each worker has spent stepping and resetting its environments (the
        rest of its time it waited for the master); empty when no workers."""
        return self._master.busy_seconds()


class _Maker:
    """gym.make(env_id, **kwargs) as a callable that survives pickling by id."""

    def __init__(self, env_id: str, kwargs: dict):
        self.env_id, self.kwargs = env_id, kwargs

    def __call__(self) -> gym.Env:
        return gym.make(self.env_id, **self.kwargs)
