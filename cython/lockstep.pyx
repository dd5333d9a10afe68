# cython: boundscheck=False, wraparound=False
"""The turn handoff of the lockstep environment protocol (pal_hpc.envs.lockstep_protocol).

Thin wrappers over lockstep_core.h; every wait releases the GIL, so a master thread
can compute while it waits and the caller's signal handlers run between waits."""

from libc.stdint cimport int64_t, uint32_t

cdef extern from "lockstep_core.h" nogil:
    int LS_CONTROL_WORDS
    int LS_CMD_SEQ
    int LS_CMD_OP
    int LS_CMD_ARG
    int LS_PENDING
    uint32_t ls_post(uint32_t *ctl, uint32_t op, uint32_t arg, uint32_t nworkers)
    int ls_wait_round(uint32_t *ctl, int64_t spin_ns, int64_t yield_ns, int64_t budget_ns)
    uint32_t ls_wait_command(uint32_t *ctl, uint32_t last, int64_t spin_ns, int64_t yield_ns,
                             int64_t budget_ns)
    void ls_done(uint32_t *ctl)
    uint32_t ls_barrier_arrive(uint32_t *b, uint32_t n, int *opened)
    int ls_barrier_wait(uint32_t *b, uint32_t gen, int64_t spin_ns, int64_t yield_ns,
                        int64_t budget_ns)

CONTROL_BYTES = LS_CONTROL_WORDS * 4


cdef inline uint32_t *_ctl(uint32_t[::1] ctl) except NULL:
    if ctl.shape[0] < LS_CONTROL_WORDS:
        raise ValueError(f"control block needs {LS_CONTROL_WORDS} words, got {ctl.shape[0]}")
    if (<size_t>&ctl[0]) % 64:
        raise ValueError("control block must be 64-byte aligned")
    return &ctl[0]


def post(uint32_t[::1] ctl, uint32_t op, uint32_t arg, uint32_t nworkers):
    """Master: publish command `op` to `nworkers` workers; returns its sequence number."""
    cdef uint32_t *c = _ctl(ctl)
    return ls_post(c, op, arg, nworkers)


def wait_round(uint32_t[::1] ctl, int64_t spin_ns, int64_t yield_ns, int64_t budget_ns):
    """Master: True once every worker finished the current command, False after budget_ns."""
    cdef uint32_t *c = _ctl(ctl)
    cdef int r
    with nogil:
        r = ls_wait_round(c, spin_ns, yield_ns, budget_ns)
    return r != 0


def wait_command(uint32_t[::1] ctl, uint32_t last, int64_t spin_ns, int64_t yield_ns,
                 int64_t budget_ns):
    """Worker: (seq, op, arg) of the next command after `last`, or None after budget_ns."""
    cdef uint32_t *c = _ctl(ctl)
    cdef uint32_t seq
    with nogil:
        seq = ls_wait_command(c, last, spin_ns, yield_ns, budget_ns)
    if seq == last:
        return None
    return seq, c[LS_CMD_OP], c[LS_CMD_ARG]


def done(uint32_t[::1] ctl):
    """Worker: report the current command finished."""
    cdef uint32_t *c = _ctl(ctl)
    ls_done(c)


def command_seq(uint32_t[::1] ctl):
    """The last posted sequence number (0: none yet)."""
    cdef uint32_t *c = _ctl(ctl)
    return c[LS_CMD_SEQ]


def arm(uint32_t[::1] ctl, uint32_t nworkers):
    """Master, before any worker starts: zero the control block and expect one
    'ready' (a `done`) from each of `nworkers` workers."""
    cdef uint32_t *c = _ctl(ctl)
    cdef int i
    for i in range(LS_CONTROL_WORDS):
        c[i] = 0
    c[LS_PENDING] = nworkers


def barrier_arrive(uint32_t[::1] ctl, uint32_t n):
    """Arrive at the barrier of `n` processes on control block `ctl` (zeroed before the
    first use, a block of its own): (generation to wait past, whether this arrival
    opened it)."""
    cdef uint32_t *c = _ctl(ctl)
    cdef int opened = 0
    cdef uint32_t gen = ls_barrier_arrive(c, n, &opened)
    return gen, opened != 0


def barrier_wait(uint32_t[::1] ctl, uint32_t gen, int64_t spin_ns, int64_t yield_ns,
                 int64_t budget_ns):
    """True once the barrier is past generation `gen`, False after budget_ns."""
    cdef uint32_t *c = _ctl(ctl)
    cdef int r
    with nogil:
        r = ls_barrier_wait(c, gen, spin_ns, yield_ns, budget_ns)
    return r != 0
