/* What the AVX2 sections of the C kernels share. Included inside each file's AVX2 section, after
 * its `#pragma GCC target` and <immintrin.h>. */
#ifndef SPECDEC_AVX2_COMMON_H
#define SPECDEC_AVX2_COMMON_H

#define INLINE static inline __attribute__((always_inline))
/* fixed-count loops fully unrolled: the per-row accumulator arrays then live in registers */
#define UNROLL _Pragma("GCC unroll 8")

/* The sum of 8 lanes in one fixed order (every kernel's last float step of a dot product). */
INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#endif
