"""A deadline on every wait for another rank (`--peer-timeout`): no rank waits for ever.

Across hosts, a peer can vanish without a word: its host powers off, or the network
between them partitions and packets just stop (no RST).  MPI then leaves the other
ranks in their collectives until the batch limit.  `start()` closes that gap for the
whole runtime at once: it returns COMM_WORLD as a `WatchedComm` (`cluster.watched`), and
every communicator derived from it (Dup, Split, ...) is watched too.  Each collective or
point-to-point operation on them is an *open operation* from its call (blocking ones) or
from its start until a `Test`/`Wait` finds it done (non-blocking ones).

A watchdog thread looks at the open operations twice a second.  When one has been open
for `timeout` seconds, it probes the operation's peers over UDP (`cluster.liveness`):

- some peers do not answer within a few seconds: they are lost (dead, or cut off).  The
  rank prints one line naming the operation, where it was started, and the lost hosts
  and their ranks, then ends the job (MPI_Abort, exit status `PEER_LOST_EXIT`).  If the
  abort itself cannot reach the launcher (a partition), the process ends anyway a few
  seconds later (SIGALRM).  So both sides of a partition exit within the deadline plus
  a few seconds.
- every peer answers: they are alive, only slow (an evaluation, a checkpoint being
  written, a peer descheduled on a crowded host).  The operation gets another `timeout`,
  and, for a communicator that spans hosts, one note says who is where.  After
  `MAX_EXTENSIONS` such rounds with every peer alive the job is taken for deadlocked and
  ends the same way, with every peer's whereabouts (rounds in which some peer was busy
  rather than waiting itself do not count).

The probes need no MPI and no GIL of a blocked main thread, so a rank stuck in MPI
still answers.  A rank that holds the GIL in one long C call (h5py writing a big
replay file) cannot answer: keep `--peer-timeout` above the longest checkpoint.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterable

from mpi4py import MPI

from pal_hpc.cluster import liveness
from pal_hpc.cluster.watched import (TIMEOUT, WatchedComm, WatchedRequest, _lock, _Op,  # noqa: F401
                                     _open, blocked, open_operations, untimed, watched)

PEER_LOST_EXIT = 76          # the job's exit status when a peer was lost (requeue-able)
MAX_EXTENSIONS = 10          # deadlines passed with every peer alive before giving up
ABORT_GRACE_S = 5.0          # MPI_Abort that cannot reach the launcher: exit after this
PROBE_LIMIT = 256            # peers probed at most (one per host first, then the rest)

_watch: "Watch | None" = None


class Watch:
    """This rank's watchdog: the responder, the peers' endpoints and the thread."""

    def __init__(self, timeout: float, endpoints: list, responder: liveness.Responder):
        self.timeout = float(timeout)
        self.endpoints = endpoints        # world rank -> (host, address, port); [] at first
        self.responder = responder
        self.rank = MPI.COMM_WORLD.Get_rank()
        self.host = responder.host
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pal_hpc-deadline",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        tick = min(0.5, max(self.timeout / 10, 0.05))
        while not self._stop.wait(tick):
            now = time.monotonic()
            with _lock:
                late = [op for op in _open.values() if op.due <= now]
            for op in late:
                self._judge(op)

    def _judge(self, op: _Op) -> None:
        # Members unknown (a communicator that escaped `watched`): ask every rank.
        members = op.comm_ranks or range(len(self.endpoints))
        peers = [r for r in members if r != self.rank]
        if len(self.endpoints) < MPI.COMM_WORLD.Get_size():   # still exchanging them
            self._give_up(op, time.monotonic() - op.start, "not every rank arrived at "
                          "start-up (no rank can be probed yet)", {})
        asked = _pick(peers, self.endpoints)
        answers = liveness.probe([(r, *self.endpoints[r][1:]) for r in asked])
        lost = [r for r in asked if r not in answers]
        waited = time.monotonic() - op.start
        if lost:
            self._give_up(op, waited, f"no answer from {_by_host(lost, self.endpoints)}",
                          answers)
        # Peers that wait themselves cannot be what this operation waits for; a deadlock
        # is when every peer asked waits, deadline after deadline.
        if all(any(o[3] for o in a.get("ops") or []) for a in answers.values()):
            op.extensions += 1
        if op.extensions > MAX_EXTENSIONS:
            self._give_up(op, waited, "every peer answers but none completes it "
                          "(a deadlock?)", answers)
        op.due = time.monotonic() + self.timeout
        hosts = {self.endpoints[r][0] for r in op.comm_ranks}
        if not op.noted and len(hosts) > 1:
            op.noted = True
            _say(f"pal_hpc: note: rank {self.rank} ({self.host}): {op.what} at {op.where} "
                 f"open for {waited:.0f} s (--peer-timeout {self.timeout:g}); its "
                 f"{len(peers)} peers are alive ({_whereabouts(answers, 3)}); waiting on")

    def _give_up(self, op: _Op, waited: float, why: str, answers: dict) -> None:
        line = (f"pal_hpc: error: rank {self.rank} ({self.host}): {op.what} at {op.where} "
                f"did not complete in {waited:.0f} s (--peer-timeout {self.timeout:g}): {why}"
                + (f"; alive: {_whereabouts(answers, 4)}" if answers else "")
                + "; ending the job")
        _say(line)
        _record(line)
        end_job(PEER_LOST_EXIT)

    def close(self) -> None:
        """Stop the thread and the responder (idempotent)."""
        self._stop.set()
        self.responder.close()


def _pick(peers: list[int], endpoints: list) -> list[int]:
    """At most PROBE_LIMIT of `peers`: one per host first, then the others in order."""
    if len(peers) <= PROBE_LIMIT:
        return peers
    seen, first, rest = set(), [], []
    for r in peers:
        (rest if endpoints[r][0] in seen else first).append(r)
        seen.add(endpoints[r][0])
    return (first + rest)[:PROBE_LIMIT]


def _by_host(ranks: Iterable[int], endpoints: list) -> str:
    hosts: dict[str, list[int]] = {}
    for r in ranks:
        hosts.setdefault(endpoints[r][0], []).append(r)
    return "; ".join(f"host {h} (rank{'s' if len(rs) > 1 else ''} "
                     f"{', '.join(map(str, rs))})" for h, rs in hosts.items())


def _whereabouts(answers: dict, limit: int) -> str:
    parts = []
    for rank in sorted(answers)[:limit]:
        a = answers[rank]
        ops = a.get("ops") or []
        doing = (f"in {ops[0][0]} at {ops[0][1]} for {ops[0][2]:.0f} s" if ops
                 else f"busy at {a.get('where', '?')}")
        parts.append(f"rank {rank} on {a.get('host', '?')} {doing}")
    more = len(answers) - limit
    return ", ".join(parts) + (f", and {more} more" if more > 0 else "")


_record_path: str = ""


def set_record(path: str) -> None:
    """Also append the line that ends the job to `path` (the run's `peer_lost.log`):
    the launcher may never show it -- hydra's mpiexec waits for a cut-off host's proxy
    until TCP gives up -- and jobs/launch.sh ends mpiexec, and requeues, on seeing it."""
    global _record_path
    _record_path = str(path)


def _record(line: str) -> None:
    if not _record_path:
        return
    try:
        fd = os.open(_record_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())    # one write: lines never interleave
        finally:
            os.close(fd)
    except OSError:
        pass


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def end_job(code: int) -> None:
    """End the job from this thread: MPI_Abort, and exit within ABORT_GRACE_S even if
    the abort cannot reach the launcher (SIGALRM's default action ends the process)."""
    signal.alarm(int(ABORT_GRACE_S) + 1)
    time.sleep(0.3)                    # the launcher forwards the line above first
    try:
        MPI.COMM_WORLD.Abort(code)
    finally:
        os._exit(code)


def start(timeout: float) -> WatchedComm:
    """Collective over COMM_WORLD: every rank starts answering probes and watching its
    operations; returns COMM_WORLD as a WatchedComm.  `timeout` <= 0 watches nothing
    (the comms are still WatchedComm, at no cost but a call).  Idempotent.

    The exchange of the ranks' probe addresses is itself watched: a rank that does not
    arrive ends the job after `timeout`, though nobody can be probed yet."""
    global _watch
    world = watched(MPI.COMM_WORLD)
    if _watch is not None:
        return world
    responder = liveness.Responder(world.Get_rank(), MPI.Get_processor_name(),
                                   describe=open_operations)
    _watch = Watch(timeout, [], responder)
    TIMEOUT[0] = float(timeout)
    _watch.endpoints = world.allgather(responder.endpoint)
    return world


def set_timeout(timeout: float) -> None:
    """Change the deadline (the configuration's --peer-timeout, once it is read); it
    applies to operations started from now on."""
    if _watch is not None:
        _watch.timeout = TIMEOUT[0] = float(timeout)


def stop() -> None:
    """Stop watching (before MPI_Finalize); open operations are forgotten."""
    global _watch
    TIMEOUT[0] = 0.0
    if _watch is not None:
        _watch.close()
        _watch = None
    with _lock:
        _open.clear()
