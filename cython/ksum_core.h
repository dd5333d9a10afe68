/*
 * ksum_core.h -- K-ary prioritized sum/min tree over caller-owned memory.
 *
 * The tree never allocates: every function takes a `kst_tree` view whose
 * pointers lie inside one buffer that the caller owns (numpy array, MPI
 * shared window, ...).  Layout of that buffer (all offsets 64-byte aligned):
 *
 *   [ header (64 B) | leaves: float32[L0] | sum level 1: float64[L1] | ...
 *     | sum level D (root): float64[1] | min level 1: float32[L1] | ...
 *     | min level D: float32[LD] ]
 *
 * Level 0 holds the leaves (priorities), padded with zeros to a multiple of
 * K.  Node i of level l has its K children at indices i*K .. i*K+K-1 of level
 * l-1, so every group of K siblings is contiguous and, because every level
 * starts on a 64-byte line and groups have power-of-two sizes, a group never
 * straddles a cache line when it fits in one (K*4 <= 64 for leaves/min nodes,
 * K*8 <= 64 for sum nodes) and starts on a line boundary when it does not.
 * With K = 16 a leaf group is exactly one line (PAL's layout).  Padding
 * nodes stay exactly zero, and descents never enter them.
 *
 * (Storing running sums of each sibling group instead of node masses makes
 * the pick branch-free without SIMD, but an update then rewrites a whole
 * group per level, and those stores to the hot top groups made updates 7x
 * slower; the in-register prefix sum below gives the same pick speed.)
 *
 * Why float64 inner sums: priorities are float32 leaves, and inner entries are
 * maintained by delta propagation (old leaf -> new leaf, add the difference
 * on the path to the root).  In float32 the rounding of every delta would
 * accumulate without bound (PER's well-known drift); in float64 the sums of
 * float32 values are mostly exact and the error after 1e7 updates stays far
 * below 1e-9 relative.  Delta propagation touches one node per level, which
 * is what makes updates cheap.
 *
 * The min tree keeps the smallest *positive* leaf (zero leaves count as
 * +inf) so importance weights can be normalised without an O(N) scan; it is
 * updated with early exit, so most updates stop after one level.
 */
#ifndef PAL_KSUM_CORE_H
#define PAL_KSUM_CORE_H

#include <stdint.h>
#include <string.h>
#include <math.h>
#include <float.h>
#include <stdlib.h>

/* The batch loops are compiled for several x86-64 levels and the best one for
 * the running CPU is chosen at load time (GCC function multiversioning), so a
 * portable build still gets AVX2/AVX-512 compares (1.4x faster sampling here). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 \
    && !defined(PAL_NO_MULTIVERSION)
#define KST_BATCH_FN __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) static
#else
#define KST_BATCH_FN static inline
#endif

#define KST_MAGIC 0x3145455254534b50ULL /* "PKSTREE1" little-endian */
#define KST_VERSION 1u
#define KST_ALIGN 64u
#define KST_HEADER_BYTES 64u
#define KST_MAX_LEVELS 64

typedef struct {
    uint64_t magic;
    uint32_t version;
    uint32_t fanout;
    uint64_t capacity;
    uint64_t nbytes;
    uint32_t n_levels;
    uint32_t _pad0;
    uint64_t _reserved[3];
} kst_header;

typedef struct {
    uint64_t capacity;
    uint32_t fanout;
    uint32_t shift;      /* log2(fanout) */
    uint32_t n_levels;   /* inner levels; level n_levels is the root */
    uint64_t size[KST_MAX_LEVELS + 1];      /* padded node count per level */
    uint64_t sum_off[KST_MAX_LEVELS + 1];   /* [0] = leaves offset */
    uint64_t min_off[KST_MAX_LEVELS + 1];
    uint64_t nbytes;
} kst_layout;

typedef struct {
    kst_header *header;
    float *leaves;
    double *sums[KST_MAX_LEVELS + 1];  /* sums[0] unused */
    float *mins[KST_MAX_LEVELS + 1];   /* mins[0] unused */
    uint64_t real[KST_MAX_LEVELS + 1]; /* nodes per level that are not padding */
    uint64_t capacity;
    uint32_t fanout;
    uint32_t shift;
    uint32_t n_levels;
} kst_tree;

static inline uint64_t kst_round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Every size and offset stays <= KST_MAX_BYTES: callers index with int64 and
 * Py_ssize_t, and an offset that wrapped would bind the tree outside its buffer. */
#define KST_MAX_BYTES ((uint64_t)INT64_MAX)

/* *out = x rounded up to a multiple of a; 0, or -1 past KST_MAX_BYTES. */
static inline int kst_round_up_checked(uint64_t x, uint64_t a, uint64_t *out)
{
    uint64_t s;
    if (__builtin_add_overflow(x, a - 1, &s)) return -1;
    *out = s / a * a;
    return *out > KST_MAX_BYTES ? -1 : 0;
}

/* *out = off + n * item, rounded up to KST_ALIGN; 0, or -1 past KST_MAX_BYTES. */
static inline int kst_extend(uint64_t off, uint64_t n, uint64_t item, uint64_t *out)
{
    uint64_t bytes, end;
    if (__builtin_mul_overflow(n, item, &bytes) || __builtin_add_overflow(off, bytes, &end))
        return -1;
    return kst_round_up_checked(end, KST_ALIGN, out);
}

/* Fills `lay`; returns 0, -1 for a bad fanout/capacity, or -2 when the tree
 * would need more than KST_MAX_BYTES (checked before anything could wrap). */
static inline int kst_compute_layout(uint64_t capacity, uint32_t fanout, kst_layout *lay)
{
    uint32_t shift = 0;
    if (capacity < 1 || fanout < 2 || (fanout & (fanout - 1)) != 0 || fanout > 4096)
        return -1;
    while ((1u << shift) < fanout) shift++;
    memset(lay, 0, sizeof(*lay));
    lay->capacity = capacity;
    lay->fanout = fanout;
    lay->shift = shift;

    uint64_t n;
    if (kst_round_up_checked(capacity, fanout, &n)) return -2;
    lay->size[0] = n;
    uint32_t l = 0;
    for (;;) {
        uint64_t parents = n / fanout;
        l++;
        if (l > KST_MAX_LEVELS) return -1;
        if (parents <= 1) { lay->size[l] = 1; break; }
        n = kst_round_up(parents, fanout);   /* parents <= KST_MAX_BYTES / 2: no wrap */
        lay->size[l] = n;
    }
    lay->n_levels = l;

    uint64_t off = KST_HEADER_BYTES;
    lay->sum_off[0] = off;
    if (kst_extend(off, lay->size[0], sizeof(float), &off)) return -2;
    for (uint32_t i = 1; i <= l; i++) {
        lay->sum_off[i] = off;
        if (kst_extend(off, lay->size[i], sizeof(double), &off)) return -2;
    }
    for (uint32_t i = 1; i <= l; i++) {
        lay->min_off[i] = off;
        if (kst_extend(off, lay->size[i], sizeof(float), &off)) return -2;
    }
    lay->nbytes = off;
    return 0;
}

static inline void kst_bind(kst_tree *t, void *base, const kst_layout *lay)
{
    char *b = (char *)base;
    t->header = (kst_header *)b;
    t->leaves = (float *)(b + lay->sum_off[0]);
    t->sums[0] = NULL;
    t->mins[0] = NULL;
    for (uint32_t i = 1; i <= lay->n_levels; i++) {
        t->sums[i] = (double *)(b + lay->sum_off[i]);
        t->mins[i] = (float *)(b + lay->min_off[i]);
    }
    uint64_t r = lay->capacity;
    for (uint32_t i = 0; i <= lay->n_levels; i++) {
        t->real[i] = r;
        r = (r + lay->fanout - 1) / lay->fanout;
    }
    t->capacity = lay->capacity;
    t->fanout = lay->fanout;
    t->shift = lay->shift;
    t->n_levels = lay->n_levels;
}

/* Zero the tree and stamp the header.  The header is written last so a
 * concurrent attach never sees a half-initialised tree as valid. */
static inline void kst_init(kst_tree *t, const kst_layout *lay)
{
    char *b = (char *)t->header;
    memset(b + KST_HEADER_BYTES, 0, lay->nbytes - KST_HEADER_BYTES);
    for (uint32_t i = 1; i <= lay->n_levels; i++) {
        float *m = t->mins[i];
        for (uint64_t j = 0; j < lay->size[i]; j++) m[j] = INFINITY;
    }
    kst_header h;
    memset(&h, 0, sizeof(h));
    h.version = KST_VERSION;
    h.fanout = lay->fanout;
    h.capacity = lay->capacity;
    h.nbytes = lay->nbytes;
    h.n_levels = lay->n_levels;
    h.magic = 0;
    memcpy(t->header, &h, sizeof(h));
    __atomic_store_n(&t->header->magic, KST_MAGIC, __ATOMIC_RELEASE);
}

/* 0 if the header describes exactly this layout, else a negative code. */
static inline int kst_check_header(const void *base, const kst_layout *lay)
{
    const kst_header *h = (const kst_header *)base;
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != KST_MAGIC) return -1;
    if (h->version != KST_VERSION) return -2;
    if (h->capacity != lay->capacity || h->fanout != lay->fanout) return -3;
    if (h->nbytes != lay->nbytes || h->n_levels != lay->n_levels) return -4;
    return 0;
}

static inline float kst_as_min(float p) { return p > 0.0f ? p : INFINITY; }

/* Smallest positive value of the K-group that starts at `first` on level l-1. */
static inline float kst_group_min(const kst_tree *t, uint32_t l, uint64_t first)
{
    float m = INFINITY;
    if (l == 1) {
        const float *c = t->leaves + first;
        for (uint32_t j = 0; j < t->fanout; j++) {
            float v = kst_as_min(c[j]);
            m = v < m ? v : m;
        }
    } else {
        const float *c = t->mins[l - 1] + first;
        for (uint32_t j = 0; j < t->fanout; j++) m = c[j] < m ? c[j] : m;
    }
    return m;
}

/* The child at `idx` on level 0 changed from old to new: repair the min path. */
static inline void kst_min_propagate(kst_tree *t, uint64_t idx, float oldp, float newp)
{
    float oc = kst_as_min(oldp), nc = kst_as_min(newp);
    if (oc == nc) return;
    for (uint32_t l = 1; l <= t->n_levels; l++) {
        uint64_t parent = idx >> t->shift;
        float cur = t->mins[l][parent];
        float np;
        if (nc < cur) np = nc;
        else if (oc == cur && nc > oc) np = kst_group_min(t, l, parent << t->shift);
        else return;
        if (np == cur) return;
        t->mins[l][parent] = np;
        oc = cur;
        nc = np;
        idx = parent;
    }
}

/* Deltas on their way up, merged while consecutive updates share ancestors.
 * Writers insert runs of neighbouring slots, so a batch of 64 touches the
 * root once instead of 64 times; that matters beyond the saved adds: every
 * write to a top node takes its cache line away from the samplers on the
 * other cores, which all read it. */
typedef struct {
    uint64_t node[KST_MAX_LEVELS + 1];
    double acc[KST_MAX_LEVELS + 1];
    int active;
} kst_pending;

static inline void kst_pending_flush_level(kst_tree *t, kst_pending *q, uint32_t l)
{
    if (q->acc[l] != 0.0) t->sums[l][q->node[l]] += q->acc[l];
}

static inline void kst_pending_add(kst_tree *t, kst_pending *q, uint64_t idx, double delta)
{
    uint64_t i = idx;
    for (uint32_t l = 1; l <= t->n_levels; l++) {
        i >>= t->shift;
        if (q->active && q->node[l] == i) {
            /* Same ancestor here, hence on every level above too. */
            for (uint32_t u = l; u <= t->n_levels; u++) q->acc[u] += delta;
            return;
        }
        if (q->active) kst_pending_flush_level(t, q, l);
        q->node[l] = i;
        q->acc[l] = delta;
    }
    q->active = 1;
}

static inline void kst_pending_flush(kst_tree *t, kst_pending *q)
{
    if (!q->active) return;
    for (uint32_t l = 1; l <= t->n_levels; l++) kst_pending_flush_level(t, q, l);
    q->active = 0;
}

/* Set one leaf and its min path; its sum delta joins `q` (flush before the
 * sums are read).  One writer at a time: SharedReplay serialises writers with
 * a lock.  p must be finite and >= 0. */
static inline void kst_set_deferred(kst_tree *t, kst_pending *q, uint64_t idx, float p)
{
    float old = t->leaves[idx];
    if (old == p) return;
    t->leaves[idx] = p;
    kst_pending_add(t, q, idx, (double)p - (double)old);
    kst_min_propagate(t, idx, old, p);
}

static inline void kst_set(kst_tree *t, uint64_t idx, float p)
{
    kst_pending q;
    q.active = 0;
    kst_set_deferred(t, &q, idx, p);
    kst_pending_flush(t, &q);
}

/* Batch update in input order (so the last occurrence of an index wins).
 * The caller has validated every index and priority. */
KST_BATCH_FN void kst_update_batch(kst_tree *t, const int64_t *idx, const float *p, int64_t n)
{
    const int64_t ahead = 8;
    kst_pending q;
    q.active = 0;
    for (int64_t k = 0; k < n; k++) {
        if (k + ahead < n) {
            uint64_t f = (uint64_t)idx[k + ahead];
            __builtin_prefetch(t->leaves + f, 1, 1);
            __builtin_prefetch(t->sums[1] + (f >> t->shift), 1, 1);
        }
        kst_set_deferred(t, &q, (uint64_t)idx[k], p[k]);
    }
    kst_pending_flush(t, &q);
}

static inline double kst_total(const kst_tree *t)
{
    double s = t->sums[t->n_levels][0];
    return s > 0.0 ? s : 0.0;
}

static inline float kst_min(const kst_tree *t)
{
    float m = t->mins[t->n_levels][0];
    return isinf(m) ? 0.0f : m;
}

/* Children of `node` (on level l) that are not padding: a descent never enters
 * a padding child, even when a concurrent writer's half-applied update makes a
 * padding entry look positive for a moment. */
static inline uint32_t kst_real_children(const kst_tree *t, uint32_t l, uint64_t node)
{
    uint64_t first = node << t->shift, real = t->real[l - 1];
    if (first >= real) return 0;
    return real - first < t->fanout ? (uint32_t)(real - first) : t->fanout;
}

/* Fallback when a descent hit a residue-only subtree: follow the largest
 * child at every level, which always leads to a positive leaf if one exists. */
static inline int64_t kst_find_largest(const kst_tree *t)
{
    const uint32_t K = t->fanout;
    uint64_t node = 0;
    for (uint32_t l = t->n_levels; l >= 2; l--) {
        uint64_t first = node << t->shift;
        uint64_t best = first;
        double best_mass = t->sums[l - 1][first];
        uint32_t nreal = kst_real_children(t, l, node);
        for (uint32_t j = 1; j < nreal; j++) {
            double m = t->sums[l - 1][first + j];
            if (m > best_mass) { best_mass = m; best = first + j; }
        }
        node = best;
    }
    const float *c = t->leaves + (node << t->shift);
    uint32_t best = 0;
    for (uint32_t j = 1; j < K; j++) if (c[j] > c[best]) best = j;
    if (!(c[best] > 0.0f)) return -1;
    return (int64_t)((node << t->shift) + best);
}

/* Pick the child of `node` (on level l >= 1) whose slice of the node's mass
 * holds `*mass`, subtracting the masses of the children it passes.  Children
 * with no positive mass, and padding children, are never picked; a mass at or
 * past the group's end (rounding, a caller passing total(), or a group caught
 * mid-update by a concurrent writer) goes to the last positive child.
 * Returns the child in 0..K-1, or -1 if the group has no positive child. */
#define KST_PICK_BODY(c)                                             \
    for (uint32_t j = 0; j < nreal; j++) {                           \
        double v = (double)(c)[j];                                   \
        if (v <= 0.0) continue;                                      \
        last = j;                                                    \
        if (m < v) { *mass = m; return j; }                          \
        m -= v;                                                      \
    }                                                                \
    if (last >= 0) *mass = (double)(c)[last];                        \
    return last;

static inline int64_t kst_pick_child(const kst_tree *t, uint32_t l, uint64_t node, double *mass)
{
    const uint32_t nreal = kst_real_children(t, l, node);
    double m = *mass;
    int64_t last = -1;
    if (l >= 2) {
        const double *c = t->sums[l - 1] + (node << t->shift);
        KST_PICK_BODY(c)
    } else {
        const float *c = t->leaves + (node << t->shift);
        KST_PICK_BODY(c)
    }
}
#undef KST_PICK_BODY

static inline void kst_prefetch_group(const kst_tree *t, uint32_t l, uint64_t node)
{
    if (l >= 2) {
        const char *p = (const char *)(t->sums[l - 1] + (node << t->shift));
        uint64_t bytes = (uint64_t)t->fanout * sizeof(double);
        for (uint64_t o = 0; o < bytes && o < 256; o += 64) __builtin_prefetch(p + o, 0, 3);
    } else {
        const char *p = (const char *)(t->leaves + (node << t->shift));
        uint64_t bytes = (uint64_t)t->fanout * sizeof(float);
        for (uint64_t o = 0; o < bytes && o < 256; o += 64) __builtin_prefetch(p + o, 0, 3);
    }
}

/* Descend towards the leaf whose prefix interval holds `mass`.  Children with
 * no positive mass are never entered; a mass at or past the end of a node
 * (rounding, or a caller passing total()) goes to its last positive child.
 * If the path ends in a group without any positive leaf (possible only when
 * inner sums carry a rounding residue of an emptied subtree), fall back to
 * the largest-child path; -1 means the tree holds no positive leaf. */
static inline int64_t kst_find(const kst_tree *t, double mass)
{
    uint64_t node = 0;
    for (uint32_t l = t->n_levels; l >= 1; l--) {
        int64_t j = kst_pick_child(t, l, node, &mass);
        if (j < 0) return kst_find_largest(t);
        node = (node << t->shift) + (uint64_t)j;
    }
    return (int64_t)node;
}

#define KST_BLOCK 16

#define KST_FIND_MANY_BODY(PICK_INNER, PICK_LEAF)                                            \
    uint64_t node[KST_BLOCK];                                                    \
    double mass[KST_BLOCK];                                                      \
    int8_t dead[KST_BLOCK];                                                      \
    for (int64_t start = 0; start < n; start += KST_BLOCK) {                     \
        int64_t b = n - start < KST_BLOCK ? n - start : KST_BLOCK;               \
        for (int64_t k = 0; k < b; k++) {                                        \
            node[k] = 0;                                                         \
            mass[k] = masses[start + k];                                         \
            dead[k] = 0;                                                         \
        }                                                                        \
        for (uint32_t l = t->n_levels; l >= 1; l--) {                            \
            for (int64_t k = 0; k < b; k++) kst_prefetch_group(t, l, node[k]);   \
            for (int64_t k = 0; k < b; k++) {                                    \
                if (dead[k]) continue;                                           \
                int64_t j = l >= 2 ? PICK_INNER(t, l, node[k], &mass[k])        \
                                   : PICK_LEAF(t, 1, node[k], &mass[k]);         \
                if (j < 0) { dead[k] = 1; continue; }                            \
                node[k] = (node[k] << t->shift) + (uint64_t)j;                   \
            }                                                                    \
        }                                                                        \
        for (int64_t k = 0; k < b; k++)                                          \
            out[start + k] = dead[k] ? kst_find_largest(t) : (int64_t)node[k];   \
    }

KST_BATCH_FN void kst_find_many_generic(const kst_tree *t, const double *masses, int64_t *out,
                                        int64_t n)
{
    KST_FIND_MANY_BODY(kst_pick_child, kst_pick_child)
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 \
    && !defined(PAL_NO_MULTIVERSION)
#include <immintrin.h>
#define KST_HAVE_AVX512_K16 1
#define KST_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,popcnt")))

/* Child pick for K = 16 with AVX-512.  The scan above mispredicts its exit
 * once per level and sample, which costs more than the scan itself.  Here
 * the 16 child masses become two vectors of 8 doubles, an in-register prefix
 * sum (3 shift-and-add steps, then the carry) gives the running masses, and
 * the pick is the number of them <= mass: no data-dependent branch (2.5x
 * faster sampling here).  Its additions are associated differently from the
 * scan, so the two can disagree only for a mass within rounding of a child
 * boundary; anything unusual (a tie at an empty child, past the end, a
 * padding child) goes to the scan. */
KST_AVX512 static inline int64_t kst_pick16_avx512(const kst_tree *t, uint32_t l, uint64_t node,
                                                   double *mass)
{
    __m512d lo, hi;
    double mass_of_pick;
    if (l >= 2) {
        const double *c = t->sums[l - 1] + (node << 4);
        lo = _mm512_load_pd(c);
        hi = _mm512_load_pd(c + 8);
    } else {
        __m512 v = _mm512_load_ps(t->leaves + (node << 4));
        lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    }
    const __m512d zero = _mm512_setzero_pd();
    __m512d plo = _mm512_max_pd(lo, zero), phi = _mm512_max_pd(hi, zero);
    const __m512i s1 = _mm512_set_epi64(6, 5, 4, 3, 2, 1, 0, 0);
    const __m512i s2 = _mm512_set_epi64(5, 4, 3, 2, 1, 0, 0, 0);
    const __m512i s4 = _mm512_set_epi64(3, 2, 1, 0, 0, 0, 0, 0);
    plo = _mm512_add_pd(plo, _mm512_maskz_permutexvar_pd(0xFE, s1, plo));
    phi = _mm512_add_pd(phi, _mm512_maskz_permutexvar_pd(0xFE, s1, phi));
    plo = _mm512_add_pd(plo, _mm512_maskz_permutexvar_pd(0xFC, s2, plo));
    phi = _mm512_add_pd(phi, _mm512_maskz_permutexvar_pd(0xFC, s2, phi));
    plo = _mm512_add_pd(plo, _mm512_maskz_permutexvar_pd(0xF0, s4, plo));
    phi = _mm512_add_pd(phi, _mm512_maskz_permutexvar_pd(0xF0, s4, phi));
    phi = _mm512_add_pd(phi, _mm512_permutexvar_pd(_mm512_set1_epi64(7), plo));
    __m512d m = _mm512_set1_pd(*mass);
    uint32_t cnt = (uint32_t)_mm_popcnt_u32(_mm512_cmp_pd_mask(plo, m, _CMP_LE_OQ)) +
                   (uint32_t)_mm_popcnt_u32(_mm512_cmp_pd_mask(phi, m, _CMP_LE_OQ));
    if (cnt < kst_real_children(t, l, node)) {
        double vals[16] __attribute__((aligned(64))), cum[16] __attribute__((aligned(64)));
        _mm512_store_pd(vals, lo);
        _mm512_store_pd(vals + 8, hi);
        mass_of_pick = vals[cnt];
        if (mass_of_pick > 0.0) {
            _mm512_store_pd(cum, plo);
            _mm512_store_pd(cum + 8, phi);
            *mass -= cnt ? cum[cnt - 1] : 0.0;
            return cnt;
        }
    }
    return kst_pick_child(t, l, node, mass);
}

KST_AVX512 static void kst_find_many_k16_avx512(const kst_tree *t, const double *masses,
                                               int64_t *out, int64_t n)
{
    KST_FIND_MANY_BODY(kst_pick16_avx512, kst_pick16_avx512)
}
#endif

/* kst_find for many masses at once.  The descents of a block advance level by
 * level, and each level first prefetches the child groups of the whole block,
 * so the block's cache misses overlap instead of queueing one after another.
 * Same leaves as calling kst_find on each mass (up to rounding ties). */
static inline void kst_find_many(const kst_tree *t, const double *masses, int64_t *out, int64_t n)
{
#ifdef KST_HAVE_AVX512_K16
    static int avx512 = -1;
    if (avx512 < 0) {
        const char *off = getenv("PAL_NO_AVX512");   /* tests compare both paths */
        __builtin_cpu_init();
        avx512 = !(off && off[0] && off[0] != '0') && __builtin_cpu_supports("avx512f") &&
                 __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    }
    if (avx512 && t->fanout == 16) {
        kst_find_many_k16_avx512(t, masses, out, n);
        return;
    }
#endif
    kst_find_many_generic(t, masses, out, n);
}

#endif /* PAL_KSUM_CORE_H */
