/* Q4_K repacked at load for the vector kernel sets: 8 weight rows (output columns) interleaved per
 * super-block. The tiles that multiply it are in gguf_x8_tiles.h.
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
#include "gguf_x8_layouts.h"


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
