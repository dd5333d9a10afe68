# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Native half of the frame-deduplicated replay (see frames_core.h): the lazy
write with invalidation and activation, and the copy-out that rebuilds each
sampled transition's obs and next_obs stacks straight into the batch arrays,
in parallel over the batch (OpenMP, when the build has it).

`FrameCore` binds memory that the Python side laid out; input validation is the
Python side's job (`pal_hpc.replay.frames`).
"""
import numpy as np
cimport numpy as cnp
from cython.parallel cimport prange
from libc.stdint cimport int64_t, int32_t, uint64_t, uint32_t, uint8_t, uintptr_t

cnp.import_array()

from ksum_core cimport (
    kst_layout, kst_tree, kst_compute_layout, kst_bind, kst_check_header)

cdef extern from "frames_core.h" nogil:
    ctypedef struct fs_buf:
        kst_tree *t
        uint64_t *lock
        double *max_prio
        uint64_t *seq
        const char *frames
        int64_t frame_bytes
        const int64_t *step
        const int64_t *first
        const int32_t *k
        int64_t stream_len
        int64_t capacity
        int stack
        int nmax
    int FS_MAX_WINDOW
    void fs_begin_write(fs_buf *b, int64_t base, const int64_t *steps, int64_t n)
    void fs_end_write(fs_buf *b, int64_t base, const int64_t *steps, int64_t n)
    int fs_gather_one(const fs_buf *b, int64_t i, int64_t out, int nf, char *const *src,
                      char *const *dst, const int64_t *row_bytes, char *obs_dst, char *next_dst,
                      uint64_t *ticket, float *prio)


def max_window():
    """Most slots one sampled transition may read (stack + n_step must stay below)."""
    return FS_MAX_WINDOW


cdef class FrameCore:
    """Native operations of one frame replay over its tree, counters and columns."""
    cdef kst_tree t
    cdef kst_layout lay
    cdef fs_buf b
    cdef object _keep

    def __init__(self, cnp.ndarray tree_bytes, capacity, fanout, cnp.ndarray seq,
                 cnp.ndarray control, int64_t lock_word, int64_t maxp_word,
                 cnp.ndarray frames, cnp.ndarray step, cnp.ndarray first, cnp.ndarray k,
                 int64_t stream_len, int stack, int nmax):
        if kst_compute_layout(capacity, fanout, &self.lay) != 0:
            raise ValueError("bad tree layout")
        if tree_bytes.nbytes < self.lay.nbytes or kst_check_header(tree_bytes.data, &self.lay) != 0:
            raise ValueError("tree memory does not hold an initialised tree of this shape")
        for name, arr, dt in (("seq", seq, np.uint64), ("step", step, np.int64),
                              ("first", first, np.int64), ("k", k, np.int32)):
            if arr.dtype != dt or arr.shape[0] < capacity or not arr.flags.c_contiguous:
                raise ValueError(f"{name} must be a contiguous {np.dtype(dt)} array of capacity entries")
        if frames.shape[0] < capacity or not frames.flags.c_contiguous:
            raise ValueError("frames must be a contiguous array of capacity frames")
        if control.dtype != np.uint64 or control.shape[0] <= max(lock_word, maxp_word):
            raise ValueError("control block too small")
        if stream_len < 1 or stack < 1 or nmax < 1 or stack + nmax >= FS_MAX_WINDOW:
            raise ValueError("bad stream length, stack or n_step")
        kst_bind(&self.t, tree_bytes.data, &self.lay)
        self.b.t = &self.t
        self.b.lock = <uint64_t *>control.data + lock_word
        self.b.max_prio = <double *>(<uint64_t *>control.data + maxp_word)
        self.b.seq = <uint64_t *>seq.data
        self.b.frames = <const char *>frames.data
        self.b.frame_bytes = frames.nbytes // frames.shape[0]
        self.b.step = <const int64_t *>step.data
        self.b.first = <const int64_t *>first.data
        self.b.k = <const int32_t *>k.data
        self.b.stream_len = stream_len
        self.b.capacity = capacity
        self.b.stack = stack
        self.b.nmax = nmax
        self._keep = (tree_bytes, seq, control, frames, step, first, k)

    def begin_write(self, int64_t base, const int64_t[::1] steps):
        """Invalidate the rows that read frames about to be overwritten; mark the slots odd."""
        with nogil:
            fs_begin_write(&self.b, base, &steps[0], steps.shape[0])

    def end_write(self, int64_t base, const int64_t[::1] steps):
        """Publish the written slots and activate the rows whose successor now exists."""
        with nogil:
            fs_end_write(&self.b, base, &steps[0], steps.shape[0])

    def gather(self, const int64_t[::1] slots, const uintptr_t[::1] src, list outs,
               const int64_t[::1] row_bytes, cnp.ndarray obs_out, cnp.ndarray next_out,
               uint64_t[::1] tickets, float[::1] prio, uint8_t[::1] ok, int threads=1):
        """Seqlock-validated copy-out of sampled rows: small fields into `outs` (one
        C-contiguous array per field, spec order), stacks into `obs_out` and
        `next_out` (B, stack, *frame).  Returns how many rows are good; ok[k] = 0
        marks a row to redraw."""
        cdef int64_t n = slots.shape[0], k, good = 0
        cdef int nf = len(outs), f
        cdef char *dst[64]
        cdef char *od = <char *>cnp.PyArray_DATA(obs_out)
        cdef char *nd = <char *>cnp.PyArray_DATA(next_out)
        cdef int64_t need = n * self.b.stack * self.b.frame_bytes
        if nf > 64 or nf != src.shape[0] or nf != row_bytes.shape[0]:
            raise ValueError("gather: one output array per field, at most 64 fields")
        if (obs_out.nbytes < need or next_out.nbytes < need or not obs_out.flags.c_contiguous
                or not next_out.flags.c_contiguous):
            raise ValueError("gather: stack outputs too small or not contiguous")
        if tickets.shape[0] < n or prio.shape[0] < n or ok.shape[0] < n:
            raise ValueError("gather: tickets, prio and ok need one entry per slot")
        for f in range(nf):
            if (<cnp.ndarray>outs[f]).nbytes < n * row_bytes[f]:
                raise ValueError("gather: a field output is too small")
            dst[f] = <char *>cnp.PyArray_DATA(<cnp.ndarray>outs[f])
        if threads < 1:
            threads = 1
        for k in prange(n, nogil=True, num_threads=threads, schedule="static"):
            tickets[k] = 0
            prio[k] = 0.0
            ok[k] = <uint8_t>fs_gather_one(&self.b, slots[k], k, nf, <char *const *>&src[0],
                                           <char *const *>dst, &row_bytes[0], od, nd,
                                           &tickets[k], &prio[k])
            good += ok[k]
        return good
