# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""RMSProp's update over a flat float32 parameter vector in one pass (pal_hpc.algos.optim).

Written with torch's tensor ops, centered RMSProp is seven passes over the vector
(`mul_`, `addcmul_`, `lerp_`, `addcmul`, `sqrt`, `add_`, `addcdiv_`), each a read and a
write of every entry: 0.35 ms of a MinAtar DQN learner's 1.5 ms update (132,179
parameters, Zen 4); this one pass, reading the gradient and the three state vectors
and writing three of them, took 0.10 ms.  Each entry's arithmetic is torch's, operation
for operation, in float32 (constants rounded to float32 first, as torch takes a Python
scalar for a float32 tensor); the results agree to float32 rounding, not always to the
bit (torch's vector kernels may fuse a multiply and an add)."""

cdef extern from "optim_core.h" nogil:
    void oc_rmsprop(float *param, const float *grad, float *square_avg, float *grad_avg,
                    size_t n, float neg_lr, float decay, float keep, float eps,
                    int eps_in_sqrt, int centered)


def rmsprop_step(float[::1] param, const float[::1] grad, float[::1] square_avg,
                 float[::1] grad_avg, double lr, double decay, double eps,
                 bint eps_in_sqrt, bint centered):
    """One RMSProp step in place; `grad_avg` is used (and must have the parameter's
    length) only when `centered`."""
    cdef Py_ssize_t n = param.shape[0]
    if grad.shape[0] != n or square_avg.shape[0] != n or (centered and grad_avg.shape[0] != n):
        raise ValueError(f"rmsprop_step: the parameter has {n} entries, the gradient "
                         f"{grad.shape[0]}, the mean squares {square_avg.shape[0]}")
    if n == 0:
        return
    cdef float *ga = &grad_avg[0] if centered else NULL
    with nogil:
        oc_rmsprop(&param[0], &grad[0], &square_avg[0], ga, <size_t>n, <float>(-lr),
                   <float>decay, <float>(1.0 - decay), <float>eps, eps_in_sqrt, centered)
