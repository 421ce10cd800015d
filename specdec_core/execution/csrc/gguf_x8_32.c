/* Q4_0, Q5_0 and Q8_0 for AVX2, repacked at load 8 weight rows (output columns) at a time, like
 * Q4_K in gguf_x8.c: a register holds 4 consecutive values of 8 columns and the 4 matching
 * activation bytes are broadcast, so vpmaddubsw yields 8 columns' partial sums at once. The
 * repacked bytes equal the file's (8 fp16 scales, then the quants re-ordered).
 *
 * Group-block of 8 columns x 32 values (one block of each column):
 *   d[8]          the columns' fp16 scales
 *   Q4_0 / Q5_0:  qs[4][32]  [register p][4 * column + i]: low nibble value 4p + i, high nibble
 *                            value 16 + 4p + i, unsigned (0..15 / 0..31)
 *                 qh[32]     Q5_0 only: bit u of byte 4 * column + i = fifth bit of value 4u + i
 *   Q8_0:         qs[8][32]  [step u][4 * column + i]: value 4u + i, int8
 * The unsigned formats sum 4 steps in int16 (4 x 2 x 31 x 127 = 31496 < 32767) and take off
 * their offset (8 or 16) times the activation block's exact sum; Q8_0 multiplies |w| by the
 * activation with w's sign (vpsignb), pairs exact in int16. */
#include <string.h>

#include "gguf_kernels.h"

static int64_t group_bytes(int type) {
    switch (type) {
    case T_Q4_0: return 16 + 128;
    case T_Q5_0: return 16 + 128 + 32;
    case T_Q8_0: return 16 + 256;
    default: return 0;
    }
}

int64_t sd_gguf_x8_32_bytes(int type, int64_t n, int64_t k) {
    if (!group_bytes(type) || k <= 0 || k % QK32 || n <= 0) return 0;
    return (n + 7) / 8 * (k / QK32) * group_bytes(type);
}

void sd_gguf_x8_32_pack(int type, const uint8_t *raw, int64_t n, int64_t k, uint8_t *dst, int64_t g0, int64_t g1) {
    const int64_t nb = k / QK32, gb = group_bytes(type);
    const int64_t raw_bsize = type == T_Q4_0 ? 18 : type == T_Q5_0 ? 22 : 34;
    for (int64_t g = g0; g < g1; g++) {
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *x = dst + (g * nb + b) * gb;
            memset(x, 0, (size_t)gb);
            for (int c = 0; c < 8 && g * 8 + c < n; c++) {
                const uint8_t *blk = raw + ((g * 8 + c) * nb + b) * raw_bsize;
                memcpy(x + 2 * c, blk, 2);
                if (type == T_Q8_0) { /* value 4u + i to [u][4 c + i] */
                    for (int u = 0; u < 8; u++) memcpy(x + 16 + 32 * u + 4 * c, blk + 2 + 4 * u, 4);
                    continue;
                }
                /* the file's byte v holds values v (low nibble) and 16 + v (high): [p][4 c + i] is byte 4 p + i */
                const uint8_t *qs = blk + (type == T_Q5_0 ? 6 : 2);
                for (int p = 0; p < 4; p++) memcpy(x + 16 + 32 * p + 4 * c, qs + 4 * p, 4);
                if (type == T_Q5_0) { /* bit u of byte 4 c + i: the fifth bit of value 4 u + i */
                    uint32_t qh;
                    memcpy(&qh, blk + 2, 4);
                    for (int i = 0; i < 4; i++) {
                        uint8_t bits = 0;
                        for (int u = 0; u < 8; u++) bits |= (uint8_t)(((qh >> (4 * u + i)) & 1) << u);
                        x[16 + 128 + 4 * c + i] = bits;
                    }
                }
            }
        }
    }
}

#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "gguf_x8_common.h"

#define ROLLED _Pragma("GCC unroll 1") /* unrolled, gcc computes every product first and spills them */

static inline __attribute__((always_inline)) void x8_32_tile(const int type, const uint8_t *w, int nb, const uint8_t *act,
                                                             size_t stride, const int R, float *out, size_t ldo, int ncols) {
    const int64_t gb = group_bytes(type);
    const __m256i m4 = _mm256_set1_epi8(0x0F), one8 = _mm256_set1_epi8(1), ones = _mm256_set1_epi16(1);
    const int offset = type == T_Q4_0 ? 8 : 16;
    __m256 acc[6];
    UNROLL
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *x = w + b * gb;
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x));
        __m256i isum[6];
        UNROLL
        for (int r = 0; r < R; r++) isum[r] = _mm256_setzero_si256();
        if (type == T_Q8_0) {
            ROLLED
            for (int u = 0; u < 8; u++) {
                const __m256i q = _mm256_loadu_si256((const __m256i *)(x + 16 + 32 * u));
                const __m256i qabs = _mm256_sign_epi8(q, q);
                UNROLL
                for (int r = 0; r < R; r++) {
                    const int8_t *aq = ((const act_32 *)(act + r * stride) + b)->qs + 4 * u;
                    const __m256i p = _mm256_maddubs_epi16(qabs, _mm256_sign_epi8(bcast4(aq), q));
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, ones));
                }
            }
        } else {
            const __m256i qh = type == T_Q5_0 ? _mm256_loadu_si256((const __m256i *)(x + 16 + 128)) : _mm256_setzero_si256();
            __m256i acc16[6];
            UNROLL
            for (int r = 0; r < R; r++) acc16[r] = _mm256_setzero_si256();
            ROLLED
            for (int p = 0; p < 4; p++) { /* steps p and p + 4: values 4p.. and 16 + 4p.. */
                const __m256i packed = _mm256_loadu_si256((const __m256i *)(x + 16 + 32 * p));
                __m256i lo = _mm256_and_si256(packed, m4), hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), m4);
                if (type == T_Q5_0) {
                    const __m128i shift_lo = _mm_cvtsi32_si128(p), shift_hi = _mm_cvtsi32_si128(p + 4);
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, shift_lo), one8), 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, shift_hi), one8), 4));
                }
                UNROLL
                for (int r = 0; r < R; r++) {
                    const int8_t *aq = ((const act_32 *)(act + r * stride) + b)->qs + 4 * p;
                    acc16[r] = _mm256_add_epi16(acc16[r], _mm256_maddubs_epi16(lo, bcast4(aq)));
                    acc16[r] = _mm256_add_epi16(acc16[r], _mm256_maddubs_epi16(hi, bcast4(aq + 16)));
                    if (p == 1) { /* 4 products summed: move them to int32 before they could overflow */
                        isum[r] = _mm256_madd_epi16(acc16[r], ones);
                        acc16[r] = _mm256_setzero_si256();
                    }
                }
            }
            UNROLL
            for (int r = 0; r < R; r++) {
                const act_32 *a = (const act_32 *)(act + r * stride) + b;
                isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(acc16[r], ones));
                isum[r] = _mm256_sub_epi32(isum[r], _mm256_set1_epi32(offset * a->sum));
            }
        }
        UNROLL
        for (int r = 0; r < R; r++) {
            const act_32 *a = (const act_32 *)(act + r * stride) + b;
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(d, _mm256_set1_ps(a->d)), acc[r]);
        }
    }
    x8_store(acc, R, out, ldo, ncols);
}

#define X8_TILES(name, type)                                                                                  \
    static void name##_1(X8_ARGS) { x8_32_tile(type, w, nb, act, stride, 1, out, ldo, ncols); }              \
    static void name##_2(X8_ARGS) { x8_32_tile(type, w, nb, act, stride, 2, out, ldo, ncols); }              \
    static void name##_3(X8_ARGS) { x8_32_tile(type, w, nb, act, stride, 3, out, ldo, ncols); }              \
    static void name##_4(X8_ARGS) { x8_32_tile(type, w, nb, act, stride, 4, out, ldo, ncols); }              \
    static void name##_5(X8_ARGS) { x8_32_tile(type, w, nb, act, stride, 5, out, ldo, ncols); }              \
    static void name##_6(X8_ARGS) { x8_32_tile(type, w, nb, act, stride, 6, out, ldo, ncols); }              \
    static void name(const uint8_t *w, int nb, const uint8_t *act, size_t stride, int rows, float *out,       \
                     size_t ldo, int ncols) {                                                                 \
        static void (*const tiles[6])(X8_ARGS) = {name##_1, name##_2, name##_3, name##_4, name##_5, name##_6}; \
        tiles[(rows < 1 ? 1 : rows > X8_ROW_TILE ? X8_ROW_TILE : rows) - 1](w, nb, act, stride, out, ldo, ncols); \
    }
X8_TILES(x8_q4_0, T_Q4_0)
X8_TILES(x8_q5_0, T_Q5_0)
X8_TILES(x8_q8_0, T_Q8_0)

group_fn sd_x8_32_tile(int type) {
    return type == T_Q4_0 ? x8_q4_0 : type == T_Q5_0 ? x8_q5_0 : type == T_Q8_0 ? x8_q8_0 : NULL;
}
#endif
