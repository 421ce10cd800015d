/* The AMX tile instructions gguf_amx.c uses, in plain C, for a build compiled with
 * -DSD_AMX_EMULATE (build_definition.AMX_EMULATION): the AMX-INT8 set then runs on any CPU with
 * AVX-512 VNNI, tile products emulated and everything around them (the weights' unpacking into
 * tile rows, the sums' layout, the float folds) the set's own code.
 *
 * Why: most machines that build and test specdec have no AMX, and the AMX set's float work must
 * give the same bits as every other set's. The tile products are exact integer sums, so an
 * emulation that sums the same integers is exact too; the tests that compare the sets bit for bit
 * run against this build where the CPU lacks AMX (tests/execution/test_amx_emulation.py). Slow:
 * for tests, never for serving.
 *
 * Semantics (Intel SDM, palette 1): 8 tiles of up to 16 rows x 64 bytes, shaped by LDTILECFG's
 * 64-byte operand (colsb[t] at bytes 16 + 2t, rows[t] at byte 48 + t). TDPBSUD / TDPBSSD:
 * C[m][n] (int32) += sum over k < colsb(A) / 4, i < 4 of A[m][4k + i] (int8) x B[k][4n + i]
 * (uint8 / int8), wrapping. Included after <immintrin.h>, whose definitions it replaces. */
#ifndef SPECDEC_AMX_EMULATION_H
#define SPECDEC_AMX_EMULATION_H

#include <stdint.h>
#include <string.h>

typedef struct {
    uint8_t rows[8];
    uint16_t colsb[8];
    _Alignas(64) uint8_t data[8][16][64];
} emulated_tiles;

static _Thread_local emulated_tiles sd_emulated;

static inline void emulated_loadconfig(const void *config) {
    const uint8_t *c = (const uint8_t *)config;
    memset(&sd_emulated, 0, sizeof sd_emulated);
    for (int t = 0; t < 8; t++) {
        sd_emulated.rows[t] = c[48 + t];
        memcpy(&sd_emulated.colsb[t], c + 16 + 2 * t, 2);
    }
}

static inline void emulated_loadd(int t, const void *base, long stride) {
    for (int r = 0; r < sd_emulated.rows[t]; r++)
        memcpy(sd_emulated.data[t][r], (const uint8_t *)base + r * stride, sd_emulated.colsb[t]);
}

static inline void emulated_stored(int t, void *base, long stride) {
    for (int r = 0; r < sd_emulated.rows[t]; r++)
        memcpy((uint8_t *)base + r * stride, sd_emulated.data[t][r], sd_emulated.colsb[t]);
}

static inline void emulated_dot(int c, int a, int b, int b_signed) {
    const int m_rows = sd_emulated.rows[c], n_cols = sd_emulated.colsb[c] / 4, k_steps = sd_emulated.colsb[a] / 4;
    for (int m = 0; m < m_rows; m++) {
        for (int n = 0; n < n_cols; n++) {
            uint32_t sum; /* wraps as the instruction's int32 does */
            memcpy(&sum, sd_emulated.data[c][m] + 4 * n, 4);
            for (int k = 0; k < k_steps; k++) {
                for (int i = 0; i < 4; i++) {
                    const int32_t x = (int8_t)sd_emulated.data[a][m][4 * k + i];
                    const uint8_t w = sd_emulated.data[b][k][4 * n + i];
                    sum += (uint32_t)(x * (b_signed ? (int32_t)(int8_t)w : (int32_t)w));
                }
            }
            memcpy(sd_emulated.data[c][m] + 4 * n, &sum, 4);
        }
    }
}

#undef _tile_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbsud
#undef _tile_dpbssd
#define _tile_loadconfig(config) emulated_loadconfig(config)
#define _tile_release() memset(&sd_emulated, 0, sizeof sd_emulated)
#define _tile_loadd(t, base, stride) emulated_loadd(t, base, (long)(stride))
#define _tile_stored(t, base, stride) emulated_stored(t, base, (long)(stride))
#define _tile_zero(t) memset(sd_emulated.data[t], 0, sizeof sd_emulated.data[t])
#define _tile_dpbsud(c, a, b) emulated_dot(c, a, b, 0)
#define _tile_dpbssd(c, a, b) emulated_dot(c, a, b, 1)

#endif
