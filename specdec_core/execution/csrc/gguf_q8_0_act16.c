/* Q8_0 weights times activations quantized to 16 bits (one scale per 32 values): the CPU
 * default's kernel for a model that is not a GGUF file (Q8_0 blocks made at load, q8_0_blocks.py).
 *
 * Why not the 8-bit activations the file formats get: on Qwen2.5-Coder-1.5B (950 positions,
 * clients/tools/quant_quality.py) Q8_0 weights with 8-bit activations kept 0.988 of fp32's top-1
 * tokens (KL 0.0040 nats), with float32 activations 0.998 (KL 0.00013): the activations'
 * rounding, not the weights', was the loss. 16 bits round a value to 1/65534 of its block's
 * max |v|, which leaves that agreement where float32 has it, while the products stay exact
 * integers (vpmaddwd: int16 x int16 pairs summed in int32; 32 products of |q| <= 127 and
 * |a| <= 32767 stay below 2^31), so an extra row costs about what it costs with 8-bit
 * activations; float32 activations made each extra row of a 5-row call cost ~5x more (an FMA per
 * weight and row).
 *
 * Batch invariance as everywhere: a row is quantized on its own, its integer block sums are
 * exact, and its float steps (one FMA per block, a horizontal sum at the end) are the same
 * instructions whatever the number of rows in the call. */
#include "gguf_kernels.h"

static void portable_q8_0_a16(const uint8_t *w, int nb, const uint8_t *act, size_t stride, int rows, float *out,
                              size_t ldo) {
    const blk_q8_0 *blk = (const blk_q8_0 *)w;
    for (int r = 0; r < rows; r++) {
        const act_16 *a = (const act_16 *)(act + (size_t)r * stride);
        float sum = 0.0f;
        for (int b = 0; b < nb; b++) {
            int32_t isum = 0;
            for (int i = 0; i < QK32; i++) isum += blk[b].qs[i] * a[b].qs[i];
            sum += sd_fp16_to_fp32(blk[b].d) * a[b].d * (float)isum;
        }
        out[(size_t)r * ldo] = sum;
    }
}

tile_fn sd_scalar_act16_tile(int type) { return type == T_Q8_0 ? portable_q8_0_a16 : NULL; }

#if defined(__x86_64__) || defined(__i386__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

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
            const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(lo, _mm256_loadu_si256((const __m256i *)a->qs)),
                                               _mm256_madd_epi16(hi, _mm256_loadu_si256((const __m256i *)(a->qs + 16))));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * a->d), acc[r]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++) out[(size_t)r * ldo] = hsum8(acc[r]);
}

_Static_assert(ROW_TILE == 4, "avx2_q8_0_a16 instantiates tiles of 1..4 rows");

static void avx2_q8_0_a16(const uint8_t *w, int nb, const uint8_t *act, size_t stride, int rows, float *out,
                          size_t ldo) {
    switch (rows) { /* R a compile-time constant per instantiation: the accumulators stay in registers */
    case 1: q8_0_a16_rows(w, nb, act, stride, 1, out, ldo); break;
    case 2: q8_0_a16_rows(w, nb, act, stride, 2, out, ldo); break;
    case 3: q8_0_a16_rows(w, nb, act, stride, 3, out, ldo); break;
    default: q8_0_a16_rows(w, nb, act, stride, 4, out, ldo); break;
    }
}

tile_fn sd_avx2_act16_tile(int type) { return type == T_Q8_0 ? avx2_q8_0_a16 : NULL; }
#pragma GCC pop_options
#endif
