/* The AMX-INT8 kernel set: the repacked ("x8") Q4_K, Q6_K and Q8_0 weights times several
 * activation rows as tile products (gguf_gemm.c runs them from AMX_MIN_ROWS rows on, two 8-column
 * groups at a time; a lone group and fewer rows take the AVX-512 VNNI tiles).
 *
 * Why tiles: one tdpbsud multiplies a 16-row x 64-byte tile of signed activations by a 64 x 16
 * tile of unsigned weights into 16 x 16 int32 sums, ~16x the products of a 512-bit vpdpbusd in
 * the same time. What bounds a tile step is the float work around it: every 32 values (16 for
 * Q6_K) carry their own activation scale (per-32 scales keep the 1.5B's outlier channels;
 * ggml's per-256 Q8_K loses them), so each 32-value sum is stored and folded into float
 * accumulators with 512-bit vector instructions, one 16-column register per row.
 *
 * The operands: tile A holds R <= 16 activation rows, straight from the quantized rows (act_k /
 * act_32 start with their int8 values, so a row stride loads them); tile B holds the weights in
 * the layout the tile product reads (row kk: 4 consecutive values of each of 16 columns), which is
 * the x8 layout's own step (8 columns x 4 values) for two adjacent groups side by side: Q8_0's
 * bytes are loaded as they are, one group a tile; Q4_K's and Q6_K's are unpacked to bytes in a
 * 512-byte buffer first. Q6_K's are stored as q - 32, signed (tdpbssd): the offset then needs no
 * correction term.
 *
 * The same bits as the VNNI and AVX2 tiles (gguf_x8_tiles.h): the integer sums are exact on every
 * set, and each output goes through the same float operations in the same order. Two float
 * operations differ in form only: an exact integer product (a sum times its column's scale) is
 * made as a float product, which is exact too because it stays below 2^24 (Q4_K: 60960 x 63;
 * Q6_K: 65024 x 128, and the sum of its two sub-blocks' products, < 16,777,216). */
#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,amx-tile,amx-int8")
#include <immintrin.h>
#include <string.h>

#include "gguf_kernels.h"
#include "gguf_x8_layouts.h"

#define INLINE static inline __attribute__((always_inline))
#define UNROLL16 _Pragma("GCC unroll 16")
#define UNROLL8 _Pragma("GCC unroll 8")
#define TILE_ROWS 16
#define SPREAD_ROWS 8 /* rows of a product over two sub-blocks: each row is two tile rows */

/* The tile registers' shapes (LDTILECFG's 64-byte operand, palette 1). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* LDTILECFG's operand: tile t gets `rows` rows of `bytes` bytes. */
INLINE void shape(tile_config *c, int t, int rows, int bytes) {
    c->rows[t] = (uint8_t)rows;
    c->colsb[t] = (uint16_t)bytes;
}

/* 32 bytes of group g and the same 32 of group g + 1, as one register (columns 0-7, then 8-15). */
INLINE __m512i pair32(const void *p0, const void *p1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p0)),
                              _mm256_loadu_si256((const __m256i *)p1), 1);
}

/* 8 byte scales of each group as 16 floats. */
INLINE __m512 scales_u8(const uint8_t *p0, const uint8_t *p1) {
    const __m128i b = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)p0), _mm_loadl_epi64((const __m128i *)p1));
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b));
}
INLINE __m512 scales_i8(const int8_t *p0, const int8_t *p1) {
    const __m128i b = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)p0), _mm_loadl_epi64((const __m128i *)p1));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
}

/* 8 fp16 values of each group as 16 floats. */
INLINE __m512 halves(const uint16_t *p0, const uint16_t *p1) {
    return _mm512_cvtph_ps(_mm256_set_m128i(_mm_loadu_si128((const __m128i *)p1), _mm_loadu_si128((const __m128i *)p0)));
}

INLINE void store_rows(const __m512 *acc, int R, float *out, size_t ldo, int ncols) {
    const __mmask16 keep = (__mmask16)((1u << (8 + ncols)) - 1);
    UNROLL16
    for (int r = 0; r < TILE_ROWS; r++)
        if (r < R) _mm512_mask_storeu_ps(out + r * ldo, keep, acc[r]);
}

#define ACT_K(r) ((const act_k *)(act + (size_t)(r) * stride) + b)

/* One tile product: C (tile tc) = A (ta, loaded from a, rows a_stride apart) x B (tb, from wb,
 * rows 64 bytes apart), stored to sums. Signed x unsigned (dpbsud) or signed x signed (dpbssd). */
#define TILE_PRODUCT(ta, tb, tc, a, a_stride, wb, sums, dot) \
    do {                                                     \
        _tile_loadd(ta, a, a_stride);                        \
        _tile_loadd(tb, wb, 64);                             \
        _tile_zero(tc);                                      \
        _tile_##dot(tc, ta, tb);                             \
        _tile_stored(tc, sums, 64);                          \
    } while (0)

/* Q4_K: a super-block at a time, in three passes so that none waits on the one before (a tile
 * reads its operands from memory and writes its sums there; interleaved with the vector work of
 * the same sub-block, each step waited for the stores before it): the 8 sub-blocks' weights
 * unpacked, 4 tile products of two sub-blocks each (the spread rows: one sub-block's sums a C
 * row), then per row acc += (sum x sc) x (d x d32) for each sub-block (gguf_x8_tiles.h's
 * q4k_tile) and the mins. */
static void q4k_rows(const uint8_t *w0, const uint8_t *w1, int nb, const uint8_t *act, size_t stride,
                     const uint8_t *spread, size_t chunk_bytes, int R, float *out, size_t ldo, int ncols) {
    _Alignas(64) uint8_t wbuf[2][8][8 * 64];
    _Alignas(64) int32_t sums[2][8][TILE_ROWS * 16]; /* a sub-block's sums, or (spread) a pair's, a C tile each */
    _Alignas(64) float mins[3][8][16];
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc[TILE_ROWS];
    UNROLL16
    for (int r = 0; r < TILE_ROWS; r++) acc[r] = _mm512_setzero_ps();
    tile_config c = {.palette = 1};
    const int c_rows = spread ? 2 * R : R, a_bytes = spread ? 64 : 32, b_rows = spread ? 16 : 8;
    shape(&c, 0, c_rows, a_bytes), shape(&c, 2, c_rows, a_bytes), shape(&c, 1, b_rows, 64), shape(&c, 5, b_rows, 64);
    shape(&c, 3, c_rows, 64), shape(&c, 4, c_rows, 64);
    _tile_loadconfig(&c);
    for (int i = 0; i < nb + 2; i++) { /* super-block i unpacked, i - 1 multiplied, i - 2 summed */
        if (i < nb) {
            const q4k_x8 *x0 = (const q4k_x8 *)w0 + i, *x1 = (const q4k_x8 *)w1 + i;
            for (int s = 0; s < 8; s++) {
                for (int u = 0; u < 4; u++) { /* B row u: values 4u..4u+3 (low nibbles); row 4 + u: 16 + 4u.. */
                    const __m512i p = pair32(x0->qs[s][u], x1->qs[s][u]);
                    _mm512_store_si512(wbuf[i & 1][s] + 64 * u, _mm512_and_si512(p, m4));
                    _mm512_store_si512(wbuf[i & 1][s] + 64 * (4 + u), _mm512_and_si512(_mm512_srli_epi16(p, 4), m4));
                }
                _mm512_store_ps(mins[i % 3][s], scales_u8(x0->mn[s], x1->mn[s]));
            }
        }
        if (i >= 1 && i <= nb) {
            const int b = i - 1;
            uint8_t (*wb)[8 * 64] = wbuf[b & 1];
            int32_t (*sm)[TILE_ROWS * 16] = sums[b & 1];
            if (spread) { /* two sets of tiles, so that one product need not wait for the other */
                const uint8_t *a = spread + (size_t)(4 * b) * chunk_bytes;
                for (int p = 0; p < 4; p += 2) {
                    TILE_PRODUCT(0, 1, 3, a + p * chunk_bytes, 64, wb[2 * p], sm[p], dpbsud);
                    TILE_PRODUCT(2, 5, 4, a + (p + 1) * chunk_bytes, 64, wb[2 * p + 2], sm[p + 1], dpbsud);
                }
            } else {
                for (int s = 0; s < 8; s += 2) {
                    TILE_PRODUCT(0, 1, 3, ACT_K(0)->qs + 32 * s, stride, wb[s], sm[s], dpbsud);
                    TILE_PRODUCT(2, 5, 4, ACT_K(0)->qs + 32 * s + 32, stride, wb[s + 1], sm[s + 1], dpbsud);
                }
            }
        }
        if (i >= 2) {
            const int b = i - 2;
            const q4k_x8 *x0 = (const q4k_x8 *)w0 + b, *x1 = (const q4k_x8 *)w1 + b;
            const __m512 d = halves(x0->d, x1->d), dmin = halves(x0->dmin, x1->dmin);
            for (int s = 0; s < 8; s++) {
                const __m512 sc = scales_u8(x0->sc[s], x1->sc[s]);
                const int32_t *sum = spread ? sums[b & 1][s / 2] + 16 * (s & 1) : sums[b & 1][s];
                const int row_step = spread ? 32 : 16;
                UNROLL16
                for (int r = 0; r < TILE_ROWS; r++) {
                    if (r >= R) break;
                    const __m512 isum = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sum + row_step * r)), sc);
                    acc[r] = _mm512_fmadd_ps(isum, _mm512_mul_ps(d, _mm512_set1_ps(ACT_K(r)->d32[s])), acc[r]);
                }
            }
            UNROLL16
            for (int r = 0; r < TILE_ROWS; r++) { /* the mins: sum_s mn[s] * d32[s] * sub-block sum */
                if (r >= R) break;
                __m512 msum = _mm512_setzero_ps();
                UNROLL8
                for (int s = 0; s < 8; s++)
                    msum = _mm512_fmadd_ps(_mm512_load_ps(mins[b % 3][s]), _mm512_set1_ps(ACT_K(r)->s32[s]), msum);
                acc[r] = _mm512_fnmadd_ps(msum, dmin, acc[r]);
            }
        }
    }
    store_rows(acc, R, out, ldo, ncols);
}

/* Q6_K: the same three passes over a super-block; per 32 values one tile product of its two
 * sub-blocks of 16 (their own scales), weights q - 32; per row acc += (P0 sc0 + P1 sc1) x
 * (d x d32) (gguf_x8_tiles.h's q6k_tile, whose integer sum with the offset taken off is this one). */
static void q6k_rows(const uint8_t *w0, const uint8_t *w1, int nb, const uint8_t *act, size_t stride,
                     const uint8_t *spread, size_t chunk_bytes, int R, float *out, size_t ldo, int ncols) {
    _Alignas(64) uint8_t wbuf[16][4 * 64];
    _Alignas(64) int32_t sums[16][TILE_ROWS * 16]; /* a sub-block's sums, or (spread) a pair's, a C tile each */
    const __m512i m3f = _mm512_set1_epi8(0x3F), m03 = _mm512_set1_epi8(0x03), m0c = _mm512_set1_epi8(0x0C),
                  m30 = _mm512_set1_epi8(0x30), k32 = _mm512_set1_epi8(32);
    __m512 acc[TILE_ROWS];
    UNROLL16
    for (int r = 0; r < TILE_ROWS; r++) acc[r] = _mm512_setzero_ps();
    tile_config c = {.palette = 1};
    const int c_rows = spread ? 2 * R : R, a_bytes = spread ? 32 : 16, b_rows = spread ? 8 : 4;
    shape(&c, 0, c_rows, a_bytes), shape(&c, 2, c_rows, a_bytes), shape(&c, 1, b_rows, 64), shape(&c, 5, b_rows, 64);
    shape(&c, 3, c_rows, 64), shape(&c, 4, c_rows, 64);
    _tile_loadconfig(&c);
    for (int b = 0; b < nb; b++) {
        const q6k_x8 *x0 = (const q6k_x8 *)w0 + b, *x1 = (const q6k_x8 *)w1 + b;
        for (int s = 0; s < 16; s++) {
            const __m512i b0 = pair32(x0->q[s].b[0], x1->q[s].b[0]), b1 = pair32(x0->q[s].b[1], x1->q[s].b[1]),
                          b2 = pair32(x0->q[s].b[2], x1->q[s].b[2]);
            const __m512i q3 = _mm512_or_si512(_mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(b0, 6), m03),
                                                               _mm512_and_si512(_mm512_srli_epi16(b1, 4), m0c)),
                                               _mm512_and_si512(_mm512_srli_epi16(b2, 2), m30));
            _mm512_store_si512(wbuf[s], _mm512_sub_epi8(_mm512_and_si512(b0, m3f), k32));
            _mm512_store_si512(wbuf[s] + 64, _mm512_sub_epi8(_mm512_and_si512(b1, m3f), k32));
            _mm512_store_si512(wbuf[s] + 128, _mm512_sub_epi8(_mm512_and_si512(b2, m3f), k32));
            _mm512_store_si512(wbuf[s] + 192, _mm512_sub_epi8(q3, k32));
        }
        if (spread) {
            const uint8_t *a = spread + (size_t)(8 * b) * chunk_bytes;
            for (int t = 0; t < 8; t += 2) {
                TILE_PRODUCT(0, 1, 3, a + t * chunk_bytes, 32, wbuf[2 * t], sums[t], dpbssd);
                TILE_PRODUCT(2, 5, 4, a + (t + 1) * chunk_bytes, 32, wbuf[2 * t + 2], sums[t + 1], dpbssd);
            }
        } else {
            for (int s = 0; s < 16; s += 2) {
                TILE_PRODUCT(0, 1, 3, ACT_K(0)->qs + 16 * s, stride, wbuf[s], sums[s], dpbssd);
                TILE_PRODUCT(2, 5, 4, ACT_K(0)->qs + 16 * s + 16, stride, wbuf[s + 1], sums[s + 1], dpbssd);
            }
        }
        const __m512 d = halves(x0->d, x1->d);
        for (int t = 0; t < 8; t++) {
            const __m512 sc0 = scales_i8(x0->sc[2 * t], x1->sc[2 * t]);
            const __m512 sc1 = scales_i8(x0->sc[2 * t + 1], x1->sc[2 * t + 1]);
            const int32_t *sum0 = spread ? sums[t] : sums[2 * t], *sum1 = spread ? sums[t] + 16 : sums[2 * t + 1];
            const int row_step = spread ? 32 : 16;
            UNROLL16
            for (int r = 0; r < TILE_ROWS; r++) {
                if (r >= R) break;
                const __m512 p0 = _mm512_cvtepi32_ps(_mm512_load_si512(sum0 + row_step * r));
                const __m512 p1 = _mm512_cvtepi32_ps(_mm512_load_si512(sum1 + row_step * r));
                const __m512 v = _mm512_fmadd_ps(p1, sc1, _mm512_mul_ps(p0, sc0));
                acc[r] = _mm512_fmadd_ps(v, _mm512_mul_ps(d, _mm512_set1_ps(ACT_K(r)->d32[t])), acc[r]);
            }
        }
    }
    store_rows(acc, R, out, ldo, ncols);
}

#define ACT_32(r) ((const act_32 *)(act + (size_t)(r) * stride) + b)
#define Q8_0_BATCH 8 /* blocks whose tile products run before their float work */

/* Q8_0: per block one tile product a group, the weights' bytes as they lie, Q8_0_BATCH blocks
 * at a time; per row acc += sum x (d x d_act) (gguf_x8_tiles.h's x32_tile). */
static void q8_0_rows(const uint8_t *w0, const uint8_t *w1, int nb, const uint8_t *act, size_t stride,
                      const uint8_t *spread, size_t chunk_bytes, int R, float *out, size_t ldo, int ncols) {
    (void)spread, (void)chunk_bytes;
    const int64_t gb = x8_32_group_bytes(T_Q8_0);
    _Alignas(64) int32_t sums[Q8_0_BATCH][TILE_ROWS * 16];
    __m512 acc[TILE_ROWS];
    UNROLL16
    for (int r = 0; r < TILE_ROWS; r++) acc[r] = _mm512_setzero_ps();
    tile_config c = {.palette = 1};
    shape(&c, 0, R, 32), shape(&c, 1, 8, 32), shape(&c, 2, 8, 32), shape(&c, 3, R, 32), shape(&c, 4, R, 32);
    _tile_loadconfig(&c);
    for (int b0 = 0; b0 < nb; b0 += Q8_0_BATCH) {
        const int n = nb - b0 < Q8_0_BATCH ? nb - b0 : Q8_0_BATCH;
        for (int i = 0; i < n; i++) {
            const int b = b0 + i;
            _tile_loadd(0, ACT_32(0)->qs, stride);
            _tile_loadd(1, w0 + b * gb + 16, 32);
            _tile_loadd(2, w1 + b * gb + 16, 32);
            _tile_zero(3);
            _tile_zero(4);
            _tile_dpbssd(3, 0, 1);
            _tile_dpbssd(4, 0, 2);
            _tile_stored(3, sums[i], 64);
            _tile_stored(4, sums[i] + 8, 64);
        }
        for (int i = 0; i < n; i++) {
            const int b = b0 + i;
            const __m512 d = halves((const uint16_t *)(w0 + b * gb), (const uint16_t *)(w1 + b * gb));
            UNROLL16
            for (int r = 0; r < TILE_ROWS; r++) {
                if (r >= R) break;
                const __m512 isum = _mm512_cvtepi32_ps(_mm512_load_si512(sums[i] + 16 * r));
                acc[r] = _mm512_fmadd_ps(isum, _mm512_mul_ps(d, _mm512_set1_ps(ACT_32(r)->d)), acc[r]);
            }
        }
    }
    store_rows(acc, R, out, ldo, ncols);
}

/* The tile products' activations, for the formats whose products span two sub-blocks (Q4_K: 64
 * values, Q6_K: 32): per chunk of `span` values, each row twice, once with the first half of its
 * values and zeros, once with zeros and the second half, so that one product sums both
 * sub-blocks of up to SPREAD_ROWS rows and keeps them apart (a tile step costs ~30 cycles of
 * loads and stores whatever its size, and one sub-block of a few rows left most of it unused).
 * Chunk c of row r is at ((c * m) + r) * 2 * span bytes. */
int64_t sd_amx_spread_bytes(int type, int64_t m, int64_t k) {
    return (type == T_Q4_K || type == T_Q6_K) && m <= AMX_SPREAD_MAX_ROWS ? 2 * m * k : 0;
}

void sd_amx_spread(int type, const uint8_t *act, size_t stride, int64_t m, int64_t k, uint8_t *spread) {
    const int64_t span = type == T_Q4_K ? 64 : 32, half = span / 2;
    memset(spread, 0, (size_t)sd_amx_spread_bytes(type, m, k));
    for (int64_t c = 0; c < k / span; c++) {
        const int64_t block = c * span / QK_K, first = c * span % QK_K;
        for (int64_t r = 0; r < m; r++) {
            const int8_t *src = ((const act_k *)(act + (size_t)r * stride) + block)->qs + first;
            uint8_t *dst = spread + (size_t)((c * m + r) * 2 * span);
            memcpy(dst, src, (size_t)half);
            memcpy(dst + span + half, src + half, (size_t)half);
        }
    }
}

typedef void (*rows_fn)(const uint8_t *w0, const uint8_t *w1, int nb, const uint8_t *act, size_t stride,
                        const uint8_t *spread, size_t chunk_bytes, int R, float *out, size_t ldo, int ncols);

/* The pair_fn of a format: rows in tiles of 16, or of SPREAD_ROWS with spread activations. */
#define AMX_PAIR(name, rows, span)                                                                                \
    static void name(const uint8_t *w, int64_t group_bytes, int nb, const uint8_t *act, size_t stride,            \
                     const uint8_t *spread, int n_rows, float *out, size_t ldo, int ncols) {                      \
        const size_t chunk_bytes = (size_t)n_rows * 2 * (span);                                                    \
        const int chunk = spread ? SPREAD_ROWS : TILE_ROWS;                                                        \
        for (int r0 = 0; r0 < n_rows; r0 += chunk) {                                                               \
            const int R = n_rows - r0 < chunk ? n_rows - r0 : chunk;                                               \
            rows(w, w + group_bytes, nb, act + (size_t)r0 * stride, stride,                                        \
                 spread ? spread + (size_t)r0 * 2 * (span) : NULL, chunk_bytes, R, out + (size_t)r0 * ldo, ldo, ncols); \
        }                                                                                                          \
        _tile_release();                                                                                           \
    }
AMX_PAIR(amx_q4k, q4k_rows, 64)
AMX_PAIR(amx_q6k, q6k_rows, 32)
AMX_PAIR(amx_q8_0, q8_0_rows, 0)

pair_fn sd_amx_x8_pair(int type) {
    switch (type) {
    case T_Q4_K: return amx_q4k;
    case T_Q6_K: return amx_q6k;
    case T_Q8_0: return amx_q8_0;
    default: return NULL;
    }
}
#endif
