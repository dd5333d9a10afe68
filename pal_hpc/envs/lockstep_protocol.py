"""The lockstep environment protocol: one master, W workers, one block of shared memory.

The block (`Layout`) holds a control block (the turn handoff, `pal_hpc.envs._lockstep`),
one status slot per worker and one for the master, the batch arrays themselves
(observations and actions as one array per leaf of their spaces, rewards, terminations,
truncations) and the message areas.  Each round the master writes the actions and posts
STEP; every worker steps its contiguous share of the environments
(`pal_hpc.envs.lockstep_share.EnvShare`), writes the results into its rows of the batch
arrays and reports done.  Nothing is pickled, piped or messaged per step.

What does not fit a fixed row -- infos, observations and actions of variable-size spaces,
reset arguments, `call` results, errors -- goes in a `Channel`: the writer's message area
in the block, or, for a message larger than that, the writer's own spill memfd, which the
reader opens through /proc.  A round with nothing to say writes nothing.

The same protocol serves two kinds of workers: the processes `LockstepVectorEnv` starts
(memory: a memfd mapping, never a /dev/shm file) and MPI ranks of one node attached to a
window of the node (`LockstepVectorEnv.attach`).  Only how the memory is obtained and how
a dead peer is noticed differ; `serve` and `Master` are the same.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from pal_hpc.envs import _lockstep as core
from pal_hpc.envs import codec

OP_RESET, OP_STEP, OP_CLOSE, OP_CALL, OP_SETATTR = 1, 2, 3, 4, 5
OP_NAMES = {OP_RESET: "reset", OP_STEP: "step", OP_CLOSE: "close", OP_CALL: "call",
            OP_SETATTR: "set_attr"}

# Status slot of each worker (and, after them, the master's): 16 uint32 words on one cache
# line.  Words 4-5 hold a uint64: the nanoseconds the worker has spent running commands.
S_STATUS, S_OUT_LEN, S_PID, S_SPILLED, S_SPILL_FD = 0, 2, 3, 6, 7
S64_BUSY_NS = 2
STATUS_OK, STATUS_ERROR = 0, 1
SLOT_WORDS = 16

_ALIGN = 64


class LockstepError(RuntimeError):
    """The lockstep environments cannot go on: a worker raised, died, or was closed."""


def split(num_envs: int, num_workers: int) -> list[tuple[int, int]]:
    """Contiguous [lo, hi) env ranges, one per worker, sizes differing by at most one."""
    base, extra = divmod(num_envs, num_workers)
    out, lo = [], 0
    for w in range(num_workers):
        hi = lo + base + (1 if w < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


def check_master_envs(master_envs, num_envs: int, num_workers: int) -> int:
    """`master_envs` checked against the layout: an int in [0, num_envs], leaving every
    worker at least one environment.  With no workers the master steps them all (the
    value is then num_envs whatever was asked).  Raises ValueError naming it."""
    if isinstance(master_envs, bool) or not isinstance(master_envs, (int, np.integer)) \
            or not 0 <= master_envs <= num_envs:
        raise ValueError(f"master_envs: {master_envs!r}; expected an int in [0, {num_envs}] "
                         f"(the environments the master steps itself)")
    if num_workers == 0:
        return num_envs
    if num_envs - master_envs < num_workers:
        raise ValueError(f"master_envs: {master_envs} of {num_envs} environments leaves "
                         f"{num_envs - master_envs} for {num_workers} workers; every worker "
                         f"needs at least one (use at most {num_envs - num_workers}, or no "
                         f"workers for a master that steps them all)")
    return int(master_envs)


def _round_up(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _nbytes(leaf: tuple) -> int:
    shape, dtype = leaf
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


@dataclass(frozen=True)
class Layout:
    """Where everything lives in the shared block, and how the workers step.  Plain data:
    it is sent to MPI ranks.  `obs_leaves`/`act_leaves`: (row shape, dtype str) of each
    shared batch array; empty when that space's values are encoded instead."""

    num_envs: int
    num_workers: int
    obs_leaves: tuple
    act_leaves: tuple
    autoreset: str = "NextStep"    # gymnasium.vector.AutoresetMode's value
    info_bytes: int = 1 << 16      # message area per worker (more spills)
    args_bytes: int = 1 << 16      # the master's message area (more spills)
    master_envs: int = 0           # envs [0, master_envs) are stepped by the master itself

    def _sizes(self) -> list[tuple[str, int]]:
        n, w = self.num_envs, self.num_workers
        parts = [("control", core.CONTROL_BYTES), ("slots", (w + 1) * SLOT_WORDS * 4)]
        parts += [(f"obs{k}", n * _nbytes(leaf)) for k, leaf in enumerate(self.obs_leaves)]
        parts += [(f"act{k}", n * _nbytes(leaf)) for k, leaf in enumerate(self.act_leaves)]
        return parts + [("rew", n * 8), ("term", n), ("trunc", n),
                        ("info", max(w, 1) * self.info_bytes), ("args", self.args_bytes)]

    def offsets(self) -> dict[str, tuple[int, int]]:
        """name -> (offset, nbytes), every part 64-byte aligned."""
        out, pos = {}, 0
        for name, size in self._sizes():
            out[name] = (pos, size)
            pos += _round_up(max(size, 1))
        out["total"] = (0, pos)
        return out

    @property
    def nbytes(self) -> int:
        return self.offsets()["total"][1]

    def ranges(self) -> list[tuple[int, int]]:
        """The workers' [lo, hi) env ranges: the envs after the master's share."""
        if not self.num_workers:
            return []
        m = self.master_envs
        return [(lo + m, hi + m) for lo, hi in split(self.num_envs - m, self.num_workers)]


class Channel:
    """One writer's messages to its readers: `area` in the shared block, or the writer's
    spill memfd (grown to fit) for a message larger than it.  `slot`: the writer's status
    slot, which holds the length, where the message is, and the spill fd."""

    def __init__(self, slot: np.ndarray, area: np.ndarray):
        self.slot, self.area = slot, area
        self._spill = -1                  # the writer's memfd
        self._readers: dict[tuple[int, int], int] = {}

    def write(self, raw: bytes) -> None:
        n = len(raw)
        if n <= self.area.nbytes:
            self.area[:n] = np.frombuffer(raw, np.uint8)
            self.slot[S_SPILLED] = 0
        else:
            if self._spill < 0:
                self._spill = os.memfd_create("pal_lockstep_spill", os.MFD_CLOEXEC)
                self.slot[S_SPILL_FD] = self._spill
            os.ftruncate(self._spill, n)
            view, done = memoryview(raw), 0
            while done < n:
                done += os.pwrite(self._spill, view[done:], done)
            self.slot[S_SPILLED] = 1
        self.slot[S_OUT_LEN] = n

    def clear(self) -> None:
        self.slot[S_OUT_LEN] = 0

    def __len__(self) -> int:
        return int(self.slot[S_OUT_LEN])

    def read(self):
        """The last message (a buffer), or None if the writer wrote nothing."""
        n = int(self.slot[S_OUT_LEN])
        if n == 0:
            return None
        if not self.slot[S_SPILLED]:
            return self.area[:n]
        key = (int(self.slot[S_PID]), int(self.slot[S_SPILL_FD]))
        fd = self._readers.get(key)
        if fd is None:
            fd = self._readers[key] = os.open(f"/proc/{key[0]}/fd/{key[1]}", os.O_RDONLY)
        parts, done = [], 0
        while done < n:
            chunk = os.pread(fd, n - done, done)
            if not chunk:
                raise LockstepError(f"spilled message of {n:,} B ends at {done:,} B")
            parts.append(chunk)
            done += len(chunk)
        return b"".join(parts)

    def close(self) -> None:
        for fd in self._readers.values():
            os.close(fd)
        self._readers.clear()
        if self._spill >= 0:
            os.close(self._spill)
            self._spill = -1


class Views:
    """Numpy views of a shared block laid out by `layout` (`buf`: a writable uint8 array)."""

    def __init__(self, layout: Layout, buf: np.ndarray):
        if buf.nbytes < layout.nbytes:
            raise ValueError(f"shared block of {buf.nbytes} B, layout needs {layout.nbytes} B")
        if buf.ctypes.data % _ALIGN:
            raise ValueError("shared block must be 64-byte aligned")
        off = layout.offsets()
        n, w = layout.num_envs, layout.num_workers

        def part(name, dtype, shape):
            o, size = off[name]
            return buf[o:o + size].view(dtype).reshape(shape)

        self.layout = layout
        self.control = part("control", np.uint32, (-1,))
        self.slots = part("slots", np.uint32, (-1, SLOT_WORDS))
        self.slots64 = self.slots.view(np.uint64)
        self.obs = [part(f"obs{k}", np.dtype(d), (n, *shape))
                    for k, (shape, d) in enumerate(layout.obs_leaves)]
        self.act = [part(f"act{k}", np.dtype(d), (n, *shape))
                    for k, (shape, d) in enumerate(layout.act_leaves)]
        self.rew = part("rew", np.float64, (n,))
        self.term = part("term", np.bool_, (n,))
        self.trunc = part("trunc", np.bool_, (n,))
        info = part("info", np.uint8, (-1, layout.info_bytes))
        self.out = [Channel(self.slots[k], info[k]) for k in range(max(w, 1))]
        self.master = Channel(self.slots[w], part("args", np.uint8, (-1,)))

    def close(self) -> None:
        for ch in self.out + [self.master]:
            ch.close()


# ---------------------------------------------------------------------------- workers

def send_out(views: Views, w: int, out: dict) -> None:
    """Worker w's message of this round (its status says whether it holds errors)."""
    ch = views.out[w]
    if not out:
        ch.clear()
        return
    ch.write(codec.encode(out, f"worker {w}'s results"))


def read_out(views: Views, w: int) -> dict:
    raw = views.out[w].read()
    return {} if raw is None else codec.decode(raw)


def error_record(i: int, what: str, exc: BaseException) -> tuple:
    """An exception as plain data: (env, what, type module, type name, message, traceback)."""
    t = type(exc)
    return (i, what, t.__module__, t.__qualname__, str(exc), traceback.format_exc())


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


def _culprit(out: dict) -> tuple | None:
    """The error record naming the first value of `out` that cannot be encoded."""
    for key, label in (("infos", "info"), ("obs", "observation"), ("results", "result")):
        for i, value in out.get(key, ()):
            try:
                codec.encode(value, f"{label} of env {i}")
            except Exception as exc:
                return error_record(i, f"encoding its {label}", exc)
    return None


def report(views: Views, w: int, out: dict) -> None:
    try:
        send_out(views, w, out)
    except Exception as exc:          # e.g. an info that is not plain data
        out = {"errors": [_culprit(out) or error_record(-1, "encoding the results", exc)]}
        send_out(views, w, out)
    if "errors" in out:
        views.slots[w, S_STATUS] = STATUS_ERROR


# ---------------------------------------------------------------------------- master

class Master:
    """The master's side: post a command, wait for every worker, collect their errors.

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
        self.v.slots[self.n, S_PID] = os.getpid()
        core.arm(self.v.control, self.n)

    def send(self, message) -> None:
        """The arguments of the next command, for every worker."""
        self.v.master.write(codec.encode(message, "arguments"))

    def post(self, op: int) -> None:
        # Workers set their own message length every round and a status only on error
        # (which ends the env), so there is nothing to clear here.
        core.post(self.v.control, op, 0, self.n)
        self.in_flight = True

    def wait(self, what: str, timeout: float | None = None) -> bool:
        """Wait for the command in flight: True once every worker is done, False after
        `timeout` seconds; LockstepError names a worker that died."""
        b, ctl = self.backoff, self.v.control
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            budget = b.check_ns
            if deadline is not None:
                budget = max(1000, min(budget, int((deadline - time.monotonic()) * 1e9)))
            if core.wait_round(ctl, b.spin_ns, b.yield_ns, budget):
                break
            for w in range(self.n):
                why = self.worker_dead(w)
                if why is not None:
                    self.in_flight = False
                    raise LockstepError(f"lockstep worker {w} {why} during {what}")
            if deadline is not None and time.monotonic() >= deadline:
                return False
        self.in_flight = False
        return True

    def failures(self) -> list[tuple]:
        """(worker, error record) for every error the workers reported in the last round."""
        status = self.v.slots[:self.n, S_STATUS]
        if not status.any():
            return []
        return [(int(w), rec) for w in np.flatnonzero(status == STATUS_ERROR)
                for rec in read_out(self.v, int(w)).get("errors", ())]

    def pids(self) -> list[int]:
        return [int(p) for p in self.v.slots[:self.n, S_PID]]

    def busy_seconds(self) -> np.ndarray:
        """Seconds each worker has spent running commands (stepping, resetting)."""
        return self.v.slots64[:self.n, S64_BUSY_NS] / 1e9
