/* What the three repacked ("x8") AVX2 kernels share: gguf_x8.c (Q4_K), gguf_x8_32.c (the
 * 32-blocks) and gguf_x8_q6k.c (Q6_K). Included inside each file's AVX2 section, after its
 * `#pragma GCC target` and <immintrin.h>. */
#ifndef SPECDEC_GGUF_X8_COMMON_H
#define SPECDEC_GGUF_X8_COMMON_H

#include <string.h>

#include "avx2_common.h"

/* The signature of a tile of R rows of one 8-column group (the kernels instantiate R = 1..rows). */
#define X8_ARGS const uint8_t *w, int64_t gb, int nb, const uint8_t *act, size_t stride, float *out, size_t ldo, int ncols

/* X8_GROUP_ROWS(name, call, rows): the group_fn `name` of one format, which cuts any number of
 * rows into tiles of at most `rows` (5, 6 or 8, a literal or a macro of one), each tile one
 * instantiation `name_R` that runs `call(R)` with R a compile-time constant, so its row arrays
 * live in registers. */
#define X8_TILE(name, call, R) static void name##_##R(X8_ARGS) { call(R); }
#define X8_TILES_5(name, call) X8_TILE(name, call, 1) X8_TILE(name, call, 2) X8_TILE(name, call, 3) \
                               X8_TILE(name, call, 4) X8_TILE(name, call, 5)
#define X8_TILES_6(name, call) X8_TILES_5(name, call) X8_TILE(name, call, 6)
#define X8_TILES_8(name, call) X8_TILES_6(name, call) X8_TILE(name, call, 7) X8_TILE(name, call, 8)
#define X8_TABLE_5(name) name##_1, name##_2, name##_3, name##_4, name##_5
#define X8_TABLE_6(name) X8_TABLE_5(name), name##_6
#define X8_TABLE_8(name) X8_TABLE_6(name), name##_7, name##_8
#define X8_GROUP_ROWS(name, call, rows) X8_GROUP_ROWS_(name, call, rows) /* expands `rows` first */
#define X8_GROUP_ROWS_(name, call, rows)                                                                      \
    X8_TILES_##rows(name, call)                                                                               \
    static void name(const uint8_t *w, int nb, const uint8_t *act, size_t stride, int n_rows, float *out,     \
                     size_t ldo, int ncols) {                                                                 \
        static void (*const tiles[rows])(X8_ARGS) = {X8_TABLE_##rows(name)};                                  \
        for (int r0 = 0; r0 < n_rows; r0 += rows) {                                                           \
            const int n = n_rows - r0 < rows ? n_rows - r0 : rows;                                            \
            tiles[n - 1](w, 0, nb, act + (size_t)r0 * stride, stride, out + (size_t)r0 * ldo, ldo, ncols);    \
        }                                                                                                     \
    }
/* X8_PAIR_ROWS(name, call, rows): the same cut for a pair_fn (two groups, group_bytes apart; the
 * tiles read the second group gb = group_bytes past the first). */
#define X8_PAIR_ROWS(name, call, rows) X8_PAIR_ROWS_(name, call, rows)
#define X8_PAIR_ROWS_(name, call, rows)                                                                       \
    X8_TILES_##rows(name, call)                                                                               \
    static void name(const uint8_t *w, int64_t group_bytes, int nb, const uint8_t *act, size_t stride,        \
                     int n_rows, float *out, size_t ldo, int ncols) {                                         \
        static void (*const tiles[rows])(X8_ARGS) = {X8_TABLE_##rows(name)};                                  \
        for (int r0 = 0; r0 < n_rows; r0 += rows) {                                                           \
            const int n = n_rows - r0 < rows ? n_rows - r0 : rows;                                            \
            tiles[n - 1](w, group_bytes, nb, act + (size_t)r0 * stride, stride, out + (size_t)r0 * ldo, ldo,  \
                         ncols);                                                                              \
        }                                                                                                     \
    }

#define ROLLED _Pragma("GCC unroll 1") /* unrolled, gcc computes every product first and spills them */

/* 4 bytes broadcast to every 32-bit lane (4 activation values against 8 columns' weights). */
INLINE __m256i bcast4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Rows' 8-column accumulators to out[r * ldo], only the first ncols (<= 8) columns. */
INLINE void x8_store(const __m256 *acc, const int rows, float *out, size_t ldo, int ncols) {
    UNROLL
    for (int r = 0; r < rows; r++) {
        if (ncols == 8) {
            _mm256_storeu_ps(out + r * ldo, acc[r]);
        } else {
            float tmp[8];
            _mm256_storeu_ps(tmp, acc[r]);
            memcpy(out + r * ldo, tmp, (size_t)ncols * sizeof(float));
        }
    }
}

#endif
