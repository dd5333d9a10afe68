# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""A small unpadded convolution (+ ReLU) straight from uint8 frames, and its weight and
bias gradients (cython/conv_core.h): DQN's numpy TD gradient on MinAtar's network
(pal_hpc.algos.dqn_numpy)."""

from libc.stdint cimport uint8_t

import numpy as np

cdef extern from "conv_core.h" nogil:
    int CC_MAX_FILTERS
    int cc_cpu_level()
    int cc_use_level(int want)
    void cc_conv_relu(const uint8_t *x, int B, int C, int H, int W, const float *scale,
                      const float *wt, const float *bias, int filters, int k, int s,
                      float *out)
    void cc_conv_weight_grad(const uint8_t *x, int B, int C, int H, int W,
                             const float *scale, const float *d_h, int filters, int k, int s,
                             float *gw, float *gb)

# x / 255 in float32 for each byte, as numpy's `x.astype(float32) / float32(255)`.
SCALE = np.arange(256, dtype=np.float32) / np.float32(255.0)
cdef const float[::1] _scale = SCALE


LEVELS = {4: "avx512", 3: "avx2", 0: "baseline"}


def cpu_level() -> int:
    """The best version of the 16-filter kernels this CPU runs: 4 (AVX-512), 3 (AVX2+FMA)
    or 0 (baseline x86-64, or not x86)."""
    return cc_cpu_level()


def use_level(int level=-1) -> int:
    """Run the 16-filter kernels' version `level` (a key of LEVELS; one above the CPU's,
    or -1: the CPU's best) from now on; returns the version in use.  For tests."""
    return cc_use_level(level)


def _check(const uint8_t[:, :, :, ::1] x, int filters, int k, int s):
    if not 0 < filters <= CC_MAX_FILTERS:
        raise ValueError(f"convcore: {filters} filters (at most {CC_MAX_FILTERS})")
    if k < 1 or s < 1 or x.shape[2] < k or x.shape[3] < k:
        raise ValueError(f"convcore: kernel {k} stride {s} on frames of {x.shape[2]}x{x.shape[3]}")
    return (x.shape[2] - k) // s + 1, (x.shape[3] - k) // s + 1


def conv_relu(const uint8_t[:, :, :, ::1] x, const float[:, ::1] wt, const float[::1] bias,
              int k, int s, float[:, :, ::1] out):
    """out (B, O, OH*OW) = relu(conv(x / 255) + bias); wt is the weight as (C*k*k, O)."""
    cdef int B = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3], O = wt.shape[1]
    oh, ow = _check(x, O, k, s)
    if (wt.shape[0] != C * k * k or bias.shape[0] != O or out.shape[0] != B
            or out.shape[1] != O or out.shape[2] != oh * ow):
        raise ValueError("convcore.conv_relu: shapes do not match")
    if B == 0:
        return
    with nogil:
        cc_conv_relu(&x[0, 0, 0, 0], B, C, H, W, &_scale[0], &wt[0, 0], &bias[0], O, k, s,
                     &out[0, 0, 0])


def conv_weight_grad(const uint8_t[:, :, :, ::1] x, const float[:, :, ::1] d_h, int k, int s,
                     float[:, ::1] gw, float[::1] gb):
    """gw (C*k*k, O) and gb (O), overwritten: the gradients of the weight and bias of
    `conv_relu` given d_h (B, O, OH*OW), the gradient at its output, ReLU mask applied."""
    cdef int B = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3], O = d_h.shape[1]
    oh, ow = _check(x, O, k, s)
    if (d_h.shape[0] != B or d_h.shape[2] != oh * ow or gw.shape[0] != C * k * k
            or gw.shape[1] != O or gb.shape[0] != O):
        raise ValueError("convcore.conv_weight_grad: shapes do not match")
    if B == 0:
        gw[:, :] = 0
        gb[:] = 0
        return
    with nogil:
        cc_conv_weight_grad(&x[0, 0, 0, 0], B, C, H, W, &_scale[0], &d_h[0, 0, 0], O, k, s,
                            &gw[0, 0], &gb[0])
