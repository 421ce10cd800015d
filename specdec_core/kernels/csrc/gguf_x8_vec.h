/* The vector dialect of the repacked ("x8") tiles (gguf_x8_tiles.h): the operations they use, for
 * registers of X8_WIDTH bits. Included by gguf_x8_tiles.h after the including file's
 * `#pragma GCC target` and its X8_WIDTH.
 *
 * 256 bits: one register holds one 8-column group (AVX2, and AVX-512 VNNI on 256-bit registers).
 * 512 bits: one register holds two adjacent groups, columns 0-7 from the group at p and 8-15 from
 * the next one, `gb` (its bytes) further: every weight operand is a pair of 256-bit loads, and the
 * tiles compute two groups at once (Intel cores with two 512-bit FMA ports run twice the products
 * an instruction; AMD's Zen 4 runs a 512-bit instruction as two halves, so 256 bits stay its width).
 * The operations and their order per output are the same at either width, so are the bits. */
#ifndef SPECDEC_GGUF_X8_VEC_H
#define SPECDEC_GGUF_X8_VEC_H

#if X8_WIDTH == 512
typedef __m512i vi;
typedef __m512 vf;
#define v_zero_i _mm512_setzero_si512
#define v_zero_f _mm512_setzero_ps
#define v_set1_8 _mm512_set1_epi8
#define v_set1_32 _mm512_set1_epi32
#define v_set1_f _mm512_set1_ps
#define v_and _mm512_and_si512
#define v_or _mm512_or_si512
#define v_srli16 _mm512_srli_epi16
#define v_add32 _mm512_add_epi32
#define v_sub32 _mm512_sub_epi32
#define v_madd16 _mm512_madd_epi16
#define v_cvt _mm512_cvtepi32_ps
#define v_mul _mm512_mul_ps
#define v_fmadd _mm512_fmadd_ps
#define v_fnmadd _mm512_fnmadd_ps

/* 32 weight bytes of each group */
INLINE vi w_load(const void *p, int64_t gb) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p)),
                              _mm256_loadu_si256((const __m256i *)((const uint8_t *)p + gb)), 1);
}
/* 8 fp16 scales of each group as floats */
INLINE vf w_halves(const void *p, int64_t gb) {
    return _mm512_cvtph_ps(_mm256_set_m128i(_mm_loadu_si128((const __m128i *)((const uint8_t *)p + gb)),
                                            _mm_loadu_si128((const __m128i *)p)));
}
/* 8 bytes of each group, side by side in 16 bytes */
INLINE __m128i w_bytes8(const void *p, int64_t gb) {
    return _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)p), _mm_loadl_epi64((const __m128i *)((const uint8_t *)p + gb)));
}
#define w_u8_to32(p, gb) _mm512_cvtepu8_epi32(w_bytes8(p, gb))
#define w_i8_to32(p, gb) _mm512_cvtepi8_epi32(w_bytes8(p, gb))
#define w_prefetch(p, gb) (_mm_prefetch((const char *)(p), _MM_HINT_T0), _mm_prefetch((const char *)(p) + (gb), _MM_HINT_T0))

/* Q6_K's offsets: lanes 2c, 2c+1 hold 32 sa[c], 32 sb[c] (int16) for each group's 8 columns. */
INLINE __m256i q6k_offsets8(const int8_t *sa8, const int8_t *sb8) {
    const __m128i sa = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)sa8));
    const __m128i sb = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)sb8));
    return _mm256_slli_epi16(_mm256_set_m128i(_mm_unpackhi_epi16(sa, sb), _mm_unpacklo_epi16(sa, sb)), 5);
}
INLINE vi q6k_offsets(const int8_t *sa, const int8_t *sb, int64_t gb) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(q6k_offsets8(sa, sb)), q6k_offsets8(sa + gb, sb + gb), 1);
}

/* 4 bytes broadcast to every 32-bit lane (4 activation values against 16 columns' weights). */
INLINE vi v_bcast4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* Rows' 16-column accumulators to out[r * ldo]: the first group's 8 columns and ncols (<= 8) of
 * the second's. */
INLINE void v_store(const vf *acc, const int rows, float *out, size_t ldo, int ncols) {
    const __mmask16 keep = (__mmask16)((1u << (8 + ncols)) - 1);
    UNROLL
    for (int r = 0; r < rows; r++) _mm512_mask_storeu_ps(out + r * ldo, keep, acc[r]);
}
#else
typedef __m256i vi;
typedef __m256 vf;
#define v_zero_i _mm256_setzero_si256
#define v_zero_f _mm256_setzero_ps
#define v_set1_8 _mm256_set1_epi8
#define v_set1_32 _mm256_set1_epi32
#define v_set1_f _mm256_set1_ps
#define v_and _mm256_and_si256
#define v_or _mm256_or_si256
#define v_srli16 _mm256_srli_epi16
#define v_add32 _mm256_add_epi32
#define v_sub32 _mm256_sub_epi32
#define v_madd16 _mm256_madd_epi16
#define v_cvt _mm256_cvtepi32_ps
#define v_mul _mm256_mul_ps
#define v_fmadd _mm256_fmadd_ps
#define v_fnmadd _mm256_fnmadd_ps

#define w_load(p, gb) _mm256_loadu_si256((const __m256i *)(p))
#define w_halves(p, gb) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define w_u8_to32(p, gb) _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define w_i8_to32(p, gb) _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define w_prefetch(p, gb) _mm_prefetch((const char *)(p), _MM_HINT_T0)

INLINE vi q6k_offsets(const int8_t *sa8, const int8_t *sb8, int64_t gb) {
    (void)gb;
    const __m128i sa = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)sa8));
    const __m128i sb = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)sb8));
    return _mm256_slli_epi16(_mm256_set_m128i(_mm_unpackhi_epi16(sa, sb), _mm_unpacklo_epi16(sa, sb)), 5);
}
#define v_store x8_store
#define v_bcast4 bcast4
#endif

#endif
