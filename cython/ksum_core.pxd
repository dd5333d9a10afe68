# Declarations of ksum_core.h (the K-ary sum/min tree over caller-owned memory),
# shared by every extension that works on a tree: one copy to keep in step with the header.
from libc.stdint cimport int64_t, uint64_t, uint32_t

cdef extern from "ksum_core.h" nogil:
    enum: KST_MAX_LEVELS
    enum: KST_ALIGN
    ctypedef struct kst_header:
        pass
    ctypedef struct kst_layout:
        uint64_t capacity
        uint32_t fanout
        uint32_t n_levels
        uint64_t *size
        uint64_t *sum_off
        uint64_t *min_off
        uint64_t nbytes
    ctypedef struct kst_tree:
        float *leaves
        uint64_t capacity
        uint32_t fanout
        uint32_t n_levels
    int kst_compute_layout(uint64_t capacity, uint32_t fanout, kst_layout *lay)
    void kst_bind(kst_tree *t, void *base, const kst_layout *lay)
    void kst_init(kst_tree *t, const kst_layout *lay)
    int kst_check_header(const void *base, const kst_layout *lay)
    void kst_update_batch(kst_tree *t, const int64_t *idx, const float *p, int64_t n)
    double kst_total(const kst_tree *t)
    float kst_min(const kst_tree *t)
    int64_t kst_find(const kst_tree *t, double mass)
    void kst_find_many(const kst_tree *t, const double *masses, int64_t *out, int64_t n)
    enum: KST_BLOCK
