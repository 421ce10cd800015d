/* Q6_K for AVX2, repacked at load 8 weight rows (output columns) at a time, like Q4_K in
 * gguf_x8.c: a register holds 4 consecutive values of 8 columns and the 4 matching activation
 * bytes are broadcast, so one vpmaddubsw yields 8 columns' partial sums and no horizontal sum is
 * ever needed. The file's layout (gguf_avx2.c) spends most of its time on those horizontal sums
 * with several rows; here a super-block of 8 columns is unpacked once per tile of rows.
 *
 * Repacked super-block of 8 columns (1680 bytes, exactly 8 x 210: the same bytes re-ordered), in
 * the order the kernel reads it (read out of order, the hardware prefetchers fall behind: the
 * first version, with d at the end, streamed from DRAM at half the speed):
 *   d[8]        the columns' fp16 super-block scales
 *   sc[16][8]   [sub-block][column] the int8 scales
 *   then per sub-block s (16 values), q[s].b[3][32]: [j][4 * column + i], step j (0..2) in
 *               bits 0-5 (values 16s + 4j + i), and in bits 6-7 bits 2j, 2j+1 of step 3's value
 *               (16s + 12 + i): steps 0-2 unpack with one AND each, step 3 with three shifts,
 *               three ANDs and two ORs (ggml's ql/qh split took 17 operations for the four)
 * Per row and sub-block: two steps (unsigned 6-bit q times int8, |2 x 2 x 63 x 127| = 32004 <
 * 32767) are summed in int16, then one vpmaddwd applies the 8 columns' scales, exact in int32.
 * Per 32 values the -32 offset comes off exactly (32 sc times the activation's 16-value sums) and
 * one FMA folds the integer sums into the row's float accumulator with d * d32. The per-row
 * instruction sequence does not depend on the tile size, so a row's result does not depend on
 * the other rows. */
#include <string.h>

#include "gguf_kernels.h"

#if Q6K_ROW_TILE < 1 || Q6K_ROW_TILE > 6
#error "the Q6_K tiles are instantiated for 1..6 rows"
#endif

typedef struct {
    uint16_t d[8];
    int8_t sc[16][8];
    struct { uint8_t b[3][32]; } q[16];
} q6k_x8;

int64_t sd_gguf_x8_q6k_bytes(int64_t n, int64_t k) {
    if (k <= 0 || k % QK_K || n <= 0) return 0;
    return (n + 7) / 8 * (k / QK_K) * (int64_t)sizeof(q6k_x8);
}

/* raw: n rows of k/256 Q6_K blocks; dst: sd_gguf_x8_q6k_bytes bytes. Missing columns of the
 * last group are zero (they compute zeros that are never stored). */
void sd_gguf_x8_q6k_pack(int type, const uint8_t *raw, int64_t n, int64_t k, uint8_t *dst, int64_t g0, int64_t g1) {
    (void)type;
    const int64_t nb = k / QK_K;
    for (int64_t g = g0; g < g1; g++) {
        for (int64_t b = 0; b < nb; b++) {
            q6k_x8 *x = (q6k_x8 *)dst + g * nb + b;
            memset(x, 0, sizeof *x);
            for (int c = 0; c < 8 && g * 8 + c < n; c++) {
                const blk_q6_K *src = (const blk_q6_K *)raw + (g * 8 + c) * nb + b;
                x->d[c] = src->d;
                for (int s = 0; s < 16; s++) x->sc[s][c] = src->scales[s];
                for (int s = 0; s < 16; s++) {
                    /* values 16 s + t (ggml's layout: value e is nibble (e % 128) / 64 of ql[64 (e / 128) +
                     * 32 ((e / 32) % 2) + e % 32], its bits 4-5 bits 2 ((e % 128) / 32) of qh[32 (e / 128) + e % 32]) */
                    uint8_t v[16];
                    const int h = s / 8, g = (s % 8) / 2, l0 = 16 * (s % 2), lo_shift = (g & 2) ? 4 : 0, hi_shift = 2 * g;
                    const uint8_t *ql = src->ql + 64 * h + ((g & 1) ? 32 : 0) + l0, *qh = src->qh + 32 * h + l0;
                    for (int t = 0; t < 16; t++)
                        v[t] = (uint8_t)(((ql[t] >> lo_shift) & 0xF) | (((qh[t] >> hi_shift) & 3) << 4));
                    for (int i = 0; i < 4; i++) /* step 3 (values 12..15) in bits 6-7 of steps 0-2 */
                        for (int j = 0; j < 3; j++)
                            x->q[s].b[j][4 * c + i] = (uint8_t)(v[4 * j + i] | (((v[12 + i] >> (2 * j)) & 3) << 6));
                }
            }
        }
    }
}

#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "gguf_x8_common.h"

#define ROLLED _Pragma("GCC unroll 1") /* unrolled, gcc hoists every product and spills them */
#define ACT(r) ((const act_k *)(act + (size_t)(r) * stride) + b)

/* int8 scales of 8 columns -> int16, each twice (lanes 2c, 2c+1: vpmaddubsw's pairs of column c) */
INLINE __m256i dup_scales(__m128i s16) { return _mm256_set_m128i(_mm_unpackhi_epi16(s16, s16), _mm_unpacklo_epi16(s16, s16)); }

INLINE void q6k_x8_tile(const uint8_t *w, int nb, const uint8_t *act, size_t stride, const int R, float *out,
                        size_t ldo, int ncols) {
    const __m256i m3f = _mm256_set1_epi8(0x3F), m03 = _mm256_set1_epi8(0x03), m0c = _mm256_set1_epi8(0x0C),
                  m30 = _mm256_set1_epi8(0x30);
    __m256 acc[6];
    UNROLL
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const q6k_x8 *x = (const q6k_x8 *)w + b;
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x->d));
        ROLLED
        for (int t = 0; t < 8; t++) { /* 32 values: sub-blocks 2t, 2t + 1 */
            { /* an eighth of the super-block X8_PREFETCH super-blocks ahead (see the header) */
                const char *pf = (const char *)(x + X8_PREFETCH) + 210 * t;
                _mm_prefetch(pf, _MM_HINT_T0);
                _mm_prefetch(pf + 64, _MM_HINT_T0);
                _mm_prefetch(pf + 128, _MM_HINT_T0);
                _mm_prefetch(pf + 192, _MM_HINT_T0);
            }
            __m256i isum[6];
            UNROLL
            for (int h = 0; h < 2; h++) {
                const int s = 2 * t + h;
                const __m256i scale = dup_scales(_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)x->sc[s])));
                const __m256i b0 = _mm256_loadu_si256((const __m256i *)x->q[s].b[0]);
                const __m256i b1 = _mm256_loadu_si256((const __m256i *)x->q[s].b[1]);
                const __m256i q0 = _mm256_and_si256(b0, m3f), q1 = _mm256_and_si256(b1, m3f);
                UNROLL
                for (int r = 0; r < R; r++) {
                    const int8_t *aq = ACT(r)->qs + 16 * s;
                    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(q0, bcast4(aq)), _mm256_maddubs_epi16(q1, bcast4(aq + 4)));
                    isum[r] = h ? _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, scale)) : _mm256_madd_epi16(p, scale);
                }
                const __m256i b2 = _mm256_loadu_si256((const __m256i *)x->q[s].b[2]);
                const __m256i q2 = _mm256_and_si256(b2, m3f);
                const __m256i q3 = _mm256_or_si256(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b0, 6), m03),
                                                                   _mm256_and_si256(_mm256_srli_epi16(b1, 4), m0c)),
                                                   _mm256_and_si256(_mm256_srli_epi16(b2, 2), m30));
                UNROLL
                for (int r = 0; r < R; r++) {
                    const int8_t *aq = ACT(r)->qs + 16 * s + 8;
                    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(q2, bcast4(aq)), _mm256_maddubs_epi16(q3, bcast4(aq + 4)));
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, scale));
                }
            }
            /* lanes 2c, 2c+1: 32 sc[2t][c], 32 sc[2t+1][c], against the pair (bsum16[2t], bsum16[2t+1]) */
            const __m128i sa = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)x->sc[2 * t]));
            const __m128i sb = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)x->sc[2 * t + 1]));
            const __m256i off = _mm256_slli_epi16(_mm256_set_m128i(_mm_unpackhi_epi16(sa, sb), _mm_unpacklo_epi16(sa, sb)), 5);
            UNROLL
            for (int r = 0; r < R; r++) {
                const __m256i v = _mm256_sub_epi32(isum[r], _mm256_madd_epi16(off, bcast4(ACT(r)->bsum16 + 2 * t)));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_mul_ps(d, _mm256_set1_ps(ACT(r)->d32[t])), acc[r]);
            }
        }
    }
    x8_store(acc, R, out, ldo, ncols);
}

#define X8_TILE(R) static void q6k_x8_##R(X8_ARGS) { q6k_x8_tile(w, nb, act, stride, R, out, ldo, ncols); }
X8_TILE(1)
X8_TILE(2)
X8_TILE(3)
X8_TILE(4)
X8_TILE(5)
X8_TILE(6)

/* Any number of rows of one 8-column group, Q6K_ROW_TILE at a time; `w` points at the group's
 * first super-block. */
void sd_q6k_x8_tile(const uint8_t *w, int nb, const uint8_t *act, size_t stride, int rows, float *out, size_t ldo,
                    int ncols) {
    static void (*const tiles[6])(X8_ARGS) = {q6k_x8_1, q6k_x8_2, q6k_x8_3, q6k_x8_4, q6k_x8_5, q6k_x8_6};
    for (int r0 = 0; r0 < rows; r0 += Q6K_ROW_TILE) {
        const int n = rows - r0 < Q6K_ROW_TILE ? rows - r0 : Q6K_ROW_TILE;
        tiles[n - 1](w, nb, act + (size_t)r0 * stride, stride, out + (size_t)r0 * ldo, ldo, ncols);
    }
}
#endif
