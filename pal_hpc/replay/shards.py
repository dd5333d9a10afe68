"""The replay files of a checkpoint read back as *shards*: one node's rings (a region of a
SharedReplay, a stream of a FrameStackReplay), each ring's rows in age order with their
stored priorities, and the node's rate-limiter counters -- what re-splitting the union
of a checkpoint's shards over another layout (`pal_hpc.replay.resplit`) starts from.

A ring that received w rows and has L slots holds its newest n = min(w, L) rows; row
p in age order (0 = oldest held) has write number w - n + p and lives in ring slot
(w - n + p) % L.  A replay file stores each ring's first n slots, rings in order, so
that row is row o + (w - n + p) % L of a column (o: the rows of the rings before).
Everything is checked against the file's own signature before it is used; nothing
here writes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import h5py
import numpy as np

from pal_hpc.replay._ksumtree import KSumTree, aligned_empty
from pal_hpc.replay._replaycore import ReplayCore, control_words, writes_word


class ShardError(ValueError):
    """A replay file that cannot be re-split: its message names the file and the part."""


@dataclass
class Ring:
    """One ring of a saved shard (see the module docstring)."""

    start: int                 # first slot in the shard's buffer
    length: int                # L
    writes: int                # w
    offset: int                # o: its first row in the saved columns
    prio: np.ndarray           # stored priority of each held row, age order (float32)
    # Frame replays: each held row's stream step, episode-first step and k, age order.
    step: np.ndarray | None = None
    first: np.ndarray | None = None
    k: np.ndarray | None = None

    @property
    def rows(self) -> int:
        """n: rows held."""
        return int(self.prio.size)

    def column_ranges(self, a: int, b: int) -> list[tuple[int, int]]:
        """The (start, stop) ranges of saved-column rows holding age rows [a, b)."""
        if b <= a:
            return []
        first = (self.writes - self.rows + a) % self.length
        if first + (b - a) <= self.length:
            return [(self.offset + first, self.offset + first + b - a)]
        head = self.length - first
        return [(self.offset + first, self.offset + self.length),
                (self.offset, self.offset + b - a - head)]


@dataclass
class Shard:
    """A checkpoint's replay file for one node, read and checked (columns stay in the
    open file: `columns[name]` is its h5py dataset)."""

    path: str
    signature: dict
    rings: list[Ring]
    max_priority: float
    sampled: int
    inserted: int
    columns: dict = field(repr=False)
    file: h5py.File | None = field(default=None, repr=False)

    @property
    def frames(self) -> bool:
        return "streams" in self.signature

    @property
    def rows(self) -> int:
        return sum(r.rows for r in self.rings)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def write_shard(f: h5py.File, signature: dict, state: dict) -> None:
    """Fill a replay file: the buffer's `signature()` and its `state_arrays()` (what a
    checkpoint stores per node, and `open_shard` reads back)."""
    f.attrs["signature"] = json.dumps(signature)
    group = f.create_group("replay")
    for name, arr in state.items():
        group.create_dataset(name, data=arr, chunks=True if arr.size else None)


def ring_geometry(sig: dict) -> tuple[list[int], list[int]]:
    """(first slots, lengths) of the rings of a buffer with signature `sig`, as
    SharedReplay (regions) and FrameStackReplay (streams of equal length) lay them out."""
    cap, regions = int(sig["capacity"]), int(sig["regions"])
    if "streams" in sig:
        q = regions * int(sig["streams"])
        per = cap // q
        return [i * per for i in range(q)], [per] * q
    bounds = [r * cap // regions for r in range(regions + 1)]
    return bounds[:-1], [bounds[r + 1] - bounds[r] for r in range(regions)]


def open_shard(path) -> Shard:
    """Read and check one replay file of a checkpoint; raises ShardError naming it."""
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise ShardError(f"{path}: unreadable replay file ({exc})") from None
    try:
        return _read(f, str(path))
    except ShardError:
        f.close()
        raise
    except (KeyError, ValueError, TypeError) as exc:
        f.close()
        raise ShardError(f"{path}: not a replay file of this format ({exc})") from None


def _read(f: h5py.File, path: str) -> Shard:
    def bad(what: str):
        return ShardError(f"{path}: {what}")

    sig = json.loads(f.attrs["signature"])
    group = f["replay"]
    cap, regions, fanout = int(sig["capacity"]), int(sig["regions"]), int(sig["fanout"])
    starts, lengths = ring_geometry(sig)
    frames = "streams" in sig
    words = control_words(regions) + (len(starts) if frames else 0)
    control = _array(group, "control", np.uint64, (words,), bad)
    tree_nbytes = KSumTree.nbytes(cap, fanout)
    tree = aligned_empty(tree_nbytes)
    tree[:] = _array(group, "tree", np.uint8, (tree_nbytes,), bad)
    seq = np.ascontiguousarray(_array(group, "seq", np.uint64, (cap,), bad))
    rows = _array(group, "region_rows", np.int64, (len(starts),), bad)
    try:
        core = ReplayCore(tree, cap, fanout, seq, control, regions)
    except ValueError as exc:
        raise bad(f"its tree does not fit its signature ({exc})") from None
    core.reset_locks()                    # a private copy: nobody holds them here
    writes = ([int(control[control_words(regions) + q]) for q in range(len(starts))]
              if frames else [int(control[writes_word(r)]) for r in range(regions)])
    expect = [min(w, n) for w, n in zip(writes, lengths)]
    if rows.tolist() != expect:
        raise bad(f"region_rows {rows.tolist()} disagree with its insert counters ({expect})")
    if frames and any(sum(writes[r * int(sig['streams']):(r + 1) * int(sig['streams'])])
                      != core.writes(r) for r in range(regions)):
        raise bad("its stream counters do not add up to its region counters")
    spec = {n: (tuple(s), np.dtype(d)) for n, (s, d) in sig["spec"].items()}
    total = int(rows.sum())
    columns = {}
    for name, (shape, dtype) in spec.items():
        ds = group.get(f"column.{name}")
        if ds is None or ds.dtype != dtype or ds.shape != (total,) + shape:
            raise bad(f"column {name!r} is missing or not {dtype} of shape {(total,) + shape}")
        columns[name] = ds
    leaves_off = KSumTree.layout(cap, fanout)[0]["offset"]
    leaves = tree[leaves_off:leaves_off + 4 * cap].view(np.float32)
    meta = ({n: np.asarray(columns[n][()]) for n in ("_step", "_first", "_k")}
            if frames else {})
    rings, offset = [], 0
    for start, length, w, n in zip(starts, lengths, writes, rows.tolist()):
        p = np.arange(n, dtype=np.int64)
        in_ring = (w - n + p) % length
        slots = start + in_ring
        if n and (seq[slots] == 0).any():
            raise bad("a slot its counters say was written has never been written (seq)")
        ring = Ring(start, length, w, offset, leaves[slots].copy())
        if frames:
            at = offset + in_ring
            ring.step, ring.first = meta["_step"][at], meta["_first"][at]
            ring.k = meta["_k"][at].astype(np.int64)
            if n and (not np.array_equal(ring.step, w - n + p) or (ring.first > ring.step).any()
                      or (ring.k < 0).any() or (ring.k > int(sig["n_step"])).any()):
                raise bad("a stream's step, episode or n-step columns are inconsistent")
        if not np.isfinite(ring.prio).all() or (ring.prio < 0).any():
            raise bad("its tree holds a priority that is negative or not finite")
        rings.append(ring)
        offset += n
    return Shard(path, sig, rings, float(core.max_priority()), int(core.sampled()),
                 sum(int(core.writes(r)) for r in range(regions)), columns, f)


def _array(group, key: str, dtype, shape: tuple, bad) -> np.ndarray:
    ds = group.get(key)
    if ds is None or ds.dtype != np.dtype(dtype) or tuple(ds.shape) != tuple(shape):
        raise bad(f"state array {key!r} is missing or not {np.dtype(dtype)} of shape {shape}")
    return np.asarray(ds[()])
