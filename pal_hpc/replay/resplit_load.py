"""Loading one new node's share of a re-split checkpoint (`pal_hpc.replay.resplit`)
into its live replay buffer.

The new buffer's state is built as `state_arrays()` would have saved it -- a fresh
tree with each placed row's stored priority, its slot counters, each ring's insert
counter (= the rows it now holds, oldest in its first slot, so the ring overwrites
its oldest rows first), the union's max priority and the carried sample count -- and
handed to the buffer's own `load_state_arrays`, which checks it whole before anything
changes.  Columns are read from the old files one new ring at a time.
"""

from __future__ import annotations

import numpy as np

from pal_hpc.replay._ksumtree import KSumTree
from pal_hpc.replay._replaycore import ReplayCore, control_words
from pal_hpc.replay.resplit import Piece, ring_rows
from pal_hpc.replay.shards import Shard, ShardError

FRAME_META = ("_step", "_first", "_k")


def check_shards_fit(replay, shards: list[Shard]) -> None:
    """Raise ShardError unless every shard stores the fields `replay` stores (names,
    shapes, dtypes), is of its kind (frames or not) and, for frames, of its stack and
    n_step."""
    mine = replay.signature()
    for shard in shards:
        sig = shard.signature
        if ("streams" in sig) != ("streams" in mine):
            raise ShardError(f"{shard.path}: holds a {'frame' if 'streams' in sig else 'plain'} "
                             f"replay; this run's is {'frame' if 'streams' in mine else 'plain'}")
        for key in ("spec", "alpha", "eps", "stack", "n_step"):
            if sig.get(key) != mine.get(key):
                raise ShardError(f"{shard.path}: its replay's {key} is {sig.get(key)!r}, this "
                                 f"run's is {mine.get(key)!r}")


def carried_samples(shards: list[Shard], inserted: int, ratio: float) -> int:
    """The sample count a new node starts with, so that its rate limiter stands where
    the old nodes stood on average: sampled - ratio * inserted (the limiter's whole
    state, what both the actors' and the learners' checks compare) is the mean of the
    old nodes'; never below 0."""
    if not shards:
        return 0
    debt = float(np.mean([s.sampled - ratio * s.inserted for s in shards]))
    return max(0, int(round(ratio * inserted + debt)))


class _Column:
    """One column of the new buffer's state, read ring by ring from the old files when
    sliced (what `load_state_arrays` does, ring by ring)."""

    def __init__(self, name: str, shape: tuple, dtype, rings: list[dict], shards):
        self.name, self.dtype, self._rings, self._shards = name, np.dtype(dtype), rings, shards
        self.shape = (sum(r["prio"].size for r in rings),) + tuple(shape)
        self._bounds = np.cumsum([0] + [r["prio"].size for r in rings])

    def __getitem__(self, sl):
        start, stop, step = sl.indices(self.shape[0])
        assert step == 1, "read in row ranges"
        parts = []
        for q, ring in enumerate(self._rings):
            a, b = int(self._bounds[q]), int(self._bounds[q + 1])
            if b <= start or a >= stop or a == b:
                continue
            rows = self._ring(ring)
            parts.append(rows[max(start, a) - a:min(stop, b) - a])
        return (np.concatenate(parts) if parts
                else np.zeros((0,) + self.shape[1:], self.dtype))

    def _ring(self, ring: dict) -> np.ndarray:
        reads = [self._shards[i].columns[self.name][a:b]
                 for i, ranges in ring["source"] for a, b in ranges]
        rows = (np.concatenate(reads) if reads
                else np.zeros((0,) + self.shape[1:], self.dtype))
        return rows if ring["order"] is None else rows[ring["order"]]


def load_resplit(replay, pieces: list[list[Piece]], shards: list[Shard], sampled: int) -> dict:
    """Fill `replay` (no rank may use it meanwhile) with the rings `pieces` describe,
    one list of pieces per ring of `replay`; returns {"rows", "transitions"} placed."""
    check_shards_fit(replay, shards)
    frames = ((replay.frames.stack, replay.n_step) if hasattr(replay, "stack_name") else None)
    starts, lengths = replay._ring_bounds()
    if len(pieces) != len(starts):
        raise ValueError(f"a plan of {len(pieces)} rings for a buffer of {len(starts)}")
    rings = [ring_rows(ps, shards, frames) for ps in pieces]
    counts = [r["prio"].size for r in rings]
    if any(n > length for n, length in zip(counts, lengths)):
        raise ValueError(f"a plan of {counts} rows for rings of {lengths} slots")

    tree = KSumTree(replay.capacity, replay.fanout)
    slots = np.concatenate([s + np.arange(n) for s, n in zip(starts, counts)] + [[]]
                           ).astype(np.int64)
    prio = np.concatenate([r["prio"] for r in rings] + [np.zeros(0, np.float32)])
    tree.update(slots, prio.astype(np.float64))
    seq = np.zeros(replay.capacity, np.uint64)
    seq[slots] = 2                    # written once, stable
    control = np.zeros(replay._layout.control_words, np.uint64)
    core = ReplayCore(tree.buffer, replay.capacity, replay.fanout, seq, control, replay.regions)
    core.init_control(max((s.max_priority for s in shards), default=1.0))
    if frames is None:
        for r, n in enumerate(counts):
            core.publish_writes(r, n)
    else:
        per = replay.streams
        for q, n in enumerate(counts):
            control[control_words(replay.regions) + q] = n
        for r in range(replay.regions):
            core.publish_writes(r, sum(counts[r * per:(r + 1) * per]))
    core.count_sampled(sampled)

    state = {"control": control, "tree": tree.buffer, "seq": seq,
             "region_rows": np.array(counts, np.int64)}
    for name, (shape, dtype) in replay.spec.items():
        if frames is not None and name in FRAME_META:
            state[f"column.{name}"] = np.concatenate([r[name] for r in rings]).astype(dtype)
        else:
            state[f"column.{name}"] = _Column(name, shape, dtype, rings, shards)
    replay.load_state_arrays(state)
    return {"rows": int(sum(counts)), "transitions": int(np.count_nonzero(prio))}
