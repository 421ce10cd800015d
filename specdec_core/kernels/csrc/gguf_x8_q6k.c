/* Q6_K repacked at load for the vector kernel sets (tiles in gguf_x8_tiles.h), 8 weight rows
 * (output columns) at a time, like Q4_K in
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
#include "gguf_x8_layouts.h"

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
