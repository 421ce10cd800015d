/* The Q8_0 x 16-bit-activation tile (gguf_q8_0_act16.c), written once for the vector kernel sets:
 * gguf_q8_0_act16.c (AVX2) and gguf_vnni.c (AVX-512 VNNI) each include it after their own
 * `#pragma GCC target` and the int16 dot product their instructions make:
 *   dot16_first(w, a)  pairs of int16 products summed into 8 int32 lanes
 *   dot16(acc, w, a)   acc + dot16_first(w, a) (VNNI: one vpdpwssd)
 *   ACT16_TILE_FN      the name of the function that returns the tile_fn of a type
 * The int32 sums are exact on both (32 products of |q| <= 127 and |a| <= 32767), and the float
 * steps are shared: both sets give every output the same bits. */
#include "avx2_common.h"

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
