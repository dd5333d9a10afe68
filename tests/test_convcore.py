"""The C convolution behind DQN's numpy gradient (pal_hpc.algos._convcore) against a
plain numpy convolution, on the shapes its fast path takes (16 filters) and the rest."""

import numpy as np
import pytest

from pal_hpc.algos._convcore import (LEVELS, SCALE, conv_relu, conv_weight_grad, cpu_level,
                                     use_level)

# Every version of the 16-filter kernels this CPU runs (AVX-512, AVX2, baseline).
RUNNABLE = [level for level in LEVELS if level <= cpu_level()]


@pytest.fixture(params=RUNNABLE, ids=[LEVELS[level] for level in RUNNABLE])
def level(request):
    assert use_level(request.param) == request.param
    yield request.param
    use_level(-1)


def reference(x, w, b, k, s):
    """relu(conv(x / 255) + b) as (B, O, OH*OW), and the patches (B, C*k*k, OH*OW)."""
    B, C, H, W = x.shape
    oh, ow = (H - k) // s + 1, (W - k) // s + 1
    xf = x.astype(np.float32) / np.float32(255.0)
    patches = np.empty((B, C * k * k, oh * ow), np.float32)
    for oy in range(oh):
        for ox in range(ow):
            patch = xf[:, :, oy * s:oy * s + k, ox * s:ox * s + k]     # (B, C, k, k)
            patches[:, :, oy * ow + ox] = patch.reshape(B, -1)
    h = np.einsum("oj,bjp->bop", w, patches) + b[:, None]
    return np.maximum(h, 0.0), patches


@pytest.mark.parametrize("B, C, H, W, O, k, s", [
    (32, 4, 10, 10, 16, 3, 1),      # MinAtar Breakout
    (32, 10, 10, 10, 16, 3, 1),     # MinAtar Seaquest
    (5, 3, 9, 12, 16, 3, 1),        # 16 filters, rows of 10
    (4, 2, 11, 11, 16, 3, 2),       # 16 filters, stride 2
    (3, 6, 10, 10, 7, 3, 1),        # another filter count: the generic path
    (2, 1, 8, 8, 33, 5, 3),
    (1, 4, 10, 10, 16, 1, 1),       # 1x1 kernel, 100 positions
])
def test_forward_and_gradients_are_a_plain_convolutions(B, C, H, W, O, k, s, level):
    rng = np.random.default_rng(B * 100 + O)
    x = ((rng.random((B, C, H, W)) < 0.15) * 255).astype(np.uint8)
    x.reshape(-1)[:7] = [1, 2, 3, 100, 128, 254, 255]        # values between 0 and 255 too
    w = rng.normal(size=(O, C * k * k)).astype(np.float32)
    b = rng.normal(size=O).astype(np.float32)
    want, patches = reference(x, w, b, k, s)
    out = np.full(want.shape, np.nan, np.float32)
    conv_relu(x, np.ascontiguousarray(w.T), b, k, s, out)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert (out == 0).any() and (out > 0).any()              # the ReLU cut some, not all
    d_h = rng.normal(size=want.shape).astype(np.float32) * (want > 0)
    gw = np.full((C * k * k, O), np.nan, np.float32)
    gb = np.full(O, np.nan, np.float32)
    conv_weight_grad(x, d_h, k, s, gw, gb)
    np.testing.assert_allclose(gw.T, np.einsum("bop,bjp->oj", d_h, patches), rtol=1e-4,
                               atol=1e-4)
    np.testing.assert_allclose(gb, d_h.sum(axis=(0, 2)), rtol=1e-4, atol=1e-4)


def test_every_version_gives_the_same_result_to_rounding():
    """The versions sum in the same order; only FMA contraction (not in the baseline)
    rounds differently."""
    rng = np.random.default_rng(7)
    x = ((rng.random((32, 6, 10, 10)) < 0.2) * 255).astype(np.uint8)
    wt = rng.normal(size=(54, 16)).astype(np.float32)
    b = rng.normal(size=16).astype(np.float32)
    d_h = rng.normal(size=(32, 16, 64)).astype(np.float32)
    outs = {}
    try:
        for level in RUNNABLE:
            use_level(level)
            out = np.empty((32, 16, 64), np.float32)
            conv_relu(x, wt, b, 3, 1, out)
            gw, gb = np.empty((54, 16), np.float32), np.empty(16, np.float32)
            conv_weight_grad(x, d_h, 3, 1, gw, gb)
            outs[level] = out, gw, gb
    finally:
        use_level(-1)
    for level in RUNNABLE[1:]:
        for got, want in zip(outs[level], outs[RUNNABLE[0]]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_level_is_clamped_to_what_the_cpu_runs():
    try:
        assert use_level(99) == cpu_level()
        assert use_level(1) == 0
        assert use_level(0) == 0
    finally:
        use_level(-1)
    assert cpu_level() in LEVELS


def test_the_scale_is_numpys_division_by_255():
    assert SCALE.dtype == np.float32
    np.testing.assert_array_equal(SCALE, np.arange(256).astype(np.float32) / np.float32(255))


def test_shapes_that_do_not_match_are_refused():
    x = np.zeros((2, 4, 10, 10), np.uint8)
    wt, b = np.zeros((36, 16), np.float32), np.zeros(16, np.float32)
    with pytest.raises(ValueError, match="shapes do not match"):
        conv_relu(x, wt, b, 3, 1, np.zeros((2, 16, 63), np.float32))
    with pytest.raises(ValueError, match="kernel 11"):
        conv_relu(x, wt, b, 11, 1, np.zeros((2, 16, 0), np.float32))
    with pytest.raises(ValueError, match="shapes do not match"):
        conv_weight_grad(x, np.zeros((2, 16, 64), np.float32), 3, 1,
                         np.zeros((36, 15), np.float32), b)
    with pytest.raises(ValueError, match="300 filters"):
        conv_relu(x, np.zeros((36, 300), np.float32), np.zeros(300, np.float32), 3, 1,
                  np.zeros((2, 300, 64), np.float32))
