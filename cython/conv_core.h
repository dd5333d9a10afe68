/* A small convolution (+ ReLU) from uint8 frames, and its weight and bias gradients
 * (cython/convcore.pyx; DQN's numpy TD gradient, pal_hpc/algos/dqn_numpy.py).
 *
 * MinAtar's network has one unpadded convolution: 16 filters of 3x3 over 4-10 channels
 * of a 10x10 frame, about 1.2M multiply-adds for a batch of 32.  In numpy it was a
 * gather of every patch into a float array and one small matrix product per frame, at
 * each of its three uses (two forwards, one weight gradient): per-call and per-copy
 * costs.  Here each frame is turned into floats once (a 256-entry table: x / 255 in
 * float32, as numpy's patches were), the 16 filters fill the CPU's vectors (the
 * innermost, contiguous axis of the weights, laid out (C k k, O)) and a block of an
 * output row's sums stays in registers.  Batch 32, idle, 4-6 channels: Zen 4 forward
 * 48-65 us against numpy's 140-200, weight gradient 47-69 against 80-155; Zen 3 (AVX2)
 * forward 53-80 us, weight gradient 60-88.
 *
 * x (B, C, H, W) uint8; output (B, O, OH OW), torch's layout, which its Flatten hands the
 * dense layer.  No padding, square kernel and stride.  Other filter counts and larger
 * shapes take a plain scalar loop.
 *
 * The 16-filter kernels are compiled for AVX-512, AVX2+FMA and baseline x86-64 and the
 * first call picks one for the CPU: the build stays portable and each machine gets its
 * vector width.  Each version keeps as many output columns' sums in registers as its
 * register file holds (AVX-512: 8 columns of one 16-float register in 32; AVX2: 4 of
 * two 8-float ones in 16; SSE: 2 of four).  One 16-float vector type compiled for AVX2
 * (GCC's target_clones, as first written) kept 8 columns' sums in memory and was 6-8x
 * slower there than on AVX-512 (Zen 3: forward 372-396 us against Zen 4's 48-65).
 * Results agree with numpy's to float32 rounding; on one machine they are the same
 * every run (each version sums in the same order). */
#ifndef PAL_CONV_CORE_H
#define PAL_CONV_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && __GNUC__ >= 12
#define CC_X86_LEVELS 1
#endif

#define CC_MAX_FILTERS 256

/* The fast paths' buffers, on the stack: frames of at most this many pixels, outputs
 * of at most this many positions (MinAtar: 400-1,000 and 64). */
#define CC_MAX_PIXELS 4096
#define CC_MAX_POSITIONS 256

/* Vectors of 16, 8 and 4 floats (and their comparison masks): one register each of
 * AVX-512, AVX2 and SSE.  Loads and stores go through memcpy (unaligned, inlined). */
typedef float cc_f16 __attribute__((vector_size(64)));
typedef int32_t cc_m16 __attribute__((vector_size(64)));
typedef float cc_f8 __attribute__((vector_size(32)));
typedef int32_t cc_m8 __attribute__((vector_size(32)));
typedef float cc_f4 __attribute__((vector_size(16)));
typedef int32_t cc_m4 __attribute__((vector_size(16)));

/* Vector values stay inside the always-inlined kernels: no call passes one, so the
 * ABI of such calls (what -Wpsabi warns about) never applies. */
#pragma GCC diagnostic ignored "-Wpsabi"

#define CC_LOAD(VT, p) __extension__({ VT v_; memcpy(&v_, (p), sizeof v_); v_; })
#define CC_STORE(p, v) do { __typeof__(v) v_ = (v); memcpy((p), &v_, sizeof v_); } while (0)

/* A frame's pixels as floats (the scale table's), so the sums below read each with its
 * multiply (one load) instead of a byte, then a table entry. */
static inline __attribute__((always_inline)) void
cc_frame_to_float(const uint8_t *restrict frame, size_t n, const float *restrict scale,
                  float *restrict fx)
{
    for (size_t i = 0; i < n; i++)
        fx[i] = scale[frame[i]];
}

/* Output columns o0 .. o0+NB-1 of row oy, 16 filters as 16/L vectors of L floats: for
 * each weight row j (c, ky, kx), every column's sums += pixel * w[j, :] (wt is
 * (C k k, 16)).  NB and L are constants, so the NB x 16/L sums are registers. */
#define CC_FORWARD_BLOCK(VT, MT, L, NB)                                                 \
    do {                                                                                \
        VT acc[NB][16 / L];                                                             \
        _Pragma("GCC unroll 16")                                                        \
        for (int v = 0; v < 16 / L; v++) {                                              \
            VT bv = CC_LOAD(VT, bias + v * L);                                          \
            _Pragma("GCC unroll 16")                                                    \
            for (int ox = 0; ox < (NB); ox++)                                           \
                acc[ox][v] = bv;                                                        \
        }                                                                               \
        const float *wj = wt;                                                           \
        for (int c = 0; c < C; c++)                                                     \
            for (int ky = 0; ky < k; ky++) {                                            \
                const float *row = fx + ((size_t)c * H + (size_t)(oy * s + ky)) * W     \
                                   + (size_t)o0 * s;                                    \
                for (int kx = 0; kx < k; kx++, wj += 16) {                              \
                    VT wv[16 / L];                                                      \
                    _Pragma("GCC unroll 16")                                            \
                    for (int v = 0; v < 16 / L; v++)                                    \
                        wv[v] = CC_LOAD(VT, wj + v * L);                                \
                    _Pragma("GCC unroll 16")                                            \
                    for (int ox = 0; ox < (NB); ox++) {                                 \
                        float px = row[ox * s + kx];                                    \
                        _Pragma("GCC unroll 16")                                        \
                        for (int v = 0; v < 16 / L; v++)                                \
                            acc[ox][v] += px * wv[v];                                   \
                    }                                                                   \
                }                                                                       \
            }                                                                           \
        VT zero = {0};                                                                  \
        _Pragma("GCC unroll 16")                                                        \
        for (int ox = 0; ox < (NB); ox++)                                               \
            _Pragma("GCC unroll 16")                                                    \
            for (int v = 0; v < 16 / L; v++)                        /* ReLU */          \
                CC_STORE(rows + ((size_t)oy * OW + o0 + ox) * 16 + v * L,               \
                         (VT)((MT)acc[ox][v] & (MT)(acc[ox][v] > zero)));               \
    } while (0)

/* The weight gradient's block: columns o0 .. o0+NB-1 of row oy hold their 16 output
 * gradients in registers (g), and each weight row j's 16 sums are loaded, added to
 * and stored once a block; the bias gradient's 16 sums (gbv) stay in registers. */
#define CC_GRAD_BLOCK(VT, L, NB)                                                        \
    do {                                                                                \
        VT g[NB][16 / L];                                                               \
        _Pragma("GCC unroll 16")                                                        \
        for (int ox = 0; ox < (NB); ox++)                                               \
            _Pragma("GCC unroll 16")                                                    \
            for (int v = 0; v < 16 / L; v++) {                                          \
                g[ox][v] = CC_LOAD(VT, rows + ((size_t)oy * OW + o0 + ox) * 16 + v * L); \
                gbv[v] += g[ox][v];                                                     \
            }                                                                           \
        float *gj = gw;                                                                 \
        for (int c = 0; c < C; c++)                                                     \
            for (int ky = 0; ky < k; ky++) {                                            \
                const float *row = fx + ((size_t)c * H + (size_t)(oy * s + ky)) * W     \
                                   + (size_t)o0 * s;                                    \
                for (int kx = 0; kx < k; kx++, gj += 16) {                              \
                    VT sum[16 / L];                                                     \
                    _Pragma("GCC unroll 16")                                            \
                    for (int v = 0; v < 16 / L; v++)                                    \
                        sum[v] = CC_LOAD(VT, gj + v * L);                               \
                    _Pragma("GCC unroll 16")                                            \
                    for (int ox = 0; ox < (NB); ox++) {                                 \
                        float px = row[ox * s + kx];                                    \
                        _Pragma("GCC unroll 16")                                        \
                        for (int v = 0; v < 16 / L; v++)                                \
                            sum[v] += px * g[ox][v];                                    \
                    }                                                                   \
                    _Pragma("GCC unroll 16")                                            \
                    for (int v = 0; v < 16 / L; v++)                                    \
                        CC_STORE(gj + v * L, sum[v]);                                   \
                }                                                                       \
            }                                                                           \
    } while (0)

/* cc_forward16_<SUF> and cc_grad16_<SUF>: the 16-filter kernels for one instruction
 * set (ATTR), vectors of L floats, rows taken NB columns at a time (the rest one at a
 * time).  The caller has checked the fast path's limits. */
#define CC_DEFINE_KERNELS16(SUF, ATTR, VT, MT, L, NB)                                   \
ATTR static void                                                                        \
cc_forward16_##SUF(const uint8_t *restrict x, int B, int C, int H, int W,              \
                   const float *restrict scale, const float *restrict wt,               \
                   const float *restrict bias, int k, int s, float *restrict out)       \
{                                                                                       \
    int OH = (H - k) / s + 1, OW = (W - k) / s + 1;                                     \
    size_t P = (size_t)OH * OW;                                                         \
    float fx[CC_MAX_PIXELS], rows[CC_MAX_POSITIONS * 16];                               \
    for (int b = 0; b < B; b++) {                                                       \
        cc_frame_to_float(x + (size_t)b * C * H * W, (size_t)C * H * W, scale, fx);   \
        for (int oy = 0; oy < OH; oy++) {                                               \
            int o0 = 0;                                                                 \
            for (; o0 + (NB) <= OW; o0 += (NB))                                         \
                CC_FORWARD_BLOCK(VT, MT, L, NB);                                        \
            for (; o0 < OW; o0++)                                                       \
                CC_FORWARD_BLOCK(VT, MT, L, 1);                                         \
        }                                                                               \
        float *ob = out + (size_t)b * 16 * P;                                           \
        for (int o = 0; o < 16; o++)            /* (P, 16) -> torch's (16, P) */        \
            for (size_t p = 0; p < P; p++)                                              \
                ob[o * P + p] = rows[p * 16 + o];                                       \
    }                                                                                   \
}                                                                                       \
                                                                                        \
ATTR static void                                                                        \
cc_grad16_##SUF(const uint8_t *restrict x, int B, int C, int H, int W,                 \
                const float *restrict scale, const float *restrict d_h, int k, int s,   \
                float *restrict gw, float *restrict gb)                                 \
{                                                                                       \
    int OH = (H - k) / s + 1, OW = (W - k) / s + 1;                                     \
    size_t P = (size_t)OH * OW;                                                         \
    float fx[CC_MAX_PIXELS], rows[CC_MAX_POSITIONS * 16];                               \
    VT gbv[16 / L];                                                                     \
    for (int v = 0; v < 16 / L; v++)                                                    \
        gbv[v] = (VT){0};                                                               \
    for (int b = 0; b < B; b++) {                                                       \
        cc_frame_to_float(x + (size_t)b * C * H * W, (size_t)C * H * W, scale, fx);   \
        const float *db = d_h + (size_t)b * 16 * P;                                     \
        for (int o = 0; o < 16; o++)            /* (16, P) -> (P, 16) */                \
            for (size_t p = 0; p < P; p++)                                              \
                rows[p * 16 + o] = db[o * P + p];                                       \
        for (int oy = 0; oy < OH; oy++) {                                               \
            int o0 = 0;                                                                 \
            for (; o0 + (NB) <= OW; o0 += (NB))                                         \
                CC_GRAD_BLOCK(VT, L, NB);                                               \
            for (; o0 < OW; o0++)                                                       \
                CC_GRAD_BLOCK(VT, L, 1);                                                \
        }                                                                               \
    }                                                                                   \
    for (int v = 0; v < 16 / L; v++)                                                    \
        CC_STORE(gb + v * L, gbv[v]);                                                   \
}

#ifdef CC_X86_LEVELS
CC_DEFINE_KERNELS16(avx512, __attribute__((target("arch=x86-64-v4"))), cc_f16, cc_m16, 16, 8)
CC_DEFINE_KERNELS16(avx2, __attribute__((target("arch=x86-64-v3"))), cc_f8, cc_m8, 8, 4)
#endif
CC_DEFINE_KERNELS16(base, , cc_f4, cc_m4, 4, 2)

/* The kernels' versions: 4 AVX-512 (x86-64-v4), 3 AVX2+FMA (x86-64-v3), 0 the baseline. */
static int
cc_cpu_level(void)
{
#ifdef CC_X86_LEVELS
    __builtin_cpu_init();
    return __builtin_cpu_supports("x86-64-v4") ? 4 : __builtin_cpu_supports("x86-64-v3") ? 3 : 0;
#else
    return 0;
#endif
}

/* The version in use: the CPU's best, read on the first call (threads racing on it all
 * write the same value), unless cc_use_level chose a lower one. */
static int cc_level_in_use = -1;

static int
cc_level(void)
{
    if (cc_level_in_use < 0)
        cc_level_in_use = cc_cpu_level();
    return cc_level_in_use;
}

/* Use version `want` (4, 3 or 0; -1 or one the CPU lacks: its best); returns the one in
 * use.  For tests that check every version this CPU can run. */
static int
cc_use_level(int want)
{
    int top = cc_cpu_level();
    if (want < 0 || want > top)
        want = top;
    else if (want < 3)
        want = 0;
    cc_level_in_use = want;
    return want;
}

/* The 16-filter kernels take 16 filters, rows of at most 16 columns, frames and outputs
 * within the stack buffers. */
static inline int
cc_fast16(int C, int H, int W, int O, int k, int s)
{
    int OH = (H - k) / s + 1, OW = (W - k) / s + 1;
    return O == 16 && OW <= 16 && (size_t)C * H * W <= CC_MAX_PIXELS
           && (size_t)OH * OW <= CC_MAX_POSITIONS;
}

static void
cc_conv_relu(const uint8_t *restrict x, int B, int C, int H, int W, const float *restrict scale,
             const float *restrict wt, const float *restrict bias, int O, int k, int s,
             float *restrict out)
{
    int OH = (H - k) / s + 1, OW = (W - k) / s + 1;
    size_t P = (size_t)OH * OW;
    if (cc_fast16(C, H, W, O, k, s)) {
        switch (cc_level()) {
#ifdef CC_X86_LEVELS
        case 4: cc_forward16_avx512(x, B, C, H, W, scale, wt, bias, k, s, out); return;
        case 3: cc_forward16_avx2(x, B, C, H, W, scale, wt, bias, k, s, out); return;
#endif
        default: cc_forward16_base(x, B, C, H, W, scale, wt, bias, k, s, out); return;
        }
    }
    /* Any other shape: one position at a time, scalar sums. */
    for (int b = 0; b < B; b++) {
        const uint8_t *frame = x + (size_t)b * C * H * W;
        for (int oy = 0; oy < OH; oy++)
            for (int ox = 0; ox < OW; ox++) {
                float *op = out + (size_t)b * O * P + (size_t)oy * OW + ox;
                for (int o = 0; o < O; o++) {
                    float h = bias[o];
                    const float *wo = wt + o;
                    for (int c = 0; c < C; c++)
                        for (int ky = 0; ky < k; ky++) {
                            const uint8_t *row = frame + ((size_t)c * H + (size_t)(oy * s + ky)) * W
                                                 + ox * s;
                            for (int kx = 0; kx < k; kx++, wo += O)
                                h += scale[row[kx]] * *wo;
                        }
                    op[(size_t)o * P] = h > 0.0f ? h : 0.0f;
                }
            }
    }
}

/* gw (C k k, O) = sum over frames and positions of pixel_j d_h[b, :, p]; gb (O) the
 * sum of d_h.  d_h (B, O, OH OW): the loss's gradient at the convolution's output, the
 * ReLU's mask applied. */
static void
cc_conv_weight_grad(const uint8_t *restrict x, int B, int C, int H, int W,
                    const float *restrict scale, const float *restrict d_h, int O, int k,
                    int s, float *restrict gw, float *restrict gb)
{
    int OH = (H - k) / s + 1, OW = (W - k) / s + 1;
    size_t P = (size_t)OH * OW;
    memset(gw, 0, sizeof(float) * (size_t)C * k * k * O);
    if (cc_fast16(C, H, W, O, k, s)) {
        switch (cc_level()) {
#ifdef CC_X86_LEVELS
        case 4: cc_grad16_avx512(x, B, C, H, W, scale, d_h, k, s, gw, gb); return;
        case 3: cc_grad16_avx2(x, B, C, H, W, scale, d_h, k, s, gw, gb); return;
#endif
        default: cc_grad16_base(x, B, C, H, W, scale, d_h, k, s, gw, gb); return;
        }
    }
    for (int o = 0; o < O; o++)
        gb[o] = 0.0f;
    for (int b = 0; b < B; b++) {
        const uint8_t *frame = x + (size_t)b * C * H * W;
        for (int oy = 0; oy < OH; oy++)
            for (int ox = 0; ox < OW; ox++) {
                const float *dp = d_h + (size_t)b * O * P + (size_t)oy * OW + ox;
                for (int o = 0; o < O; o++) {
                    float g = dp[(size_t)o * P];
                    gb[o] += g;
                    float *go = gw + o;
                    for (int c = 0; c < C; c++)
                        for (int ky = 0; ky < k; ky++) {
                            const uint8_t *row = frame + ((size_t)c * H + (size_t)(oy * s + ky)) * W
                                                 + ox * s;
                            for (int kx = 0; kx < k; kx++, go += O)
                                *go += scale[row[kx]] * g;
                        }
                }
            }
    }
}

#endif
