"""`LockstepAgents`: multi-agent inference in lockstep.  One PettingZoo ParallelEnv lives
in this process; each agent's policy (its own object, its own weights) lives in a worker
process, and every step the joint observation goes to all the policies and their actions
come back through shared memory, then `env.step`.

It is the lockstep engine of `LockstepVectorEnv` with policies where that one has
environments: the same shared block and turn handoff (`pal_hpc.envs.lockstep_protocol`:
atomics and a futex, no pipe, queue or pickle per step), the same worker processes
(`pal_hpc.envs.lockstep_procs`: memfd memory, never a /dev/shm file; workers that die
with their parent; closed at interpreter exit), the same error records (a worker's
exception is raised here with its traceback) and death checks.  The agents' rows are
`pal_hpc.envs.lockstep_agent_share`.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from pal_hpc.envs.lockstep_agent_share import AgentRows, PolicyShare
from pal_hpc.envs.lockstep_api import LockstepAPI
from pal_hpc.envs.lockstep_errors import exception_for
from pal_hpc.envs.lockstep_procs import (
    Memory, exit_reason, master_broadcast, pid_dead, start_workers, track, worker_cores,
)
from pal_hpc.envs.lockstep_protocol import (
    OP_CALL, OP_STEP, Backoff, Layout, LockstepError, Master, Views, error_record, read_out,
)

__all__ = ["LockstepAgents"]


class LockstepAgents:
    """Agents' policies evaluated in lockstep beside a PettingZoo ParallelEnv.

    Args:
        env: a PettingZoo ParallelEnv (`possible_agents`, `observation_space(agent)`,
            `action_space(agent)`, `reset`, `step`, `agents`), stepped by this process.
            Every agent's observation space must be a fixed-shape Box; the action spaces
            all Discrete or all Box.
        policy_fns: agent -> a callable that builds that agent's policy, one for every
            agent of `env.possible_agents`; a policy maps an observation (a read-only
            array of the agent's observation space, valid during the call) to an action.
            Each is built in the worker that serves the agent (forked: nothing pickled).
        num_workers: worker processes (default: min(agents, usable cores)); agent i goes
            to one worker, in contiguous blocks.  0 evaluates every policy here.
        master_agents: agents [0, master_agents) are evaluated by this process itself,
            while the workers evaluate theirs.
        context: multiprocessing start method ("fork" by default; "spawn"/"forkserver"
            pickle policy_fns once with cloudpickle).
        backoff: how long waits spin and yield before sleeping (default: by cores).
        pin_workers: pin each worker to a core of its own (default: only while the
            workers leave this process a core: a worker pinned beside the master, or
            beside other jobs, cannot move away; on a loaded 2-core machine W=2
            pinned ran 4x slower than unpinned).
        daemon: worker processes are daemonic.
    """

    def __init__(self, env: Any, policy_fns: Mapping[Any, Callable[[], Callable]],
                 num_workers: int | None = None, *, master_agents: int = 0,
                 context: str | None = None, backoff: Backoff | None = None,
                 pin_workers: bool | None = None, daemon: bool = True):
        self._init_state()
        fns, layout = self._describe(env, policy_fns, num_workers, master_agents)
        num_workers = self.num_workers
        self._memory = Memory(layout.nbytes)
        self._bind(Views(layout, self._memory.array()))
        make_share = partial(PolicyShare, self.rows)
        if num_workers == 0:
            self._master = Master(self._views, Backoff(), lambda w: None)
            try:
                self._local([fn() for fn in fns], make_share)
            except BaseException:
                self.close()
                raise
            return
        backoff = backoff or Backoff.for_processes(num_workers + 1)
        self._master = Master(self._views, backoff, self._process_dead)
        self._master.arm_startup()
        ctx = mp.get_context(context or "fork")
        if pin_workers is None:
            pin_workers = num_workers < len(os.sched_getaffinity(0))
        cores = worker_cores(num_workers) if pin_workers else [None] * num_workers
        track(self)
        try:
            start_workers(self._procs, ctx, self._memory, layout, fns, backoff, cores, daemon,
                          "lockstep-agents", share=make_share)
            self._master.wait("start-up")
            failures = self._master.failures()
            if failures:
                self._fail(failures)
            if self.master_agents:          # built after the fork: no worker holds a copy
                self._local([fn() for fn in fns[:self.master_agents]], make_share)
        except BaseException:
            self.close()
            raise
        self._ready = True

    def _init_state(self) -> None:
        self._ready, self._procs, self._share, self._orphan = False, [], None, None
        self._memory = self._free = self._views = self._master = None
        self._obs_in = self._act_out = self._live = None

    def _describe(self, env, policy_fns, num_workers, master_agents) -> tuple[list, Layout]:
        """Check the arguments (ValueError naming the field); the policy builders in agent
        order and the shared block's layout."""
        self.rows = AgentRows.of(env)
        agents = self.rows.agents
        self.env, self.agents, n = env, agents, len(agents)
        fns = _policy_list(policy_fns, agents)
        if num_workers is None:
            ok = isinstance(master_agents, int) and 0 <= master_agents < n
            num_workers = min(n - master_agents if ok else n, len(os.sched_getaffinity(0)))
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or \
                not 0 <= num_workers <= n:
            raise ValueError(f"num_workers: {num_workers!r}; expected an int in [0, {n}] "
                             f"(at most one worker per agent; 0 evaluates them all here)")
        if isinstance(master_agents, bool) or not isinstance(master_agents, int) or \
                not 0 <= master_agents <= n - num_workers:
            raise ValueError(f"master_agents: {master_agents!r}; expected an int in "
                             f"[0, {n - num_workers}] (every one of the {num_workers} "
                             f"workers needs at least one of the {n} agents)")
        self.num_workers = num_workers
        self.master_agents = n if num_workers == 0 else master_agents
        self._index = {agent: i for i, agent in enumerate(agents)}
        layout = Layout(num_envs=n, num_workers=num_workers, obs_leaves=self.rows.obs_leaves,
                        act_leaves=self.rows.act_leaves, info_bytes=1 << 12,
                        master_envs=self.master_agents if num_workers else 0)
        return fns, layout

    def _bind(self, views: Views) -> None:
        n = len(self.agents)
        self._views = views
        self._obs_in = [self.rows.obs_row(views, i) for i in range(n)]
        self._act_out = [self.rows.act_row(views, i) for i in range(n)]
        self._live = views.obs[1]

    @classmethod
    def attach(cls, comm, env_fn: Callable[[], Any], policy_fns: Mapping[Any, Callable],
               *, master_agents: int = 0, backoff: Backoff | None = None):
        """Collective over `comm`, ranks of one node: rank 0 builds the env
        (`env_fn()`) and gets the LockstepAgents; every other rank is a worker that
        evaluates its block of agents' policies (`policy_fns`: the same mapping on every
        rank) until the master closes, then gets None.  With one rank the master
        evaluates every policy; otherwise agents [0, master_agents) (the same value on
        every rank) and the worker ranks share the rest."""
        from pal_hpc.cluster.window import allocate_shared
        from pal_hpc.envs.lockstep_share import serve

        rank, workers = comm.Get_rank(), comm.Get_size() - 1
        self = fns = None

        def build():                     # rank 0: the env, the agents' rows, the layout
            nonlocal self, fns
            self = cls.__new__(cls)
            self._init_state()
            fns, layout = self._describe(env_fn(), policy_fns, workers, master_agents)
            return layout, self.rows

        layout, rows = master_broadcast(comm, build, "LockstepAgents.attach")
        backoff = backoff or Backoff.for_processes(workers + 1)
        shared = allocate_shared(comm, layout.nbytes)
        views = Views(layout, shared.array)
        make_share = partial(PolicyShare, rows)
        if rank == 0:
            self._free = shared.free
            self._bind(views)
            self._master = Master(views, backoff, self._process_dead)
            self._master.arm_startup()
            comm.bcast(os.getpid(), root=0)
            if workers == 0:
                self._local([fn() for fn in fns], make_share)
                return self
            track(self)
            self._master.wait("start-up")
            failures = self._master.failures()
            if failures:
                self._fail(failures)
            if self.master_agents:
                self._local([fn() for fn in fns[:self.master_agents]], make_share)
            self._ready = True
            return self
        master_pid = comm.bcast(None, root=0)
        lo, hi = layout.ranges()[rank - 1]
        mine = _policy_list(policy_fns, rows.agents)[lo:hi]
        serve(views, rank - 1, mine, backoff, lambda: pid_dead(master_pid) is None,
              share=make_share)
        views.close()
        del views
        shared.free()
        return None

    def _local(self, policies: list, make_share) -> None:
        self._share = make_share(policies, 0, self._views)
        self._ready = True

    # ------------------------------------------------------------------ stepping

    def act(self, observations: Mapping[Any, Any]) -> dict:
        """Every agent of `observations` (agent -> observation: the live agents) to its
        policy's action, evaluated in lockstep; agent -> action (an int for Discrete)."""
        self._check_open()
        self._put(observations)
        self._round(OP_STEP, "step")
        rows, out, index = self.rows, self._act_out, self._index
        return {agent: rows.action(out[index[agent]], index[agent]) for agent in observations}

    def _put(self, observations: Mapping[Any, Any]) -> None:
        # Apart from `act`: a failing round closes the memory, and no frame that an
        # exception keeps may hold a view of it then.
        live, index = self._live, self._index
        live[:] = False
        for agent, obs in observations.items():
            i = index.get(agent)
            if i is None:
                raise ValueError(f"observations: unknown agent {agent!r}; the env's "
                                 f"possible_agents are {list(self.agents)}")
            row = self._obs_in[i]
            if getattr(obs, "shape", None) != row.shape:
                raise ValueError(f"observations[{agent!r}]: shape {getattr(obs, 'shape', obs)}"
                                 f"; observation_space({agent!r}) has shape {row.shape}")
            row[...] = obs
            live[i] = True

    def run(self, steps: int, seed: int | None = None) -> dict:
        """The reactor paper's loop for `steps` env steps: reset, then each step the
        live agents' observations to their policies, their actions to `env.step`;
        a new episode when no agent is left.  {"steps", "episodes", "seconds"}."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps: {steps!r}; expected an int >= 1")
        env = self.env
        obs, _ = env.reset(seed=seed)
        episodes, t0 = 1, time.perf_counter()
        for _ in range(steps):
            if not env.agents:
                obs, _ = env.reset()
                episodes += 1
            # the step's obs also hold the agents it ended: only the live ones act
            obs, _, _, _, _ = env.step(self.act({a: obs[a] for a in env.agents}))
        return {"steps": steps, "episodes": episodes, "seconds": time.perf_counter() - t0}

    def call(self, name: str, *args, **kwargs) -> dict:
        """`policy.name(*args, **kwargs)` (or the attribute `name`) of every agent's
        policy, where it lives; agent -> result.  Results and arguments must be plain
        data (`pal_hpc.envs.codec`)."""
        self._check_open()
        self._master.send({"name": name, "args": list(args), "kwargs": dict(kwargs)})
        outs = self._round(OP_CALL, f"call({name!r})")
        results = {}
        for out in outs:
            for i, value in out.get("results", ()):
                results[self.agents[i]] = value
        return {agent: results[agent] for agent in self.agents}

    def _round(self, op: int, what: str) -> list[dict]:
        """Post `op`, run the master's share meanwhile, wait; the round's messages."""
        m = self._master
        if self.num_workers:
            m.post(op)
        local = {}
        if self._share is not None:
            try:
                local = self._share.run(op)
            except Exception as exc:
                local = {"errors": [error_record(0, what, exc)]}
        if self.num_workers:
            try:
                m.wait(what)
            except BaseException:          # a worker died, or Ctrl-C: the round is lost
                self._grace = 0.2
                self.close()
                raise
        failures = m.failures() + [(-1, rec) for rec in local.get("errors", ())]
        if failures:
            self._fail(failures)
        outs = [local] if local else []
        if op != OP_STEP:
            outs += [read_out(self._views, w) for w in range(self.num_workers)]
        return outs

    def _views_ranges(self) -> list:
        n = len(self.agents)
        return Layout(num_envs=n, num_workers=self.num_workers, obs_leaves=(), act_leaves=(),
                      master_envs=self.master_agents if self.num_workers else 0).ranges()

    def _fail(self, failures: list) -> None:
        """Close, then raise the last worker error with its traceback."""
        ranges = self._views_ranges()
        self._grace = 0.2
        self.close()
        w, (i, what, module, qualname, message, trace) = failures[-1]
        where = "the master" if w < 0 else f"worker {w}"
        if 0 <= w < len(ranges):
            where += f" (agents {self.agents[ranges[w][0]]!r}..{self.agents[ranges[w][1] - 1]!r})"
        agent = f" of agent {self.agents[i]!r}" if 0 <= i < len(self.agents) else ""
        raise exception_for(module, qualname, f"{message}\n\nLockstepAgents {where} raised "
                                              f"{qualname} during {what}{agent}:\n{trace}")

    # ------------------------------------------------------------------ life

    def _check_open(self) -> None:
        if not self._ready:
            raise LockstepError("LockstepAgents: closed (or a worker failed); make a new one")

    def _process_dead(self, w: int) -> str | None:
        lo, hi = self._views_ranges()[w]
        if not self._procs:                                   # MPI worker ranks
            pid = self._master.pids()[w]
            why = pid_dead(pid)
            return None if why is None else \
                f"(rank {w + 1}, agents {self.agents[lo]!r}..{self.agents[hi - 1]!r}) {why}"
        why = exit_reason(self._procs[w])
        return None if why is None else \
            f"(pid {self._procs[w].pid}, agents {self.agents[lo]!r}..{self.agents[hi - 1]!r}) {why}"

    @property
    def worker_pids(self) -> list[int]:
        """The pids of the worker processes (or ranks)."""
        return [p.pid for p in self._procs] if self._procs else self._master.pids()

    def close(self, timeout: float | None = None) -> None:
        """Stop the workers (politely, then by force) and release the shared memory;
        the env is the caller's and stays open.  Idempotent."""
        self._obs_in = self._act_out = self._live = None   # views of the memory: unmap it
        self._shutdown(timeout)

    # The vector env's shutdown works on the same attributes: one way to end workers.
    _shutdown = LockstepAPI._shutdown

    def __enter__(self) -> "LockstepAgents":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _policy_list(policy_fns, agents: tuple) -> list:
    """policy_fns as a list in the order of `agents`; ValueError naming a bad key."""
    if not isinstance(policy_fns, Mapping):
        raise ValueError(f"policy_fns: {type(policy_fns).__name__}; expected a mapping of "
                         f"agent -> callable that builds its policy")
    unknown = [a for a in policy_fns if a not in agents]
    if unknown:
        raise ValueError(f"policy_fns: unknown agent {unknown[0]!r}; the env's "
                         f"possible_agents are {list(agents)}")
    missing = [a for a in agents if a not in policy_fns]
    if missing:
        raise ValueError(f"policy_fns: no policy for agent(s) {missing}")
    for agent in agents:
        if not callable(policy_fns[agent]):
            raise ValueError(f"policy_fns[{agent!r}]: {policy_fns[agent]!r} is not callable")
    return [policy_fns[a] for a in agents]
