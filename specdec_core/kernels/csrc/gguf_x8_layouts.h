/* The repacked ("x8") weight layouts: 8 weight rows (output columns) interleaved per block, so
 * that a 256-bit register holds 4 consecutive values of 8 columns and one broadcast of 4
 * activation bytes multiplies all 8 at once. Packed by gguf_x8.c (Q4_K), gguf_x8_q6k.c (Q6_K) and
 * gguf_x8_32.c (Q4_0, Q5_0, Q8_0), where each layout is described; multiplied by the tiles of
 * gguf_x8_tiles.h, which every vector kernel set (AVX2, AVX-512 VNNI) compiles for itself. */
#ifndef SPECDEC_GGUF_X8_LAYOUTS_H
#define SPECDEC_GGUF_X8_LAYOUTS_H

#include <stdint.h>

typedef struct {
    uint16_t d[8], dmin[8];
    uint8_t sc[8][8];
    uint8_t mn[8][8];
    uint8_t qs[8][4][32];
} q4k_x8;

typedef struct {
    uint16_t d[8];
    int8_t sc[16][8];
    struct { uint8_t b[3][32]; } q[16];
} q6k_x8;

/* Bytes of one group-block (8 columns x 32 values) of the repacked 32-blocks; 0: not repacked. */
static inline int64_t x8_32_group_bytes(int type) {
    switch (type) {
    case 2 /* Q4_0 */: return 16 + 128;
    case 6 /* Q5_0 */: return 16 + 128 + 32;
    case 8 /* Q8_0 */: return 16 + 256;
    default: return 0;
    }
}

#endif
