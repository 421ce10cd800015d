/* The repacked ("x8") tiles on 512-bit registers (gguf_x8_tiles.h at X8_WIDTH 512): two adjacent
 * 8-column groups a register, so each vpdpbusd multiplies 16 columns' 4 weight bytes by 4
 * activation bytes. The AMX-INT8 set runs them for Q4_K and Q6_K below AMX_MIN_ROWS rows (a
 * verification of a few drafts), where a tile product's fixed cost does not pay: the Intel cores
 * that have AMX run two 512-bit vpdpbusd a cycle, so a 16-column step costs what an 8-column one
 * costs on 256-bit registers. Same integer sums, same float steps: the same bits as every set. */
#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")
#include <immintrin.h>

#include "gguf_kernels.h"

#include "gguf_x8_common.h"

#define X8_WIDTH 512
#define X8_ROWS 8
#define X8_SPLIT 2
#define X8_DOT32 1

#define dot_first(w, a) _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, a)
#define dot(acc, w, a) _mm512_dpbusd_epi32(acc, w, a)
#define dot_add(x, y) _mm512_add_epi32(x, y)
#define dot_to32(acc) (acc)
#define dot_scale_i8(p) w_i8_to32(p, gb)
#define dot_apply(acc, s) _mm512_mullo_epi32(acc, s)
#define X8_GROUP_FN sd_vnni512_x8_pair

#include "gguf_x8_tiles.h"
#endif
