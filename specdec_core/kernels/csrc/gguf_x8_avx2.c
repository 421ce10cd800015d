/* The repacked ("x8") tiles for AVX2 (gguf_x8_tiles.h): vpmaddubsw multiplies pairs of unsigned
 * weight bytes and signed activation bytes and sums them in int16 (each kernel's bound keeps the
 * sums exact), vpmaddwd widens them to int32 and applies the columns' sub-block scales. 6 rows a
 * tile: with 16 registers, more rows spill. */
#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "gguf_kernels.h"

#include "gguf_x8_common.h"

#define X8_WIDTH 256
#define X8_ROWS 6
#define X8_SPLIT 0
#define X8_DOT32 0

/* int16 scales of 8 columns, each twice (lanes 2c, 2c+1: vpmaddubsw's pairs of column c) */
INLINE __m256i dup16(__m128i s16) { return _mm256_set_m128i(_mm_unpackhi_epi16(s16, s16), _mm_unpacklo_epi16(s16, s16)); }

#define dot_first(w, a) _mm256_maddubs_epi16(w, a)
#define dot(acc, w, a) _mm256_add_epi16(acc, dot_first(w, a))
#define dot_add(x, y) _mm256_add_epi16(x, y)
#define dot_to32(acc) _mm256_madd_epi16(acc, _mm256_set1_epi16(1))
#define dot_acc32(i, w, a) _mm256_add_epi32(i, dot_to32(dot_first(w, a)))
#define dot_scale_i8(p) dup16(_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(p))))
#define dot_apply(acc, s) _mm256_madd_epi16(acc, s)
#define X8_GROUP_FN sd_avx2_x8_group

#include "gguf_x8_tiles.h"
#endif
