/*
 * frames_core.h -- frame-deduplicated replay: each slot stores one new frame,
 * and a sampled transition's stacks are rebuilt from the slots around it.
 *
 * Slots are grouped in *streams* of equal length S (one per environment of
 * each writer): stream q is slots [q*S, (q+1)*S), and the u-th row the stream
 * ever received (its step u) lives in slot q*S + u % S.  Per slot, besides the
 * frame and the small fields, three words say what the slot holds:
 *   step[i]  = u, the row's number in its stream (identity: a reader compares
 *              it with the step it expects, so an overwritten slot is noticed);
 *   first[i] = the step of its episode's first row (stacks never reach below it:
 *              the first observation of an episode is its reset frame repeated,
 *              as gymnasium's FrameStackObservation pads);
 *   k[i]     = steps to the n-step successor, whose stack is next_obs; 0 for a
 *              row that only carries an episode's final observation.
 *
 * The stack of row u is the frames of steps max(first, u-stack+1 .. u), and its
 * next_obs the stack of row u + k.  A sample therefore reads the window of
 * slots [max(first, u-stack+1), u+k].  The invariants (DESIGN.md, 7):
 *   - a row gets a priority > 0 only when its successor is written (end write,
 *     "activation"); until then the tree never returns it;
 *   - before a slot is overwritten, every live row whose window contains it
 *     (the next stack-1 rows of the same episode) is invalidated under the tree
 *     lock: priority 0 and its sequence counter advanced by 2, so a sample in
 *     flight fails its check and a priority update with an old ticket is dropped;
 *   - a reader checks every slot of the window with its seqlock (even, equal
 *     before and after the copy) and its identity (step, episode).
 * The stream length S > stack - 1 + n keeps a row's window alive from its
 * activation until one of its own frames is overwritten.
 */
#ifndef PAL_FRAMES_CORE_H
#define PAL_FRAMES_CORE_H

#include <stdint.h>
#include <string.h>

#include "ksum_core.h"
#include "sync_core.h"

#define FS_MAX_WINDOW 256

typedef struct {
    kst_tree *t;
    uint64_t *lock;
    double *max_prio;
    uint64_t *seq;
    const char *frames;        /* frame column: capacity rows of frame_bytes */
    int64_t frame_bytes;
    const int64_t *step;
    const int64_t *first;
    const int32_t *k;
    int64_t stream_len;        /* S */
    int64_t capacity;
    int stack;
    int nmax;                  /* largest k a row may have */
} fs_buf;

static inline int64_t fs_slot(const fs_buf *b, int64_t base, int64_t u)
{
    return base + u % b->stream_len;
}

/* Writer, step 1, for rows `steps[0..n)` of the stream starting at slot
 * `base`: invalidate the live rows whose windows hold a frame about to be
 * overwritten, then take the written slots out of the tree (odd seq). */
static inline void fs_begin_write(fs_buf *b, int64_t base, const int64_t *steps, int64_t n)
{
    kst_pending q;
    q.active = 0;
    sy_lock(b->lock);
    for (int64_t r = 0; r < n; r++) {
        int64_t s = fs_slot(b, base, steps[r]);
        if (__atomic_load_n(&b->seq[s], __ATOMIC_RELAXED) == 0) continue;  /* never written */
        int64_t x = b->step[s];                  /* the row being overwritten */
        for (int64_t j = x + 1; j < x + b->stack; j++) {
            int64_t sj = fs_slot(b, base, j);
            uint64_t sq = __atomic_load_n(&b->seq[sj], __ATOMIC_RELAXED);
            if (sq == 0 || (sq & 1u) || b->step[sj] != j || b->k[sj] <= 0) continue;
            int64_t lo = j - b->stack + 1;
            if (b->first[sj] > lo) lo = b->first[sj];
            if (lo > x) continue;                /* its window starts after x */
            kst_set_deferred(b->t, &q, (uint64_t)sj, 0.0f);
            __atomic_store_n(&b->seq[sj], sq + 2, __ATOMIC_RELEASE);
        }
    }
    for (int64_t r = 0; r < n; r++) {
        int64_t s = fs_slot(b, base, steps[r]);
        uint64_t sq = __atomic_load_n(&b->seq[s], __ATOMIC_RELAXED);
        __atomic_store_n(&b->seq[s], sq | 1u, __ATOMIC_RELAXED);
        kst_set_deferred(b->t, &q, (uint64_t)s, 0.0f);
    }
    kst_pending_flush(b->t, &q);
    sy_unlock(b->lock);
    __atomic_thread_fence(__ATOMIC_RELEASE);
}

/* Writer, step 2: publish the written slots (even seq, priority still 0), then
 * activate every row whose successor is now written: the rows j < u of u's
 * episode with j + k[j] == u get the largest priority seen so far. */
static inline void fs_end_write(fs_buf *b, int64_t base, const int64_t *steps, int64_t n)
{
    kst_pending q;
    q.active = 0;
    sy_lock(b->lock);
    for (int64_t r = 0; r < n; r++) {
        int64_t s = fs_slot(b, base, steps[r]);
        uint64_t sq = __atomic_load_n(&b->seq[s], __ATOMIC_RELAXED);
        __atomic_store_n(&b->seq[s], sq + 1, __ATOMIC_RELEASE);
    }
    float prio = (float)*b->max_prio;
    for (int64_t r = 0; r < n; r++) {
        int64_t u = steps[r];
        int64_t ep = b->first[fs_slot(b, base, u)];
        for (int64_t j = u - 1; j >= u - b->nmax && j >= ep && j >= 0; j--) {
            int64_t sj = fs_slot(b, base, j);
            uint64_t sq = __atomic_load_n(&b->seq[sj], __ATOMIC_RELAXED);
            if (sq == 0 || (sq & 1u) || b->step[sj] != j || b->first[sj] != ep) continue;
            if ((int64_t)b->k[sj] != u - j) continue;
            kst_set_deferred(b->t, &q, (uint64_t)sj, prio);
        }
    }
    kst_pending_flush(b->t, &q);
    sy_unlock(b->lock);
}

/* Copy out sampled row i: its small fields (nf of them, row r of field f at
 * src[f] + r*row_bytes[f], to dst[f] + out*row_bytes[f]), its stack into
 * obs_dst and its successor's stack into next_dst (stack frames each, at
 * position `out`).  Returns 1 with *ticket and *prio set when every slot of the
 * window was stable, written and the one expected; 0 otherwise (redraw). */
static inline int fs_gather_one(const fs_buf *b, int64_t i, int64_t out, int nf,
                                char *const *src, char *const *dst, const int64_t *row_bytes,
                                char *obs_dst, char *next_dst, uint64_t *ticket, float *prio)
{
    uint64_t s1[FS_MAX_WINDOW];
    if (i < 0 || i >= b->capacity) return 0;
    uint64_t si = __atomic_load_n(&b->seq[i], __ATOMIC_ACQUIRE);
    if (si == 0 || (si & 1u)) return 0;
    float p;
    __atomic_load(&b->t->leaves[i], &p, __ATOMIC_RELAXED);
    if (!(p > 0.0f)) return 0;
    int64_t u = b->step[i], ep = b->first[i], k = b->k[i];
    int64_t base = i / b->stream_len * b->stream_len;
    if (k < 1 || k > b->nmax || u < 0 || ep < 0 || ep > u || fs_slot(b, base, u) != i) return 0;
    int64_t lo = u - b->stack + 1;
    if (lo < ep) lo = ep;
    int64_t hi = u + k;
    if (hi - lo + 1 > FS_MAX_WINDOW) return 0;
    /* First pass: every slot of the window stable and holding the row expected. */
    for (int64_t j = lo; j <= hi; j++) {
        int64_t sj = fs_slot(b, base, j);
        uint64_t sq = __atomic_load_n(&b->seq[sj], __ATOMIC_ACQUIRE);
        if (sq == 0 || (sq & 1u)) return 0;
        if (b->step[sj] != j || b->first[sj] != ep) return 0;
        s1[j - lo] = sq;
    }
    for (int f = 0; f < nf; f++)
        sy_copy_row(dst[f] + out * row_bytes[f], src[f] + i * row_bytes[f], row_bytes[f]);
    const int64_t fb = b->frame_bytes;
    char *o = obs_dst + out * b->stack * fb;
    char *nx = next_dst + out * b->stack * fb;
    for (int p_ = 0; p_ < b->stack; p_++) {
        int64_t a = u - b->stack + 1 + p_, c = hi - b->stack + 1 + p_;
        if (a < ep) a = ep;
        if (c < ep) c = ep;
        memcpy(o + p_ * fb, b->frames + fs_slot(b, base, a) * fb, (size_t)fb);
        memcpy(nx + p_ * fb, b->frames + fs_slot(b, base, c) * fb, (size_t)fb);
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    for (int64_t j = lo; j <= hi; j++)
        if (__atomic_load_n(&b->seq[fs_slot(b, base, j)], __ATOMIC_RELAXED) != s1[j - lo]) return 0;
    *ticket = si;
    *prio = p;
    return 1;
}

#endif /* PAL_FRAMES_CORE_H */
