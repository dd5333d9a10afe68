"""Metrics from every rank into rank 0's HDF5 log, without stalling anyone.

Each rank buffers rows per stream (see pal_hpc.io.schema) and about once a second
ships each stream's rows to rank 0 as one non-blocking message on a communicator
of its own; rank 0 probes for messages from its main loop and appends them to the
log, which flushes every few seconds.  At the end every rank sends what is left
and an end marker, and rank 0 drains until it has heard from everyone.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from mpi4py import MPI

from pal_hpc.config_io import config_to_dict
from pal_hpc.io.metrics import MetricsLog, log_segments, open_run_log
from pal_hpc.io.provenance import run_attributes
from pal_hpc.io.rundir import DISK_MARGIN, free_bytes
from pal_hpc.io.schema import STREAMS

TAGS = {name: 100 + i for i, name in enumerate(STREAMS)}
STREAM_OF = {tag: name for name, tag in TAGS.items()}
END = 199


class Telemetry:
    """Per-rank row buffers; rank 0 owns the `MetricsLog` they end up in."""

    def __init__(self, comm: MPI.Comm, log=None, send_every: float = 1.0,
                 streams: dict | None = None):
        self.comm = comm
        self.streams = dict(streams or STREAMS)     # the learner columns are the algorithm's
        self.root = comm.Get_rank() == 0
        self.log = log
        self.send_every = send_every
        self.rows: dict[str, list] = {name: [] for name in self.streams}
        self._inflight: list[tuple] = []        # (request, buffer) until complete
        self._last_send = time.monotonic()
        self._held: dict[str, list] = {name: [] for name in self.streams}   # disk full: waiting
        self._disk_full = False
        self._last_write = time.monotonic()
        self.dropped_rows = 0
        self.broken_log = None
        # Rank 0 with --tensorboard: a TensorBoardMirror that gets every block of rows
        # the moment it goes into the HDF5 log (pal_hpc.io.tensorboard).
        self.mirror = None

    # Rows reach the HDF5 file only in `_write_log`: all held rows appended, then one
    # flush, right after a check that the disk has room.  HDF5 cannot recover a file
    # that ran out of space mid-write (the handle can be neither flushed nor closed, and
    # the library may crash at exit), so it never holds unwritten rows for long: on a
    # full disk rows wait here (up to HELD_ROWS per stream, the oldest dropped beyond)
    # and go in once there is room.
    HELD_ROWS = 200_000

    def _disk_ok(self, nbytes: int) -> bool:
        try:
            free = free_bytes(self.log.path)
        except OSError:
            return True             # cannot tell: let the write itself decide
        ok = free >= DISK_MARGIN + 4 * nbytes
        if not ok and not self._disk_full:
            print(f"pal_hpc: error: the disk holding {self.log.path} is full "
                  f"({free / 2**20:.1f} MiB free); metrics wait in memory until there is "
                  f"room, training goes on", file=sys.stderr, flush=True)
        elif ok and self._disk_full:
            print(f"pal_hpc: the disk holding {self.log.path} has room again; writing the "
                  f"held metrics", file=sys.stderr, flush=True)
        self._disk_full = not ok
        return ok

    def _to_log(self, name: str, arr: np.ndarray) -> None:
        if self.log is None:
            return
        held = self._held[name]
        held.append(arr)
        while sum(len(a) for a in held) > self.HELD_ROWS:
            self.dropped_rows += len(held.pop(0))

    def _write_log(self, force: bool = False) -> None:
        """Every `log.flush_every` seconds (or now): the held rows into the file, flushed."""
        if self.log is None:
            return
        if not force and time.monotonic() - self._last_write < self.log.flush_every:
            return
        self._last_write = time.monotonic()
        pending = sum(a.nbytes for held in self._held.values() for a in held)
        if not self._disk_ok(pending):
            return
        try:
            for name, held in self._held.items():
                if held:
                    rows = np.concatenate(held) if len(held) > 1 else held[0]
                    self.log.append(name, rows)
                    held.clear()
                    self._mirror("write", name, rows)
            self.log.flush()
            self._mirror("flush")
        except (OSError, RuntimeError) as exc:
            # A race with the space check, or an I/O error: drop the log, never touch
            # (nor close) it again; the rows flushed before stay readable.
            print(f"pal_hpc: error: metrics log {self.log.path} cannot be written ({exc}); "
                  f"training goes on without it", file=sys.stderr, flush=True)
            self.broken_log, self.log = self.log, None

    def _mirror(self, method: str, *args) -> None:
        """Pass a call on to the TensorBoard mirror; one that fails is reported and
        dropped (the HDF5 log is the record: training goes on)."""
        if self.mirror is None:
            return
        try:
            getattr(self.mirror, method)(*args)
        except Exception as exc:
            print(f"pal_hpc: error: tensorboard event files in {self.mirror.log_dir} cannot "
                  f"be written ({exc}); training goes on without them",
                  file=sys.stderr, flush=True)
            self.mirror = None

    def write_now(self, stream: str, records: np.ndarray) -> None:
        """Rank 0: add rows to the log straight away (the summary's final evaluation)."""
        self._to_log(stream, records)
        self._write_log(force=True)

    def close_log(self) -> None:
        """Rank 0: write what is held and close the log (failures are reported).
        Rows rank 0 recorded after `close` (the wind-down's last evaluations) go too."""
        if self.root:
            self._store_own()
        if self.log is not None:
            self._write_log(force=True)
        if self.log is not None:
            if not any(self._held.values()):   # else the disk is full: closing would fail
                try:
                    self.log.close()
                except (OSError, RuntimeError) as exc:
                    print(f"pal_hpc: error: closing {self.log.path} failed: {exc}",
                          file=sys.stderr, flush=True)
            else:
                self.broken_log = self.log
            self.log = None
        self._mirror("close")
        self.mirror = None
        lost = self.dropped_rows + sum(len(a) for h in self._held.values() for a in h)
        if lost:
            print(f"pal_hpc: error: {lost} metrics rows could not be written (disk full)",
                  file=sys.stderr, flush=True)

    def record(self, stream: str, row: tuple) -> None:
        """Queue one row (a tuple in the stream's field order)."""
        self.rows[stream].append(row)

    def poll(self) -> None:
        """Ship (other ranks) or store (rank 0) what is due; never blocks."""
        if self.root:
            self._drain()
            self._store_own()
            self._write_log()
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
            self._write_log(force=True)
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
                buf = np.array(rows, dtype=self.streams[name])
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
        self._to_log(name, buf.view(self.streams[name]))

    def _store_own(self) -> None:
        for name, rows in self.rows.items():
            if rows:
                self._to_log(name, np.array(rows, dtype=self.streams[name]))
            rows.clear()


def open_job_log(cfg, layout: dict, hosts: list[str], resumed_at_wall_s: float | None,
                 streams: dict, cpus: dict | None = None) -> MetricsLog:
    """Rank 0: open the run's metrics log, its attributes holding the config, `layout`,
    the hosts, their CPUs (`cpus`, host -> description) and the MPI library.  A resumed run (`resumed_at_wall_s`: the checkpoint's
    wall time, from which a reader drops a killed run's later rows) goes on in its log.
    A fresh one finding old segments -- `--resume auto` found no checkpoint, so they are
    an attempt that died before its first -- moves them aside, out of this run's way."""
    attrs = run_attributes(config_to_dict(cfg), layout, hosts,
                           MPI.Get_library_version().strip(), cpus=cpus)
    if resumed_at_wall_s is not None:
        attrs["resumed_at_wall_s"] = resumed_at_wall_s
    run_dir = Path(cfg.resolved_run_dir())
    old = log_segments(run_dir)
    if old and resumed_at_wall_s is None:
        aside = run_dir / f"abandoned-{time.strftime('%Y%m%d-%H%M%S')}"
        aside.mkdir()
        for path in old:
            os.replace(path, aside / path.name)
        print(f"pal_hpc: no checkpoint to resume; the earlier attempt's metrics log "
              f"moved to {aside}", flush=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        log = open_run_log(run_dir, attrs, resume=resumed_at_wall_s is not None,
                           streams=streams)
    for w in caught:
        print(f"pal_hpc: warning: {w.message}", flush=True)
    return log


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
