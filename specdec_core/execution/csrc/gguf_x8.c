/* Q4_K for AVX2, repacked at load: 8 weight rows (output columns) interleaved per super-block.
 *
 * The plain layout multiplies one weight row by one activation row and ends every block with a
 * horizontal sum; here a 256-bit register holds 4 consecutive values of 8 columns, the 4 matching
 * activation bytes are broadcast, and vpmaddubsw yields 8 columns' partial sums at once. Within a
 * 32-value sub-block the 8 steps are summed in int16 (|8 x 2 x 15 x 127| = 30480 < 32767), then
 * one vpmaddwd applies the 8 columns' sub-block scales and one FMA the sub-block's activation
 * scale. About half the instructions per weight of the plain kernel, and none spent on horizontal
 * sums.
 *
 * Repacked super-block of 8 columns (1184 bytes against 8 x 144):
 *   d[8], dmin[8]   the fp16 values (converted in the kernel; as float32 they cost 3% more bytes)
 *   sc[8][8]        [sub-block][column] 6-bit scales
 *   mn[8][8]        [sub-block][column] 6-bit mins
 *   qs[8][4][32]    [sub-block][step u][4 * column + i]: low nibble value 4u + i of the
 *                   sub-block, high nibble value 16 + 4u + i
 * Exactness and row invariance are the same as the plain kernels': integer sums are exact, each
 * output column is one lane of one thread's accumulator, and the per-row float steps do not
 * depend on the number of rows. */
#include <string.h>

#include "gguf_kernels.h"

typedef struct {
    uint16_t d[8], dmin[8];
    uint8_t sc[8][8];
    uint8_t mn[8][8];
    uint8_t qs[8][4][32];
} q4k_x8;

int64_t sd_gguf_x8_bytes(int type, int64_t n, int64_t k) {
    if (type != T_Q4_K || k <= 0 || k % QK_K || n <= 0) return 0;
    return (n + 7) / 8 * (k / QK_K) * (int64_t)sizeof(q4k_x8);
}

/* raw: n rows of k/256 Q4_K blocks; dst: sd_gguf_x8_bytes bytes. Missing columns of the last
 * group are zero (they compute zeros that are never stored). */
void sd_gguf_x8_pack(int type, const uint8_t *raw, int64_t n, int64_t k, uint8_t *dst, int64_t g0, int64_t g1) {
    (void)type;
    const int64_t nb = k / QK_K;
    for (int64_t g = g0; g < g1; g++) {
        for (int64_t b = 0; b < nb; b++) {
            q4k_x8 *x = (q4k_x8 *)dst + g * nb + b;
            memset(x, 0, sizeof *x);
            for (int c = 0; c < 8 && g * 8 + c < n; c++) {
                const blk_q4_K *src = (const blk_q4_K *)raw + (g * 8 + c) * nb + b;
                uint8_t sc[8], mn[8];
                sd_q4k_scale_min(src->scales, sc, mn);
                x->d[c] = src->d;
                x->dmin[c] = src->dmin;
                for (int s = 0; s < 8; s++) {
                    x->sc[s][c] = sc[s];
                    x->mn[s][c] = mn[s];
                }
                /* sub-block s is the low (s even) or high nibbles of the file's 32 bytes qs[32 (s / 2) ..] */
                for (int s = 0; s < 8; s++) {
                    const uint8_t *q = src->qs + 32 * (s / 2);
                    const int shift = (s & 1) ? 4 : 0;
                    for (int u = 0; u < 4; u++)
                        for (int i = 0; i < 4; i++)
                            x->qs[s][u][4 * c + i] = (uint8_t)(((q[4 * u + i] >> shift) & 0xF) |
                                                               (((q[16 + 4 * u + i] >> shift) & 0xF) << 4));
                }
            }
        }
    }
}

#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "gguf_x8_common.h"

static inline __attribute__((always_inline)) void q4k_x8_tile(const uint8_t *w, int nb, const uint8_t *act, size_t stride,
                                                              const int R, float *out, size_t ldo, int ncols) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[6];
    UNROLL
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const q4k_x8 *x = (const q4k_x8 *)w + b;
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x->d));
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x->dmin));
        for (int s = 0; s < 8; s++) {
            { /* an eighth of the super-block X8_PREFETCH super-blocks ahead (see the header) */
                const char *pf = (const char *)(x + X8_PREFETCH) + 148 * s;
                _mm_prefetch(pf, _MM_HINT_T0);
                _mm_prefetch(pf + 64, _MM_HINT_T0);
                _mm_prefetch(pf + 128, _MM_HINT_T0);
            }
            const __m128i s16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)x->sc[s]));
            const __m256i scale = _mm256_set_m128i(_mm_unpackhi_epi16(s16, s16), _mm_unpacklo_epi16(s16, s16));
            __m256i acc16[6];
            UNROLL
            for (int r = 0; r < R; r++) acc16[r] = _mm256_setzero_si256();
            /* not unrolled: unrolled, gcc computes every product first and spills them */
            _Pragma("GCC unroll 1")
            for (int u = 0; u < 4; u++) {
                const __m256i packed = _mm256_loadu_si256((const __m256i *)x->qs[s][u]);
                const __m256i lo = _mm256_and_si256(packed, m4), hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), m4);
                UNROLL
                for (int r = 0; r < R; r++) {
                    const int8_t *aq = ((const act_k *)(act + r * stride) + b)->qs + 32 * s + 4 * u;
                    acc16[r] = _mm256_add_epi16(acc16[r], _mm256_maddubs_epi16(lo, bcast4(aq)));
                    acc16[r] = _mm256_add_epi16(acc16[r], _mm256_maddubs_epi16(hi, bcast4(aq + 16)));
                }
            }
            UNROLL
            for (int r = 0; r < R; r++) {
                const float da = ((const act_k *)(act + r * stride) + b)->d32[s];
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(acc16[r], scale)),
                                         _mm256_mul_ps(d, _mm256_set1_ps(da)), acc[r]);
            }
        }
        UNROLL
        for (int r = 0; r < R; r++) { /* the mins: column c gets sum_s mn[s][c] * d32[s] * sub-block sum */
            const act_k *a = (const act_k *)(act + r * stride) + b;
            __m256 msum = _mm256_setzero_ps();
            UNROLL
            for (int s = 0; s < 8; s++) {
                const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)x->mn[s])));
                msum = _mm256_fmadd_ps(m, _mm256_set1_ps(a->s32[s]), msum);
            }
            acc[r] = _mm256_fnmadd_ps(msum, dmin, acc[r]);
        }
    }
    x8_store(acc, R, out, ldo, ncols);
}

#define X8_TILE(R) static void q4k_x8_##R(X8_ARGS) { q4k_x8_tile(w, nb, act, stride, R, out, ldo, ncols); }
X8_TILE(1)
X8_TILE(2)
X8_TILE(3)
X8_TILE(4)
X8_TILE(5)
X8_TILE(6)

/* Rows (1..X8_ROW_TILE) of one 8-column group; `w` points at the group's first super-block. */
void sd_q4k_x8_tile(const uint8_t *w, int nb, const uint8_t *act, size_t stride, int rows, float *out, size_t ldo,
                    int ncols) {
    static void (*const tiles[6])(X8_ARGS) = {q4k_x8_1, q4k_x8_2, q4k_x8_3, q4k_x8_4, q4k_x8_5, q4k_x8_6};
    tiles[(rows < 1 ? 1 : rows > X8_ROW_TILE ? X8_ROW_TILE : rows) - 1](w, nb, act, stride, out, ldo, ncols);
}
#endif
