# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Native half of SharedReplay: lock-protected tree updates, seqlocked slots and
the validated copy-out of sampled rows (see sync_core.h for the protocol).

`ReplayCore` binds memory that the Python side laid out (in an MPI shared window
or in private memory); it allocates nothing and checks nothing beyond what it
must to stay memory-safe: input validation is SharedReplay's job.
"""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport int64_t, uint64_t, uint32_t, uint8_t, uintptr_t
from libc.math cimport pow, isfinite

cnp.import_array()

from ksum_core cimport (
    kst_layout, kst_tree, kst_compute_layout, kst_bind, kst_check_header, kst_total,
    kst_find_many)

cdef extern from "sync_core.h" nogil:
    void sy_lock(uint64_t *lock)
    void sy_unlock(uint64_t *lock)
    int sy_try_acquire(uint64_t *flag)
    uint64_t sy_load(const uint64_t *p)
    void sy_add(uint64_t *p, uint64_t n)
    void sy_begin_write(kst_tree *t, uint64_t *lock, uint64_t *seq, const int64_t *slots, int64_t n)
    void sy_end_write(kst_tree *t, uint64_t *lock, uint64_t *seq, const int64_t *slots, int64_t n,
                      const double *max_prio)
    int64_t sy_update_if_current(kst_tree *t, uint64_t *lock, const uint64_t *seq,
                                 const int64_t *slots, const float *prio, const uint64_t *tickets,
                                 int64_t n, double *max_prio)
    int64_t sy_gather(const kst_tree *t, const uint64_t *seq, const int64_t *slots, int64_t n,
                      int nfields, char *const *src, char *const *dst, const int64_t *row_bytes,
                      uint64_t *tickets, float *prio, uint8_t *ok)

# Word offsets in the control block (uint64 words).  Hot words sit on their own
# 64-byte line: the tree lock, the max priority, and one line per region.
cdef enum:
    LOCK_WORD = 8
    MAXP_WORD = 16
    SAMPLES_WORD = 24
    REGION_BASE = 64
    WORDS_PER_REGION = 8


def control_words(regions):
    """Number of uint64 words the control block needs for `regions` regions."""
    # Python ints: a C int would wrap for a (silly but accepted) 2**28 regions.
    return REGION_BASE + WORDS_PER_REGION * int(regions)


def lock_word():
    """Index, in the control block, of the tree lock (frame replay takes the same lock)."""
    return LOCK_WORD


def max_priority_word():
    """Index, in the control block, of the max priority (a double) new data gets."""
    return MAXP_WORD


def writes_word(r):
    """Index, in the control block, of region r's insert counter (writes ever published)."""
    return REGION_BASE + WORDS_PER_REGION * int(r)


cdef class ReplayCore:
    """Native operations over one replay buffer's tree, sequence counters and control words."""
    cdef kst_tree t
    cdef kst_layout lay
    cdef uint64_t *control
    cdef uint64_t *seq
    cdef int64_t capacity
    cdef int64_t regions
    cdef object _keep

    def __init__(self, cnp.ndarray tree_bytes, capacity, fanout,
                 cnp.ndarray seq, cnp.ndarray control, int64_t regions):
        if kst_compute_layout(capacity, fanout, &self.lay) != 0:
            raise ValueError("bad tree layout")
        if tree_bytes.nbytes < self.lay.nbytes or kst_check_header(tree_bytes.data, &self.lay) != 0:
            raise ValueError("tree memory does not hold an initialised tree of this shape")
        if seq.dtype != np.uint64 or seq.shape[0] < capacity or not seq.flags.c_contiguous:
            raise ValueError("seq must be a contiguous uint64 array of capacity entries")
        if control.dtype != np.uint64 or control.shape[0] < control_words(regions):
            raise ValueError("control block too small")
        kst_bind(&self.t, tree_bytes.data, &self.lay)
        self.seq = <uint64_t *>seq.data
        self.control = <uint64_t *>control.data
        self.capacity = capacity
        self.regions = regions
        self._keep = (tree_bytes, seq, control)

    cdef uint64_t *_region(self, int64_t r):
        return self.control + REGION_BASE + WORDS_PER_REGION * r

    def init_control(self, double max_priority):
        """Zero the control block and set the initial max priority (creator only)."""
        cdef Py_ssize_t i
        for i in range(control_words(self.regions)):
            self.control[i] = 0
        (<double *>(self.control + MAXP_WORD))[0] = max_priority

    def reset_locks(self):
        """Release the tree lock and every region claim (after restoring a saved buffer)."""
        cdef int64_t r
        self.control[LOCK_WORD] = 0
        for r in range(self.regions):
            self._region(r)[1] = 0

    # -- writers -----------------------------------------------------------
    def try_acquire_region(self, int64_t r):
        """Claim region r for this writer; False if another writer holds it."""
        return bool(sy_try_acquire(self._region(r) + 1))

    def release_region(self, int64_t r):
        sy_unlock(self._region(r) + 1)

    def writes(self, int64_t r):
        """Transitions ever written to region r (published ones)."""
        return sy_load(self._region(r))

    def sampled(self):
        """Transitions ever handed out by sample() on this buffer (all ranks)."""
        return sy_load(self.control + SAMPLES_WORD)

    def count_sampled(self, int64_t n):
        sy_add(self.control + SAMPLES_WORD, <uint64_t>n)

    def publish_writes(self, int64_t r, int64_t n):
        sy_add(self._region(r), <uint64_t>n)

    def begin_write(self, const int64_t[::1] slots):
        with nogil:
            sy_begin_write(&self.t, self.control + LOCK_WORD, self.seq, &slots[0], slots.shape[0])

    def end_write(self, const int64_t[::1] slots):
        with nogil:
            sy_end_write(&self.t, self.control + LOCK_WORD, self.seq, &slots[0], slots.shape[0],
                         <double *>(self.control + MAXP_WORD))

    # -- learners ----------------------------------------------------------
    def max_priority(self):
        """Largest stored priority seen so far (what new data gets)."""
        cdef double m
        sy_lock(self.control + LOCK_WORD)
        m = (<double *>(self.control + MAXP_WORD))[0]
        sy_unlock(self.control + LOCK_WORD)
        return m

    def update_if_current(self, const int64_t[::1] slots, const float[::1] prio,
                          const uint64_t[::1] tickets):
        """Set priorities of slots still holding the sampled write; returns how many."""
        cdef int64_t n = slots.shape[0], applied = 0
        if n == 0:
            return 0
        with nogil:
            applied = sy_update_if_current(&self.t, self.control + LOCK_WORD, self.seq,
                                           &slots[0], &prio[0], &tickets[0], n,
                                           <double *>(self.control + MAXP_WORD))
        return applied

    def total(self):
        return kst_total(&self.t)

    def prepare_priorities(self, const int64_t[::1] slots, const double[::1] raw, double alpha,
                           double eps, float[::1] stored):
        """Check slots and raw priorities and store (raw + eps) ** alpha as float32.

        Returns (-1, 0) when all is well, (0, k) for slot k out of range, and
        (1, k) for a raw priority that is negative, NaN, infinite, or overflows
        float32 once transformed.  Nothing in the buffer is touched."""
        cdef int64_t n = slots.shape[0], k, bad = -1, kind = -1
        cdef double v
        with nogil:
            for k in range(n):
                if slots[k] < 0 or slots[k] >= self.capacity:
                    kind = 0
                    bad = k
                    break
                v = raw[k]
                if not (v >= 0.0 and isfinite(v)):
                    kind = 1
                    bad = k
                    break
                v = pow(v + eps, alpha)
                if not (v <= 3.4028234663852886e38):
                    kind = 1
                    bad = k
                    break
                stored[k] = <float>v
        return kind, bad

    def find(self, const double[::1] masses, int64_t[::1] out):
        """Descend for each mass (no lock); -1 where a racing writer emptied the path."""
        with nogil:
            kst_find_many(&self.t, &masses[0], &out[0], masses.shape[0])

    def gather(self, const int64_t[::1] slots, const uintptr_t[::1] src, list outs,
               const int64_t[::1] row_bytes, uint64_t[::1] tickets, float[::1] prio, uint8_t[::1] ok):
        """Seqlock-validated copy of sampled rows into the C-contiguous arrays `outs`
        (one per field, in spec order); returns how many rows are good."""
        cdef int64_t good
        cdef int nf = len(outs), f
        cdef char *dst[64]
        if nf > 64 or nf != src.shape[0]:
            raise ValueError("gather: one output array per field, at most 64 fields")
        for f in range(nf):
            dst[f] = <char *>cnp.PyArray_DATA(<cnp.ndarray>outs[f])
        with nogil:
            good = sy_gather(&self.t, self.seq, &slots[0], slots.shape[0], nf,
                             <char *const *>&src[0], dst, &row_bytes[0],
                             &tickets[0], &prio[0], &ok[0])
        return good
