/* A small convolution (+ ReLU) from uint8 frames, and its weight and bias gradients
 * (cython/convcore.pyx; DQN's numpy TD gradient, pal_hpc/algos/dqn_numpy.py).
 *
 * MinAtar's network has one unpadded convolution: 16 filters of 3x3 over 4-10 channels
 * of a 10x10 frame, about 1.2M multiply-adds for a batch of 32.  In numpy it was a
 * gather of every patch into a float array and one small matrix product per frame, at
 * each of its three uses (two forwards, one weight gradient): per-call and per-copy
 * costs.  Here each frame is turned into floats once (a 256-entry table: x / 255 in
 * float32, as numpy's patches were), the 16 filters are one vector (the innermost,
 * contiguous axis of the weights, laid out (C k k, O)) and an output row's 8 sums stay
 * in registers.  Zen 4, batch 32, idle: forward 48-65 us against numpy's 140-200,
 * weight gradient 47-69 against 80-155 (4-6 channels).
 *
 * x (B, C, H, W) uint8; output (B, O, OH OW), torch's layout, which its Flatten hands the
 * dense layer.  No padding, square kernel and stride.  Other filter counts and larger
 * shapes take a plain scalar loop.
 *
 * The functions are compiled for AVX-512, AVX2+FMA and baseline x86-64 and the loader
 * picks one for the CPU (GCC's target_clones): the build stays portable and each machine
 * gets its vector width.  Results agree with numpy's to float32 rounding; on one machine
 * they are the same every run. */
#ifndef PAL_CONV_CORE_H
#define PAL_CONV_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && __GNUC__ >= 12
#define CC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CC_CLONES
#endif

#define CC_MAX_FILTERS 256

/* cc_load/cc_store pass 64-byte vectors by value; they are always inlined, so the
 * ABI of such calls (what -Wpsabi warns about) never applies. */
#pragma GCC diagnostic ignored "-Wpsabi"

/* 16 floats: one AVX-512 register, two AVX2 ones, four SSE ones (per clone). */
typedef float cc_v16 __attribute__((vector_size(64)));
typedef int32_t cc_i16 __attribute__((vector_size(64)));

static inline __attribute__((always_inline)) cc_v16 cc_load(const float *p)
{
    cc_v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) void cc_store(float *p, cc_v16 v)
{
    memcpy(p, &v, sizeof v);
}

/* A frame's pixels as floats (the scale table's), so the sums below read each with its
 * multiply (one load) instead of a byte, then a table entry. */
static inline __attribute__((always_inline)) void
cc_frame_to_float(const uint8_t *restrict frame, size_t n, const float *restrict scale,
                  float *restrict fx)
{
    for (size_t i = 0; i < n; i++)
        fx[i] = scale[frame[i]];
}

/* The fast paths' buffers, on the stack: frames of at most this many pixels, outputs
 * of at most this many positions (MinAtar: 400-1,000 and 64). */
#define CC_MAX_PIXELS 4096
#define CC_MAX_POSITIONS 256

/* 16 filters, NOW output columns a row (a constant for MinAtar's 8, so the row's sums
 * stay in registers): for each weight row j, every column's sum += pixel * w[j, :]. */
#define CC_FORWARD16(NOW)                                                               \
    for (int b = 0; b < B; b++) {                                                       \
        cc_frame_to_float(x + (size_t)b * C * H * W, (size_t)C * H * W, scale, fx);   \
        float *ob = out + (size_t)b * 16 * P;                                           \
        for (int oy = 0; oy < OH; oy++) {                                               \
            cc_v16 acc[NOW];                                                            \
            cc_v16 b16 = cc_load(bias);                                                 \
            _Pragma("GCC unroll 16")                                                    \
            for (int ox = 0; ox < (NOW); ox++)                                          \
                acc[ox] = b16;                                                          \
            const float *wj = wt;                                                       \
            for (int c = 0; c < C; c++)                                                 \
                for (int ky = 0; ky < k; ky++) {                                        \
                    const float *row = fx + ((size_t)c * H + (size_t)(oy * s + ky)) * W; \
                    for (int kx = 0; kx < k; kx++, wj += 16) {                          \
                        cc_v16 w16 = cc_load(wj);                                       \
                        _Pragma("GCC unroll 16")                                        \
                        for (int ox = 0; ox < (NOW); ox++)                              \
                            acc[ox] += row[ox * s + kx] * w16;                          \
                    }                                                                   \
                }                                                                       \
            cc_v16 zero = {0};                                                          \
            _Pragma("GCC unroll 16")                                                    \
            for (int ox = 0; ox < (NOW); ox++)                                          \
                cc_store(rows + ((size_t)oy * OW + ox) * 16,    /* ReLU */              \
                         (cc_v16)((cc_i16)acc[ox] & (acc[ox] > zero)));                 \
        }                                                                               \
        for (int o = 0; o < 16; o++)            /* (P, 16) -> torch's (16, P) */        \
            for (size_t p = 0; p < P; p++)                                              \
                ob[o * P + p] = rows[p * 16 + o];                                       \
    }

CC_CLONES static void
cc_conv_relu(const uint8_t *restrict x, int B, int C, int H, int W, const float *restrict scale,
             const float *restrict wt, const float *restrict bias, int O, int k, int s,
             float *restrict out)
{
    int OH = (H - k) / s + 1, OW = (W - k) / s + 1;
    size_t P = (size_t)OH * OW;
    if (O == 16 && OW <= 16 && (size_t)C * H * W <= CC_MAX_PIXELS
            && P <= CC_MAX_POSITIONS) {
        float fx[CC_MAX_PIXELS], rows[CC_MAX_POSITIONS * 16];
        if (OW == 8)
            CC_FORWARD16(8)
        else
            CC_FORWARD16(OW)
        return;
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
 * ReLU's mask applied.  16 filters: a row's NOW gradient vectors stay in registers and
 * each weight row j's sums are loaded and stored once a row. */
#define CC_GRAD16(NOW)                                                                  \
    for (int b = 0; b < B; b++) {                                                       \
        cc_frame_to_float(x + (size_t)b * C * H * W, (size_t)C * H * W, scale, fx);   \
        const float *db = d_h + (size_t)b * 16 * P;                                     \
        for (int o = 0; o < 16; o++)            /* (16, P) -> (P, 16) */                \
            for (size_t p = 0; p < P; p++)                                              \
                rows[p * 16 + o] = db[o * P + p];                                       \
        for (int oy = 0; oy < OH; oy++) {                                               \
            cc_v16 g[NOW];                                                              \
            _Pragma("GCC unroll 16")                                                    \
            for (int ox = 0; ox < (NOW); ox++) {                                        \
                g[ox] = cc_load(rows + ((size_t)oy * OW + ox) * 16);                    \
                gb16 += g[ox];                                                          \
            }                                                                           \
            float *gj = gw;                                                             \
            for (int c = 0; c < C; c++)                                                 \
                for (int ky = 0; ky < k; ky++) {                                        \
                    const float *row = fx + ((size_t)c * H + (size_t)(oy * s + ky)) * W; \
                    for (int kx = 0; kx < k; kx++, gj += 16) {                          \
                        cc_v16 sum = cc_load(gj);                                       \
                        _Pragma("GCC unroll 16")                                        \
                        for (int ox = 0; ox < (NOW); ox++)                              \
                            sum += row[ox * s + kx] * g[ox];                            \
                        cc_store(gj, sum);                                              \
                    }                                                                   \
                }                                                                       \
        }                                                                               \
    }

CC_CLONES static void
cc_conv_weight_grad(const uint8_t *restrict x, int B, int C, int H, int W,
                    const float *restrict scale, const float *restrict d_h, int O, int k,
                    int s, float *restrict gw, float *restrict gb)
{
    int OH = (H - k) / s + 1, OW = (W - k) / s + 1;
    size_t P = (size_t)OH * OW;
    memset(gw, 0, sizeof(float) * (size_t)C * k * k * O);
    if (O == 16 && OW <= 16 && (size_t)C * H * W <= CC_MAX_PIXELS
            && P <= CC_MAX_POSITIONS) {
        float fx[CC_MAX_PIXELS], rows[CC_MAX_POSITIONS * 16];
        cc_v16 gb16 = {0};
        if (OW == 8)
            CC_GRAD16(8)
        else
            CC_GRAD16(OW)
        cc_store(gb, gb16);
        return;
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
