/* The AMX-INT8 kernel set's tile products: the repacked ("x8") Q4_K, Q6_K and Q8_0 weights times
 * AMX_MIN_ROWS or more activation rows (gguf_gemm.c), two 8-column groups at a time; a lone
 * group takes the AVX-512 VNNI tiles, fewer rows the 512-bit ones (gguf_vnni512.c).
 *
 * Why tiles: one tdpbsud multiplies a 16-row x 64-byte tile of signed activations by a 64 x 16
 * tile of unsigned weights into 16 x 16 int32 sums, ~8x the products two 512-bit vpdpbusd make
 * in the same time. What bounds a tile step is the work around it: every 32 values (16 for
 * Q6_K) carry their own activation scale (per-32 scales keep the 1.5B's outlier channels;
 * ggml's per-256 Q8_K loses them), so each 32-value sum is stored and folded into float
 * accumulators with 512-bit vector instructions, one 16-column register per row; and a tile's
 * loads and stores cost ~30 cycles whatever its rows, which a few rows do not repay.
 *
 * The operands: tile A holds 16 activation rows, straight from the quantized rows (act_k /
 * act_32 start with their int8 values, so a row stride loads them; rows past the call's are
 * allocated padding whose sums are never read); tile B holds the weights in
 * the layout the tile product reads (row kk: 4 consecutive values of each of 16 columns), which is
 * the x8 layout's own step (8 columns x 4 values) for two adjacent groups side by side: Q8_0's
 * bytes are loaded as they are, one group a tile; Q4_K's and Q6_K's are unpacked to bytes in a
 * 512-byte buffer first. Q6_K's are stored as q - 32, signed (tdpbssd): the offset then needs no
 * correction term.
 *
 * The same bits as the VNNI and AVX2 tiles (gguf_x8_tiles.h): the integer sums are exact on every
 * set, and each output goes through the same float operations in the same order. Q6_K's differ
 * in form only: an exact integer product (a sum times its column's scale) is made as a float
 * product, which is exact too because it stays below 2^24 (65024 x 128, and the sum of its two
 * sub-blocks' products, < 16,777,216). Their exactness is tested on CPUs without AMX too, with the
 * tile products emulated (amx_emulation.h). */
#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,amx-tile,amx-int8")
#include <immintrin.h>
#include <string.h>

#include "gguf_kernels.h"
#ifdef SD_AMX_EMULATE
#include "amx_emulation.h" /* tile products in plain C, for tests on CPUs without AMX */
#endif

#include "gguf_x8_common.h"
#include "gguf_x8_layouts.h"
#define X8_WIDTH 512 /* the pair loads and stores of the 512-bit tiles (gguf_x8_vec.h) */
#include "gguf_x8_vec.h"

#define UNROLL16 _Pragma("GCC unroll 16")
#define TILE_ROWS AMX_TILE_ROWS

/* The tile registers' shapes (LDTILECFG's 64-byte operand, palette 1). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* The rows' accumulators: in registers when the call has one tile of rows; with more, each tile
 * of rows keeps its accumulators in its output rows between super-blocks (v_store puts them
 * there; the weights are unpacked once a super-block for every tile of rows, and each output
 * still goes through the same float operations in the same order). */
INLINE void load_rows(__m512 *acc, int R, const float *out, size_t ldo, int ncols, int first) {
    const __mmask16 keep = (__mmask16)((1u << (8 + ncols)) - 1);
    UNROLL16
    for (int r = 0; r < TILE_ROWS; r++)
        if (r < R) acc[r] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(keep, out + r * ldo);
}

#define ACT_32(r) ((const act_32 *)(act + (size_t)(r) * stride) + b)

/* One tile product: C (tile tc) = A (ta: 16 activation rows from a) x B (tb, from wb, rows of 64
 * bytes), stored to sums. Signed x unsigned (dpbsud) or signed x signed (dpbssd). */
#define TILE_PRODUCT(ta, tb, tc, a, wb, wb_stride, sums, dot) \
    do {                                                      \
        _tile_loadd(ta, a, stride);                           \
        _tile_loadd(tb, wb, wb_stride);                       \
        _tile_zero(tc);                                       \
        _tile_##dot(tc, ta, tb);                              \
        _tile_stored(tc, sums, 64);                           \
    } while (0)

/* Tile of rows t of a call: its activation rows `at`, output rows `ot`, and R <= 16 of them. */
#define TILE_OF_ROWS(t)                                                 \
    const uint8_t *at = act + (size_t)(t) * TILE_ROWS * stride;     \
    float *ot = out + (size_t)(t) * TILE_ROWS * ldo;                \
    const int R = n_rows - (t) * TILE_ROWS < TILE_ROWS ? n_rows - (t) * TILE_ROWS : TILE_ROWS

/* The n sub-blocks of super-block b (bytes values each) of tile of rows `at` times wbuf[s] into
 * sums[s], on the two sets of tiles by turns. */
#define SUB_BLOCK_PRODUCTS(n, bytes, dot)                                                                          \
    for (int s = 0; s < (n); s += 2) {                                                                             \
        TILE_PRODUCT(0, 1, 3, ((const act_k *)at + b)->qs + (bytes) * s, wbuf[s], 64, sums[s], dot);              \
        TILE_PRODUCT(2, 5, 4, ((const act_k *)at + b)->qs + (bytes) * (s + 1), wbuf[s + 1], 64, sums[s + 1], dot); \
    }

/* Tiles 0, 2: 16 activation rows of a_bytes; 1, 5 (Q8_0: 1, 2): weights, b_rows of b_bytes;
 * 3, 4: 16 rows of int32 sums, c_bytes. Two sets, so that one product need not wait for the
 * other. The activation rows past the call's are padding (sd_gguf_gemm allocates them); their
 * sums are never read. */
static void configure(int a_bytes, int b_rows, int b_bytes, int c_bytes, int b_tile0, int b_tile1) {
    tile_config c = {.palette = 1};
    c.rows[0] = c.rows[2] = c.rows[3] = c.rows[4] = TILE_ROWS;
    c.colsb[0] = c.colsb[2] = (uint16_t)a_bytes;
    c.colsb[3] = c.colsb[4] = (uint16_t)c_bytes;
    c.rows[b_tile0] = c.rows[b_tile1] = (uint8_t)b_rows;
    c.colsb[b_tile0] = c.colsb[b_tile1] = (uint16_t)b_bytes;
    _tile_loadconfig(&c);
}

/* Q4_K: a super-block at a time, in three passes so that none waits on the one before (a tile
 * reads its operands from memory and writes its sums there; interleaved with the vector work of
 * the same sub-block, each step waited for the stores before it): the 8 sub-blocks' weights
 * unpacked; then for each tile of 16 rows, one tile product a sub-block and per row
 * acc += sum x ((d x sc) x d32) (gguf_x8_tiles.h's q4k_tile), and the mins. */
static void amx_q4k(const uint8_t *w, int64_t gb, int nb, const uint8_t *act, size_t stride, int n_rows,
                    float *out, size_t ldo, int ncols) {
    _Alignas(64) uint8_t wbuf[8][8 * 64];
    _Alignas(64) int32_t sums[8][TILE_ROWS * 16];
    _Alignas(64) float mins[8][16];
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const int tiles = (n_rows + TILE_ROWS - 1) / TILE_ROWS;
    __m512 acc[TILE_ROWS] = {0};
    configure(32, 8, 64, 64, 1, 5);
    for (int b = 0; b < nb; b++) {
        const q4k_x8 *x = (const q4k_x8 *)w + b; /* the next group's block is gb further */
        for (int s = 0; s < 8; s++) {
            for (int u = 0; u < 4; u++) { /* B row u: values 4u..4u+3 (low nibbles); row 4 + u: 16 + 4u.. */
                const __m512i p = w_load(x->qs[s][u], gb);
                _mm512_store_si512(wbuf[s] + 64 * u, _mm512_and_si512(p, m4));
                _mm512_store_si512(wbuf[s] + 64 * (4 + u), _mm512_and_si512(_mm512_srli_epi16(p, 4), m4));
            }
            _mm512_store_ps(mins[s], v_cvt(w_u8_to32(x->mn[s], gb)));
        }
        const __m512 d = w_halves(x->d, gb), dmin = w_halves(x->dmin, gb);
        for (int t = 0; t < tiles; t++) {
            TILE_OF_ROWS(t);
            SUB_BLOCK_PRODUCTS(8, 32, dpbsud);
            if (tiles > 1 || b == 0) load_rows(acc, R, ot, ldo, ncols, b == 0);
            for (int s = 0; s < 8; s++) {
                const __m512 scale = _mm512_mul_ps(d, v_cvt(w_u8_to32(x->sc[s], gb))); /* d x sc: exact */
                UNROLL16
                for (int r = 0; r < TILE_ROWS; r++) {
                    if (r >= R) break;
                    const float da = ((const act_k *)(at + r * stride) + b)->d32[s];
                    const __m512 sum = _mm512_cvtepi32_ps(_mm512_load_si512(sums[s] + 16 * r));
                    acc[r] = _mm512_fmadd_ps(sum, _mm512_mul_ps(scale, _mm512_set1_ps(da)), acc[r]);
                }
            }
            UNROLL16
            for (int r = 0; r < TILE_ROWS; r++) { /* the mins: sum_s mn[s] * d32[s] * sub-block sum */
                if (r >= R) break;
                const act_k *a = (const act_k *)(at + r * stride) + b;
                __m512 msum = _mm512_setzero_ps();
                UNROLL
                for (int s = 0; s < 8; s++) msum = _mm512_fmadd_ps(_mm512_load_ps(mins[s]), _mm512_set1_ps(a->s32[s]), msum);
                acc[r] = _mm512_fnmadd_ps(msum, dmin, acc[r]);
            }
            if (tiles > 1 || b == nb - 1) v_store(acc, R, ot, ldo, ncols);
        }
    }
    _tile_release();
}

/* Q6_K: the same passes; per 32 values two tile products (sub-blocks of 16 with their own
 * scales), weights q - 32; per row acc += (P0 sc0 + P1 sc1) x (d x d32) (gguf_x8_tiles.h's
 * q6k_tile, whose integer sum with the offset taken off is this one). */
static void amx_q6k(const uint8_t *w, int64_t gb, int nb, const uint8_t *act, size_t stride, int n_rows,
                    float *out, size_t ldo, int ncols) {
    _Alignas(64) uint8_t wbuf[16][4 * 64];
    _Alignas(64) int32_t sums[16][TILE_ROWS * 16];
    const __m512i m3f = _mm512_set1_epi8(0x3F), m03 = _mm512_set1_epi8(0x03), m0c = _mm512_set1_epi8(0x0C),
                  m30 = _mm512_set1_epi8(0x30), k32 = _mm512_set1_epi8(32);
    const int tiles = (n_rows + TILE_ROWS - 1) / TILE_ROWS;
    __m512 acc[TILE_ROWS] = {0};
    configure(16, 4, 64, 64, 1, 5);
    for (int b = 0; b < nb; b++) {
        const q6k_x8 *x = (const q6k_x8 *)w + b; /* the next group's block is gb further */
        for (int s = 0; s < 16; s++) {
            const __m512i b0 = w_load(x->q[s].b[0], gb), b1 = w_load(x->q[s].b[1], gb), b2 = w_load(x->q[s].b[2], gb);
            const __m512i q3 = _mm512_or_si512(_mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(b0, 6), m03),
                                                               _mm512_and_si512(_mm512_srli_epi16(b1, 4), m0c)),
                                               _mm512_and_si512(_mm512_srli_epi16(b2, 2), m30));
            _mm512_store_si512(wbuf[s], _mm512_sub_epi8(_mm512_and_si512(b0, m3f), k32));
            _mm512_store_si512(wbuf[s] + 64, _mm512_sub_epi8(_mm512_and_si512(b1, m3f), k32));
            _mm512_store_si512(wbuf[s] + 128, _mm512_sub_epi8(_mm512_and_si512(b2, m3f), k32));
            _mm512_store_si512(wbuf[s] + 192, _mm512_sub_epi8(q3, k32));
        }
        const __m512 d = w_halves(x->d, gb);
        for (int t = 0; t < tiles; t++) {
            TILE_OF_ROWS(t);
            SUB_BLOCK_PRODUCTS(16, 16, dpbssd);
            if (tiles > 1 || b == 0) load_rows(acc, R, ot, ldo, ncols, b == 0);
            for (int t2 = 0; t2 < 8; t2++) {
                const __m512 sc0 = v_cvt(w_i8_to32(x->sc[2 * t2], gb));
                const __m512 sc1 = v_cvt(w_i8_to32(x->sc[2 * t2 + 1], gb));
                UNROLL16
                for (int r = 0; r < TILE_ROWS; r++) {
                    if (r >= R) break;
                    const float da = ((const act_k *)(at + r * stride) + b)->d32[t2];
                    const __m512 p0 = _mm512_cvtepi32_ps(_mm512_load_si512(sums[2 * t2] + 16 * r));
                    const __m512 p1 = _mm512_cvtepi32_ps(_mm512_load_si512(sums[2 * t2 + 1] + 16 * r));
                    const __m512 v = _mm512_fmadd_ps(p1, sc1, _mm512_mul_ps(p0, sc0));
                    acc[r] = _mm512_fmadd_ps(v, _mm512_mul_ps(d, _mm512_set1_ps(da)), acc[r]);
                }
            }
            if (tiles > 1 || b == nb - 1) v_store(acc, R, ot, ldo, ncols);
        }
    }
    _tile_release();
}

#define Q8_0_BATCH 8 /* blocks whose tile products run before their float work */

/* Q8_0: per block one tile product a group, the weights' bytes as they lie (no unpacking, so the
 * tiles of rows simply run one after the other), Q8_0_BATCH blocks at a time; per row
 * acc += sum x (d x d_act) (gguf_x8_tiles.h's x32_tile). */
static void amx_q8_0(const uint8_t *w, int64_t gb, int nb, const uint8_t *act, size_t stride, int n_rows,
                     float *out, size_t ldo, int ncols) {
    const int64_t bb = x8_32_group_bytes(T_Q8_0);
    const uint8_t *w1 = w + gb;
    _Alignas(64) int32_t sums[Q8_0_BATCH][TILE_ROWS * 16];
    __m512 acc[TILE_ROWS] = {0};
    configure(32, 8, 32, 32, 1, 2);
    for (int r0 = 0; r0 < n_rows; r0 += TILE_ROWS, act += TILE_ROWS * stride, out += TILE_ROWS * ldo) {
        const int R = n_rows - r0 < TILE_ROWS ? n_rows - r0 : TILE_ROWS;
        load_rows(acc, R, out, ldo, ncols, 1);
        for (int b0 = 0; b0 < nb; b0 += Q8_0_BATCH) {
            const int n = nb - b0 < Q8_0_BATCH ? nb - b0 : Q8_0_BATCH;
            for (int i = 0; i < n; i++) {
                const int b = b0 + i;
                _tile_loadd(0, ACT_32(0)->qs, stride);
                _tile_loadd(1, w + b * bb + 16, 32);
                _tile_loadd(2, w1 + b * bb + 16, 32);
                _tile_zero(3);
                _tile_zero(4);
                _tile_dpbssd(3, 0, 1);
                _tile_dpbssd(4, 0, 2);
                _tile_stored(3, sums[i], 64);
                _tile_stored(4, sums[i] + 8, 64);
            }
            for (int i = 0; i < n; i++) {
                const int b = b0 + i;
                const __m512 d = w_halves(w + b * bb, gb);
                UNROLL16
                for (int r = 0; r < TILE_ROWS; r++) {
                    if (r >= R) break;
                    const __m512 isum = _mm512_cvtepi32_ps(_mm512_load_si512(sums[i] + 16 * r));
                    acc[r] = _mm512_fmadd_ps(isum, _mm512_mul_ps(d, _mm512_set1_ps(ACT_32(r)->d)), acc[r]);
                }
            }
        }
        v_store(acc, R, out, ldo, ncols);
    }
    _tile_release();
}

pair_fn sd_amx_x8_pair(int type) {
    switch (type) {
    case T_Q4_K: return amx_q4k;
    case T_Q6_K: return amx_q6k;
    case T_Q8_0: return amx_q8_0;
    default: return NULL;
    }
}
#endif
