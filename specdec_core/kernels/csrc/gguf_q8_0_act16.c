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
 * The vector sets multiply the repacked layout of the 8-bit formats (gguf_x8_32.c), 8 columns a
 * register (the group tiles at the end of gguf_q8_0_act16_tile.h); the file's layout, one column
 * at a time, is left to the portable set: one float step per block for 8 columns instead of one
 * a column, which made multi-row steps markedly cheaper (docs/execution-measurements.md).
 *
 * Batch invariance as everywhere: a row is quantized on its own, its integer block sums are
 * exact, and its float steps (one FMA per block, a horizontal sum at the end; repacked: one FMA
 * per block for 8 columns) are the same instructions whatever the number of rows in the call. */
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

/* int16 x int16 pairs summed in int32 (vpmaddwd), then added */
#define dot16_first(w, a) _mm256_madd_epi16(w, a)
#define dot16(acc, w, a) _mm256_add_epi32(acc, _mm256_madd_epi16(w, a))
#define ACT16_X8_ROWS 5 /* 3 registers a row of the 16: a 5-row verify in one pass, some spilled */
#define ACT16_TILE_FN sd_avx2_act16_tile
#define ACT16_GROUP_FN sd_avx2_act16_group
#include "gguf_q8_0_act16_tile.h"
#pragma GCC pop_options
#endif
