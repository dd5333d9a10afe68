"""The HDF5 metrics log: one writer (rank 0 of a job), any number of readers.

`<run dir>/metrics.h5` holds one resizable 1-D compound dataset per stream of
`schema.STREAMS` (`/episodes`, `/learner`, `/evaluation`, `/system`) and the run's
description as root attributes (dicts and lists as JSON strings).  The writer switches
the file to SWMR (single writer, multiple readers), so `read_metrics` and
`pal_hpc.analyze` can read a run while it is being written, and the rows flushed before
a crash survive it: a killed run is analysed from what it flushed.

A file whose writer was killed still carries the "open for writing" mark: h5py with
`swmr=True` (what `read_metrics` does) reads it as is; `h5dump` and other non-SWMR
readers refuse it until `h5clear -s metrics.h5` clears the mark.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from pal_hpc.io.schema import STREAMS

CHUNK_ROWS = 1024
# SWMR needs the 1.10 file format at least.  The low bound is pinned to it rather than
# "latest" so HDF5 1.10-1.14 tools (Debian's h5dump is 1.10) still open the file; with
# "latest" HDF5 2.x writes object versions those tools cannot read.  The high bound
# leaves every newer feature allowed.
LIBVER = ("v110", "latest")
VERSIONED_PACKAGES = ("numpy", "torch", "gymnasium", "h5py", "mpi4py")


def _attr_value(key: str, value: Any) -> Any:
    """What a root attribute stores for `value`: scalars as is, containers as JSON."""
    if value is None:
        return ""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value)
    raise TypeError(f"metrics attribute {key!r}: cannot store a {type(value).__name__}")


def _decode_attr(value: Any) -> Any:
    """Inverse of `_attr_value`: JSON containers back to dicts/lists, numpy to Python."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        if value[:1] in ("{", "["):
            try:
                return json.loads(value)
            except ValueError:
                return value
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


class MetricsLog:
    """Append-only writer of `metrics.h5` (one per job, on rank 0).

    `append(stream, records)` adds rows; `maybe_flush()` (also called by `append`)
    flushes at most every `flush_every` seconds, `flush()` at once, `close()` always.
    The file is truncated if it exists.  Use as a context manager.
    """

    def __init__(self, path: str | Path, attrs: dict, flush_every: float = 5.0,
                 append_existing: bool = False):
        self.path = Path(path)
        self.flush_every = float(flush_every)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        stored = {key: _attr_value(key, value) for key, value in attrs.items()}
        # A resumed run continues the log it started (same streams, rows appended).
        reopen = append_existing and self.path.exists()
        self._file = h5py.File(self.path, "a" if reopen else "w", libver=LIBVER)
        try:
            if reopen:
                missing = [name for name in STREAMS if name not in self._file]
                if missing:
                    raise ValueError(f"{self.path}: not a metrics log (no {missing})")
                self._datasets = {name: self._file[name] for name in STREAMS}
                resumes = json.loads(self._file.attrs.get("resumes", "[]") or "[]")
                stored = {"resumes": json.dumps(resumes + [stored.get("start_time", "")])}
            else:
                self._datasets = {
                    name: self._file.create_dataset(name, shape=(0,), maxshape=(None,),
                                                    chunks=(CHUNK_ROWS,), dtype=dtype)
                    for name, dtype in STREAMS.items()}
            for key, value in stored.items():
                self._file.attrs[key] = value
            # From here on no new objects or attributes may be created: only appends.
            self._file.swmr_mode = True
        except BaseException:
            self._file.close()
            raise
        self._rows = {name: int(self._datasets[name].shape[0]) for name in STREAMS}
        self._last_flush = time.monotonic()

    def rows(self, stream: str) -> int:
        """Rows appended to `stream` so far."""
        self._check_stream(stream)
        return self._rows[stream]

    def append(self, stream: str, records) -> None:
        """Append a structured array of the stream's dtype (or a list of tuples)."""
        if self._file is None:
            raise RuntimeError(f"metrics log {self.path} is closed")
        dtype = self._check_stream(stream)
        if isinstance(records, np.ndarray):
            if records.dtype != dtype:
                raise ValueError(f"metrics stream {stream!r}: records have dtype "
                                 f"{records.dtype}, expected {dtype}")
            arr = records.reshape(-1)
        else:
            try:
                arr = np.array(list(records), dtype=dtype).reshape(-1)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"metrics stream {stream!r}: records do not fit dtype "
                                 f"{dtype}: {exc}") from exc
        if arr.size:
            ds, start = self._datasets[stream], self._rows[stream]
            ds.resize((start + arr.size,))
            ds[start:start + arr.size] = arr
            self._rows[stream] = start + arr.size
        self.maybe_flush()

    def maybe_flush(self) -> bool:
        """Flush if `flush_every` seconds passed since the last flush; True if it did."""
        if self._file is None or time.monotonic() - self._last_flush < self.flush_every:
            return False
        self.flush()
        return True

    def flush(self) -> None:
        """Make every appended row visible to readers and durable against a crash."""
        if self._file is not None:
            self._file.flush()
            self._last_flush = time.monotonic()

    def close(self) -> None:
        """Flush and close; closing twice is harmless."""
        if self._file is not None:
            try:
                self._file.flush()
            finally:
                self._file.close()
                self._file = None

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @staticmethod
    def _check_stream(stream: str) -> np.dtype:
        if stream not in STREAMS:
            raise ValueError(f"unknown metrics stream {stream!r} "
                             f"(known: {', '.join(STREAMS)})")
        return STREAMS[stream]


def read_metrics(path: str | Path) -> dict:
    """Read a metrics log, also one still being written or whose writer was killed.

    Returns {"attrs": {name: value, JSON decoded}, stream: structured array, ...} with
    an array (possibly empty) for every stream of the schema.
    """
    path = Path(path)
    try:
        f = h5py.File(path, "r", libver="latest", swmr=True)
    except OSError:
        # Files older than the 1.10 format cannot be opened for SWMR reading.
        f = h5py.File(path, "r")
    with f:
        out: dict[str, Any] = {"attrs": {k: _decode_attr(v) for k, v in f.attrs.items()}}
        for name, dtype in STREAMS.items():
            ds = f.get(name)
            if ds is None:
                out[name] = np.zeros(0, dtype=dtype)
                continue
            if f.swmr_mode:
                ds.refresh()
            out[name] = ds[()] if ds.shape[0] else np.zeros(0, dtype=ds.dtype)
    return out


def _git_commit() -> str:
    """HEAD of the checkout the package runs from, or "" (installed copy, no git)."""
    try:
        res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return ""
    return res.stdout.strip() if res.returncode == 0 else ""


def _versions() -> dict[str, str]:
    """Versions of the stack, from package metadata (importing torch would take seconds)."""
    import pal_hpc

    versions = {"python": platform.python_version()}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = ""
    versions["hdf5"] = h5py.version.hdf5_version
    versions["pal_hpc"] = pal_hpc.__version__
    return versions


def run_attributes(cfg_dict: dict, layout: dict, hosts: list, mpi_library: str) -> dict:
    """The root attributes the runtime gives `MetricsLog`: what ran, where, with what."""
    return {
        "config": cfg_dict,
        "versions": _versions(),
        "mpi_library": mpi_library,
        "layout": layout,
        "hosts": hosts,
        "start_time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_commit": _git_commit(),
    }
