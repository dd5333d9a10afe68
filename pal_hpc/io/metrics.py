"""The HDF5 metrics log: one writer (rank 0 of a job), any number of readers.

`<run dir>/metrics.h5` holds one resizable 1-D compound dataset per stream of
`schema.STREAMS` (`/episodes`, `/learner`, `/evaluation`, `/system`) and the run's
description as root attributes (dicts and lists as JSON strings).  The writer switches
the file to SWMR (single writer, multiple readers), so `read_metrics` and
`pal_hpc.analyze` can read a run while it is being written, and the rows flushed before
a crash survive it: a killed run is analysed from what it flushed.

A run's log may be split in *segments*: `metrics.h5`, then `metrics.1.h5`, ... .  A
resumed run appends to the newest segment when that file reopens cleanly; a file whose
writer was killed keeps its "open for writing" mark, and HDF5 refuses to reopen it for
writing (without `h5clear`), so `open_run_log` leaves it as it is (still readable) and
starts the next segment.  `read_run_metrics` reads the segments back as one log.

Reading never opens a truncated file in SWMR mode: an SWMR reader retries a metadata
read that fails its checksum with a sleep doubled each time, up to 100 times (HDF5's
default for SWMR), which on the zeros past a file's end is a hang of years.
`read_metrics` compares the end-of-file address stored in the superblock with the
file's size first and refuses a truncated file at once.
"""

from __future__ import annotations

import json
import os
import re
import struct
import time
import warnings
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from pal_hpc.io.attrs import attr_value, clean_text, decode_attr
from pal_hpc.io.schema import STREAMS

CHUNK_ROWS = 1024
FIRST_SEGMENT = "metrics.h5"
_SEGMENT = re.compile(r"metrics(?:\.(\d+))?\.h5")     # metrics.h5, metrics.1.h5, ...
# SWMR needs the 1.10 file format at least.  The low bound is pinned to it rather than
# "latest" so HDF5 1.10-1.14 tools (Debian's h5dump is 1.10) still open the file; with
# "latest" HDF5 2.x writes object versions those tools cannot read.  The high bound
# leaves every newer feature allowed.
LIBVER = ("v110", "latest")


class MetricsLog:
    """Append-only writer of `metrics.h5` (one per job, on rank 0).

    `append(stream, records)` adds rows; `maybe_flush()` (also called by `append`)
    flushes at most every `flush_every` seconds, `flush()` at once, `close()` always.
    The file is truncated if it exists, unless `append_existing` (then rows are appended
    to it).  Use as a context manager; a run opens its log with `open_run_log`.
    """

    def __init__(self, path: str | Path, attrs: dict, flush_every: float = 5.0,
                 append_existing: bool = False, streams: dict | None = None):
        self.path = Path(path)
        self.streams = dict(streams or STREAMS)
        self.flush_every = float(flush_every)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Checked before the file is touched: a value HDF5 cannot store is named.
        stored = {key: attr_value(key, value) for key, value in attrs.items()}
        # A resumed run continues the log it started (same streams, rows appended).
        reopen = append_existing and self.path.exists()
        # A new log is built under a hidden name and renamed into place once its
        # streams exist and SWMR is on: a reader never finds a half-made file.
        building = None if reopen else self.path.with_name(f".{self.path.name}.new")
        self._file = h5py.File(building or self.path, "r+" if reopen else "w", libver=LIBVER)
        try:
            if reopen:
                problem = _schema_problem(self._file, self.streams)
                if problem:
                    raise ValueError(f"{self.path}: {problem}")
                self._datasets = {name: self._file[name] for name in self.streams}
                resumes = json.loads(self._file.attrs.get("resumes", "[]") or "[]")
                stored = {"resumes": json.dumps(resumes + [stored.get("start_time", "")])}
            else:
                self._datasets = {
                    name: self._file.create_dataset(name, shape=(0,), maxshape=(None,),
                                                    chunks=(CHUNK_ROWS,), dtype=dtype)
                    for name, dtype in self.streams.items()}
            for key, value in stored.items():
                try:
                    self._file.attrs[key] = value
                except (TypeError, ValueError, OverflowError) as exc:
                    raise ValueError(f"metrics attribute {key!r}: HDF5 cannot store "
                                     f"{value!r:.80}: {exc}") from exc
            # From here on no new objects or attributes may be created: only appends.
            self._file.swmr_mode = True
            if building is not None:
                self._file.flush()
                os.replace(building, self.path)   # the open file goes on under its name
        except BaseException:
            self._file.close()
            if building is not None:
                building.unlink(missing_ok=True)
            raise
        self._rows = {name: int(self._datasets[name].shape[0]) for name in self.streams}
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

    def _check_stream(self, stream: str) -> np.dtype:
        if stream not in self.streams:
            raise ValueError(f"unknown metrics stream {stream!r} "
                             f"(known: {', '.join(self.streams)})")
        return self.streams[stream]


class MetricsReadError(OSError):
    """A metrics log that cannot be read; the message names the file and the reason."""


def _schema_problem(f: h5py.File, streams: dict | None = None) -> str | None:
    """Why an open HDF5 file is not a metrics log of this schema, or None."""
    streams = streams or STREAMS
    missing = [name for name in streams if name not in f]
    if missing:
        return f"not a metrics log (no {', '.join(missing)})"
    for name, dtype in streams.items():
        if not isinstance(f[name], h5py.Dataset) or f[name].dtype != dtype:
            return f"not a metrics log of this schema (stream {name!r} differs)"
    return None


def _superblock(path: Path) -> tuple[bool, str | None]:
    """(marked open for writing, why the file cannot be read) from its first bytes.

    The superblock stores the end-of-file address as of the writer's last flush;
    a file shorter than that lost its tail (truncated copy, full disk, crashed node).
    HDF5 makes this check itself, except for SWMR readers of a marked file, which
    instead retry every checksum failure with an exponential sleep (module docstring).
    """
    with open(path, "rb") as fh:
        head = fh.read(2048 + 64)
        size = fh.seek(0, 2)              # after the superblock: the file only grows
    for base in (0, 512, 1024, 2048):     # where HDF5 looks (after a user block)
        if head[base:base + 8] == b"\x89HDF\r\n\x1a\n":
            break
    else:
        return False, "not an HDF5 file (no HDF5 signature)"
    sb = head[base:]
    if len(sb) < 64:                      # a superblock, and more, in any real log
        return False, f"truncated: {size:,} bytes"
    version = sb[8]
    if version in (2, 3):
        offsets, flags, fields = sb[9], sb[11], 12       # base, ext, eof addresses
    elif version in (0, 1):
        offsets, flags = sb[13], int.from_bytes(sb[20:24], "little")
        fields = 24 if version == 0 else 28               # base, free space, eof
    else:
        return False, "truncated or corrupt superblock"
    if offsets != 8 or len(sb) < fields + 3 * 8:
        return False, f"truncated or unsupported superblock (version {version})"
    sb_base, _, eof = struct.unpack_from("<3Q", sb, fields)
    if eof != 2 ** 64 - 1 and size + sb_base < eof:
        return False, f"truncated: {size:,} bytes, its superblock says {eof:,}"
    return bool(flags & 1), None


def read_metrics(path: str | Path) -> dict:
    """Read a metrics log, also one still being written or whose writer was killed.

    Returns {"attrs": {name: value, JSON decoded}, stream: structured array, ...} with
    an array (possibly empty) for every stream of the schema.  Raises MetricsReadError
    (an OSError), naming the file, for a truncated, corrupt or foreign file.
    """
    path = Path(path)
    try:
        # Only a file marked open for writing (live or killed writer) needs SWMR; a
        # plain reader of a closed file fails fast on any damage instead of retrying.
        # The second round is for a closed log that a resumed run reopened meanwhile.
        for last_try in (False, True):
            marked, problem = _superblock(path)
            if problem:
                raise MetricsReadError(f"{path}: {problem}")
            try:
                f = h5py.File(path, "r", libver="latest", swmr=True) if marked \
                    else h5py.File(path, "r")
                break
            except OSError:
                if marked or last_try:
                    raise
        with f:
            return _read_open(f)
    except MetricsReadError:
        raise
    except (OSError, KeyError, ValueError, RuntimeError, TypeError) as exc:
        raise MetricsReadError(f"{path}: {_reason(exc)}") from exc


def _reason(exc: BaseException) -> str:
    """An exception as a reason after a file name ("No such file or directory")."""
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def _read_open(f: h5py.File) -> dict:
    if not any(name in f for name in STREAMS):
        raise ValueError(f"not a metrics log (none of {', '.join(STREAMS)})")
    out: dict[str, Any] = {"attrs": {k: decode_attr(v) for k, v in f.attrs.items()}}
    for name, dtype in STREAMS.items():
        ds = f.get(name)
        if ds is None:
            out[name] = np.zeros(0, dtype=dtype)
            continue
        if f.swmr_mode:
            ds.refresh()
        out[name] = ds[()] if ds.shape[0] else np.zeros(0, dtype=ds.dtype)
    return out


# -- a run's log in segments ---------------------------------------------------------

def log_segments(run_dir: str | Path) -> list[Path]:
    """The run's metrics log files in order: metrics.h5, metrics.1.h5, metrics.2.h5..."""
    found = []
    for p in Path(run_dir).glob("metrics*.h5"):
        m = _SEGMENT.fullmatch(p.name)
        if m and p.is_file():
            found.append((int(m.group(1) or 0), p))
    return [p for _, p in sorted(found)]


def _append_problem(path: Path, streams: dict | None = None) -> str | None:
    """Why `path` cannot take appended rows, or None; never raises, changes nothing."""
    try:
        marked, problem = _superblock(path)
        if problem:
            return problem
        if marked:
            return "still marked open for writing (its writer was killed, or still runs)"
        with h5py.File(path, "r") as f:
            return _schema_problem(f, streams)
    except Exception as exc:       # noqa: BLE001 -- any damage means: next segment
        return _reason(exc)


def open_run_log(run_dir: str | Path, attrs: dict, resume: bool,
                 flush_every: float = 5.0, streams: dict | None = None) -> MetricsLog:
    """Open the run's metrics log for writing (rank 0).

    Fresh run: a new `metrics.h5`; earlier segments in `run_dir` are deleted.
    Resume: rows go on in the newest segment when it reopens cleanly (its "resumes"
    attribute records the restart); otherwise that file is left as it is and a new
    segment `metrics.<n>.h5` starts, with `attrs` plus "continues" (the file it
    follows) and "continues_because", and one warning says why.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    segments = log_segments(run_dir)
    if not resume:
        for old in segments:
            old.unlink()
        return MetricsLog(run_dir / FIRST_SEGMENT, attrs, flush_every, streams=streams)
    if not segments:
        return MetricsLog(run_dir / FIRST_SEGMENT, attrs, flush_every, streams=streams)
    last = segments[-1]
    reason = _append_problem(last, streams)
    if reason is None:
        try:
            return MetricsLog(last, attrs, flush_every, append_existing=True, streams=streams)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            reason = _reason(exc)
    index = int(_SEGMENT.fullmatch(last.name).group(1) or 0) + 1
    new = run_dir / f"metrics.{index}.h5"
    warnings.warn(f"metrics log {last} cannot be appended to ({reason}); it is kept as "
                  f"it is and the log continues in {new.name}", stacklevel=2)
    return MetricsLog(new, {**attrs, "continues": last.name,
                            "continues_because": clean_text(reason)},
                      flush_every, streams=streams)


def read_run_metrics(run_dir: str | Path) -> dict:
    """Every segment of a run's log read as one: each stream concatenated in order.

    Returns read_metrics' dict (attrs from the first readable segment) plus
    "segments" (every segment file, in order) and "unreadable" ({path: reason} of the
    segments skipped, each with a warning).  A segment whose attrs carry
    "resumed_at_wall_s" (the checkpoint its run resumed from) replaces the rows earlier
    segments logged after that time: those belong to the lost end of a killed run.
    Raises FileNotFoundError without any
    segment and MetricsReadError when none can be read.
    """
    run_dir = Path(run_dir)
    segments = log_segments(run_dir)
    if not segments:
        raise FileNotFoundError(f"{run_dir}: no {FIRST_SEGMENT} there")
    parts, unreadable = [], {}
    for path in segments:
        try:
            part = read_metrics(path)
        except MetricsReadError as exc:
            unreadable[path] = str(exc).removeprefix(f"{path}: ")
            continue
        differs = [s for s in STREAMS if parts and part[s].dtype != parts[0][s].dtype]
        if differs:
            unreadable[path] = f"stream {differs[0]!r} has another dtype than in the first"
            continue
        parts.append(part)
    for path, reason in unreadable.items():
        warnings.warn(f"metrics log segment {path} skipped: {reason}", stacklevel=2)
    if not parts:
        raise MetricsReadError("; ".join(f"{p}: {r}" for p, r in unreadable.items()))
    # A run killed after its last checkpoint logged rows that its resumed run logs
    # again (from the checkpoint's wall time on): keep the resumed run's.
    for i, part in enumerate(parts[1:], 1):
        resumed_at = part["attrs"].get("resumed_at_wall_s")
        if isinstance(resumed_at, (int, float)):
            for earlier in parts[:i]:
                for name in STREAMS:
                    earlier[name] = earlier[name][earlier[name]["wall_s"] <= resumed_at]
    out = {"attrs": parts[0]["attrs"], "segments": segments, "unreadable": unreadable}
    for name in STREAMS:
        out[name] = np.concatenate([part[name] for part in parts])
    return out
