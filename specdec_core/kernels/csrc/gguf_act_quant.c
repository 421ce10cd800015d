/* Activation rows quantized for the block kernels: one scale per 32 values, 8 bits (and 16 for
 * SD_ACT16, at the end of the file).
 *
 * Why a file of its own, with an AVX2 copy: every GEMM call quantizes its M input rows on the
 * calling thread before the parts start, so a row's quantization is serial work in every linear
 * layer. The portable loop took ~3.4 ns a value on the 2-core AVX2 dev machine (its `fmaxf` was
 * a libm call per value), ~1.3 ms a row per 1.5B forward, a seventh of what one more verified
 * row costs; the AVX2 copy runs the same arithmetic 8 values at a time.
 *
 * Both produce the same bytes for every input (tests compare them): the scale is the exact
 * max |v| of the 32 values (NaN ignored, as fmaxf does), each value is v * (127 / amax) rounded
 * half to even with the add-and-subtract of 1.5 * 2^23 in float32 (no FMA contraction: the
 * library is built with -ffp-contract=off), clamped to [-127, 127]; the sums are exact integers. */
#include <math.h>
#include <string.h>

#include "gguf_kernels.h"

#define ROUND_MAGIC 12582912.0f /* 1.5 * 2^23: adding and subtracting it rounds |v| < 2^22 to even */

/* Round half to even for |v| < 2^22, exactly as the FPU's default mode; vectorises everywhere. */
static inline int round_ne(float v) { return (int)((v + ROUND_MAGIC) - ROUND_MAGIC); }

/* max |v| / qmax, and qmax / max |v| in *id (0 for an all-zero block). */
static float block_scale(const float *v, int n, float qmax, float *id) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        const float a = fabsf(v[i]);
        amax = a > amax ? a : amax; /* fmaxf's result (amax is never NaN), without its libm call */
    }
    *id = amax > 0.0f ? qmax / amax : 0.0f;
    return amax / qmax;
}

static inline int8_t quant(float v, float id) {
    int q = round_ne(v * id);
    return (int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
}

/* Sub-block s's sums into y, from the sums of its two halves (d32[s] already set): the one
 * place both quantizers store them. */
static inline void store_sums_k(act_k *y, int s, int lo, int hi) {
    y->bsum16[2 * s] = (int16_t)lo;
    y->bsum16[2 * s + 1] = (int16_t)hi;
    y->bsum32[s] = (int16_t)(lo + hi);
    y->s32[s] = y->d32[s] * (float)y->bsum32[s];
}

/* The same for a 32-block (d already set). */
static inline void store_sum_32(act_32 *y, int sum) {
    y->sum = sum;
    y->s = y->d * (float)sum;
}

static int sum_i8(const int8_t *q, int n) {
    int sum = 0;
    for (int i = 0; i < n; i++) sum += q[i];
    return sum;
}

static void quantize_row_k_portable(const float *x, int64_t k, act_k *y) {
    for (int64_t b = 0; b < k / QK_K; b++) {
        const float *v = x + b * QK_K;
        for (int s = 0; s < 8; s++) {
            float id;
            y[b].d32[s] = block_scale(v + 32 * s, 32, 127.0f, &id);
            for (int i = 32 * s; i < 32 * s + 32; i++) y[b].qs[i] = quant(v[i], id);
            store_sums_k(&y[b], s, sum_i8(y[b].qs + 32 * s, 16), sum_i8(y[b].qs + 32 * s + 16, 16));
        }
    }
}

static void quantize_row_32_portable(const float *x, int64_t k, act_32 *y) {
    for (int64_t b = 0; b < k / QK32; b++) {
        const float *v = x + b * QK32;
        float id;
        y[b].d = block_scale(v, QK32, 127.0f, &id);
        for (int i = 0; i < QK32; i++) y[b].qs[i] = quant(v[i], id);
        store_sum_32(&y[b], sum_i8(y[b].qs, QK32));
    }
}

#if defined(__x86_64__) || defined(__i386__)
/* AVX2 for this section only: the dispatcher below also runs where the portable code must */
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

static inline __attribute__((always_inline)) int hsum_epi32(__m256i s) {
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
    return _mm_cvtsi128_si32(h);
}

/* 32 values to 32 int8 at q; returns their scale d (= amax / 127); sum16 gets the exact sums of
 * the first and the last 16 int8 values. */
static inline __attribute__((always_inline)) float quant32_avx2(const float *v, int8_t *q, int sum16[2]) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 x[4];
    __m256 amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        x[i] = _mm256_loadu_ps(v + 8 * i);
        amax = _mm256_max_ps(_mm256_andnot_ps(sign, x[i]), amax); /* NaN lanes keep amax, as fmaxf */
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float a = _mm_cvtss_f32(m);
    const float id = a > 0.0f ? 127.0f / a : 0.0f;
    const __m256 vid = _mm256_set1_ps(id), magic = _mm256_set1_ps(ROUND_MAGIC);
    const __m256i hi = _mm256_set1_epi32(127), lo = _mm256_set1_epi32(-127);
    __m256i r[4];
    for (int i = 0; i < 4; i++) {
        const __m256 t = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(x[i], vid), magic), magic);
        r[i] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvttps_epi32(t), hi), lo);
    }
    /* packs interleave 128-bit lanes (values 0-3, 8-11, 16-19, 24-27, 4-7, ...): one permute restores order */
    const __m256i p8 = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
    _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    sum16[0] = hsum_epi32(_mm256_add_epi32(r[0], r[1]));
    sum16[1] = hsum_epi32(_mm256_add_epi32(r[2], r[3]));
    return a / 127.0f;
}

static void quantize_row_k_avx2(const float *x, int64_t k, act_k *y) {
    for (int64_t b = 0; b < k / QK_K; b++) {
        for (int s = 0; s < 8; s++) {
            int sum16[2];
            y[b].d32[s] = quant32_avx2(x + b * QK_K + 32 * s, y[b].qs + 32 * s, sum16);
            store_sums_k(&y[b], s, sum16[0], sum16[1]);
        }
    }
}

static void quantize_row_32_avx2(const float *x, int64_t k, act_32 *y) {
    for (int64_t b = 0; b < k / QK32; b++) {
        int sum16[2];
        y[b].d = quant32_avx2(x + b * QK32, y[b].qs, sum16);
        store_sum_32(&y[b], sum16[0] + sum16[1]);
    }
}
#pragma GCC pop_options
#endif

/* Bytes of one quantized row of k values: act_k blocks when kq, else act_32. */
int64_t sd_act_row_bytes(int kq, int64_t k) {
    return kq ? (k / QK_K) * (int64_t)sizeof(act_k) : (k / QK32) * (int64_t)sizeof(act_32);
}

/* Row r of x (ldx floats apart) to act + r * stride, for r < m: act_k blocks when kq, else act_32. */
void sd_quantize_rows(int kq, const float *x, int64_t k, int64_t m, int64_t ldx, uint8_t *act, int64_t stride) {
    const int portable = sd_use_scalar();
    for (int64_t r = 0; r < m; r++) {
        const float *row = x + r * ldx;
        uint8_t *dst = act + r * stride;
#if defined(__x86_64__) || defined(__i386__)
        if (!portable) {
            if (kq) quantize_row_k_avx2(row, k, (act_k *)dst);
            else quantize_row_32_avx2(row, k, (act_32 *)dst);
            continue;
        }
#endif
        if (kq) quantize_row_k_portable(row, k, (act_k *)dst);
        else quantize_row_32_portable(row, k, (act_32 *)dst);
    }
}

/* SD_ACT16 (Q8_0 made at load, gguf_q8_0_act16.c): per 32 values, d = max |v| / 32767 and each
 * value rounded as above to [-32767, 32767]. One portable loop for every kernel set: it is a
 * small part of a 16-bit-activation GEMM, whose products cost more than the 8-bit ones. */
int64_t sd_act16_row_bytes(int64_t k) { return k / QK32 * (int64_t)sizeof(act_16); }

void sd_quantize_rows16(const float *x, int64_t k, int64_t m, int64_t ldx, uint8_t *act, int64_t stride) {
    for (int64_t r = 0; r < m; r++) {
        act_16 *y = (act_16 *)(act + r * stride);
        for (int64_t b = 0; b < k / QK32; b++) {
            const float *v = x + r * ldx + b * QK32;
            float id;
            y[b].d = block_scale(v, QK32, 32767.0f, &id);
            for (int i = 0; i < QK32; i++) {
                const int q = round_ne(v[i] * id);
                y[b].qs[i] = (int16_t)(q > 32767 ? 32767 : q < -32767 ? -32767 : q);
            }
        }
    }
}
