"""Watched communicators: every operation on them is an *open operation* until it
completes, which `cluster.deadline`'s watchdog looks at.

`watched(comm)` wraps a communicator (the same MPI handle) as a `WatchedComm`: its
blocking collectives and point-to-point calls are open while they run; its non-blocking
ones return a `WatchedRequest`, open until a Test or Wait finds it complete; Dup, Split
and the like return watched communicators too.  Nothing is recorded while no deadline is
set (`TIMEOUT[0]` <= 0) or inside `untimed()`.  The cost: about 4 us an operation
(an Iallreduce and its Test on one rank: 1.2 us bare, 5.0 us watched), a few per update.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import threading
import time

from mpi4py import MPI

from pal_hpc.cluster.liveness import _short

TIMEOUT = [0.0]              # the deadline in seconds (set by cluster.deadline); 0 = none

_lock = threading.Lock()
_open: dict[int, "_Op"] = {}
_ids = itertools.count(1)


class _Op:
    __slots__ = ("what", "where", "comm_ranks", "blocked", "start", "due", "extensions",
                 "noted")

    def __init__(self, what: str, where: str, comm_ranks: tuple, blocked: bool,
                 timeout: float):
        self.what, self.where, self.comm_ranks, self.blocked = what, where, comm_ranks, blocked
        self.start = time.monotonic()
        self.due = self.start + timeout
        self.extensions = 0
        self.noted = False


def _caller() -> str:
    frame = sys._getframe(1)
    # Skip this module's own frames and mpi4py's: the user of the communicator is wanted.
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{_short(frame.f_code.co_filename)}:{frame.f_lineno} {frame.f_code.co_name}"


def _begin(what: str, comm: "WatchedComm", blocked: bool) -> int:
    timeout = TIMEOUT[0]
    if timeout <= 0 or getattr(_untimed, "on", False):
        return 0
    token = next(_ids)
    op = _Op(what, _caller(), comm._world_ranks, blocked, timeout)
    with _lock:
        _open[token] = op
    return token


def _end(token: int) -> None:
    if token:
        with _lock:
            _open.pop(token, None)


def open_operations() -> list[list]:
    """[what, where, seconds open, blocked] of this rank's open operations, oldest
    first (blocked: the rank does nothing else until it completes)."""
    now = time.monotonic()
    with _lock:
        ops = sorted(_open.values(), key=lambda op: op.start)
    return [[op.what, op.where, round(now - op.start, 1), op.blocked] for op in ops]


@contextlib.contextmanager
def blocked(request: "WatchedRequest"):
    """Mark the rank blocked on `request` while the body polls it (a Test-and-sleep
    loop): to a probe it then counts as waiting, not as busy."""
    op = _open.get(getattr(request, "token", 0))
    if op is not None:
        op.blocked = True
    try:
        yield request
    finally:
        if op is not None:
            op.blocked = False


_untimed = threading.local()


@contextlib.contextmanager
def untimed():
    """Operations started in the body have no deadline: for a rank that idles on
    purpose until a peer of its own node is done (the node's master stepping every
    environment), however long that takes."""
    before = getattr(_untimed, "on", False)
    _untimed.on = True
    try:
        yield
    finally:
        _untimed.on = before


class WatchedRequest:
    """A request whose operation stays open until Test or Wait finds it complete."""

    __slots__ = ("request", "token")

    def __init__(self, request: MPI.Request, token: int):
        self.request, self.token = request, token

    def Test(self, status=None) -> bool:  # noqa: N802 (MPI's names)
        done = self.request.Test(status)
        if done:
            _end(self.token)
        return done

    def Wait(self, status=None):  # noqa: N802
        try:
            return self.request.Wait(status)
        finally:
            _end(self.token)

    def Cancel(self):  # noqa: N802
        _end(self.token)
        return self.request.Cancel()

    def Free(self):  # noqa: N802
        _end(self.token)
        return self.request.Free()

    def __getattr__(self, name):
        return getattr(self.request, name)


def _blocking(name: str):
    base = getattr(MPI.Intracomm, name)

    def call(self, *args, **kwargs):
        token = _begin(name, self, True)
        try:
            return base(self, *args, **kwargs)
        finally:
            _end(token)
    call.__name__ = name
    call.__doc__ = f"MPI's {name}, open (watched by the deadline) while it runs."
    return call


def _nonblocking(name: str):
    base = getattr(MPI.Intracomm, name)

    def call(self, *args, **kwargs):
        token = _begin(name, self, False)
        try:
            return WatchedRequest(base(self, *args, **kwargs), token)
        except BaseException:
            _end(token)
            raise
    call.__name__ = name
    call.__doc__ = f"MPI's {name}; its request stays open until found complete."
    return call


def _derived(name: str):
    base = getattr(MPI.Intracomm, name)

    def call(self, *args, **kwargs):
        token = _begin(name, self, True)
        try:
            comm = base(self, *args, **kwargs)
        finally:
            _end(token)
        return watched(comm) if comm != MPI.COMM_NULL else comm
    call.__name__ = name
    call.__doc__ = f"MPI's {name}; the new communicator is watched too."
    return call


BLOCKING = ("Barrier", "Bcast", "Allreduce", "Reduce", "Allgather", "Gather", "Scatter",
            "Alltoall", "Reduce_scatter_block", "Send", "Recv", "Sendrecv", "Probe",
            "barrier", "bcast", "allreduce", "reduce", "allgather", "gather", "scatter",
            "alltoall", "send", "recv", "sendrecv", "probe")
NONBLOCKING = ("Ibarrier", "Ibcast", "Iallreduce", "Ireduce", "Iallgather", "Igather",
               "Isend", "Irecv")
DERIVED = ("Dup", "Split", "Split_type", "Create", "Create_group")


class WatchedComm(MPI.Intracomm):
    """An intracommunicator whose operations the deadline watches (see the module
    docstring).  Same handle as the one it wraps; `MPI.COMM_NULL` stays unwrapped."""

    _world_ranks: tuple = ()


for _make, _names in ((_blocking, BLOCKING), (_nonblocking, NONBLOCKING), (_derived, DERIVED)):
    for _name in _names:
        setattr(WatchedComm, _name, _make(_name))
del _make, _names, _name


def watched(comm: MPI.Intracomm) -> WatchedComm:
    """`comm` as a WatchedComm (the same MPI handle), knowing its members' world ranks.

    mpi4py's `Dup` makes its result of the caller's class, so a WatchedComm's Dup arrives
    here already a WatchedComm -- with the class's empty member list: a deadline on it
    then had no peers to probe, took every wait on it for a slow peer, and a rank
    waiting there (actors in a checkpoint's barrier) outlived a partition by
    MAX_EXTENSIONS deadlines.  Only a WatchedComm with its own members is taken as is."""
    if isinstance(comm, WatchedComm) and "_world_ranks" in vars(comm):
        return comm
    out = comm if isinstance(comm, WatchedComm) else WatchedComm(comm)
    world = MPI.COMM_WORLD.Get_group()
    group = comm.Get_group()
    try:
        out._world_ranks = tuple(MPI.Group.Translate_ranks(group, range(group.Get_size()),
                                                           world))
    finally:
        group.Free()
        world.Free()
    return out
