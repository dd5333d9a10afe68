/*
 * lockstep_core.h -- the turn handoff of the lockstep environment protocol.
 *
 * One master and W workers share a control block in shared memory (a memfd
 * mapping for LockstepVectorEnv's worker processes, a node's MPI window for
 * worker ranks).  Each round the master posts a command; every worker runs it
 * on its share of the environments, writing results straight into the shared
 * batch arrays, and reports done; the master waits until all have.  Nothing
 * else crosses between processes: no pipe, queue, pickle or message per step.
 *
 * Words (32-bit, each on its own cache line):
 *   cmd_seq   the command's sequence number; workers wait for it to change
 *   cmd_op    what to do (read after cmd_seq with acquire ordering)
 *   pending   workers that have not finished the current command
 *   sleepers  workers asleep on cmd_seq (the master wakes them only if > 0)
 *   m_sleep   1 while the master is asleep on pending
 *
 * Waiting backs off in three stages, because ranks often outnumber cores:
 * spin (pause) for spin_ns, then sched_yield for yield_ns, then sleep on a
 * futex -- a sleeper is woken by the one store it waits for, so sleeping costs
 * no latency beyond the wake-up itself.  Lost wake-ups are excluded the
 * Dekker way: the sleeper announces itself (seq_cst store), re-reads the word,
 * and FUTEX_WAIT re-checks it in the kernel; the waker stores the word
 * (seq_cst) and then reads the announcement.
 *
 * Every wait returns after budget_ns even if nothing happened, so the Python
 * caller can check that its peers are alive and deliver signals (Ctrl-C).
 */
#ifndef PAL_LOCKSTEP_CORE_H
#define PAL_LOCKSTEP_CORE_H

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum {
    LS_CMD_SEQ = 0,        /* word indices (uint32) into the control block */
    LS_CMD_OP = 1,
    LS_CMD_ARG = 2,
    LS_PENDING = 16,
    LS_SLEEPERS = 32,
    LS_M_SLEEP = 48,
    LS_CONTROL_WORDS = 64  /* 256 bytes */
};

static inline int64_t ls_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void ls_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Not FUTEX_*_PRIVATE: the word is shared between processes. */
static inline void ls_futex_wait(uint32_t *word, uint32_t expected, int64_t timeout_ns)
{
    struct timespec ts;
    if (timeout_ns < 1000) timeout_ns = 1000;
    ts.tv_sec = timeout_ns / 1000000000LL;
    ts.tv_nsec = timeout_ns % 1000000000LL;
    syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, NULL, 0);
}

static inline void ls_futex_wake(uint32_t *word, int n)
{
    syscall(SYS_futex, word, FUTEX_WAKE, n, NULL, NULL, 0);
}

/* Spin, then yield, until `*word != avoid` (want_change) or `*word == want`
 * (!want_change), for at most spin_ns + yield_ns.  Returns 1 when satisfied. */
static inline int ls_poll(uint32_t *word, uint32_t value, int want_change,
                          int64_t t0, int64_t spin_ns, int64_t yield_ns)
{
    unsigned i = 0;
    for (;;) {
        uint32_t v = __atomic_load_n(word, __ATOMIC_ACQUIRE);
        if (want_change ? (v != value) : (v == value)) return 1;
        if ((++i & 15) == 0) {
            int64_t el = ls_now_ns() - t0;
            if (el >= spin_ns + yield_ns) return 0;
            if (el >= spin_ns) sched_yield();
        } else if (spin_ns > 0) {
            ls_relax();
        } else {
            sched_yield();
        }
    }
}

/* Master: publish command `op` (with `arg`) to `nworkers` workers.  Returns its
 * sequence number.  The previous command must have completed. */
static inline uint32_t ls_post(uint32_t *ctl, uint32_t op, uint32_t arg, uint32_t nworkers)
{
    uint32_t seq = __atomic_load_n(&ctl[LS_CMD_SEQ], __ATOMIC_RELAXED) + 1;
    if (seq == 0) seq = 1;                    /* 0 means "never posted" */
    __atomic_store_n(&ctl[LS_PENDING], nworkers, __ATOMIC_RELAXED);
    __atomic_store_n(&ctl[LS_CMD_OP], op, __ATOMIC_RELAXED);
    __atomic_store_n(&ctl[LS_CMD_ARG], arg, __ATOMIC_RELAXED);
    __atomic_store_n(&ctl[LS_CMD_SEQ], seq, __ATOMIC_SEQ_CST);   /* releases all of the above */
    if (__atomic_load_n(&ctl[LS_SLEEPERS], __ATOMIC_SEQ_CST) > 0)
        ls_futex_wake(&ctl[LS_CMD_SEQ], INT_MAX);
    return seq;
}

/* Master: wait until every worker has finished the current command.
 * Returns 1 when all have, 0 after budget_ns without that. */
static inline int ls_wait_round(uint32_t *ctl, int64_t spin_ns, int64_t yield_ns, int64_t budget_ns)
{
    int64_t t0 = ls_now_ns();
    if (ls_poll(&ctl[LS_PENDING], 0, 0, t0, spin_ns, yield_ns)) return 1;
    __atomic_store_n(&ctl[LS_M_SLEEP], 1, __ATOMIC_SEQ_CST);
    int done = 0;
    for (;;) {
        uint32_t v = __atomic_load_n(&ctl[LS_PENDING], __ATOMIC_SEQ_CST);
        if (v == 0) { done = 1; break; }
        int64_t left = budget_ns - (ls_now_ns() - t0);
        if (left <= 0) break;
        ls_futex_wait(&ctl[LS_PENDING], v, left);
    }
    __atomic_store_n(&ctl[LS_M_SLEEP], 0, __ATOMIC_RELAXED);
    return done;
}

/* Wait until `*word` is no longer `old`: spin, yield, then sleep on the futex
 * with `*sleepers` counted up while asleep (the waker reads it after its own
 * seq_cst write of `*word`: the Dekker pairing that excludes a lost wake-up).
 * Returns the new value, or `old` after budget_ns without a change. */
static inline uint32_t ls_wait_change(uint32_t *word, uint32_t old, uint32_t *sleepers,
                                      int64_t spin_ns, int64_t yield_ns, int64_t budget_ns)
{
    int64_t t0 = ls_now_ns();
    if (ls_poll(word, old, 1, t0, spin_ns, yield_ns))
        return __atomic_load_n(word, __ATOMIC_ACQUIRE);
    __atomic_fetch_add(sleepers, 1, __ATOMIC_SEQ_CST);
    uint32_t v;
    for (;;) {
        v = __atomic_load_n(word, __ATOMIC_SEQ_CST);
        if (v != old) break;
        int64_t left = budget_ns - (ls_now_ns() - t0);
        if (left <= 0) break;
        ls_futex_wait(word, old, left);
    }
    __atomic_fetch_sub(sleepers, 1, __ATOMIC_SEQ_CST);
    return v;
}

/* Worker: wait for a command after `last`.  Returns the new sequence number,
 * or `last` after budget_ns without one. */
static inline uint32_t ls_wait_command(uint32_t *ctl, uint32_t last, int64_t spin_ns,
                                       int64_t yield_ns, int64_t budget_ns)
{
    return ls_wait_change(&ctl[LS_CMD_SEQ], last, &ctl[LS_SLEEPERS],
                          spin_ns, yield_ns, budget_ns);
}

/* Worker: report the current command finished (results and status written
 * before this call become visible to the master with it). */
static inline void ls_done(uint32_t *ctl)
{
    if (__atomic_sub_fetch(&ctl[LS_PENDING], 1, __ATOMIC_SEQ_CST) == 0 &&
        __atomic_load_n(&ctl[LS_M_SLEEP], __ATOMIC_SEQ_CST))
        ls_futex_wake(&ctl[LS_PENDING], 1);
}

/* ---- a barrier of n processes, on a control block of its own --------------
 * Words: b_count arrivals in this generation, b_gen the generation (the
 * barrier's sequence number), b_sleepers waiters asleep on b_gen.  The last
 * arrival resets b_count, then opens the barrier by bumping b_gen (seq_cst:
 * whatever every process wrote before it arrived is visible to every process
 * that sees the new generation), and wakes the sleepers if there are any;
 * the others wait for b_gen to change, spinning, yielding, then asleep on a
 * futex (the same Dekker pairing as above excludes a lost wake-up).  A
 * process reads b_gen only after it passed the barrier before, so the
 * generation it waits past is always the current one. */
enum { LS_B_COUNT = 0, LS_B_GEN = 16, LS_B_SLEEPERS = 32 };

/* Arrive; returns the generation to wait past, *opened = 1 when this was the
 * last arrival (the barrier is already open: no wait). */
static inline uint32_t ls_barrier_arrive(uint32_t *b, uint32_t n, int *opened)
{
    uint32_t gen = __atomic_load_n(&b[LS_B_GEN], __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&b[LS_B_COUNT], 1, __ATOMIC_SEQ_CST) >= n) {
        __atomic_store_n(&b[LS_B_COUNT], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&b[LS_B_GEN], gen + 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&b[LS_B_SLEEPERS], __ATOMIC_SEQ_CST) > 0)
            ls_futex_wake(&b[LS_B_GEN], INT_MAX);
        *opened = 1;
    } else {
        *opened = 0;
    }
    return gen;
}

/* Wait until the barrier's generation is past `gen`: 1 when it is, 0 after
 * budget_ns without that. */
static inline int ls_barrier_wait(uint32_t *b, uint32_t gen, int64_t spin_ns,
                                  int64_t yield_ns, int64_t budget_ns)
{
    return ls_wait_change(&b[LS_B_GEN], gen, &b[LS_B_SLEEPERS],
                          spin_ns, yield_ns, budget_ns) != gen;
}

#endif
