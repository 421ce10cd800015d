/* The Q8_0 x 16-bit-activation tiles (gguf_q8_0_act16.c), written once for the vector kernel sets:
 * gguf_q8_0_act16.c (AVX2) and gguf_vnni.c (AVX-512 VNNI) each include it after their own
 * `#pragma GCC target` and the int16 dot product their instructions make:
 *   dot16_first(w, a)  pairs of int16 products summed into 8 int32 lanes
 *   dot16(acc, w, a)   acc + dot16_first(w, a) (VNNI: one vpdpwssd)
 *   ACT16_X8_ROWS      rows per tile of the repacked layout (more registers, more rows)
 *   ACT16_TILE_FN      the name of the function that returns the tile_fn of a type (the file's layout)
 *   ACT16_GROUP_FN     ... the group_fn of a type (the repacked layout)
 * The int32 sums are exact on both (32 products of |q| <= 127 and |a| <= 32767), and the float
 * steps are shared: both sets give every output the same bits. */
#include "avx2_common.h"
#include "gguf_x8_common.h"
#include "gguf_x8_layouts.h"

INLINE void q8_0_a16_rows(const uint8_t *w, int nb, const uint8_t *act, size_t stride, const int R, float *out,
                          size_t ldo) {
    __m256 acc[ROW_TILE];
    UNROLL
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const blk_q8_0 *blk = (const blk_q8_0 *)(w + (size_t)b * sizeof(blk_q8_0));
        const float d = _cvtsh_ss(blk->d);
        const __m256i lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)blk->qs));
        const __m256i hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk->qs + 16)));
        UNROLL
        for (int r = 0; r < R; r++) {
            const act_16 *a = (const act_16 *)(act + (size_t)r * stride) + b;
            const __m256i p = dot16(dot16_first(lo, _mm256_loadu_si256((const __m256i *)a->qs)), hi,
                                    _mm256_loadu_si256((const __m256i *)(a->qs + 16)));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * a->d), acc[r]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++) out[(size_t)r * ldo] = hsum8(acc[r]);
}

_Static_assert(ROW_TILE == 4, "the 16-bit-activation tile is instantiated for 1..4 rows");

static void q8_0_a16(const uint8_t *w, int nb, const uint8_t *act, size_t stride, int rows, float *out, size_t ldo) {
    switch (rows) { /* R a compile-time constant per instantiation: the accumulators stay in registers */
    case 1: q8_0_a16_rows(w, nb, act, stride, 1, out, ldo); break;
    case 2: q8_0_a16_rows(w, nb, act, stride, 2, out, ldo); break;
    case 3: q8_0_a16_rows(w, nb, act, stride, 3, out, ldo); break;
    default: q8_0_a16_rows(w, nb, act, stride, 4, out, ldo); break;
    }
}

tile_fn ACT16_TILE_FN(int type) { return type == T_Q8_0 ? q8_0_a16 : NULL; }

/* The repacked Q8_0 layout (gguf_x8_32.c: step u holds values 4u..4u+3 of the 8 columns, 4 bytes a
 * column) times 16-bit activations. A step's low and high 16 bytes widened to int16 are columns
 * 0-3 and 4-7, two lanes a column; one 64-bit broadcast of the 4 matching activation values makes
 * each int32 lane the sum of two products, and one horizontal add a block folds each column's two
 * lanes: 8 columns a register, so the block's float step (convert, scale, add) is one per 8
 * columns, where the file's layout needs one per column and a horizontal sum at the end. The
 * horizontal add leaves the columns in the order 0 1 4 5 2 3 6 7: the scales are put in that
 * order, and the sums back in column order once, at the end. */
#define X8_A16_ORDER 0xD8 /* 64-bit lanes 0 2 1 3: swaps columns 2-3 and 4-5, both ways */

INLINE void q8_0_a16_x8_rows(const uint8_t *w, int nb, const uint8_t *act, size_t stride, const int R, float *out,
                             size_t ldo, int ncols) {
    __m256 acc[ACT16_X8_ROWS];
    UNROLL
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *x = w + (size_t)b * x8_32_group_bytes(T_Q8_0);
        const __m256 d = _mm256_castpd_ps(_mm256_permute4x64_pd(
            _mm256_castps_pd(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x))), X8_A16_ORDER));
        /* one or two rows: a second pair of chains (odd steps), to hide the dot product's latency */
        const int split = R <= 2;
        __m256i lo[ACT16_X8_ROWS], hi[ACT16_X8_ROWS], lo2[2], hi2[2];
        UNROLL
        for (int r = 0; r < R; r++) lo[r] = hi[r] = _mm256_setzero_si256();
        lo2[0] = hi2[0] = lo2[1] = hi2[1] = _mm256_setzero_si256();
        ROLLED
        for (int u = 0; u < 8; u++) {
            const __m128i *q = (const __m128i *)(x + 16 + 32 * u);
            const __m256i wl = _mm256_cvtepi8_epi16(_mm_loadu_si128(q));
            const __m256i wh = _mm256_cvtepi8_epi16(_mm_loadu_si128(q + 1));
            UNROLL
            for (int r = 0; r < R; r++) {
                const int16_t *four = ((const act_16 *)(act + (size_t)r * stride) + b)->qs + 4 * u;
                const __m256i a = _mm256_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)four));
                if (split && (u & 1)) {
                    lo2[r & 1] = dot16(lo2[r & 1], wl, a);
                    hi2[r & 1] = dot16(hi2[r & 1], wh, a);
                } else {
                    lo[r] = dot16(lo[r], wl, a);
                    hi[r] = dot16(hi[r], wh, a);
                }
            }
        }
        UNROLL
        for (int r = 0; r < R; r++) {
            const act_16 *a = (const act_16 *)(act + (size_t)r * stride) + b;
            if (split) {
                lo[r] = _mm256_add_epi32(lo[r], lo2[r & 1]);
                hi[r] = _mm256_add_epi32(hi[r], hi2[r & 1]);
            }
            const __m256 sums = _mm256_cvtepi32_ps(_mm256_hadd_epi32(lo[r], hi[r]));
            acc[r] = _mm256_fmadd_ps(sums, _mm256_mul_ps(d, _mm256_set1_ps(a->d)), acc[r]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++)
        acc[r] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(acc[r]), X8_A16_ORDER));
    x8_store(acc, R, out, ldo, ncols);
}

#if ACT16_X8_ROWS != 5 && ACT16_X8_ROWS != 8
#error "ACT16_X8_ROWS: the repacked 16-bit-activation tiles are instantiated for 5 or 8 rows"
#endif
#define X8_A16(R) q8_0_a16_x8_rows(w, nb, act, stride, R, out, ldo, ncols)
X8_GROUP_ROWS(q8_0_a16_x8, X8_A16, ACT16_X8_ROWS)

group_fn ACT16_GROUP_FN(int type) { return type == T_Q8_0 ? q8_0_a16_x8 : NULL; }
