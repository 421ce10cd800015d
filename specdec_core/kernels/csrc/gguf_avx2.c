/* AVX2 + FMA tiles. The weight bytes of a block are unpacked once and multiplied into up to
 * ROW_TILE activation rows (vpmaddubsw: unsigned 4/5/6-bit weights or |int8| times signed int8
 * activations, pairs exact in int16; vpmaddwd with the sub-block scales, exact in int32); one FMA
 * per 32-value activation block and row folds the integer sum into a float accumulator (Q6_K
 * first gathers a super-block's eight integer block sums into the lanes of one register). Each row's instruction
 * sequence is the same for every tile size (R is a compile-time constant per instantiation and the
 * per-row code does not depend on it), so a row's result does not depend on the other rows. */
#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#include <string.h>

#include "gguf_kernels.h"

#include "avx2_common.h"

#define ROW(type, r) ((const type *)(act + (size_t)(r) * stride))

INLINE float h2f(uint16_t h) { return _cvtsh_ss(h); }

/* 0xFF in byte i where bit i of the 32-bit word at p is set (ggml's bytes_from_bits_32). */
INLINE __m256i bits_to_bytes(const uint8_t *p) {
    uint32_t x32;
    memcpy(&x32, p, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x32), shuf);
    bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

/* The 32 values of a Q4_0/Q4_1/Q5_0/Q5_1 block as bytes in element order (0..15 or 0..31). */
INLINE __m256i unpack32(const uint8_t *qs, const uint8_t *qh) {
    const __m128i tmp = _mm_loadu_si128((const __m128i *)qs);
    __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(tmp, 4), tmp), _mm256_set1_epi8(0x0F));
    if (qh) q = _mm256_or_si256(q, _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10)));
    return q;
}

/* One block of 32: weights (unsigned, or signed when `offset` is subtracted) against act_32 rows. */
INLINE void tile32(int type, const uint8_t *w, int nb, const uint8_t *act, size_t stride, const int R,
                   float *out, size_t ldo) {
    const size_t bsize = type == T_Q4_0 ? sizeof(blk_q4_0) : type == T_Q4_1 ? sizeof(blk_q4_1)
                       : type == T_Q5_0 ? sizeof(blk_q5_0) : type == T_Q5_1 ? sizeof(blk_q5_1) : sizeof(blk_q8_0);
    const int has_min = type == T_Q4_1 || type == T_Q5_1;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[ROW_TILE];
    float summ[ROW_TILE];
    UNROLL
    for (int r = 0; r < R; r++) { acc[r] = _mm256_setzero_ps(); summ[r] = 0.0f; }
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * bsize;
        uint16_t d16, m16 = 0;
        memcpy(&d16, blk, 2);
        if (has_min) memcpy(&m16, blk + 2, 2);
        const float d = h2f(d16), m = h2f(m16);
        __m256i q; /* signed weights for Q8_0/Q4_0/Q5_0, unsigned for Q4_1/Q5_1 */
        switch (type) {
        case T_Q8_0: q = _mm256_loadu_si256((const __m256i *)(blk + 2)); break;
        case T_Q4_0: q = _mm256_sub_epi8(unpack32(blk + 2, NULL), _mm256_set1_epi8(8)); break;
        case T_Q5_0: q = _mm256_sub_epi8(unpack32(blk + 6, blk + 2), _mm256_set1_epi8(16)); break;
        case T_Q4_1: q = unpack32(blk + 4, NULL); break;
        default: q = unpack32(blk + 8, blk + 4); break;
        }
        const __m256i qabs = has_min ? q : _mm256_sign_epi8(q, q);
        UNROLL
        for (int r = 0; r < R; r++) {
            const act_32 *a = ROW(act_32, r) + b;
            __m256i av = _mm256_loadu_si256((const __m256i *)a->qs);
            if (!has_min) av = _mm256_sign_epi8(av, q);
            const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(qabs, av), ones);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d * a->d), acc[r]);
            if (has_min) summ[r] += m * a->s;
        }
    }
    UNROLL
    for (int r = 0; r < R; r++) out[r * ldo] = hsum8(acc[r]) + summ[r];
}

/* Q4_K / Q5_K: sc/min unpacked with ggml's mask trick; bytes 0..7 scales, 8..15 mins. */
INLINE void tile_k45(const int five, const uint8_t *w, int nb, const uint8_t *act, size_t stride, const int R,
                     float *out, size_t ldo) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    const size_t bsize = five ? sizeof(blk_q5_K) : sizeof(blk_q4_K);
    __m256 acc[ROW_TILE];
    UNROLL
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * bsize;
        const blk_q4_K *x4 = (const blk_q4_K *)blk;
        const uint8_t *qs = five ? ((const blk_q5_K *)blk)->qs : x4->qs;
        uint32_t u0, u1, u2;
        memcpy(&u0, x4->scales, 4);
        memcpy(&u1, x4->scales + 4, 4);
        memcpy(&u2, x4->scales + 8, 4);
        /* in registers, not through a stack array: four 32-bit stores read back as one 128-bit
         * load would miss store-to-load forwarding */
        const __m128i sm = _mm_set_epi32((int)(((u2 >> 4) & 0x0f0f0f0f) | (((u1 >> 6) & 0x03030303) << 4)),
                                         (int)(u1 & 0x3f3f3f3f),
                                         (int)((u2 & 0x0f0f0f0f) | (((u0 >> 6) & 0x03030303) << 4)),
                                         (int)(u0 & 0x3f3f3f3f));
        const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm)); /* sc0..7 as int16, both lanes */
        const __m256 mins = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8)));
        const float d = h2f(x4->d), dmin = h2f(x4->dmin);
        __m256i hbits = five ? _mm256_loadu_si256((const __m256i *)((const blk_q5_K *)blk)->qh) : _mm256_setzero_si256();
        UNROLL
        for (int j = 0; j < 4; j++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            __m256i qlo = _mm256_and_si256(bits, m4), qhi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            if (five) {
                qlo = _mm256_or_si256(qlo, _mm256_slli_epi16(_mm256_and_si256(hbits, one), 4));
                qhi = _mm256_or_si256(qhi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 1), one), 4));
                hbits = _mm256_srli_epi16(hbits, 2);
            }
            const __m256i slo = _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)(0x0100 + 0x0404 * j)));
            const __m256i shi = _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)(0x0302 + 0x0404 * j)));
            UNROLL
            for (int r = 0; r < R; r++) {
                const act_k *a = ROW(act_k, r) + b;
                const int8_t *aq = a->qs + 64 * j;
                const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(qlo, _mm256_loadu_si256((const __m256i *)aq)), slo);
                const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(qhi, _mm256_loadu_si256((const __m256i *)(aq + 32))), shi);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(d * a->d32[2 * j]), acc[r]);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_set1_ps(d * a->d32[2 * j + 1]), acc[r]);
            }
        }
        UNROLL
        for (int r = 0; r < R; r++) { /* the mins, lane s: m[s] * d32[s] * sum of the sub-block */
            const act_k *a = ROW(act_k, r) + b;
            acc[r] = _mm256_fnmadd_ps(_mm256_mul_ps(mins, _mm256_loadu_ps(a->s32)), _mm256_set1_ps(dmin), acc[r]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++) out[r * ldo] = hsum8(acc[r]);
}

/* Q6_K: 6-bit unsigned q (the -32 comes back through the exact activation sums), one int8 scale
 * per 16 values: the low 128-bit lane of a 32-value group uses scale 2g, the high lane 2g+1. */
INLINE void tile_q6k(const uint8_t *w, int nb, const uint8_t *act, size_t stride, const int R, float *out, size_t ldo) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m256 acc[ROW_TILE];
    UNROLL
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const blk_q6_K *x = (const blk_q6_K *)w + b;
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)x->scales);
        const float d = h2f(x->d);
        __m256i part[2][ROW_TILE]; /* per half and row: [values 0-15 | 16-31] sums of the 4 groups */
        UNROLL
        for (int h = 0; h < 2; h++) {
            const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h));
            const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
            q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
            const __m256i half = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(h ? _mm_srli_si128(sc8, 8) : sc8));
            __m256i scale[4];
            UNROLL
            for (int g = 0; g < 4; g++)
                scale[g] = _mm256_shuffle_epi8(half, _mm256_set_m128i(_mm_set1_epi16((short)(0x0302 + 0x0404 * g)),
                                                                      _mm_set1_epi16((short)(0x0100 + 0x0404 * g))));
            UNROLL
            for (int r = 0; r < R; r++) {
                const int8_t *aq = (ROW(act_k, r) + b)->qs + 128 * h;
                __m256i p[4];
                UNROLL
                for (int g = 0; g < 4; g++)
                    p[g] = _mm256_madd_epi16(_mm256_maddubs_epi16(q[g], _mm256_loadu_si256((const __m256i *)(aq + 32 * g))), scale[g]);
                part[h][r] = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
            }
        }
        /* lane t = the exact integer sum of 32-value block t (4h + g), minus 32 * sum_s sc[s] * bsum16[s]
         * over its two scale groups; then one float step per lane with that block's activation scale */
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        const __m256 dv = _mm256_set1_ps(d);
        UNROLL
        for (int r = 0; r < R; r++) {
            const act_k *a = ROW(act_k, r) + b;
            __m256i s = _mm256_add_epi32(_mm256_permute2x128_si256(part[0][r], part[1][r], 0x20),
                                         _mm256_permute2x128_si256(part[0][r], part[1][r], 0x31));
            const __m256i off = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)a->bsum16));
            s = _mm256_sub_epi32(s, _mm256_slli_epi32(off, 5));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(_mm256_loadu_ps(a->d32), dv), acc[r]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++) out[r * ldo] = hsum8(acc[r]);
}

/* One instantiation per (format, tile size): R is a constant inside each. */
#define DEFINE_TILES(name, call)                                                                                \
    static void name##_1(const uint8_t *w, int nb, const uint8_t *act, size_t stride, float *out, size_t ldo) { call(1); } \
    static void name##_2(const uint8_t *w, int nb, const uint8_t *act, size_t stride, float *out, size_t ldo) { call(2); } \
    static void name##_3(const uint8_t *w, int nb, const uint8_t *act, size_t stride, float *out, size_t ldo) { call(3); } \
    static void name##_4(const uint8_t *w, int nb, const uint8_t *act, size_t stride, float *out, size_t ldo) { call(4); } \
    static void name(const uint8_t *w, int nb, const uint8_t *act, size_t stride, int rows, float *out, size_t ldo) { \
        switch (rows) {                                                                                         \
        case 1: name##_1(w, nb, act, stride, out, ldo); break;                                                  \
        case 2: name##_2(w, nb, act, stride, out, ldo); break;                                                  \
        case 3: name##_3(w, nb, act, stride, out, ldo); break;                                                  \
        default: name##_4(w, nb, act, stride, out, ldo); break;                                                 \
        }                                                                                                       \
    }

#define CALL_Q8_0(R) tile32(T_Q8_0, w, nb, act, stride, R, out, ldo)
#define CALL_Q4_0(R) tile32(T_Q4_0, w, nb, act, stride, R, out, ldo)
#define CALL_Q4_1(R) tile32(T_Q4_1, w, nb, act, stride, R, out, ldo)
#define CALL_Q5_0(R) tile32(T_Q5_0, w, nb, act, stride, R, out, ldo)
#define CALL_Q5_1(R) tile32(T_Q5_1, w, nb, act, stride, R, out, ldo)
#define CALL_Q4_K(R) tile_k45(0, w, nb, act, stride, R, out, ldo)
#define CALL_Q5_K(R) tile_k45(1, w, nb, act, stride, R, out, ldo)
#define CALL_Q6_K(R) tile_q6k(w, nb, act, stride, R, out, ldo)
DEFINE_TILES(avx2_q8_0, CALL_Q8_0)
DEFINE_TILES(avx2_q4_0, CALL_Q4_0)
DEFINE_TILES(avx2_q4_1, CALL_Q4_1)
DEFINE_TILES(avx2_q5_0, CALL_Q5_0)
DEFINE_TILES(avx2_q5_1, CALL_Q5_1)
DEFINE_TILES(avx2_q4_K, CALL_Q4_K)
DEFINE_TILES(avx2_q5_K, CALL_Q5_K)
DEFINE_TILES(avx2_q6_K, CALL_Q6_K)

tile_fn sd_avx2_tile(int type) {
    switch (type) {
    case T_Q4_0: return avx2_q4_0;
    case T_Q4_1: return avx2_q4_1;
    case T_Q5_0: return avx2_q5_0;
    case T_Q5_1: return avx2_q5_1;
    case T_Q8_0: return avx2_q8_0;
    case T_Q4_K: return avx2_q4_K;
    case T_Q5_K: return avx2_q5_K;
    case T_Q6_K: return avx2_q6_K;
    default: return NULL;
    }
}
#endif
