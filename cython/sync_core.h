/*
 * sync_core.h -- the concurrency primitives of the node-shared replay buffer.
 *
 * Everything here works on memory shared by several processes (an MPI
 * shared-memory window), so it uses GCC's __atomic builtins on plain words,
 * never process-local locks.
 *
 *  - a spin lock with backoff (pause, then sched_yield, then a short sleep:
 *    ranks often outnumber cores, and a spinning rank must not starve the
 *    rank that holds the lock);
 *  - per-slot sequence counters (a seqlock per transition): odd while the
 *    slot is being written, even when stable; 0 = never written.  The even
 *    value at sampling time is the slot's ticket;
 *  - the writer and learner operations on the tree, done under the tree lock,
 *    and the seqlock-validated copy of sampled rows, done without any lock.
 *
 * Protocol (PAL's lazy write, made safe for readers):
 *   writer:  lock { seq odd; leaf = 0 } -> copy data, no lock -> lock { seq
 *            even (release); leaf = max priority }
 *   sampler: descend the tree (no lock) -> s1 = seq (acquire); copy row;
 *            fence; s2 = seq; keep the row only if s1 == s2, s1 even, s1 > 0
 *   learner: lock { for each sampled slot: if seq == ticket: set leaf }
 * The tree lock covers only tree updates (a few node writes per slot), never
 * the data copies, so writers on different regions never wait for each
 * other's data.  Checking the ticket and setting the leaf under the same lock
 * that the writer holds while it flips seq is what makes a stale priority
 * update impossible rather than unlikely.
 */
#ifndef PAL_SYNC_CORE_H
#define PAL_SYNC_CORE_H

#include <stdint.h>
#include <string.h>
#include <sched.h>
#include <time.h>

#include "ksum_core.h"

static inline void sy_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline void sy_lock(uint64_t *lock)
{
    unsigned spins = 0;
    for (;;) {
        uint64_t expected = 0;
        if (__atomic_load_n(lock, __ATOMIC_RELAXED) == 0 &&
            __atomic_compare_exchange_n(lock, &expected, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            return;
        spins++;
        if (spins < 128) {
            sy_cpu_relax();
        } else if (spins < 256) {
            sched_yield();
        } else {
            struct timespec ts = {0, 20000};  /* 20 us: the holder was descheduled */
            nanosleep(&ts, NULL);
        }
    }
}

static inline void sy_unlock(uint64_t *lock)
{
    __atomic_store_n(lock, 0, __ATOMIC_RELEASE);
}

static inline uint64_t sy_load(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void sy_add(uint64_t *p, uint64_t n) { __atomic_fetch_add(p, n, __ATOMIC_RELEASE); }

/* 1 if the flag was free and is now ours, 0 if someone holds it. */
static inline int sy_try_acquire(uint64_t *flag)
{
    uint64_t expected = 0;
    return __atomic_compare_exchange_n(flag, &expected, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

/* Writer, step 1: mark the slots as being written and take them out of the
 * tree, so no sampler picks them (and any that already did sees the odd seq). */
static inline void sy_begin_write(kst_tree *t, uint64_t *lock, uint64_t *seq,
                                  const int64_t *slots, int64_t n)
{
    kst_pending q;
    q.active = 0;
    sy_lock(lock);
    for (int64_t k = 0; k < n; k++) {
        uint64_t s = __atomic_load_n(&seq[slots[k]], __ATOMIC_RELAXED);
        __atomic_store_n(&seq[slots[k]], s | 1u, __ATOMIC_RELAXED);
        kst_set_deferred(t, &q, (uint64_t)slots[k], 0.0f);
    }
    kst_pending_flush(t, &q);
    sy_unlock(lock);
    /* The odd counters must be visible before any of the data stores that follow. */
    __atomic_thread_fence(__ATOMIC_RELEASE);
}

/* Writer, step 2: publish the slots (even seq) with the largest priority seen
 * so far (read under the lock, so a concurrent learner's raise is not lost). */
static inline void sy_end_write(kst_tree *t, uint64_t *lock, uint64_t *seq,
                                const int64_t *slots, int64_t n, const double *max_prio)
{
    kst_pending q;
    q.active = 0;
    sy_lock(lock);
    float prio = (float)*max_prio;
    for (int64_t k = 0; k < n; k++) {
        uint64_t s = __atomic_load_n(&seq[slots[k]], __ATOMIC_RELAXED);
        __atomic_store_n(&seq[slots[k]], s + 1, __ATOMIC_RELEASE);
        kst_set_deferred(t, &q, (uint64_t)slots[k], prio);
    }
    kst_pending_flush(t, &q);
    sy_unlock(lock);
}

/* Learner: set each slot's priority only if it still holds the write that was
 * sampled (seq == ticket).  `*max_prio` is raised to the largest applied value.
 * Returns how many were applied.  In input order: the last repeat wins. */
static inline int64_t sy_update_if_current(kst_tree *t, uint64_t *lock, const uint64_t *seq,
                                           const int64_t *slots, const float *prio,
                                           const uint64_t *tickets, int64_t n, double *max_prio)
{
    int64_t applied = 0;
    kst_pending q;
    q.active = 0;
    sy_lock(lock);
    double m = *max_prio;
    for (int64_t k = 0; k < n; k++) {
        /* A ticket is the even, non-zero counter of a published write: 0 (never
         * written) or odd (mid-write) can match a slot's counter but is no ticket. */
        if (tickets[k] == 0 || (tickets[k] & 1u)) continue;
        if (__atomic_load_n(&seq[slots[k]], __ATOMIC_RELAXED) != tickets[k]) continue;
        kst_set_deferred(t, &q, (uint64_t)slots[k], prio[k]);
        if ((double)prio[k] > m) m = (double)prio[k];
        applied++;
    }
    kst_pending_flush(t, &q);
    *max_prio = m;
    sy_unlock(lock);
    return applied;
}

/* memcpy with the small fixed sizes of typical fields (scalars, CartPole
 * vectors) unrolled: a libc call per field and row cost more than the copy. */
static inline void sy_copy_row(char *d, const char *s, int64_t bytes)
{
    switch (bytes) {
    case 1: *d = *s; return;
    case 2: memcpy(d, s, 2); return;
    case 4: memcpy(d, s, 4); return;
    case 8: memcpy(d, s, 8); return;
    case 16: memcpy(d, s, 16); return;
    case 32: memcpy(d, s, 32); return;
    default: memcpy(d, s, (size_t)bytes); return;
    }
}

static inline void sy_prefetch_row(const kst_tree *t, const uint64_t *seq, int64_t i, int nfields,
                                   char *const *src, const int64_t *row_bytes)
{
    if (i < 0 || (uint64_t)i >= t->capacity) return;
    __builtin_prefetch(&seq[i], 0, 3);
    __builtin_prefetch(&t->leaves[i], 0, 3);
    for (int f = 0; f < nfields; f++) {
        const char *row = src[f] + i * row_bytes[f];
        int64_t bytes = row_bytes[f] < 256 ? row_bytes[f] : 256;
        for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(row + o, 0, 3);
    }
}

/* Copy the rows of sampled slots out of the shared columns, each validated by
 * its seqlock.  For field f, row i lives at src[f] + i*row_bytes[f] and goes to
 * dst[f] + k*row_bytes[f].  Writes tickets[k], prio[k] and ok[k] (1 = a stable,
 * untorn copy of a written slot with positive priority). */
static inline int64_t sy_gather(const kst_tree *t, const uint64_t *seq, const int64_t *slots,
                                int64_t n, int nfields, char *const *src, char *const *dst,
                                const int64_t *row_bytes, uint64_t *tickets, float *prio,
                                uint8_t *ok)
{
    int64_t good = 0;
    /* Sampled rows are scattered over the whole buffer: request the rows a few
     * samples ahead so their cache misses overlap (2x faster copy-out here). */
    const int64_t ahead = 6;
    for (int64_t k = 0; k < n && k < ahead; k++)
        sy_prefetch_row(t, seq, slots[k], nfields, src, row_bytes);
    for (int64_t k = 0; k < n; k++) {
        if (k + ahead < n) sy_prefetch_row(t, seq, slots[k + ahead], nfields, src, row_bytes);
        int64_t i = slots[k];
        ok[k] = 0;
        tickets[k] = 0;
        prio[k] = 0.0f;
        if (i < 0 || (uint64_t)i >= t->capacity) continue;
        uint64_t s1 = __atomic_load_n(&seq[i], __ATOMIC_ACQUIRE);
        if (s1 == 0 || (s1 & 1u)) continue;
        float p;
        __atomic_load(&t->leaves[i], &p, __ATOMIC_RELAXED);
        for (int f = 0; f < nfields; f++)
            sy_copy_row(dst[f] + k * row_bytes[f], src[f] + i * row_bytes[f], row_bytes[f]);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        uint64_t s2 = __atomic_load_n(&seq[i], __ATOMIC_RELAXED);
        if (s1 != s2 || !(p > 0.0f)) continue;
        tickets[k] = s1;
        prio[k] = p;
        ok[k] = 1;
        good++;
    }
    return good;
}

/* A whole buffer under one seqlock (the learners' weights for the actors).
 * Single writer: bump to odd, copy, bump to even.  Readers copy and keep the
 * copy only if the counter was even and unchanged around it. */
static inline uint64_t sy_publish(uint64_t *seq, char *dst, const char *src, size_t n)
{
    uint64_t s = __atomic_load_n(seq, __ATOMIC_RELAXED);
    __atomic_store_n(seq, s + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    memcpy(dst, src, n);
    __atomic_store_n(seq, s + 2, __ATOMIC_RELEASE);
    return s + 2;
}

/* The version copied (even, > 0), or 0 if nothing was published yet or a
 * writer was busy: the caller retries. */
static inline uint64_t sy_read_snapshot(const uint64_t *seq, char *dst, const char *src, size_t n)
{
    uint64_t s1 = __atomic_load_n(seq, __ATOMIC_ACQUIRE);
    if (s1 == 0 || (s1 & 1u)) return 0;
    memcpy(dst, src, n);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    uint64_t s2 = __atomic_load_n(seq, __ATOMIC_RELAXED);
    return s1 == s2 ? s1 : 0;
}

#endif /* PAL_SYNC_CORE_H */
