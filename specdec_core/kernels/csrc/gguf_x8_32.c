/* Q4_0, Q5_0 and Q8_0 repacked at load for the vector kernel sets (tiles in gguf_x8_tiles.h), 8
 * weight rows (output columns) at a time, like
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
#include "gguf_x8_layouts.h"

int64_t sd_gguf_x8_32_bytes(int type, int64_t n, int64_t k) {
    if (!x8_32_group_bytes(type) || k <= 0 || k % QK32 || n <= 0) return 0;
    return (n + 7) / 8 * (k / QK32) * x8_32_group_bytes(type);
}

void sd_gguf_x8_32_pack(int type, const uint8_t *raw, int64_t n, int64_t k, uint8_t *dst, int64_t g0, int64_t g1) {
    const int64_t nb = k / QK32, gb = x8_32_group_bytes(type);
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
