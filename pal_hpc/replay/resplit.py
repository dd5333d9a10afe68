"""Re-splitting a checkpoint's replay over another layout: which saved rows each new
ring receives, in what order, with what priority.  Pure (numpy only): every node of
the new job computes the same plan from the same shards, so two resumes of one
checkpoint on one layout load the same rows into the same slots.

The rules (docs/logs.md, "Resuming on another layout"):

- The union of the shards is redistributed: new total capacity = the sum of the new
  rings' lengths.  Each held row goes to exactly one new ring (a frame replay may
  also copy a few rows as context, see below).
- When the union does not fit, the oldest rows go.  A row's age is the number of rows
  its own ring received after it (rings fill at their writers' rates, which the rate
  limiter keeps close); the K newest by (age, old node, old ring) stay.
- The kept rows form a *tape*: old node by old node, ring by ring, each ring's rows
  oldest first.  New ring j takes the next stretch of the tape, its share of K in
  proportion to its length.  A plain replay then orders each new ring's rows oldest
  first (so a ring overwrites its oldest rows first, as before), interleaving the old
  rings it took from.
- A frame replay keeps every stretch contiguous: a row's stack and n-step successor
  are the rows around it in its stream, and must stay exactly what was emitted
  (DESIGN invariant 7).  Where a stretch boundary cuts an old stream, the stretch
  before it also takes the n_step rows after the cut and the stretch after it the
  stack - 1 rows before (context copies, priority 0), so no transition is cut in two;
  a transition keeps its priority only in the copy that owns it and whose window
  (stack and successor) lies whole in its stretch, which holds for every transition
  that was samplable unless its window reached into dropped rows.  K shrinks by the
  context copies' room when they would not fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Piece:
    """Age rows [a, b) of ring `ring` of shard `shard`; it owns rows [own_a, own_b)
    (the others are context copies of a frame replay)."""

    shard: int
    ring: int
    a: int
    b: int
    own_a: int
    own_b: int

    @property
    def size(self) -> int:
        return self.b - self.a


@dataclass
class Plan:
    """What goes where: `rings[node][ring]` lists its pieces in slot order."""

    rings: list[list[list[Piece]]]
    saved_rows: int              # rows the checkpoint held
    kept_rows: int               # of them, rows placed (each once, context copies aside)

    @property
    def dropped_rows(self) -> int:
        return self.saved_rows - self.kept_rows


def keep_counts(rows, keep: int) -> np.ndarray:
    """Rows each ring keeps so that the `keep` newest rows stay: the smallest ages
    first, ties to the earlier ring (the rows of a ring are ages 0..rows-1)."""
    rows = np.asarray(rows, np.int64)
    if keep >= rows.sum():
        return rows.copy()
    lo, hi = 0, int(rows.max(initial=0))
    while lo < hi:                    # the largest age bound a with sum(min(rows, a)) <= keep
        mid = (lo + hi + 1) // 2
        if np.minimum(rows, mid).sum() <= keep:
            lo = mid
        else:
            hi = mid - 1
    out = np.minimum(rows, lo)
    rest = keep - int(out.sum())
    for r in np.flatnonzero(rows > lo)[:rest]:
        out[r] += 1
    return out


def shares(total: int, lengths) -> np.ndarray:
    """`total` split in proportion to `lengths` (largest remainders, ties to the first),
    never above a length when total <= sum(lengths)."""
    lengths = np.asarray(lengths, np.int64)
    cap = int(lengths.sum())
    if cap == 0:
        return np.zeros_like(lengths)
    base = total * lengths // cap
    frac = total * lengths - base * cap
    order = np.lexsort((np.arange(lengths.size), -frac))
    base[order[:total - int(base.sum())]] += 1
    return base


def plan_resplit(saved: list[list[int]], new: list[list[int]],
                 frames: tuple[int, int] | None = None) -> Plan:
    """The plan for shards holding `saved[shard][ring]` rows onto new nodes whose rings
    have `new[node][ring]` slots; `frames` = (stack, n_step) for a frame replay."""
    held = [n for shard in saved for n in shard]
    where = [(i, r) for i, shard in enumerate(saved) for r in range(len(shard))]
    lengths = [n for node in new for n in node]
    keep = min(sum(held), sum(lengths))
    ext = (frames[0] - 1, frames[1]) if frames else (0, 0)
    while True:
        kept = keep_counts(held, keep)
        tape = [(i, r, n - m, n) for (i, r), n, m in zip(where, held, kept.tolist()) if m]
        flat = _cut(tape, shares(keep, lengths), ext)
        over = sum(max(0, sum(p.size for p in ps) - n) for ps, n in zip(flat, lengths))
        if over == 0:
            break
        keep -= over                  # room for the context copies: fewer rows fit
    rings, k = [], 0
    for node in new:
        rings.append(flat[k:k + len(node)])
        k += len(node)
    return Plan(rings, sum(held), keep)


def _cut(tape, sizes, ext) -> list[list[Piece]]:
    """Consecutive stretches of the tape, `sizes[j]` rows for ring j; a stretch that
    starts inside a segment takes ext[0] rows before it, one that ends inside one
    takes ext[1] rows after it (within the segment)."""
    out: list[list[Piece]] = []
    seg, pos = 0, 0                   # the tape's cursor: segment, and row within it
    for size in np.asarray(sizes).tolist():
        pieces: list[Piece] = []
        left = size
        while left > 0:
            i, r, a, b = tape[seg]
            start = a + pos
            take = min(left, b - start)
            before = min(ext[0], start - a) if not pieces else 0
            end = start + take
            left -= take
            after = min(ext[1], b - end) if left == 0 else 0
            pieces.append(Piece(i, r, start - before, end + after, start, end))
            pos += take
            if start + take == b:
                seg, pos = seg + 1, 0
        out.append(pieces)
    return out


# -- the rows of one new ring ----------------------------------------------------------

def ring_rows(pieces: list[Piece], shards, frames: tuple[int, int] | None) -> dict:
    """The rows of one new ring from its pieces: "prio" (stored priorities, float32),
    "source" ([(shard, column row ranges)] in the order rows are read), "order" (a
    permutation of the read rows into slot order, or None), and for a frame replay its
    "_step", "_first" and "_k" columns (steps renumbered from 0 in this ring)."""
    prio, ages, source = [], [], []
    steps, firsts, ks = [], [], []
    t = 0
    for p in pieces:
        ring = shards[p.shard].rings[p.ring]
        rows = np.arange(p.a, p.b)
        owned = (rows >= p.own_a) & (rows < p.own_b)
        pr = ring.prio[p.a:p.b].copy()
        source.append((p.shard, ring.column_ranges(p.a, p.b)))
        if frames is None:
            ages.append(ring.rows - 1 - rows)
        else:
            stack = frames[0]
            step, first, k = ring.step[p.a:p.b], ring.first[p.a:p.b], ring.k[p.a:p.b]
            base = ring.writes - ring.rows           # the step of age row 0
            lo = np.maximum(first, step - stack + 1) - base
            hi = step + k - base
            owned &= (k >= 1) & (lo >= p.a) & (hi < p.b)
            pos = t + np.arange(p.size)
            steps.append(pos)
            # An episode that began before the stretch begins at its first row here:
            # no stack of a row this stretch owns reaches below it, and no row of the
            # ring's other stretches can pass for one of this episode.
            firsts.append(np.maximum(first - step + pos, t))
            ks.append(k.astype(np.int32))
        pr[~owned] = 0.0
        prio.append(pr)
        t += p.size
    out = {"prio": _cat(prio, np.float32), "source": source, "order": None}
    if frames is None:
        out["order"] = np.argsort(-_cat(ages, np.int64), kind="stable")
        out["prio"] = out["prio"][out["order"]]
    else:
        out["_step"], out["_first"], out["_k"] = (_cat(steps, np.int64), _cat(firsts, np.int64),
                                                  _cat(ks, np.int32))
    return out


def _cat(parts, dtype) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)
