"""Metrics from every rank into rank 0's HDF5 log, without stalling anyone.

Each rank buffers rows per stream (see pal_hpc.io.schema) and about once a second
ships each stream's rows to rank 0 as one non-blocking message on a communicator
of its own; rank 0 probes for messages from its main loop and appends them to the
log, which flushes every few seconds.  At the end every rank sends what is left
and an end marker, and rank 0 drains until it has heard from everyone.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from pal_hpc.io.schema import STREAMS

TAGS = {name: 100 + i for i, name in enumerate(STREAMS)}
STREAM_OF = {tag: name for name, tag in TAGS.items()}
END = 199


class Telemetry:
    """Per-rank row buffers; rank 0 owns the `MetricsLog` they end up in."""

    def __init__(self, comm: MPI.Comm, log=None, send_every: float = 1.0):
        self.comm = comm
        self.root = comm.Get_rank() == 0
        self.log = log
        self.send_every = send_every
        self.rows: dict[str, list] = {name: [] for name in STREAMS}
        self._inflight: list[tuple] = []        # (request, buffer) until complete
        self._last_send = time.monotonic()

    def record(self, stream: str, row: tuple) -> None:
        """Queue one row (a tuple in the stream's field order)."""
        self.rows[stream].append(row)

    def poll(self) -> None:
        """Ship (other ranks) or store (rank 0) what is due; never blocks."""
        if self.root:
            self._drain()
            self._store_own()
            if self.log is not None:
                self.log.maybe_flush()
            return
        self._inflight = [(req, buf) for req, buf in self._inflight if not req.Test()]
        now = time.monotonic()
        if now - self._last_send >= self.send_every:
            self._send_all()
            self._last_send = now

    def close(self, timeout: float = 120.0) -> None:
        """Collective end: everything recorded so far reaches the log."""
        deadline = time.monotonic() + timeout
        if self.root:
            pending = self.comm.Get_size() - 1
            status = MPI.Status()
            while pending:
                if self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
                    if status.Get_tag() == END:
                        self.comm.Recv([bytearray(0), MPI.BYTE], source=status.Get_source(), tag=END)
                        pending -= 1
                    else:
                        self._receive(status)
                elif time.monotonic() > deadline:
                    raise TimeoutError("telemetry: a rank never sent its last metrics")
                else:
                    time.sleep(0.001)
            self._store_own()
            if self.log is not None:
                self.log.flush()
            return
        self._send_all()
        self._inflight.append((self.comm.Isend([bytearray(0), MPI.BYTE], dest=0, tag=END), None))
        while self._inflight:
            self._inflight = [(req, buf) for req, buf in self._inflight if not req.Test()]
            if time.monotonic() > deadline:
                raise TimeoutError("telemetry: rank 0 never took the last metrics")
            time.sleep(0.001)

    # -- internals -----------------------------------------------------------
    def _send_all(self) -> None:
        for name, rows in self.rows.items():
            if rows:
                buf = np.array(rows, dtype=STREAMS[name])
                req = self.comm.Isend([buf.view(np.uint8), MPI.BYTE], dest=0, tag=TAGS[name])
                self._inflight.append((req, buf))
                rows.clear()

    def _drain(self) -> None:
        status = MPI.Status()
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
            if status.Get_tag() == END:
                return                      # counted by close()
            self._receive(status)

    def _receive(self, status: MPI.Status) -> None:
        name = STREAM_OF[status.Get_tag()]
        buf = np.empty(status.Get_count(MPI.BYTE), np.uint8)
        self.comm.Recv([buf, MPI.BYTE], source=status.Get_source(), tag=status.Get_tag())
        if self.log is not None:
            self.log.append(name, buf.view(STREAMS[name]))

    def _store_own(self) -> None:
        for name, rows in self.rows.items():
            if rows and self.log is not None:
                self.log.append(name, np.array(rows, dtype=STREAMS[name]))
            rows.clear()


def percentile_ms(samples: list[float], q: float) -> float:
    """The q-th percentile of durations in seconds, in milliseconds (NaN when empty)."""
    return float(np.percentile(samples, q) * 1e3) if samples else float("nan")


def rss_mb() -> float:
    """This process's resident memory in MiB (Linux /proc; NaN elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * 4096 / 2**20
    except OSError:
        return float("nan")
