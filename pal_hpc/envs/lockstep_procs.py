"""The worker processes of `LockstepVectorEnv`: their shared memory, how they start, which
core each one runs on, and how they end with their parent whatever happens.

Ending: a worker dies with its parent (PR_SET_PDEATHSIG, and a parent-pid check in every
wait), takes SIGTERM's default action whatever handler the parent had installed (a
forked child inherits them: one that ignores SIGTERM made multiprocessing's exit handler,
which terminates and then joins its children, wait for ever), and every env still open
when the interpreter exits is closed by an exit handler that runs before
multiprocessing's.
"""

from __future__ import annotations

import atexit
import ctypes
import mmap
import multiprocessing.util  # noqa: F401  its exit handler must be registered before ours
import os
import signal
import sys
import weakref

from pal_hpc.envs.lockstep_protocol import Views
from pal_hpc.envs.lockstep_share import serve

_LIVE: "weakref.WeakSet" = weakref.WeakSet()


def track(env) -> None:
    """Close `env` at interpreter exit if its owner did not."""
    _LIVE.add(env)


@atexit.register                 # atexit runs last-registered first: before multiprocessing's
def _close_live_envs() -> None:
    for env in list(_LIVE):
        try:
            env._grace = 1.0
            env.close()
        except Exception:
            pass


class Memory:
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

    def array(self):
        import numpy as np
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


def _cpu_now() -> int:
    """The CPU the calling thread runs on (-1 if unknown)."""
    try:
        with open("/proc/thread-self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return -1


def _physical(cpu: int) -> tuple:
    base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
    try:
        with open(base + "physical_package_id") as f, open(base + "core_id") as g:
            return int(f.read()), int(g.read())
    except (OSError, ValueError):
        return (0, cpu)


def worker_cores(num_workers: int) -> list[int | None]:
    """One core per worker: distinct physical cores first (a hyperthread sibling last),
    and never the core the master runs on -- nor its sibling -- while there are enough
    others.  Where the master shares a core with a worker, the master's waits and work
    take that worker's time, and which worker that is changed from run to run."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) <= 1:
        return [None] * num_workers
    firsts, seconds, seen = [], [], set()
    for c in cores:
        phys = _physical(c)
        (seconds if phys in seen else firsts).append(c)
        seen.add(phys)
    order = firsts + seconds
    here = _cpu_now()
    sibling_cpus = {c for c in cores if _physical(c) == _physical(here)} if here >= 0 else set()
    if len(cores) - len(sibling_cpus) >= num_workers:
        avoid = sibling_cpus
    elif len(cores) > num_workers:
        avoid = {here}
    else:
        avoid = set()
    order = [c for c in order if c not in avoid] + [c for c in order if c in avoid]
    return [order[w % len(order)] for w in range(num_workers)]


def process_main(memory: Memory, layout, env_fns, w: int, backoff, parent: int,
                 core: int | None, check, share=None) -> None:
    """A worker process: serve worker `w`'s share until the master closes or dies
    (`share`: what runs the commands, as `serve` takes it; default: environments)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # Ctrl-C is the master's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)   # whatever the parent installed
    _die_with_parent()
    if core is not None:
        os.sched_setaffinity(0, {core})
    if os.getppid() != parent:
        return
    views = Views(layout, memory.array())

    def built():
        if "cv2" in sys.modules:                     # Atari preprocessing: one thread per worker
            sys.modules["cv2"].setNumThreads(1)

    serve(views, w, env_fns, backoff, lambda: os.getppid() == parent, check, built,
          **({} if share is None else {"share": share}))


class Pickled:
    """env_fns (and the space check) for spawned workers, pickled with cloudpickle at
    start-up only."""

    def __init__(self, obj):
        self.obj = obj

    def __getstate__(self):
        import cloudpickle
        return cloudpickle.dumps(self.obj)

    def __setstate__(self, raw):
        import pickle
        self.obj = pickle.loads(raw)


def start_workers(procs: list, ctx, memory: Memory, layout, fns, backoff, cores, daemon: bool,
                  name: str, check=None, share=None) -> None:
    """Start one worker process per range of `layout` on `fns[lo:hi]`, appending each to
    `procs` as it starts (so a caller that fails midway stops those already running).
    A forked worker inherits everything; a spawned one gets fns, check and share pickled
    once with cloudpickle."""
    spawned = ctx.get_start_method() != "fork"
    for w, (lo, hi) in enumerate(layout.ranges()):
        args = (fns[lo:hi], check, share)
        if spawned:
            args = tuple(Pickled(a) for a in args)
        p = ctx.Process(target=_spawned if spawned else _forked, name=f"{name}-{w}",
                        daemon=daemon, args=(memory, layout, w, backoff, os.getpid(),
                                             cores[w], *args))
        p.start()
        procs.append(p)


def _forked(memory, layout, w, backoff, parent, core, fns, check, share) -> None:
    process_main(memory, layout, fns, w, backoff, parent, core, check, share)


def _spawned(memory, layout, w, backoff, parent, core, fns, check, share) -> None:
    process_main(memory, layout, fns.obj, w, backoff, parent, core, check.obj, share.obj)


def exit_reason(proc) -> str | None:
    """How worker process `proc` ended ("was killed by SIGKILL", "exited with status
    1"), or None while it runs."""
    code = proc.exitcode
    if code is None:
        return None
    return f"was killed by {signal.Signals(-code).name}" if code < 0 else \
        f"exited with status {code}"


def master_broadcast(comm, build, who: str):
    """Collective over `comm`: rank 0 calls `build()` and every rank gets its result.
    If `build` raises, rank 0 re-raises and every other rank raises RuntimeError naming
    rank 0's error -- nobody is left waiting in the broadcast."""
    if comm.Get_rank() == 0:
        try:
            value = build()
        except BaseException as exc:
            comm.bcast((False, f"{type(exc).__name__}: {exc}"), root=0)
            raise
        comm.bcast((True, value), root=0)
        return value
    ok, value = comm.bcast(None, root=0)
    if not ok:
        raise RuntimeError(f"{who}: the master (rank 0) could not start ({value}); "
                           "see rank 0's traceback")
    return value


def pid_dead(pid: int) -> str | None:
    """Why process `pid` cannot answer (None while it runs)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return f"(pid {pid}) is gone"
    return f"(pid {pid}) is a zombie" if state in ("Z", "X") else None
