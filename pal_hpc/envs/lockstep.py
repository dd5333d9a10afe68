"""`LockstepVectorEnv`: a gymnasium vector environment whose sub-environments step in
worker processes (or in the MPI ranks of a node) in lockstep, through shared memory.

A drop-in for `gymnasium.vector.AsyncVectorEnv`: same spaces, next-step autoreset, the
same per-env `infos`, `step_async`/`step_wait` so the caller computes while the
environments step.  It differs in how a round is handed over: the batch arrays live in
shared memory that the workers write into, and the turn passes through atomics and a
futex (`pal_hpc.envs.lockstep_protocol`), never a pipe, queue, pickle or message.
With the same seeds it yields exactly what `SyncVectorEnv` yields, for any worker count.
"""

from __future__ import annotations

import ctypes
import mmap
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from pal_hpc.envs.lockstep_protocol import (
    OP_CLOSE, OP_RESET, OP_STEP, Backoff, EnvShare, Layout, LockstepError, Master, Views,
    S_INFO_LEN, read_infos, serve, supported_space, write_reset_args,
)

__all__ = ["LockstepVectorEnv", "LockstepError"]


def _check_space(space: gym.Space, what: str) -> None:
    if not supported_space(space):
        raise TypeError(f"LockstepVectorEnv: the {what} space {space} is not supported; "
                        f"only fixed-shape array spaces (Box, Discrete, MultiDiscrete, "
                        f"MultiBinary) fit the shared batch arrays")


def _layout(obs_space: gym.Space, act_space: gym.Space, num_envs: int, num_workers: int,
            info_bytes: int) -> Layout:
    return Layout(num_envs=num_envs, num_workers=num_workers,
                  obs_shape=tuple(obs_space.shape[1:]), obs_dtype=obs_space.dtype.str,
                  act_shape=tuple(act_space.shape[1:]), act_dtype=act_space.dtype.str,
                  info_bytes=info_bytes)


class _Memory:
    """An anonymous shared mapping (memfd): inherited by forked workers, opened through
    /proc by spawned ones, and never a file in /dev/shm, so no crash can leak it."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.fd = os.memfd_create("pal_lockstep", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, nbytes)
            self.map = mmap.mmap(self.fd, nbytes)
        except BaseException:
            os.close(self.fd)
            raise
        self.path = f"/proc/{os.getpid()}/fd/{self.fd}"

    def __getstate__(self):               # what a spawned worker receives
        return {"nbytes": self.nbytes, "path": self.path}

    def __setstate__(self, state):
        self.nbytes, self.path = state["nbytes"], state["path"]
        self.fd = os.open(self.path, os.O_RDWR)
        self.map = mmap.mmap(self.fd, self.nbytes)

    def array(self) -> np.ndarray:
        return np.frombuffer(self.map, np.uint8)

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:
            pass                          # a caller still holds a view; unmapped with it
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)     # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass                              # the master_alive check still stops us


def _process_main(memory: _Memory, layout: Layout, env_fns, w: int, backoff: Backoff,
                  parent: int, pin: bool) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the master's to handle
    _die_with_parent()
    cores = sorted(os.sched_getaffinity(0))
    if pin and len(cores) > 1:
        # One core per worker, round robin.  Left to itself the scheduler wakes the
        # workers on the core of the master that woke them, and two workers then
        # share one core while the other idles (CartPole, 2 workers x 32 envs:
        # 116k steps/s unpinned).
        os.sched_setaffinity(0, {cores[w % len(cores)]})
    if os.getppid() != parent:
        return
    views = Views(layout, memory.array())

    def make_envs():
        envs = [fn() for fn in env_fns]
        import sys
        if "cv2" in sys.modules:                   # Atari preprocessing: one thread per worker
            sys.modules["cv2"].setNumThreads(1)
        return envs

    serve(views, w, make_envs, backoff, lambda: os.getppid() == parent)


class _Pickled:
    """env_fns for spawned workers, pickled with cloudpickle at start-up only."""

    def __init__(self, fns):
        self.fns = fns

    def __getstate__(self):
        import cloudpickle
        return cloudpickle.dumps(self.fns)

    def __setstate__(self, raw):
        import pickle
        self.fns = pickle.loads(raw)

    def __iter__(self):
        return iter(self.fns)


def _pid_dead(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return f"(pid {pid}) is gone"
    return f"(pid {pid}) is a zombie" if state in ("Z", "X") else None


class LockstepVectorEnv(VectorEnv):
    """Sub-environments stepped in lockstep by worker processes through shared memory.

    Args:
        env_fns: one callable per sub-environment, each returning a gymnasium Env.
        num_workers: worker processes (default: min(num_envs, usable cores)); env i goes
            to one worker, in contiguous blocks.  0 steps every env in this process.
        copy: return copies of the observations (True, as gymnasium does), or the shared
            batch array itself, valid until the next step.
        context: multiprocessing start method ("fork" by default; "spawn" and
            "forkserver" pickle env_fns once at start-up with cloudpickle).
        info_bytes: room per worker for the encoded infos of one round.
        backoff: how long waits spin and yield before sleeping (default: by cores).
        pin_workers: pin worker w to core w mod cores (of this process's affinity set);
            unpinned, the scheduler tends to wake workers on the master's core.
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], num_workers: int | None = None,
                 *, copy: bool = True, context: str | None = None, info_bytes: int = 1 << 16,
                 backoff: Backoff | None = None, pin_workers: bool = True):
        super().__init__()
        self._ready = False
        self._procs: list = []
        self._memory = None
        self._share = None
        self._free = None
        env_fns = list(env_fns)
        n = len(env_fns)
        if n < 1:
            raise ValueError("env_fns: at least one environment is needed")
        if num_workers is None:
            num_workers = min(n, len(os.sched_getaffinity(0)))
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or \
                not 0 <= num_workers <= n:
            raise ValueError(f"num_workers: {num_workers!r}; expected an int in [0, {n}] "
                             f"(at most one worker per environment)")
        self.env_fns = env_fns
        self.num_workers = num_workers
        self.copy = copy

        if num_workers == 0:
            envs = [fn() for fn in env_fns]
            self._describe(envs[0], n)
            layout = _layout(self.observation_space, self.action_space, n, 0, info_bytes)
            self._memory = _Memory(layout.nbytes)
            self._views = Views(layout, self._memory.array())
            self._share = EnvShare(envs, 0, self._views)
            self._master = Master(self._views, Backoff(), lambda w: None)
            self._ready = True
            return

        probe = env_fns[0]()
        try:
            self._describe(probe, n)
        finally:
            probe.close()
        layout = _layout(self.observation_space, self.action_space, n, num_workers, info_bytes)
        self._memory = _Memory(layout.nbytes)
        self._views = Views(layout, self._memory.array())
        backoff = backoff or Backoff.for_processes(num_workers + 1)
        self._master = Master(self._views, backoff, self._process_dead)
        self._master.arm_startup()
        ctx = mp.get_context(context or "fork")
        try:
            for w, (lo, hi) in enumerate(layout.ranges()):
                fns = env_fns[lo:hi]
                if ctx.get_start_method() != "fork":
                    fns = _Pickled(fns)
                p = ctx.Process(target=_process_main, name=f"lockstep-worker-{w}", daemon=True,
                                args=(self._memory, layout, fns, w, backoff, os.getpid(),
                                      pin_workers))
                p.start()
                self._procs.append(p)
            self._master.wait("start-up")
        except BaseException:
            self._shutdown()
            raise
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
               info_bytes: int = 1 << 16, backoff: Backoff | None = None):
        """Collective over `comm`, a communicator of ranks on one node: rank 0 becomes the
        master and gets the vector env; every other rank becomes a worker, steps its share
        of `env_fns` (the same list on every rank) until the master closes the env, and
        then gets None.  With one rank the master steps every env itself."""
        from pal_hpc.cluster.window import allocate_shared

        rank, size = comm.Get_rank(), comm.Get_size()
        env_fns = list(env_fns)
        n, workers = len(env_fns), size - 1
        if workers > n:
            raise ValueError(f"env_fns: {n} environments for {workers} worker ranks; "
                             f"every worker rank needs at least one")
        self = layout = None
        if rank == 0:
            self = cls.__new__(cls)
            VectorEnv.__init__(self)
            self._ready, self._procs, self._memory, self._share = False, [], None, None
            self.env_fns, self.num_workers, self.copy = env_fns, workers, copy
            envs = [fn() for fn in env_fns] if workers == 0 else [env_fns[0]()]
            self._describe(envs[0], n)
            if workers:
                envs[0].close()
            layout = _layout(self.observation_space, self.action_space, n, workers, info_bytes)
        layout = comm.bcast(layout, root=0)
        backoff = backoff or Backoff.for_processes(size)
        shared = allocate_shared(comm, layout.nbytes)
        views = Views(layout, shared.array)
        if rank == 0:
            self._views, self._free = views, shared.free
            self._master = Master(views, backoff, lambda w: _pid_dead(self._master.pids()[w]))
            self._master.arm_startup()
            master_pid = comm.bcast(os.getpid(), root=0)
            if workers == 0:
                self._share = EnvShare(envs, 0, views)
            else:
                self._master.wait("start-up")
            self._ready = True
            return self
        master_pid = comm.bcast(None, root=0)
        lo, hi = layout.ranges()[rank - 1]
        serve(views, rank - 1, lambda: [fn() for fn in env_fns[lo:hi]], backoff,
              lambda: _pid_dead(master_pid) is None)
        del views
        shared.free()
        return None

    def _describe(self, env: gym.Env, n: int) -> None:
        _check_space(env.observation_space, "observation")
        _check_space(env.action_space, "action")
        self.num_envs = n
        self.metadata = dict(env.metadata)
        self.metadata["autoreset_mode"] = AutoresetMode.NEXT_STEP
        self.render_mode = env.render_mode
        self.single_observation_space = env.observation_space
        self.single_action_space = env.action_space
        self.observation_space = batch_space(env.observation_space, n)
        self.action_space = batch_space(env.action_space, n)

    def _process_dead(self, w: int) -> str | None:
        code = self._procs[w].exitcode
        if code is None:
            return None
        if code < 0:
            return f"(pid {self._procs[w].pid}) was killed by {signal.Signals(-code).name}"
        return f"(pid {self._procs[w].pid}) exited with status {code}"

    @property
    def worker_pids(self) -> list[int]:
        """The pids of the worker processes (or ranks)."""
        return [p.pid for p in self._procs] if self._procs else self._master.pids()[:self.num_workers]

    def worker_busy_seconds(self) -> np.ndarray:
        """Seconds each worker has spent stepping and resetting its environments (the
        rest of its time it waited for the master); empty when no workers."""
        return self._master.busy_seconds()

    # ------------------------------------------------------------------ the gymnasium API

    def reset(self, *, seed: int | Sequence[int | None] | None = None,
              options: dict[str, Any] | None = None):
        """Reset every sub-environment (or those in `options["reset_mask"]`)."""
        self._check_open()
        if self._master.in_flight:
            raise AlreadyPendingCallError("reset: a step_async is pending; call step_wait first",
                                          "step")
        n = self.num_envs
        if seed is None:
            seeds = [None] * n
        elif isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
            seeds = [int(seed) + i for i in range(n)]
        else:
            seeds = list(seed)
            if len(seeds) != n:
                raise ValueError(f"seed: {len(seeds)} seeds for num_envs={n}")
        options = dict(options) if options is not None else None
        mask = options.pop("reset_mask") if options and "reset_mask" in options else None
        if mask is not None:
            if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ or mask.shape != (n,):
                raise ValueError(f"options['reset_mask']: expected a bool array of shape "
                                 f"({n},), got {mask!r}")
            if not mask.any():
                raise ValueError("options['reset_mask']: no environment selected")
        if self._share is not None:
            records = self._share.reset(seeds, options, mask)
        else:
            write_reset_args(self._views, seeds, options, mask)
            self._run(OP_RESET, "reset")
            records = None
        return self._batch_obs(), self._infos(records)

    def step_async(self, actions) -> None:
        """Hand the actions to the workers and return at once; `step_wait` collects."""
        self._check_open()
        if self._master.in_flight:
            raise AlreadyPendingCallError("step_async: the previous step is still pending; "
                                          "call step_wait first", "step")
        np.copyto(self._views.act, self._checked(actions), casting="unsafe")
        if self._share is None:
            self._master.post(OP_STEP)
        else:
            self._master.in_flight = True

    def step_wait(self, timeout: float | None = None):
        """The results of the step started by `step_async` (raises LockstepError if a worker
        raised or died; the env is closed then)."""
        self._check_open()
        if not self._master.in_flight:
            raise NoAsyncCallError("step_wait: no step_async is pending", "step")
        if self._share is not None:
            self._master.in_flight = False
            records = self._share.step()
        else:
            self._wait("step", timeout)
            records = None
        v = self._views
        return self._batch_obs(), v.rew.copy(), v.term.copy(), v.trunc.copy(), self._infos(records)

    def step(self, actions):
        """Step every sub-environment once; next-step autoreset as in SyncVectorEnv."""
        self.step_async(actions)
        return self.step_wait()

    def __enter__(self) -> "LockstepVectorEnv":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close_extras(self, **kwargs: Any) -> None:
        self._shutdown()

    # ------------------------------------------------------------------ internals

    def _check_open(self) -> None:
        if self.closed or not self._ready:
            raise ClosedEnvironmentError("LockstepVectorEnv: the environment is closed")

    def _run(self, op: int, what: str) -> None:
        self._master.post(op)
        self._wait(what, None)

    def _wait(self, what: str, timeout: float | None) -> None:
        try:
            self._master.wait(what, timeout)
        except LockstepError:
            # The round is lost: no half-stepped env goes on.  Workers still inside an
            # env call are not waited for.
            self._grace = 0.2
            self.close()
            raise

    def _batch_obs(self):
        return self._views.obs.copy() if self.copy else self._views.obs

    def _infos(self, records) -> dict[str, Any]:
        infos: dict[str, Any] = {}
        if records is None:
            lengths = self._views.slots[:self.num_workers, S_INFO_LEN]
            if not lengths.any():
                return infos
            records = [r for w in np.flatnonzero(lengths) for r in read_infos(self._views, int(w))]
        for i, info in records:
            infos = self._add_info(infos, info, i)
        return infos

    def _checked(self, actions) -> np.ndarray:
        """The actions as an array, or ValueError before any worker sees them."""
        space, single = self.action_space, self.single_action_space
        a = np.asarray(actions)
        if a.shape != space.shape:
            raise ValueError(f"actions: shape {a.shape}, expected {space.shape} (one "
                             f"{single} action for each of the {self.num_envs} environments)")
        if isinstance(single, gym.spaces.Box):
            if a.dtype.kind not in "iuf":
                raise ValueError(f"actions: dtype {a.dtype} for {single}; expected numbers")
            c = a.astype(space.dtype, copy=False)
        else:
            if a.dtype.kind not in "iub":
                raise ValueError(f"actions: dtype {a.dtype} for {single}; expected integers")
            c = a
        lo, hi, lo_max, hi_min = self._action_bounds()
        # Fast path: every action within the tightest bounds.  NaN fails every
        # comparison, so it reaches the full check and is caught there.
        if not (c.min() >= lo_max and c.max() <= hi_min) and \
                not ((c >= lo) & (c <= hi)).all():
            ok = (c >= lo) & (c <= hi)
            bad = np.argwhere(~ok.reshape(self.num_envs, -1).all(axis=1))[0, 0]
            raise ValueError(f"actions: env {bad}'s action {a[bad].tolist()!r} is not in {single}")
        return c

    def _action_bounds(self):
        """Inclusive bounds of the batched action space and their tightest values, once."""
        if getattr(self, "_bounds", None) is None:
            space = self.action_space
            if isinstance(space, gym.spaces.Box):
                lo, hi = space.low, space.high
            elif isinstance(space, gym.spaces.MultiBinary):
                lo, hi = np.zeros(space.shape, np.int8), np.ones(space.shape, np.int8)
            else:                          # Discrete and MultiDiscrete batch to MultiDiscrete
                lo, hi = space.start, space.start + space.nvec - 1
            self._bounds = (lo, hi, lo.max(), hi.min())
        return self._bounds

    def _shutdown(self) -> None:
        """Stop the workers (politely, then by force) and release the memory; idempotent."""
        self._ready = False
        grace = getattr(self, "_grace", 2.0)
        if self._share is not None:
            self._share.close()
            self._share = None
        if self._procs:
            alive = [p for p in self._procs if p.exitcode is None]
            if alive:
                try:
                    self._master.post(OP_CLOSE)
                except Exception:
                    pass
                deadline = time.monotonic() + grace
                for p in alive:
                    p.join(max(0.0, deadline - time.monotonic()))
                for p in alive:
                    if p.exitcode is None:
                        p.kill()
                        p.join(2.0)
            self._procs = []
        elif self._free is not None and self.num_workers:
            self._master.post(OP_CLOSE)
            try:
                self._master.wait("close", timeout=10.0)
            except LockstepError:
                pass
        self._views = self._master.v = None      # drop every view before unmapping
        if self._free is not None:
            free, self._free = self._free, None
            free()
        if self._memory is not None:
            memory, self._memory = self._memory, None
            memory.close()


class _Maker:
    """gym.make(env_id, **kwargs) as a callable that survives pickling by id."""

    def __init__(self, env_id: str, kwargs: dict):
        self.env_id, self.kwargs = env_id, kwargs

    def __call__(self) -> gym.Env:
        return gym.make(self.env_id, **self.kwargs)
