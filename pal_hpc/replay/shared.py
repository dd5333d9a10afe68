"""Prioritized replay that lives once per node, in an MPI shared-memory window.

Every rank of a node maps the same memory:

    [ control words | K-ary sum/min tree | seq: uint64[capacity] | one column per field ]

Writers (actors) own one *region* each -- a contiguous run of slots they fill
in ring order -- and insert with PAL's lazy write: a slot's priority is set to 0
and its sequence counter made odd (under the short tree lock), the data is
copied in with no lock at all, then the counter is made even and the slot gets
the largest priority seen so far.  Samplers (learners) descend the tree with no
lock and copy rows out under each slot's seqlock, so a row is never torn and a
slot being rewritten is never returned.  A priority update carries the ticket
(the slot's even counter when sampled) and is dropped if the slot was rewritten
since.  The protocol itself is in cython/sync_core.h.
"""

from __future__ import annotations

import numbers
import time

import numpy as np

from pal_hpc.cluster.window import allocate_shared
from pal_hpc.replay._ksumtree import KSumTree, aligned_empty, check_allocatable
from pal_hpc.replay._replaycore import ReplayCore, writes_word
from pal_hpc.replay.spec import (_ALIGN, _check_spec, _finite, _plan, _positive_int,
                                  check_batch)
from pal_hpc.replay.state import ReplayState

_F32_MAX = float(np.finfo(np.float32).max)


class SharedReplay(ReplayState):
    """Node-shared prioritized replay with lazy-write regions.

    Collective over `comm` (a shared-memory node communicator, see
    `pal_hpc.cluster.node_comm`): node rank 0 allocates and initialises, every rank
    maps the same memory.  With `comm=None` the buffer lives in private memory
    with the same API.  `capacity` is split into `regions` contiguous regions,
    one per writer.  Priorities are raw (|TD error|); the buffer stores
    `(p + eps) ** alpha`.
    """

    def __init__(self, spec, capacity, comm=None, regions=1, fanout=16, alpha=0.6, eps=1e-6):
        self.spec, self.capacity, self.regions, lay = self._validate(spec, capacity, regions,
                                                                     fanout)
        self.alpha = _finite(alpha, "alpha")
        self.eps = _finite(eps, "eps")
        if self.eps <= 0:
            # eps > 0 keeps every written slot samplable: with eps = 0 a buffer whose
            # TD errors all reach 0 would have nothing left to sample.
            raise ValueError(f"eps must be > 0, got {eps!r}")
        self.fanout = fanout

        self._comm = comm
        self._shared = None
        self._closed = False
        if comm is not None:
            self._check_same_everywhere(comm)

        self._layout = lay
        self.nbytes = lay.nbytes
        # Every rank of a node checks (same node, same answer), so all raise together.
        check_allocatable(self.nbytes, f"a replay buffer of capacity {self.capacity}")

        creator = comm is None or comm.Get_rank() == 0
        if comm is None:
            mem = aligned_empty(self.nbytes)
        else:
            self._shared = allocate_shared(comm, self.nbytes, _ALIGN)
            mem = self._shared.array
        self._mem = mem
        tree_mem = mem[lay.tree_off:lay.tree_off + lay.tree_nbytes]
        control = mem[:8 * lay.control_words].view(np.uint64)
        self._control = control
        self._seq = mem[lay.seq_off:lay.seq_off + 8 * self.capacity].view(np.uint64)
        self._columns = {}
        for name, (shape, dtype) in self.spec.items():
            raw = mem[lay.col_off[name]:lay.col_off[name] + self.capacity * lay.row_bytes[name]]
            self._columns[name] = raw.view(dtype).reshape((self.capacity,) + shape)

        if creator:
            # Touch every page once now (zeroing the columns too), so that actors never
            # take a page fault on the insert path: for a multi-GiB Atari buffer, first
            # touches otherwise cost more than the copies themselves.
            mem.fill(0)
            self._tree = KSumTree(self.capacity, fanout, buffer=tree_mem)
        if comm is not None:
            comm.Barrier()
        if not creator:
            self._tree = KSumTree.attach(tree_mem, self.capacity, fanout)
        self._core = ReplayCore(tree_mem, self.capacity, fanout, self._seq, control, self.regions)
        if creator:
            self._core.init_control(1.0)
        if comm is not None:
            comm.Barrier()

        self._region_start, self._region_len = self._region_bounds()
        # Rings: the runs of slots filled in ring order from their first slot (a
        # region here; a stream of a frame replay), as checkpoints save them.
        self._ring_start, self._ring_len = self._ring_bounds()
        names = list(self.spec)
        self._row_bytes = np.array([lay.row_bytes[n] for n in names], dtype=np.int64)
        self._src = np.array([self._columns[n].ctypes.data for n in names], dtype=np.uintp)
        # sample()'s generator when the caller passes none: one per instance, not
        # one seeded from the OS per call (12 us each).
        self._rng = np.random.default_rng()

    def _region_bounds(self) -> tuple[list[int], list[int]]:
        """(first slots, lengths) of the regions."""
        bounds = [r * self.capacity // self.regions for r in range(self.regions + 1)]
        return bounds[:-1], [bounds[r + 1] - bounds[r] for r in range(self.regions)]

    def _ring_bounds(self) -> tuple[list[int], list[int]]:
        """(first slots, lengths) of the rings."""
        return self._region_start, self._region_len

    def _ring_writes(self, control) -> list[int]:
        """Rows ever written to each ring, from a control block (live or saved)."""
        return [int(control[writes_word(r)]) for r in range(self.regions)]

    @staticmethod
    def _validate(spec, capacity, regions, fanout):
        spec = _check_spec(spec)
        capacity = _positive_int(capacity, "capacity")
        regions = _positive_int(regions, "regions")
        if regions > capacity:
            raise ValueError(f"regions ({regions}) must not exceed capacity ({capacity})")
        return spec, capacity, regions, _plan(spec, capacity, regions, fanout)

    @staticmethod
    def window_nbytes(spec, capacity, regions=1, fanout=16) -> int:
        """Bytes of node memory `SharedReplay(spec, capacity, regions=regions,
        fanout=fanout)` would allocate, validated as the constructor does; allocates
        nothing (compare it with the node's free memory first)."""
        return SharedReplay._validate(spec, capacity, regions, fanout)[3].nbytes

    # -- construction helpers ----------------------------------------------
    def _check_same_everywhere(self, comm) -> None:
        mine = (self.capacity, self.regions, self.alpha, self.eps, self.fanout,
                tuple((n, s, d.str) for n, (s, d) in self.spec.items()))
        everyone = comm.allgather(mine)
        for rank, theirs in enumerate(everyone):
            if theirs != mine:
                raise ValueError(f"SharedReplay arguments differ between ranks: rank {rank} has "
                                 f"{theirs}, this rank has {mine}")

    # -- properties --------------------------------------------------------
    @property
    def bytes_per_transition(self) -> float:
        """Bytes of node memory per stored transition (fields, counter and tree share)."""
        return self.nbytes / self.capacity

    def region_slots(self, region) -> tuple[int, int]:
        """(start, stop) slot range of `region`."""
        r = self._region(region)
        return self._region_start[r], self._region_start[r] + self._region_len[r]

    def writes(self, region) -> int:
        """Transitions ever added to `region` (by any rank)."""
        return int(self._live().writes(self._region(region)))

    def inserted(self) -> int:
        """Transitions ever added, over all regions (a rate limiter's insert count)."""
        core = self._live()
        return int(sum(core.writes(r) for r in range(self.regions)))

    def sampled(self) -> int:
        """Transitions ever returned by sample(), by any rank (a rate limiter's sample count)."""
        return int(self._live().sampled())

    def size(self) -> int:
        """Slots that hold data."""
        core = self._live()
        return int(sum(min(core.writes(r), self._region_len[r]) for r in range(self.regions)))

    def total(self) -> float:
        """Sum of stored priorities, (p + eps) ** alpha over written slots."""
        return float(self._live().total())

    def max_priority(self) -> float:
        """Stored priority that newly added transitions get."""
        return float(self._live().max_priority())

    def priorities(self, indices) -> np.ndarray:
        """Stored priorities (float32) at slot `indices`."""
        self._live()
        return self._tree.get(indices)

    # -- writing -----------------------------------------------------------
    def add(self, region, batch) -> np.ndarray:
        """Append a batch (field -> array with leading dim n) to `region`, in ring order.

        Returns the slot indices written.  The whole batch is validated first:
        bad input raises and leaves the buffer unchanged.
        """
        core = self._live()
        r = self._region(region)
        arrays, n = check_batch(self.spec, batch)
        length = self._region_len[r]
        if n > length:
            raise ValueError(f"batch of {n} transitions is larger than region {r} ({length} slots)")
        if not core.try_acquire_region(r):
            raise RuntimeError(f"region {r} is being written by another writer; "
                               f"each writer needs a region of its own")
        try:
            first = core.writes(r) % length
            start = self._region_start[r]
            slots = start + (first + np.arange(n, dtype=np.int64)) % length
            head = min(n, length - first)
            core.begin_write(slots)
            for name, arr in arrays.items():
                col = self._columns[name]
                col[start + first:start + first + head] = arr[:head]
                if head < n:
                    col[start:start + n - head] = arr[head:]
            core.end_write(slots)
            core.publish_writes(r, n)
        finally:
            core.release_region(r)
        return slots

    # -- sampling ----------------------------------------------------------
    def sample(self, batch_size, beta=0.4, rng=None) -> dict:
        """Proportional (stratified) sample of `batch_size` transitions, copied out.

        One draw per equal slice of the total priority mass, so draws are with
        replacement: a slot can appear more than once, and a `batch_size` above
        size() still returns `batch_size` rows, every one a written slot.  An empty
        buffer raises ValueError.

        `rng`: a numpy Generator (or a seed for a new one); None uses this
        instance's own generator.  Returns every spec field plus "indices"
        (slots), "weights" (importance
        weights, float32, largest possible weight = 1) and "tickets" (pass them
        to update_priorities).
        """
        core = self._live()
        b = _positive_int(batch_size, "batch_size")
        beta = _finite(beta, "beta")
        if rng is None:
            rng = self._rng
        elif not isinstance(rng, np.random.Generator):
            rng = np.random.default_rng(rng)
        self._check_samplable(core)

        # First pass straight into the output arrays; rows that were being
        # rewritten while we copied them (rare) are redrawn in their own strata.
        out = self._outputs(b)
        indices = np.empty(b, np.int64)
        tickets = np.empty(b, np.uint64)
        prio = np.empty(b, np.float32)
        ok = np.empty(b, np.uint8)
        total = core.total()
        masses = (np.arange(b) + rng.random(b)) * (total / b)
        core.find(masses, indices)
        good = self._copy_out(indices, out, tickets, prio, ok)
        if good < b:
            self._redraw(core, rng, b, np.flatnonzero(ok == 0), out, indices, tickets, prio)

        p_min = self._tree.min()
        if not p_min > 0:
            p_min = float(prio.min())
        # w_i = (N P(i))^-beta / max_j (N P(j))^-beta = (p_i / p_min)^-beta; a priority
        # read below p_min (a concurrent update) is clamped to weight 1.
        weights = np.minimum(np.power(prio / np.float32(p_min), np.float32(-beta)), np.float32(1))
        core.count_sampled(b)
        out["indices"] = indices
        out["weights"] = weights.astype(np.float32, copy=False)
        out["tickets"] = tickets
        return out

    def _redraw(self, core, rng, b, todo, out, indices, tickets, prio) -> None:
        """Fill the positions `todo` whose first draw hit a slot mid-rewrite."""
        for attempt in range(10_000):
            total = core.total()
            if total > 0:
                masses = (todo + rng.random(todo.size)) * (total / b)
                slots = np.empty(todo.size, np.int64)
                core.find(masses, slots)
                got = self._gather(core, slots)
                good = got["ok"].astype(bool)
                where = todo[good]
                indices[where] = slots[good]
                tickets[where] = got["tickets"][good]
                prio[where] = got["prio"][good]
                for name in out:
                    out[name][where] = got[name][good]
                todo = todo[~good]
                if todo.size == 0:
                    return
            if attempt >= 8:
                # Every candidate is being rewritten right now (tiny buffer, busy writers).
                time.sleep(min(1e-3, 1e-5 * attempt))
        raise RuntimeError("sample: could not read a stable transition after 10000 attempts")

    def _check_samplable(self, core) -> None:
        if core.total() <= 0 and self.size() == 0:
            raise ValueError("cannot sample: the buffer holds no transitions yet")

    def _outputs(self, n: int) -> dict:
        """Empty arrays for n sampled rows, one per field sample() returns."""
        return {name: np.empty((n,) + s, d) for name, (s, d) in self.spec.items()}

    def _copy_out(self, slots, out, tickets, prio, ok) -> int:
        """Validated copy of the rows at `slots` into `out`; returns how many are good."""
        return self._core.gather(slots, self._src, list(out.values()), self._row_bytes,
                                 tickets, prio, ok)

    def _gather(self, core, slots: np.ndarray) -> dict:
        n = slots.size
        got = self._outputs(n)
        fields = dict(got)
        got["tickets"] = np.zeros(n, np.uint64)
        got["prio"] = np.zeros(n, np.float32)
        got["ok"] = np.zeros(n, np.uint8)
        self._copy_out(slots, fields, got["tickets"], got["prio"], got["ok"])
        return got

    # -- learner feedback --------------------------------------------------
    def update_priorities(self, indices, priorities, tickets) -> int:
        """Set new raw priorities for sampled slots; returns how many were applied.

        An update whose slot was rewritten after it was sampled (its ticket no
        longer matches) is dropped.  Bad input raises before anything changes.
        """
        core = self._live()
        idx = np.asarray(indices)
        pr = np.asarray(priorities)
        tk = np.asarray(tickets)
        if idx.dtype.kind not in "iu":
            raise TypeError(f"indices must be integers, got dtype {idx.dtype}")
        if pr.dtype.kind not in "fiu":
            raise TypeError(f"priorities must be real numbers, got dtype {pr.dtype}")
        if tk.dtype.kind not in "iu":
            raise TypeError(f"tickets must be integers, got dtype {tk.dtype}")
        if idx.ndim != 1 or pr.shape != idx.shape or tk.shape != idx.shape:
            raise ValueError(f"indices {idx.shape}, priorities {pr.shape} and tickets {tk.shape} "
                             f"must be 1-D and of one length")
        if tk.dtype.kind == "i" and tk.size and tk.min() < 0:
            raise ValueError("tickets must be non-negative (use the tickets sample() returned)")
        if idx.size == 0:
            return 0
        slots = np.ascontiguousarray(idx, np.int64)
        stored = np.empty(slots.size, np.float32)
        kind, k = core.prepare_priorities(slots, np.ascontiguousarray(pr, np.float64),
                                          self.alpha, self.eps, stored)
        if kind == 0:
            raise IndexError(f"indices[{k}] = {idx[k]} is out of range [0, {self.capacity})")
        if kind == 1:
            raise ValueError(f"priorities[{k}] = {pr[k]!r} is not a finite, non-negative priority")
        return int(core.update_if_current(slots, stored, np.ascontiguousarray(tk, np.uint64)))

    # -- lifetime ----------------------------------------------------------
    def close(self) -> None:
        """Release the memory (collective over the node communicator)."""
        if self._closed:
            return
        self._closed = True
        self._core = None
        self._tree = None
        self._columns = {}
        self._seq = None
        self._mem = None
        if self._shared is not None:
            self._shared.free()
            self._shared = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self._closed else f"size={self.size()}"
        return (f"SharedReplay(capacity={self.capacity}, regions={self.regions}, "
                f"fields={list(self.spec)}, {state})")

    def _live(self) -> ReplayCore:
        if self._closed:
            raise RuntimeError("this SharedReplay is closed")
        return self._core

    def _region(self, region) -> int:
        if isinstance(region, bool) or not isinstance(region, numbers.Integral):
            raise TypeError(f"region must be an integer, got {type(region).__name__}")
        if not 0 <= region < self.regions:
            raise IndexError(f"region {region} is out of range [0, {self.regions})")
        return int(region)
