/* The AVX-512 VNNI kernel set: the repacked ("x8") tiles (gguf_x8_tiles.h), where one vpdpbusd
 * multiplies 4 unsigned weight bytes by 4 signed activation bytes per int32 lane and adds them to
 * it (AVX2 needs vpmaddubsw, an int16 add and a vpmaddwd) and a vpmulld applies the columns'
 * scales; and Q8_0 with 16-bit activations (gguf_q8_0_act16_tile.h), where one vpdpwssd replaces
 * a vpmaddwd and an add. The other formats' tiles are AVX2's (gguf_gemm.c's select_tile).
 *
 * The registers stay 256 bits wide: AMD's Zen 4 runs a 512-bit instruction as two 256-bit
 * halves, so wider registers would not add products per cycle there. The AMX set, whose Intel
 * cores run two 512-bit vpdpbusd a cycle, takes the same tiles on 512-bit registers for Q4_K and
 * Q6_K (gguf_vnni512.c). One layout lets every set multiply the same prepared weights (and give
 * the same bits). AVX-512VL's 32 registers hold 8 rows a tile. */
#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")
#include <immintrin.h>

#include "gguf_kernels.h"

#include "gguf_x8_common.h"

#define X8_WIDTH 256
#define X8_ROWS 8
#define X8_SPLIT 2
#define X8_DOT32 1

#define dot_first(w, a) _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, a)
#define dot(acc, w, a) _mm256_dpbusd_epi32(acc, w, a)
#define dot_add(x, y) _mm256_add_epi32(x, y)
#define dot_to32(acc) (acc)
#define dot_acc32(i, w, a) _mm256_dpbusd_epi32(i, w, a)
#define dot_scale_i8(p) _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define dot_apply(acc, s) _mm256_mullo_epi32(acc, s)
#define X8_GROUP_FN sd_vnni_x8_group

#include "gguf_x8_tiles.h"

#define dot16_first(w, a) _mm256_dpwssd_epi32(_mm256_setzero_si256(), w, a)
#define dot16(acc, w, a) _mm256_dpwssd_epi32(acc, w, a)
#define ACT16_X8_ROWS 8 /* 3 registers a row of the 32 */
#define ACT16_TILE_FN sd_vnni_act16_tile
#define ACT16_GROUP_FN sd_vnni_act16_group
#include "gguf_q8_0_act16_tile.h"
#endif
