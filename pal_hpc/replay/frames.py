"""Frame-deduplicated prioritized replay: a SharedReplay whose image field is a
stack of the newest frames, each frame stored once.

A DQN transition on Atari carries obs and next_obs as two (4, 84, 84) stacks:
56 KB, of which 7 KB are new.  Here each slot stores the newest frame of its
observation and the small fields; `sample()` rebuilds `obs` and `next_obs` (the
stack n steps later) in native code, in parallel over the batch, straight into
the batch arrays (cython/frames_core.h has the layout and the invariants).

Each writer's region is split into `streams` equal rings, one per environment it
steps; a stream receives the rows of its environment in order, one per
observation: a transition row (the newest frame of obs_t, the action, the n-step
return and discount, k = steps to its successor) and, when an episode ends, a
row with its final observation's frame (k = 0).  An episode's first row starts a
new stack: its observation is its frame repeated, as gymnasium's
`FrameStackObservation` pads at a reset (padding_type="reset").
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from pal_hpc.replay._framecore import FrameCore, max_window
from pal_hpc.replay._replaycore import control_words, lock_word, max_priority_word
from pal_hpc.replay.shared import SharedReplay
from pal_hpc.replay.spec import RESERVED, _check_spec, _plan, _positive_int

# Hidden per-slot columns (see frames_core.h): the row's number in its stream, the
# number of its episode's first row, and the steps to its successor (0 = final row).
META = {"_step": ((), np.dtype(np.int64)), "_first": ((), np.dtype(np.int64)),
        "_k": ((), np.dtype(np.int32))}
# What a writer passes beside the fields, per row.
ROW_KEYS = ("nstep", "episode_start")


@dataclass(frozen=True)
class FrameStack:
    """A spec entry: the field is a stack of the `stack` newest image frames of shape
    `frame` (H, W) or (H, W, C), oldest first, stored one frame per slot.  Samples
    carry it as `name` and its n-step successor as `next` (default "next_<name>")."""

    frame: tuple
    dtype: object = np.uint8
    stack: int = 4
    next: str | None = None


def _split_spec(spec) -> tuple[str, FrameStack, dict]:
    """(stack field name, its FrameStack, the other fields checked as SharedReplay does)."""
    if not isinstance(spec, Mapping) or not spec:
        raise ValueError("spec must be a non-empty mapping of field name -> (shape, dtype) "
                         "or FrameStack")
    stacks = [n for n, e in spec.items() if isinstance(e, FrameStack)]
    if len(stacks) != 1:
        raise ValueError(f"a frame replay needs exactly one FrameStack field, got {stacks}")
    name = stacks[0]
    fs = spec[name]
    others = {n: e for n, e in spec.items() if n != name}
    small = _check_spec(others) if others else {}
    frame = (fs.frame,) if isinstance(fs.frame, numbers.Integral) else tuple(fs.frame)
    try:
        dtype = np.dtype(fs.dtype)
    except TypeError:
        raise ValueError(f"spec[{name!r}]: frame dtype {fs.dtype!r} is not a numpy dtype") from None
    if (len(frame) not in (2, 3) or not all(isinstance(d, numbers.Integral) and d > 0
                                            for d in frame) or dtype != np.uint8):
        raise ValueError(f"spec[{name!r}]: a frame stack needs image frames (H, W) or (H, W, C) "
                         f"of uint8, got frame shape {frame} and dtype {dtype}; store other "
                         f"fields as (shape, dtype)")
    stack = _positive_int(fs.stack, f"spec[{name!r}] stack")
    nxt = fs.next or f"next_{name}"
    for n in (name, nxt):
        if not isinstance(n, str) or not n.isidentifier() or n in RESERVED or n in small \
                or n in META or n in ROW_KEYS:
            raise ValueError(f"spec[{name!r}]: name {n!r} is taken or not an identifier")
    for n in small:
        if n in META or n in ROW_KEYS:
            raise ValueError(f"spec field name {n!r} is reserved by the frame replay")
    return name, FrameStack(tuple(int(d) for d in frame), dtype, stack, nxt), small


class FrameStackReplay(SharedReplay):
    """SharedReplay with one frame-stack field (see the module docstring).

    `regions` writers, each with `streams` environments; `n_step` is the largest
    k a row may have.  Capacity is split into regions * streams streams of equal
    length S (the remainder of the division stays unused); S must hold a stack and
    an n-step window: S >= stack + n_step + 1.  `sample_threads`: OpenMP threads
    for the copy-out, in parallel over the batch (default 1: see __init__)."""

    def __init__(self, spec, capacity, comm=None, regions=1, streams=1, n_step=1, fanout=16,
                 alpha=0.6, eps=1e-6, sample_threads=None):
        self.stack_name, self.frames, self.small = _split_spec(spec)
        self.streams = _positive_int(streams, "streams")
        self.n_step = _positive_int(n_step, "n_step")
        if self.frames.stack + self.n_step >= max_window():
            raise ValueError(f"stack ({self.frames.stack}) + n_step ({self.n_step}) must be "
                             f"below {max_window()}")
        super().__init__(spec, capacity, comm=comm, regions=regions, fanout=fanout,
                         alpha=alpha, eps=eps)
        cols = self._columns
        frames = cols[self.stack_name]
        self._fcore = FrameCore(
            self._mem[self._layout.tree_off:self._layout.tree_off + self._layout.tree_nbytes],
            self.capacity, fanout, self._seq, self._control, lock_word(), max_priority_word(),
            frames.reshape(self.capacity, -1), cols["_step"], cols["_first"], cols["_k"],
            self.stream_len, self.frames.stack, self.n_step)
        names = list(self.small)
        self._small_src = np.array([cols[n].ctypes.data for n in names], dtype=np.uintp)
        self._small_bytes = np.array([self._layout.row_bytes[n] for n in names], np.int64)
        if sample_threads is None:
            # One: learners share their node's cores with actors, and OpenMP threads on
            # oversubscribed cores cost 20x (25 ms for a batch of 32 here, not 1.2).
            sample_threads = 1
        self.sample_threads = _positive_int(sample_threads, "sample_threads")

    # -- layout --------------------------------------------------------------
    def _validate(self, spec, capacity, regions, fanout):
        """As SharedReplay's, for the stored columns: frames, small fields, META."""
        capacity = _positive_int(capacity, "capacity")
        regions = _positive_int(regions, "regions")
        name, fs, small = _split_spec(spec)
        streams = getattr(self, "streams", 1)
        n_step = getattr(self, "n_step", 1)
        need = fs.stack + n_step + 1
        per = capacity // (regions * streams)
        if per < need:
            raise ValueError(
                f"capacity {capacity} split into {regions} region(s) x {streams} stream(s) "
                f"gives {per} slots per stream; a stack of {fs.stack} frames with n_step "
                f"{n_step} needs at least {need} (capacity >= {need * regions * streams})")
        self.stream_len = per
        stored = {name: (fs.frame, fs.dtype), **small, **META}
        lay = _plan(stored, capacity, regions, fanout, extra_words=regions * streams)
        return stored, capacity, regions, lay

    @staticmethod
    def window_nbytes(spec, capacity, regions=1, streams=1, n_step=1, fanout=16) -> int:
        """Bytes of node memory this buffer would allocate (validated, nothing allocated)."""
        probe = FrameStackReplay.__new__(FrameStackReplay)
        probe.streams = _positive_int(streams, "streams")
        probe.n_step = _positive_int(n_step, "n_step")
        return probe._validate(spec, capacity, regions, fanout)[3].nbytes

    def _region_bounds(self):
        per_region = self.streams * self.stream_len
        return ([r * per_region for r in range(self.regions)], [per_region] * self.regions)

    def _stream_word(self, q: int) -> int:
        return control_words(self.regions) + q

    def _ring_writes(self, control) -> list[int]:
        return [int(control[self._stream_word(q)]) for q in range(self.regions * self.streams)]

    def _ring_bounds(self):
        q = self.regions * self.streams
        return [i * self.stream_len for i in range(q)], [self.stream_len] * q

    def _check_same_everywhere(self, comm) -> None:
        super()._check_same_everywhere(comm)
        mine = (self.streams, self.n_step, self.stack_name, self.frames.stack, self.frames.next)
        for rank, theirs in enumerate(comm.allgather(mine)):
            if theirs != mine:
                raise ValueError(f"FrameStackReplay arguments differ between ranks: rank {rank} "
                                 f"has {theirs}, this rank has {mine}")

    # -- properties ----------------------------------------------------------
    def size(self) -> int:
        """Slots that hold data (transition rows and final-observation rows)."""
        self._live()
        return int(sum(min(w, self.stream_len) for w in self._ring_writes(self._control)))

    def stream_writes(self, region, stream) -> int:
        """Rows ever added to `stream` of `region`."""
        self._live()
        return int(self._control[self._stream_word(self._stream(region, stream))])

    def signature(self) -> dict:
        sig = super().signature()
        sig.update(streams=self.streams, n_step=self.n_step,
                   stack={self.stack_name: [list(self.frames.frame), self.frames.dtype.str,
                                            self.frames.stack, self.frames.next]})
        return sig

    # -- writing -------------------------------------------------------------
    def add(self, region, batch, stream=0) -> np.ndarray:
        """Append rows of one environment's stream, in order; returns the slots written.

        `batch`: the stack field as its newest frames (n, *frame), every other field
        (n, ...), "nstep" (n,) ints: steps to the row's successor, 1..n_step for a
        transition and 0 for a row holding an episode's final observation, and
        "episode_start" (n,) bools: the row is its episode's first observation.
        A row is sampled once its successor row is written.  The whole batch is
        validated first: bad input raises and leaves the buffer unchanged."""
        core = self._live()
        r = self._region(region)
        q = self._stream(region, stream)
        arrays, k, start, n = self._check_rows(batch)
        if n > self.stream_len - self.frames.stack - self.n_step:
            raise ValueError(f"batch of {n} rows is larger than a stream allows "
                             f"({self.stream_len - self.frames.stack - self.n_step})")
        if not core.try_acquire_region(r):
            raise RuntimeError(f"region {r} is being written by another writer; "
                               f"each writer needs a region of its own")
        try:
            w = int(self._control[self._stream_word(q)])
            base = q * self.stream_len
            steps = w + np.arange(n, dtype=np.int64)
            first = self._episode_firsts(base, w, steps, k, start, stream)
            slots = base + steps % self.stream_len
            self._fcore.begin_write(base, steps)
            for name, arr in arrays.items():
                self._columns[name][slots] = arr
            self._columns["_step"][slots] = steps
            self._columns["_first"][slots] = first
            self._columns["_k"][slots] = k
            self._fcore.end_write(base, steps)
            self._control[self._stream_word(q)] = w + n
            core.publish_writes(r, n)
        finally:
            core.release_region(r)
        return slots

    def _check_rows(self, batch):
        if not isinstance(batch, Mapping):
            raise TypeError(f"batch must be a mapping of field -> array, got {type(batch).__name__}")
        fields = {self.stack_name: (self.frames.frame, self.frames.dtype), **self.small}
        missing = [f for f in (*fields, *ROW_KEYS) if f not in batch]
        extra = [f for f in batch if f not in fields and f not in ROW_KEYS]
        if missing or extra:
            raise ValueError(f"batch is missing {missing} / has unknown {extra}; a frame replay "
                             f"takes {list(fields)} + {list(ROW_KEYS)}")
        n = None
        arrays = {}
        for name, (shape, dtype) in fields.items():
            arr = np.asarray(batch[name])
            n = arr.shape[0] if (n is None and arr.ndim) else n
            if arr.ndim == 0 or arr.shape != (n,) + shape or arr.dtype != dtype:
                raise ValueError(f"field {name!r} has shape {arr.shape} and dtype {arr.dtype}, "
                                 f"expected {(n,) + shape} {dtype}"
                                 + (" (one newest frame per row)" if name == self.stack_name
                                    else ""))
            arrays[name] = arr
        k = np.asarray(batch["nstep"])
        start = np.asarray(batch["episode_start"])
        if k.shape != (n,) or k.dtype.kind not in "iu" or start.shape != (n,) \
                or start.dtype != np.bool_:
            raise ValueError(f"nstep must be integers and episode_start bools, of shape ({n},)")
        if n == 0:
            raise ValueError("batch is empty")
        if k.min() < 0 or k.max() > self.n_step:
            raise ValueError(f"nstep values must be in [0, {self.n_step}], got {k.min()}..{k.max()}")
        return arrays, k.astype(np.int32), start, n

    def _episode_firsts(self, base, w, steps, k, start, stream) -> np.ndarray:
        """The first step of each row's episode; a row that continues an episode needs
        an open one before it (the stream's last row, or the row before it here)."""
        n = steps.size
        first = np.empty(n, np.int64)
        prev_open, prev_first = False, -1
        if w > 0:
            last = base + (w - 1) % self.stream_len
            prev_open = int(self._columns["_k"][last]) > 0
            prev_first = int(self._columns["_first"][last])
        for i in range(n):
            if start[i]:
                prev_first = int(steps[i])
            elif not prev_open:
                raise ValueError(f"stream {stream}: row {i} continues an episode, but none is "
                                 f"open (set episode_start on an episode's first row)")
            first[i] = prev_first
            prev_open = k[i] > 0
        return first

    # -- sampling ------------------------------------------------------------
    def _check_samplable(self, core) -> None:
        if core.total() <= 0:
            raise ValueError("cannot sample: the buffer holds no complete transitions yet "
                             "(a row is sampled once its n-step successor is written)")

    def _outputs(self, n: int) -> dict:
        out = {name: np.empty((n,) + s, d) for name, (s, d) in self.small.items()}
        stacked = (n, self.frames.stack) + self.frames.frame
        out[self.stack_name] = np.empty(stacked, self.frames.dtype)
        out[self.frames.next] = np.empty(stacked, self.frames.dtype)
        return out

    def _copy_out(self, slots, out, tickets, prio, ok) -> int:
        return self._fcore.gather(slots, self._small_src, [out[n] for n in self.small],
                                  self._small_bytes, out[self.stack_name], out[self.frames.next],
                                  tickets, prio, ok, self.sample_threads)

    def _stream(self, region, stream) -> int:
        r = self._region(region)
        if isinstance(stream, bool) or not isinstance(stream, numbers.Integral):
            raise TypeError(f"stream must be an integer, got {type(stream).__name__}")
        if not 0 <= stream < self.streams:
            raise IndexError(f"stream {stream} is out of range [0, {self.streams})")
        return r * self.streams + int(stream)

    def __repr__(self):
        state = "closed" if self._closed else f"size={self.size()}"
        return (f"FrameStackReplay(capacity={self.capacity}, regions={self.regions}, "
                f"streams={self.streams}, stack={self.stack_name}:{self.frames.stack}, {state})")


__all__ = ["FrameStack", "FrameStackReplay"]
