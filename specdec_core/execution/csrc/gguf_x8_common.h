/* What the three repacked ("x8") AVX2 kernels share: gguf_x8.c (Q4_K), gguf_x8_32.c (the
 * 32-blocks) and gguf_x8_q6k.c (Q6_K). Included inside each file's AVX2 section, after its
 * `#pragma GCC target` and <immintrin.h>. */
#ifndef SPECDEC_GGUF_X8_COMMON_H
#define SPECDEC_GGUF_X8_COMMON_H

#include <string.h>

#include "avx2_common.h"

/* The signature of a tile of R rows of one 8-column group (the kernels instantiate R = 1..6). */
#define X8_ARGS const uint8_t *w, int nb, const uint8_t *act, size_t stride, float *out, size_t ldo, int ncols

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
