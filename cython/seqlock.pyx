# cython: boundscheck=False, wraparound=False
"""Seqlocked copies for the weight store (pal_hpc.cluster.weights): one writer publishes
a byte vector under a version counter; readers copy it and retry if a write overlapped.

The protocol itself is in sync_core.h, shared with the replay's per-slot seqlocks."""

from libc.stdint cimport uint64_t

cdef extern from "sync_core.h" nogil:
    uint64_t sy_load(const uint64_t *p)
    uint64_t sy_publish(uint64_t *seq, char *dst, const char *src, size_t n)
    uint64_t sy_read_snapshot(const uint64_t *seq, char *dst, const char *src, size_t n)


def seqlock_publish(uint64_t[::1] seq, unsigned char[::1] dst, const unsigned char[::1] src):
    """Copy `src` into `dst` under the seqlock `seq[0]` (one writer); returns the new version."""
    if src.shape[0] > dst.shape[0]:
        raise ValueError("seqlock_publish: source larger than destination")
    cdef uint64_t v
    with nogil:
        v = sy_publish(&seq[0], <char *>&dst[0], <const char *>&src[0], src.shape[0])
    return v


def seqlock_read(const uint64_t[::1] seq, unsigned char[::1] dst, const unsigned char[::1] src):
    """Copy `src` into `dst` if no write overlapped; returns the version, or 0 (retry)."""
    if src.shape[0] > dst.shape[0]:
        raise ValueError("seqlock_read: source larger than destination")
    cdef uint64_t v
    with nogil:
        v = sy_read_snapshot(&seq[0], <char *>&dst[0], <const char *>&src[0], src.shape[0])
    return v


def seqlock_version(const uint64_t[::1] seq):
    """The seqlock's current counter (acquire load)."""
    return sy_load(&seq[0])
