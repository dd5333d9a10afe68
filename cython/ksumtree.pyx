# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Python face of the native K-ary sum/min tree (see ksum_core.h for the layout).

Every method validates its whole input before it touches the tree, so bad input
raises and leaves the tree exactly as it was.  The heavy loops run without the
GIL; lookups (`find`, `sample`, `get`) are split over OpenMP threads when the
batch is large enough to pay for it, with results identical for any thread count.
"""
import numbers
import os
import sys

import numpy as np
cimport numpy as cnp
from libc.stdint cimport int64_t, uint64_t, uint32_t, uintptr_t
from cython.parallel cimport prange
cimport openmp

cnp.import_array()

from ksum_core cimport (
    KST_ALIGN, kst_layout, kst_tree, kst_compute_layout, kst_bind, kst_init,
    kst_check_header, kst_update_batch, kst_total, kst_min, kst_find_many, KST_BLOCK)

cdef extern from "float.h":
    float FLT_MAX

# Below this many lookups per thread, starting an OpenMP team costs more than it saves.
cdef int64_t PARALLEL_MIN_PER_THREAD = 1024

_ISSUES = {
    -1: "no tree header (the buffer was never initialised with KSumTree(...), or is corrupt)",
    -2: "tree header has another layout version",
    -3: "tree header records a different capacity or fanout",
    -4: "tree header does not match the expected layout",
}


def max_threads():
    """Number of OpenMP threads available to this process."""
    return openmp.omp_get_max_threads()


cdef int _layout(object capacity, object fanout, kst_layout *lay) except -1:
    if isinstance(capacity, bool) or not isinstance(capacity, numbers.Integral):
        raise TypeError(f"capacity must be an integer, got {type(capacity).__name__}")
    if isinstance(fanout, bool) or not isinstance(fanout, numbers.Integral):
        raise TypeError(f"fanout must be an integer, got {type(fanout).__name__}")
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    if capacity >= 2 ** 62:
        raise ValueError(f"capacity {capacity} is too large")
    if fanout < 2 or fanout > 4096 or (fanout & (fanout - 1)) != 0:
        raise ValueError(f"fanout must be a power of two in [2, 4096], got {fanout}")
    code = kst_compute_layout(<uint64_t>capacity, <uint32_t>fanout, lay)
    if code == -2:
        raise ValueError(f"capacity {capacity} is too large: a tree of that capacity with "
                         f"fanout={fanout} needs more than {sys.maxsize} bytes")
    if code != 0:
        raise ValueError(f"cannot lay out a tree with capacity={capacity}, fanout={fanout}")
    return 0


def physical_memory():
    """Bytes of physical memory on this machine (sys.maxsize if the OS does not say)."""
    try:
        pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return sys.maxsize
    return pages * page if pages > 0 and page > 0 else sys.maxsize


def check_allocatable(nbytes, what="buffer"):
    """Raise MemoryError, naming `nbytes`, if a buffer that size cannot fit in this
    machine's physical memory.  Our buffers are zeroed (every page touched) right
    after allocation, so a larger one would only end in the OOM killer."""
    have = physical_memory()
    if nbytes > have:
        raise MemoryError(f"{what} needs {nbytes} bytes ({nbytes / 2**30:.4g} GiB), more than "
                          f"this machine's {have} bytes of physical memory")


def _writable_bytes(buffer, Py_ssize_t need):
    """A writable, C-contiguous, 64-byte-aligned byte view of `buffer`, or a clear error."""
    try:
        mv = memoryview(buffer)
    except TypeError:
        raise TypeError(f"buffer must support the buffer protocol, got {type(buffer).__name__}") from None
    if mv.readonly:
        raise ValueError("buffer is read-only; the tree needs writable memory")
    if not mv.c_contiguous:
        raise ValueError("buffer must be C-contiguous")
    mv = mv.cast("B")
    if mv.nbytes < need:
        raise ValueError(f"buffer holds {mv.nbytes} bytes but the tree needs {need} "
                         f"(see KSumTree.nbytes)")
    arr = np.frombuffer(mv, dtype=np.uint8)
    addr = arr.ctypes.data
    if addr % KST_ALIGN:
        raise ValueError(f"buffer address {addr:#x} is not {KST_ALIGN}-byte aligned "
                         f"(use pal_hpc.replay.aligned_empty)")
    return arr


def aligned_empty(nbytes, align=KST_ALIGN):
    """A zeroed uint8 numpy array of `nbytes` whose data starts on an `align`-byte boundary.

    Raises MemoryError before allocating when `nbytes` exceeds physical memory."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral) or nbytes < 0:
        raise ValueError(f"nbytes must be an integer >= 0, got {nbytes!r}")
    if isinstance(align, bool) or not isinstance(align, numbers.Integral) or align < 1 \
            or align & (align - 1):
        raise ValueError(f"align must be a power of two, got {align!r}")
    nbytes, align = int(nbytes), int(align)
    if nbytes > sys.maxsize - align:
        raise ValueError(f"nbytes {nbytes} is too large (at most {sys.maxsize - align})")
    check_allocatable(nbytes)
    raw = np.zeros(nbytes + align, dtype=np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off:off + nbytes]


cdef object _as_indices(object indices, uint64_t capacity):
    arr = np.asarray(indices)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"indices must be integers, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"indices must be a 1-D array or a scalar, got shape {arr.shape}")
    if arr.dtype != np.int64 or not arr.flags.c_contiguous:
        if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
            raise IndexError(f"index {arr.max()} is out of range for capacity {capacity}")
        arr = np.ascontiguousarray(arr, dtype=np.int64)
    cdef const int64_t[::1] v = arr
    cdef Py_ssize_t n = v.shape[0], i, bad = -1
    with nogil:
        for i in range(n):
            if v[i] < 0 or <uint64_t>v[i] >= capacity:
                bad = i
                break
    if bad >= 0:
        raise IndexError(f"indices[{bad}] = {v[bad]} is out of range [0, {capacity})")
    return arr


cdef object _as_float64(object values, str name):
    arr = np.asarray(values)
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{name} must be real numbers, got dtype {arr.dtype}")
    if arr.dtype != np.float64 or not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr, dtype=np.float64)
    return arr


cdef class KSumTree:
    """K-ary sum tree with a min-positive tree, over memory the caller may own.

    `KSumTree(capacity, fanout=16, buffer=None)` initialises a zeroed tree in
    `buffer` (at least `KSumTree.nbytes(capacity, fanout)` writable bytes,
    64-byte aligned) or in private memory when `buffer` is None.
    `KSumTree.attach(buffer, capacity, fanout)` views a tree already there.
    Priorities are stored as float32; `total()` is kept in float64.
    """
    cdef kst_tree t
    cdef kst_layout lay
    cdef object _buf
    cdef int _threads

    def __init__(self, capacity, fanout=16, buffer=None, *, _attach=False):
        _layout(capacity, fanout, &self.lay)
        if buffer is None:
            if _attach:
                raise ValueError("attach needs a buffer")
            check_allocatable(self.lay.nbytes, f"a tree of capacity {capacity} (fanout {fanout})")
            arr = aligned_empty(self.lay.nbytes)
        else:
            arr = _writable_bytes(buffer, self.lay.nbytes)
        cdef uintptr_t addr = arr.ctypes.data
        self._buf = arr
        self._threads = 1
        if _attach:
            code = kst_check_header(<void *>addr, &self.lay)
            if code != 0:
                raise ValueError(f"cannot attach a tree with capacity={capacity}, "
                                 f"fanout={fanout}: {_ISSUES[code]}")
            kst_bind(&self.t, <void *>addr, &self.lay)
        else:
            kst_bind(&self.t, <void *>addr, &self.lay)
            with nogil:
                kst_init(&self.t, &self.lay)

    @classmethod
    def attach(cls, buffer, capacity, fanout=16):
        """View the tree that `KSumTree(capacity, fanout, buffer)` initialised in `buffer`."""
        return cls(capacity, fanout, buffer, _attach=True)

    @staticmethod
    def nbytes(capacity, fanout=16):
        """Bytes of buffer a tree of `capacity` leaves and this fanout needs."""
        cdef kst_layout lay
        _layout(capacity, fanout, &lay)
        return lay.nbytes

    @staticmethod
    def layout(capacity, fanout=16):
        """Where each array of the tree lies in its buffer, as a list of dicts with
        keys kind ("leaves", "sum" or "min"), level (0 = leaves), offset (bytes),
        nodes (padded count) and itemsize."""
        cdef kst_layout lay
        _layout(capacity, fanout, &lay)
        parts = [dict(kind="leaves", level=0, offset=lay.sum_off[0], nodes=lay.size[0], itemsize=4)]
        for l in range(1, lay.n_levels + 1):
            parts.append(dict(kind="sum", level=l, offset=lay.sum_off[l], nodes=lay.size[l], itemsize=8))
        for l in range(1, lay.n_levels + 1):
            parts.append(dict(kind="min", level=l, offset=lay.min_off[l], nodes=lay.size[l], itemsize=4))
        return parts

    @property
    def capacity(self):
        """Number of leaves (valid indices are 0 .. capacity-1)."""
        return self.lay.capacity

    @property
    def fanout(self):
        """Children per inner node (K)."""
        return self.lay.fanout

    @property
    def depth(self):
        """Number of inner levels above the leaves."""
        return self.lay.n_levels

    @property
    def buffer(self):
        """The uint8 array the tree lives in."""
        return self._buf

    @property
    def num_threads(self):
        """OpenMP threads used by batched lookups (results do not depend on it)."""
        return self._threads

    @num_threads.setter
    def num_threads(self, value):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"num_threads must be an integer >= 1, got {value!r}")
        self._threads = value

    def __len__(self):
        return self.lay.capacity

    def __repr__(self):
        return (f"KSumTree(capacity={self.lay.capacity}, fanout={self.lay.fanout}, "
                f"total={self.total():.6g})")

    def total(self):
        """Sum of all priorities."""
        return kst_total(&self.t)

    def min(self):
        """Smallest positive priority, or 0.0 when every priority is zero."""
        return float(kst_min(&self.t))

    def update(self, indices, priorities):
        """Set `priorities` at `indices` (arrays or scalars; a scalar priority broadcasts).

        The last occurrence of a repeated index wins.  Raises IndexError for an index
        outside [0, capacity) and ValueError for a negative, NaN, infinite or
        float32-overflowing priority, in both cases before changing anything.
        """
        idx = _as_indices(np.atleast_1d(indices) if np.ndim(indices) == 0 else indices,
                          self.lay.capacity)
        pr = _as_float64(priorities, "priorities")
        if pr.ndim == 0:
            pr = np.full(idx.shape[0], pr, dtype=np.float64)
        elif pr.ndim != 1 or pr.shape[0] != idx.shape[0]:
            raise ValueError(f"priorities shape {pr.shape} does not match indices shape "
                             f"{(idx.shape[0],)}")
        cdef const int64_t[::1] iv = idx
        cdef const double[::1] pv = pr
        cdef cnp.ndarray p32 = np.empty(idx.shape[0], dtype=np.float32)
        cdef float[::1] fv = p32
        cdef Py_ssize_t n = iv.shape[0], i, bad = -1
        cdef double x
        with nogil:
            for i in range(n):
                x = pv[i]
                # NaN fails every comparison, so it lands here too.
                if not (x >= 0.0 and x <= FLT_MAX):
                    bad = i
                    break
                fv[i] = <float>x
            if bad < 0:
                kst_update_batch(&self.t, &iv[0] if n else NULL, &fv[0] if n else NULL, n)
        if bad >= 0:
            raise ValueError(f"priorities[{bad}] = {pv[bad]!r} is not a finite, non-negative "
                             f"float32 value")

    def get(self, indices):
        """Priorities at `indices` (float32 array, or a float for a scalar index)."""
        scalar = np.ndim(indices) == 0
        idx = _as_indices(np.atleast_1d(indices) if scalar else indices, self.lay.capacity)
        cdef const int64_t[::1] iv = idx
        out = np.empty(idx.shape[0], dtype=np.float32)
        cdef float[::1] ov = out
        cdef Py_ssize_t n = iv.shape[0], i
        cdef int nt = self._threads_for(n)
        cdef float *leaves = self.t.leaves
        with nogil:
            if nt > 1:
                for i in prange(n, num_threads=nt, schedule="static"):
                    ov[i] = leaves[iv[i]]
            else:
                for i in range(n):
                    ov[i] = leaves[iv[i]]
        return float(out[0]) if scalar else out

    cdef int _threads_for(self, Py_ssize_t n):
        cdef int nt = self._threads
        while nt > 1 and n < nt * PARALLEL_MIN_PER_THREAD:
            nt -= 1
        return nt

    cdef int _find_into(self, const double[::1] masses, int64_t[::1] out) except -1:
        cdef Py_ssize_t n = masses.shape[0], i, nblocks, s, e
        cdef int nt = self._threads_for(n)
        cdef int64_t missing = 0
        if n == 0:
            return 0
        with nogil:
            if nt > 1:
                nblocks = (n + KST_BLOCK - 1) // KST_BLOCK
                for i in prange(nblocks, num_threads=nt, schedule="static"):
                    s = i * KST_BLOCK
                    e = s + KST_BLOCK if s + KST_BLOCK < n else n
                    kst_find_many(&self.t, &masses[s], &out[s], e - s)
            else:
                kst_find_many(&self.t, &masses[0], &out[0], n)
            for i in range(n):
                if out[i] < 0:
                    missing = 1
                    break
        if missing:
            raise ValueError("cannot sample: every priority in the tree is zero")
        return 0

    def find(self, prefix_masses):
        """Leaf index whose prefix-sum interval holds each mass in [0, total()].

        A mass at or beyond total() maps to the last leaf with positive priority.
        Zero-priority leaves are never returned; an all-zero tree raises ValueError.
        """
        scalar = np.ndim(prefix_masses) == 0
        m = _as_float64(np.atleast_1d(prefix_masses) if scalar else prefix_masses,
                        "prefix_masses")
        if m.ndim != 1:
            raise ValueError(f"prefix_masses must be 1-D or a scalar, got shape {m.shape}")
        cdef const double[::1] mv = m
        cdef Py_ssize_t n = mv.shape[0], i, bad = -1
        with nogil:
            for i in range(n):
                if not (mv[i] >= 0.0 and mv[i] < 1.0e308):
                    bad = i
                    break
        if bad >= 0:
            raise ValueError(f"prefix_masses[{bad}] = {mv[bad]!r} is not a finite, "
                             f"non-negative mass")
        if n and not kst_total(&self.t) > 0.0:
            raise ValueError("cannot sample: every priority in the tree is zero")
        out = np.empty(n, dtype=np.int64)
        self._find_into(mv, out)
        return int(out[0]) if scalar else out

    def sample(self, batch_size, rng=None):
        """Stratified proportional sample: one index from each of `batch_size` equal
        slices of the total mass (as in the PER paper).

        `rng` is a numpy Generator, a seed, or None for fresh entropy.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral):
            raise TypeError(f"batch_size must be an integer, got {type(batch_size).__name__}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not isinstance(rng, np.random.Generator):
            rng = np.random.default_rng(rng)
        cdef double total = kst_total(&self.t)
        if not total > 0.0:
            raise ValueError("cannot sample: every priority in the tree is zero")
        masses = rng.random(batch_size)
        cdef double[::1] mv = masses
        cdef Py_ssize_t n = batch_size, i
        cdef double step = total / n
        with nogil:
            for i in range(n):
                mv[i] = (i + mv[i]) * step
        out = np.empty(n, dtype=np.int64)
        self._find_into(mv, out)
        return out
