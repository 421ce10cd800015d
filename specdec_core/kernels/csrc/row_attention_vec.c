/* Row attention's vector kernels (row_attention.h), AVX2 and AVX-512: scores of a tile's keys for
 * several queries, and a tile's weighted values added to several outputs. Their own file so that
 * row_attention.c reads as the algorithm (groups, tiles, online softmax); the bits each output
 * gets, and why they do not depend on the set or the rows beside it, are that file's docstring. */
#include "row_attention.h"

#if defined(__x86_64__) || defined(__i386__)

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>

#include "avx2_common.h"

/* 4 keys' scores from their chains: x_c = (chains 0-7 of key c) + (chains 8-15), then a fixed
 * tree. Every vector path ends a key's dot product here. */
INLINE __m128 reduce4(__m256 x0, __m256 x1, __m256 x2, __m256 x3) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(x0, x1), _mm256_hadd_ps(x2, x3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* One query: both halves of the 4 keys' chains in one pass (8 accumulators). */
static void scores_avx2_1(const float *const *qs, const float *const *krow, int d, float *const *s, int n) {
    const float *q = qs[0];
    for (int c = 0; c < n; c += 4) {
        const float *k0 = krow[c], *k1 = krow[c + 1], *k2 = krow[c + 2], *k3 = krow[c + 3];
        __m256 a[8];
        for (int x = 0; x < 8; x++) a[x] = _mm256_setzero_ps();
        for (int i = 0; i < d; i += 16) {
            const __m256 qa = _mm256_loadu_ps(q + i), qb = _mm256_loadu_ps(q + i + 8);
            a[0] = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k0 + i), a[0]);
            a[1] = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k1 + i), a[1]);
            a[2] = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k2 + i), a[2]);
            a[3] = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k3 + i), a[3]);
            a[4] = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k0 + i + 8), a[4]);
            a[5] = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k1 + i + 8), a[5]);
            a[6] = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k2 + i + 8), a[6]);
            a[7] = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k3 + i + 8), a[7]);
        }
        _mm_storeu_ps(s[0] + c, reduce4(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[1], a[5]),
                                        _mm256_add_ps(a[2], a[6]), _mm256_add_ps(a[3], a[7])));
    }
}

/* Two queries: each key loaded once for both. The chains of dims 0-7 (mod 16) run first, then
 * those of dims 8-15, so that 8 accumulators fit the 16 registers. */
static void scores_avx2_2(const float *const *q, const float *const *krow, int d, float *const *s, int n) {
    for (int c = 0; c < n; c += 4) {
        const float *const *k = krow + c;
        __m256 lo[2][4], a[2][4];
        for (int half = 0; half < 2; half++) {
            for (int p = 0; p < 2; p++)
                for (int kk = 0; kk < 4; kk++) a[p][kk] = _mm256_setzero_ps();
            for (int i = 8 * half; i < d; i += 16) {
                const __m256 q0 = _mm256_loadu_ps(q[0] + i), q1 = _mm256_loadu_ps(q[1] + i);
                for (int kk = 0; kk < 4; kk++) {
                    __m256 kv = _mm256_loadu_ps(k[kk] + i);
                    __asm__("" : "+x"(kv)); /* one load, not one folded into each query's multiply-add */
                    a[0][kk] = _mm256_fmadd_ps(q0, kv, a[0][kk]);
                    a[1][kk] = _mm256_fmadd_ps(q1, kv, a[1][kk]);
                }
            }
            if (half == 0)
                for (int p = 0; p < 2; p++)
                    for (int kk = 0; kk < 4; kk++) lo[p][kk] = a[p][kk];
        }
        for (int p = 0; p < 2; p++)
            _mm_storeu_ps(s[p] + c, reduce4(_mm256_add_ps(lo[p][0], a[p][0]), _mm256_add_ps(lo[p][1], a[p][1]),
                                            _mm256_add_ps(lo[p][2], a[p][2]), _mm256_add_ps(lo[p][3], a[p][3])));
    }
}

/* acc_p[i .. i + 8 W) += e_p[c] * value_c[i ..] for c in [c0, c1) in key order, for P outputs
 * (one load of a value serves them all), the accumulators in registers. */
INLINE void values_avx2(const float *const *vrow, int c0, int c1, const float *const *e, float *const *acc, int i,
                        const int P, const int W) {
    __m256 o[2][8];
    for (int p = 0; p < P; p++)
        for (int b = 0; b < W; b++) o[p][b] = _mm256_load_ps(acc[p] + i + 8 * b);
    for (int c = c0; c < c1; c++) {
        const float *v = vrow[c] + i;
        __m256 vv[8];
        for (int b = 0; b < W; b++) vv[b] = _mm256_loadu_ps(v + 8 * b);
        for (int p = 0; p < P; p++) {
            const __m256 ec = _mm256_set1_ps(e[p][c]);
            for (int b = 0; b < W; b++) o[p][b] = _mm256_fmadd_ps(ec, vv[b], o[p][b]);
        }
    }
    for (int p = 0; p < P; p++)
        for (int b = 0; b < W; b++) _mm256_store_ps(acc[p] + i + 8 * b, o[p][b]);
}

static void values_avx2_1(const float *const *vrow, int c0, int c1, const float *const *e, float *const *acc, int d) {
    if (d % 64 == 0)
        for (int i = 0; i < d; i += 64) values_avx2(vrow, c0, c1, e, acc, i, 1, 8);
    else
        for (int i = 0; i < d; i += 16) values_avx2(vrow, c0, c1, e, acc, i, 1, 2);
}

static void values_avx2_2(const float *const *vrow, int c0, int c1, const float *const *e, float *const *acc, int d) {
    if (d % 32 == 0)
        for (int i = 0; i < d; i += 32) values_avx2(vrow, c0, c1, e, acc, i, 2, 4);
    else
        for (int i = 0; i < d; i += 16) values_avx2(vrow, c0, c1, e, acc, i, 2, 2);
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma")
/* The AVX-512 forms: a 16-lane register holds a key's 16 chains (the AVX2 path's two registers
 * side by side), and the final sum adds its two halves as the AVX2 path adds its registers. */
static inline __attribute__((always_inline)) void scores_512(const float *const *q, const float *const *krow, int d,
                                                             float *const *s, int n, const int P) {
    for (int c = 0; c < n; c += 4) {
        const float *const *k = krow + c;
        __m512 a[4][4];
        for (int p = 0; p < P; p++)
            for (int kk = 0; kk < 4; kk++) a[p][kk] = _mm512_setzero_ps();
        for (int i = 0; i < d; i += 16) {
            __m512 qv[4];
            for (int p = 0; p < P; p++) qv[p] = _mm512_loadu_ps(q[p] + i);
            for (int kk = 0; kk < 4; kk++) {
                const __m512 kv = _mm512_loadu_ps(k[kk] + i);
                for (int p = 0; p < P; p++) a[p][kk] = _mm512_fmadd_ps(qv[p], kv, a[p][kk]);
            }
        }
        for (int p = 0; p < P; p++) {
            __m256 x[4];
            for (int kk = 0; kk < 4; kk++)
                x[kk] = _mm256_add_ps(_mm512_castps512_ps256(a[p][kk]), _mm512_extractf32x8_ps(a[p][kk], 1));
            _mm_storeu_ps(s[p] + c, reduce4(x[0], x[1], x[2], x[3]));
        }
    }
}

static inline __attribute__((always_inline)) void values_512(const float *const *vrow, int c0, int c1,
                                                             const float *const *e, float *const *acc, int i,
                                                             const int P, const int W) {
    __m512 o[4][4];
    for (int p = 0; p < P; p++)
        for (int b = 0; b < W; b++) o[p][b] = _mm512_load_ps(acc[p] + i + 16 * b);
    for (int c = c0; c < c1; c++) {
        const float *v = vrow[c] + i;
        __m512 vv[4];
        for (int b = 0; b < W; b++) vv[b] = _mm512_loadu_ps(v + 16 * b);
        for (int p = 0; p < P; p++) {
            const __m512 ec = _mm512_set1_ps(e[p][c]);
            for (int b = 0; b < W; b++) o[p][b] = _mm512_fmadd_ps(ec, vv[b], o[p][b]);
        }
    }
    for (int p = 0; p < P; p++)
        for (int b = 0; b < W; b++) _mm512_store_ps(acc[p] + i + 16 * b, o[p][b]);
}

static void scores_512_1(const float *const *q, const float *const *krow, int d, float *const *s, int n) {
    scores_512(q, krow, d, s, n, 1);
}
static void scores_512_4(const float *const *q, const float *const *krow, int d, float *const *s, int n) {
    scores_512(q, krow, d, s, n, 4);
}
#define VALUES_512(P)                                                                                             \
    static void values_512_##P(const float *const *vrow, int c0, int c1, const float *const *e, float *const *acc, \
                               int d) {                                                                           \
        if (d % 64 == 0)                                                                                          \
            for (int i = 0; i < d; i += 64) values_512(vrow, c0, c1, e, acc, i, P, 4);                            \
        else if (d % 32 == 0)                                                                                     \
            for (int i = 0; i < d; i += 32) values_512(vrow, c0, c1, e, acc, i, P, 2);                            \
        else                                                                                                      \
            for (int i = 0; i < d; i += 16) values_512(vrow, c0, c1, e, acc, i, P, 1);                            \
    }
VALUES_512(1)
VALUES_512(4)
#undef VALUES_512
#pragma GCC pop_options

const vec_kernels sd_attend_avx2 = {2, 2, scores_avx2_2, scores_avx2_1, values_avx2_2, values_avx2_1};
const vec_kernels sd_attend_avx512 = {4, 4, scores_512_4, scores_512_1, values_512_4, values_512_1};
#endif
