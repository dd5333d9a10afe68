"""The lockstep environment protocol: one master, W workers, one block of shared memory.

The block (`Layout`) holds a control block (the turn handoff, `pal_hpc.envs._lockstep`),
one status slot per worker, and the batch arrays themselves: observations, actions,
rewards, terminations, truncations.  Each round the master writes the actions and posts
STEP; every worker steps its contiguous share of the environments (`EnvShare`), writes
the results into its rows of the batch arrays and its infos into its info area, and
reports done.  Nothing is pickled, piped or messaged per step.

The same protocol serves two kinds of workers: the processes `LockstepVectorEnv` starts
(memory: a memfd mapping, never a /dev/shm file) and MPI ranks of one node attached to a
window of the node (`LockstepVectorEnv.attach`).  Only how the memory is obtained and how
a dead peer is noticed differ; `serve` and `Master` are the same.
"""

from __future__ import annotations

import os
import struct
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from pal_hpc.envs import _lockstep as core
from pal_hpc.envs import codec

OP_RESET, OP_STEP, OP_CLOSE = 1, 2, 3
OP_NAMES = {OP_RESET: "reset", OP_STEP: "step", OP_CLOSE: "close"}

# Status slot of each worker: 16 uint32 words on one cache line.  Words 4-5 hold a
# uint64: the nanoseconds the worker has spent running commands (its busy time).
S_STATUS, S_ERR_LEN, S_INFO_LEN, S_PID = 0, 1, 2, 3
S64_BUSY_NS = 2
STATUS_OK, STATUS_ERROR = 0, 1
SLOT_WORDS = 16

_ALIGN = 64
_RECORD = struct.Struct("<II")   # env index, encoded info length


class LockstepError(RuntimeError):
    """The lockstep environments cannot go on: a worker raised, died, or was closed."""


def supported_space(space: gym.Space) -> bool:
    """Fixed-shape array spaces: what one row of a shared batch array can hold."""
    return isinstance(space, (gym.spaces.Box, gym.spaces.Discrete,
                              gym.spaces.MultiDiscrete, gym.spaces.MultiBinary))


def split(num_envs: int, num_workers: int) -> list[tuple[int, int]]:
    """Contiguous [lo, hi) env ranges, one per worker, sizes differing by at most one."""
    base, extra = divmod(num_envs, num_workers)
    out, lo = [], 0
    for w in range(num_workers):
        hi = lo + base + (1 if w < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


def _round_up(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


@dataclass(frozen=True)
class Layout:
    """Where everything lives in the shared block.  Plain data: it is sent to MPI ranks."""

    num_envs: int
    num_workers: int
    obs_shape: tuple
    obs_dtype: str
    act_shape: tuple
    act_dtype: str
    info_bytes: int = 1 << 16      # per worker
    error_bytes: int = 1 << 14     # per worker
    args_bytes: int = 1 << 16      # the master's reset arguments

    def _sizes(self) -> list[tuple[str, int]]:
        n, w = self.num_envs, self.num_workers
        obs = int(np.prod(self.obs_shape, dtype=np.int64)) * np.dtype(self.obs_dtype).itemsize
        act = int(np.prod(self.act_shape, dtype=np.int64)) * np.dtype(self.act_dtype).itemsize
        return [("control", core.CONTROL_BYTES), ("slots", max(w, 1) * SLOT_WORDS * 4),
                ("obs", n * obs), ("act", n * act), ("rew", n * 8), ("term", n),
                ("trunc", n), ("info", max(w, 1) * self.info_bytes),
                ("error", max(w, 1) * self.error_bytes), ("args", self.args_bytes)]

    def offsets(self) -> dict[str, tuple[int, int]]:
        """name -> (offset, nbytes), every part 64-byte aligned."""
        out, pos = {}, 0
        for name, size in self._sizes():
            out[name] = (pos, size)
            pos += _round_up(size)
        out["total"] = (0, pos)
        return out

    @property
    def nbytes(self) -> int:
        return self.offsets()["total"][1]

    def ranges(self) -> list[tuple[int, int]]:
        return split(self.num_envs, self.num_workers) if self.num_workers else []


class Views:
    """Numpy views of a shared block laid out by `layout` (`buf`: a writable uint8 array)."""

    def __init__(self, layout: Layout, buf: np.ndarray):
        if buf.nbytes < layout.nbytes:
            raise ValueError(f"shared block of {buf.nbytes} B, layout needs {layout.nbytes} B")
        if buf.ctypes.data % _ALIGN:
            raise ValueError("shared block must be 64-byte aligned")
        off = layout.offsets()
        n = layout.num_envs

        def part(name, dtype, shape):
            o, size = off[name]
            return buf[o:o + size].view(dtype).reshape(shape)

        self.layout = layout
        self.control = part("control", np.uint32, (-1,))
        self.slots = part("slots", np.uint32, (-1, SLOT_WORDS))
        self.slots64 = self.slots.view(np.uint64)
        self.obs = part("obs", np.dtype(layout.obs_dtype), (n, *layout.obs_shape))
        self.act = part("act", np.dtype(layout.act_dtype), (n, *layout.act_shape))
        self.rew = part("rew", np.float64, (n,))
        self.term = part("term", np.bool_, (n,))
        self.trunc = part("trunc", np.bool_, (n,))
        self.info = part("info", np.uint8, (-1, layout.info_bytes))
        self.error = part("error", np.uint8, (-1, layout.error_bytes))
        self.args = part("args", np.uint8, (-1,))


# ---------------------------------------------------------------------------- workers

class EnvShare:
    """The environments [lo, hi) of one worker, stepped into the shared batch arrays with
    gymnasium's next-step autoreset, exactly as `SyncVectorEnv` steps them."""

    def __init__(self, envs: Sequence[gym.Env], lo: int, views: Views):
        self.envs = list(envs)
        self.lo, self.hi = lo, lo + len(self.envs)
        self.v = views
        self.autoreset = np.zeros(len(self.envs), np.bool_)

    def reset(self, seeds: Sequence, options, mask) -> list[tuple[int, dict]]:
        v, infos = self.v, []
        for k, env in enumerate(self.envs):
            i = self.lo + k
            if mask is not None and not mask[i]:
                continue
            obs, info = env.reset(seed=seeds[i], options=options)
            v.obs[i] = obs
            v.term[i] = False
            v.trunc[i] = False
            self.autoreset[k] = False
            if info:
                infos.append((i, info))
        return infos

    def step(self) -> list[tuple[int, dict]]:
        v, infos = self.v, []
        act = v.act
        copy_action = act.ndim > 1          # an env may keep its action: never a shared view
        for k, env in enumerate(self.envs):
            i = self.lo + k
            if self.autoreset[k]:
                obs, info = env.reset()
                v.rew[i] = 0.0
                v.term[i] = False
                v.trunc[i] = False
            else:
                a = act[i].copy() if copy_action else act[i]
                obs, r, te, tr, info = env.step(a)
                v.rew[i] = r
                v.term[i] = te
                v.trunc[i] = tr
            v.obs[i] = obs
            if info:
                infos.append((i, info))
        lo, hi = self.lo, self.hi
        np.logical_or(v.term[lo:hi], v.trunc[lo:hi], out=self.autoreset)
        return infos

    def close(self) -> None:
        for env in self.envs:
            env.close()


def read_reset_args(views: Views) -> tuple[list, object, object]:
    args = codec.decode(views.args)
    return args["seeds"], args["options"], args["mask"]


def write_reset_args(views: Views, seeds, options, mask) -> None:
    raw = codec.encode({"seeds": list(seeds), "options": options, "mask": mask}, "reset")
    if len(raw) > views.args.nbytes:
        raise ValueError(f"reset options: {len(raw):,} B encoded, more than the "
                         f"{views.args.nbytes:,} B the lockstep block reserves for them")
    views.args[:len(raw)] = np.frombuffer(raw, np.uint8)


def _write_infos(views: Views, w: int, infos: list[tuple[int, dict]]) -> None:
    area = views.info[w]
    pos = 0
    for i, info in infos:
        raw = codec.encode(info, f"info of env {i}")
        end = pos + _RECORD.size + len(raw)
        if end > area.nbytes:
            raise LockstepError(f"the infos of worker {w} need more than info_bytes="
                                f"{area.nbytes:,} B per worker; raise info_bytes")
        _RECORD.pack_into(area, pos, i, len(raw))
        area[pos + _RECORD.size:end] = np.frombuffer(raw, np.uint8)
        pos = end
    views.slots[w, S_INFO_LEN] = pos


def read_infos(views: Views, w: int) -> list[tuple[int, dict]]:
    """The (env index, info) records worker `w` wrote in the last round."""
    n = int(views.slots[w, S_INFO_LEN])
    area = views.info[w]
    out, pos = [], 0
    while pos < n:
        i, k = _RECORD.unpack_from(area, pos)
        pos += _RECORD.size
        out.append((i, codec.decode(area[pos:pos + k])))
        pos += k
    return out


def _write_error(views: Views, w: int, text: str) -> None:
    raw = text.encode("utf-8", "replace")
    cap = views.error.shape[1]
    if len(raw) > cap:
        raw = b"...\n" + raw[-(cap - 4):]     # the end of a traceback says the most
    views.error[w, :len(raw)] = np.frombuffer(raw, np.uint8)
    views.slots[w, S_ERR_LEN] = len(raw)
    views.slots[w, S_STATUS] = STATUS_ERROR


def read_error(views: Views, w: int) -> str:
    n = int(views.slots[w, S_ERR_LEN])
    return bytes(views.error[w, :n]).decode("utf-8", "replace")


@dataclass(frozen=True)
class Backoff:
    """How long a waiting side spins, then yields, before it sleeps on a futex, and how
    often it wakes to check that its peers are alive (nanoseconds)."""

    spin_ns: int = 20_000
    yield_ns: int = 100_000
    check_ns: int = 50_000_000

    @staticmethod
    def for_processes(n: int) -> "Backoff":
        """No spinning when the processes outnumber the cores: a spinning waiter would
        take the core that the process it waits for needs."""
        cores = len(os.sched_getaffinity(0))
        if n > cores:
            return Backoff(spin_ns=0, yield_ns=20_000)
        return Backoff()


def serve(views: Views, w: int, make_envs: Callable[[], Sequence[gym.Env]],
          backoff: Backoff, master_alive: Callable[[], bool]) -> None:
    """Worker `w`'s loop: build its environments, then run commands until CLOSE.

    Exceptions from the environments go back to the master with their traceback; this
    function returns on CLOSE, or when `master_alive()` says the master is gone."""
    ctl = views.control
    views.slots[w, S_PID] = os.getpid()
    share = None
    try:
        lo, hi = views.layout.ranges()[w]
        envs = list(make_envs())
        if len(envs) != hi - lo:
            raise LockstepError(f"worker {w} built {len(envs)} environments, expected {hi - lo}")
        share = EnvShare(envs, lo, views)
    except BaseException:
        _write_error(views, w, f"while building environments:\n{traceback.format_exc()}")
    last = core.command_seq(ctl)       # before `done`: the master may post right after it
    core.done(ctl)
    try:
        while True:
            cmd = core.wait_command(ctl, last, backoff.spin_ns, backoff.yield_ns,
                                    backoff.check_ns)
            if cmd is None:
                if not master_alive():
                    return
                continue
            last, op, _ = cmd
            t0 = time.perf_counter_ns()
            if op == OP_CLOSE:
                core.done(ctl)
                return
            if share is None:             # could not build: the master already knows
                core.done(ctl)
                continue
            try:
                if op == OP_STEP:
                    infos = share.step()
                elif op == OP_RESET:
                    infos = share.reset(*read_reset_args(views))
                else:
                    raise LockstepError(f"unknown command {op}")
                _write_infos(views, w, infos)
            except BaseException:
                lo, hi = share.lo, share.hi
                _write_error(views, w, f"worker {w} (envs {lo}..{hi - 1}) failed in "
                                       f"{OP_NAMES.get(op, op)}:\n{traceback.format_exc()}")
            views.slots64[w, S64_BUSY_NS] += time.perf_counter_ns() - t0
            core.done(ctl)
    finally:
        if share is not None:
            try:
                share.close()
            except Exception:
                pass


# ---------------------------------------------------------------------------- master

class Master:
    """The master's side: post a command, wait for every worker, surface their errors.

    `worker_dead(w)` returns a description if worker w is gone (None while it lives);
    it is asked whenever a wait has lasted `backoff.check_ns`."""

    def __init__(self, views: Views, backoff: Backoff,
                 worker_dead: Callable[[int], str | None]):
        self.v = views
        self.backoff = backoff
        self.worker_dead = worker_dead
        self.n = views.layout.num_workers
        self.in_flight = False

    def arm_startup(self) -> None:
        """Before any worker starts: expect one 'ready' from each."""
        self.v.slots[:] = 0
        core.arm(self.v.control, self.n)

    def post(self, op: int) -> None:
        # Workers set their own info length every round and a status only on error
        # (which ends the env), so there is nothing to clear here.
        core.post(self.v.control, op, 0, self.n)
        self.in_flight = True

    def wait(self, what: str, timeout: float | None = None) -> None:
        """Wait for the command in flight; raise LockstepError naming the worker that
        failed (with its traceback) or died."""
        b, ctl = self.backoff, self.v.control
        deadline = None if timeout is None else time.monotonic() + timeout
        while not core.wait_round(ctl, b.spin_ns, b.yield_ns, b.check_ns):
            for w in range(self.n):
                why = self.worker_dead(w)
                if why is not None:
                    self.in_flight = False
                    raise LockstepError(f"lockstep worker {w} {why} during {what}")
            if deadline is not None and time.monotonic() > deadline:
                raise LockstepError(f"lockstep workers did not finish {what} within {timeout} s")
        self.in_flight = False
        status = self.v.slots[:, S_STATUS]
        if status.any():
            w = int(np.flatnonzero(status == STATUS_ERROR)[0])
            raise LockstepError(f"lockstep worker {w} raised during {what}:\n"
                                f"{read_error(self.v, w)}")

    def pids(self) -> list[int]:
        return [int(p) for p in self.v.slots[:, S_PID]]

    def busy_seconds(self) -> np.ndarray:
        """Seconds each worker has spent running commands (stepping, resetting)."""
        return self.v.slots64[:self.n, S64_BUSY_NS] / 1e9
