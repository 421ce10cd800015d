/* The tiles that multiply the repacked ("x8") layouts (gguf_x8_layouts.h), written once for every
 * vector kernel set: gguf_x8_avx2.c and gguf_vnni.c each include this file after their own
 * `#pragma GCC target` and the integer dot product their instructions make.
 *
 * Why one template: the sets differ only in how 4 unsigned weight bytes times 4 signed activation
 * bytes reach an int32 lane (AVX2: vpmaddubsw pairs summed in int16, then vpmaddwd; AVX-512 VNNI:
 * one vpdpbusd into int32). Integer sums are exact in both (the AVX2 int16 sums are bounded in
 * each kernel's comment), and every float step below is shared, so the two sets give every output
 * the same bits, and a row the same bits whatever the number of rows (the per-row float steps do
 * not depend on R).
 *
 * The including file defines:
 *   X8_WIDTH           256 (a register holds one 8-column group; the tiles are group_fns) or 512
 *                      (two adjacent groups; pair_fns, and Q4_K and Q6_K only: gguf_x8_vec.h)
 *   X8_ROWS            rows per tile (instantiated 1..X8_ROWS; more registers, more rows)
 *   X8_SPLIT           tiles of up to this many rows keep two integer chains per row: VNNI's
 *                      vpdpbusd has a latency of several cycles, and one or two rows have too few
 *                      independent chains to hide it (0: never)
 *   X8_DOT32           1 where the accumulator is int32 lanes (VNNI), which hold a whole sub-block's
 *                      products, so a scale is applied once a sub-block; 0 where they are int16
 *                      pairs (AVX2), which hold two steps (Q6_K)
 *   dot_first(w, a)    the products of unsigned bytes w and signed bytes a, as an accumulator
 *   dot(acc, w, a)     acc + dot_first(w, a)
 *   dot_add(x, y)      the sum of two accumulators
 *   dot_to32(acc)      the accumulator as int32 column sums
 *   dot_acc32(i, w, a) int32 column sums i + the products (256 bits)
 *   dot_scale_i8(p)    the columns' signed byte scales (Q6_K), as dot_apply takes them (at 512
 *                      bits, 8 at p and 8 at p + gb)
 *   dot_apply(acc, s)  int32 column sums, each times its column's scale
 *   X8_GROUP_FN        the name of the function that returns the group_fn (pair_fn) of a type
 */
#include "gguf_x8_common.h"
#include "gguf_x8_layouts.h"
#include "gguf_x8_vec.h"


/* --- Q4_K (gguf_x8.c): within a 32-value sub-block the 8 steps sum to at most |8 x 2 x 15 x 127|
 * = 30480 in int16 (60960 in int32 lanes). The fold per row is a convert, a multiply and an FMA:
 * acc += sum x ((d x sc) x d32), where d x sc, the columns' weight scale times their sub-block
 * scale, is made once a sub-block for all rows (sc applied to each row's integer sum instead, a
 * vpmulld on VNNI, cost one more instruction a row). */
INLINE void q4k_tile(const uint8_t *w, const int64_t gb, int nb, const uint8_t *act, size_t stride, const int R,
                     float *out, size_t ldo, int ncols) {
    const vi m4 = v_set1_8(0x0F);
    const int split = R <= X8_SPLIT;
    vf acc[X8_ROWS];
    UNROLL
    for (int r = 0; r < R; r++) acc[r] = v_zero_f();
    for (int b = 0; b < nb; b++) {
        const q4k_x8 *x = (const q4k_x8 *)w + b;
        const vf d = w_halves(x->d, gb);
        const vf dmin = w_halves(x->dmin, gb);
        for (int s = 0; s < 8; s++) {
            { /* an eighth of the super-block X8_PREFETCH super-blocks ahead (see gguf_kernels.h) */
                const char *pf = (const char *)(x + X8_PREFETCH) + 148 * s;
                w_prefetch(pf, gb);
                w_prefetch(pf + 64, gb);
                w_prefetch(pf + 128, gb);
            }
            /* d x sc, made once for all rows: exact in float (an 11-bit significand x 6 bits) */
            const vf scale = v_mul(d, v_cvt(w_u8_to32(x->sc[s], gb)));
            vi lo_sum[X8_ROWS], hi_sum[X8_ROWS];
            UNROLL
            for (int r = 0; r < R; r++) lo_sum[r] = hi_sum[r] = v_zero_i();
            ROLLED
            for (int u = 0; u < 4; u++) {
                const vi packed = w_load(x->qs[s][u], gb);
                const vi lo = v_and(packed, m4), hi = v_and(v_srli16(packed, 4), m4);
                UNROLL
                for (int r = 0; r < R; r++) {
                    const int8_t *aq = ((const act_k *)(act + r * stride) + b)->qs + 32 * s + 4 * u;
                    lo_sum[r] = dot(lo_sum[r], lo, v_bcast4(aq));
                    if (split)
                        hi_sum[r] = dot(hi_sum[r], hi, v_bcast4(aq + 16));
                    else
                        lo_sum[r] = dot(lo_sum[r], hi, v_bcast4(aq + 16));
                }
            }
            UNROLL
            for (int r = 0; r < R; r++) {
                const float da = ((const act_k *)(act + r * stride) + b)->d32[s];
                const vi sum = split ? dot_add(lo_sum[r], hi_sum[r]) : lo_sum[r];
                acc[r] = v_fmadd(v_cvt(dot_to32(sum)), v_mul(scale, v_set1_f(da)), acc[r]);
            }
        }
        UNROLL
        for (int r = 0; r < R; r++) { /* the mins: column c gets sum_s mn[s][c] * d32[s] * sub-block sum */
            const act_k *a = (const act_k *)(act + r * stride) + b;
            vf msum = v_zero_f();
            UNROLL
            for (int s = 0; s < 8; s++) {
                const vf m = v_cvt(w_u8_to32(x->mn[s], gb));
                msum = v_fmadd(m, v_set1_f(a->s32[s]), msum);
            }
            acc[r] = v_fnmadd(msum, dmin, acc[r]);
        }
    }
    v_store(acc, R, out, ldo, ncols);
}

/* --- Q6_K (gguf_x8_q6k.c): per sub-block of 16 values, its 4 steps in int32 (X8_DOT32) or two
 * steps at a time in int16 (unsigned 6-bit q times int8, |2 x 2 x 63 x 127| = 32004), then
 * dot_apply with the 8 columns' scales (the same exact integer either way); per
 * 32 values the -32 offset comes off exactly (32 sc times the activation's 16-value sums) and one
 * FMA folds the integer sums into the row's float accumulator with d * d32. */
#define ACT_K(r) ((const act_k *)(act + (size_t)(r) * stride) + b)

/* A Q6_K sub-block's fourth step of 4 values a column: the top 2 bits of the bytes of its first three
 * steps (whose low 6 bits are those steps' values), in both integer widths' order. */
INLINE vi q6k_fourth_step(const vi b0, const vi b1, const vi b2) {
    return v_or(v_or(v_and(v_srli16(b0, 6), v_set1_8(0x03)), v_and(v_srli16(b1, 4), v_set1_8(0x0C))),
                v_and(v_srli16(b2, 2), v_set1_8(0x30)));
}

INLINE void q6k_tile(const uint8_t *w, const int64_t gb, int nb, const uint8_t *act, size_t stride, const int R,
                     float *out, size_t ldo, int ncols) {
    const vi m3f = v_set1_8(0x3F);
    vf acc[X8_ROWS];
    UNROLL
    for (int r = 0; r < R; r++) acc[r] = v_zero_f();
    for (int b = 0; b < nb; b++) {
        const q6k_x8 *x = (const q6k_x8 *)w + b;
        const vf d = w_halves(x->d, gb);
        ROLLED
        for (int t = 0; t < 8; t++) { /* 32 values: sub-blocks 2t, 2t + 1 */
            { /* an eighth of the super-block X8_PREFETCH super-blocks ahead (see gguf_kernels.h) */
                const char *pf = (const char *)(x + X8_PREFETCH) + 210 * t;
                w_prefetch(pf, gb);
                w_prefetch(pf + 64, gb);
                w_prefetch(pf + 128, gb);
                w_prefetch(pf + 192, gb);
            }
            vi isum[X8_ROWS];
            UNROLL
            for (int h = 0; h < 2; h++) {
                const int s = 2 * t + h;
                const vi scale = dot_scale_i8(x->sc[s]);
                const vi b0 = w_load(x->q[s].b[0], gb);
                const vi b1 = w_load(x->q[s].b[1], gb);
                const vi q0 = v_and(b0, m3f), q1 = v_and(b1, m3f);
#if X8_DOT32 /* int32 sums: the sub-block's 16 products in one chain, its scale applied once */
                const vi b2 = w_load(x->q[s].b[2], gb);
                const vi q2 = v_and(b2, m3f);
                const vi q3 = q6k_fourth_step(b0, b1, b2);
                UNROLL
                for (int r = 0; r < R; r++) {
                    const int8_t *aq = ACT_K(r)->qs + 16 * s;
                    const vi p = dot(dot(dot(dot_first(q0, v_bcast4(aq)), q1, v_bcast4(aq + 4)), q2, v_bcast4(aq + 8)),
                                     q3, v_bcast4(aq + 12));
                    isum[r] = h ? v_add32(isum[r], dot_apply(p, scale)) : dot_apply(p, scale);
                }
#else /* int16 sums: two steps at a time, each pair widened by its scale */
                UNROLL
                for (int r = 0; r < R; r++) {
                    const int8_t *aq = ACT_K(r)->qs + 16 * s;
                    const vi p = dot(dot_first(q0, v_bcast4(aq)), q1, v_bcast4(aq + 4));
                    isum[r] = h ? v_add32(isum[r], dot_apply(p, scale)) : dot_apply(p, scale);
                }
                const vi b2 = w_load(x->q[s].b[2], gb);
                const vi q2 = v_and(b2, m3f);
                const vi q3 = q6k_fourth_step(b0, b1, b2);
                UNROLL
                for (int r = 0; r < R; r++) {
                    const int8_t *aq = ACT_K(r)->qs + 16 * s + 8;
                    const vi p = dot(dot_first(q2, v_bcast4(aq)), q3, v_bcast4(aq + 4));
                    isum[r] = v_add32(isum[r], dot_apply(p, scale));
                }
#endif
            }
            /* lanes 2c, 2c+1: 32 sc[2t][c], 32 sc[2t+1][c], against the pair (bsum16[2t], bsum16[2t+1]) */
            const vi off = q6k_offsets(x->sc[2 * t], x->sc[2 * t + 1], gb);
            UNROLL
            for (int r = 0; r < R; r++) {
                const vi v = v_sub32(isum[r], v_madd16(off, v_bcast4(ACT_K(r)->bsum16 + 2 * t)));
                acc[r] = v_fmadd(v_cvt(v), v_mul(d, v_set1_f(ACT_K(r)->d32[t])), acc[r]);
            }
        }
    }
    v_store(acc, R, out, ldo, ncols);
}

#if X8_WIDTH == 256
/* --- Q4_0, Q5_0, Q8_0 (gguf_x8_32.c): the unsigned formats sum 4 steps in int16 (4 x 2 x 31 x
 * 127 = 31496) and take off their offset (8 or 16) times the activation block's exact sum; Q8_0
 * multiplies |w| by the activation with w's sign (vpsignb). */
INLINE void x32_tile(const int type, const uint8_t *w, int nb, const uint8_t *act, size_t stride, const int R,
                     float *out, size_t ldo, int ncols) {
    const int64_t gb = x8_32_group_bytes(type);
    const __m256i m4 = _mm256_set1_epi8(0x0F), one8 = _mm256_set1_epi8(1);
    const int offset = type == T_Q4_0 ? 8 : 16, split = R <= X8_SPLIT;
    __m256 acc[X8_ROWS];
    UNROLL
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *x = w + b * gb;
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x));
        __m256i isum[X8_ROWS], isum2[X8_ROWS];
        UNROLL
        for (int r = 0; r < R; r++) isum[r] = isum2[r] = _mm256_setzero_si256();
        if (type == T_Q8_0) {
            ROLLED
            for (int u = 0; u < 8; u++) {
                const __m256i q = _mm256_loadu_si256((const __m256i *)(x + 16 + 32 * u));
                const __m256i qabs = _mm256_sign_epi8(q, q);
                UNROLL
                for (int r = 0; r < R; r++) {
                    const __m256i a = _mm256_sign_epi8(bcast4(((const act_32 *)(act + r * stride) + b)->qs + 4 * u), q);
                    if (split && (u & 1))
                        isum2[r] = dot_acc32(isum2[r], qabs, a);
                    else
                        isum[r] = dot_acc32(isum[r], qabs, a);
                }
            }
        } else {
            const __m256i qh = type == T_Q5_0 ? _mm256_loadu_si256((const __m256i *)(x + 16 + 128)) : _mm256_setzero_si256();
            __m256i lo_sum[X8_ROWS], hi_sum[X8_ROWS];
            UNROLL
            for (int r = 0; r < R; r++) lo_sum[r] = hi_sum[r] = _mm256_setzero_si256();
            ROLLED
            for (int p = 0; p < 4; p++) { /* steps p and p + 4: values 4p.. and 16 + 4p.. */
                const __m256i packed = _mm256_loadu_si256((const __m256i *)(x + 16 + 32 * p));
                __m256i lo = _mm256_and_si256(packed, m4), hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), m4);
                if (type == T_Q5_0) {
                    const __m128i shift_lo = _mm_cvtsi32_si128(p), shift_hi = _mm_cvtsi32_si128(p + 4);
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, shift_lo), one8), 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, shift_hi), one8), 4));
                }
                UNROLL
                for (int r = 0; r < R; r++) {
                    const int8_t *aq = ((const act_32 *)(act + r * stride) + b)->qs + 4 * p;
                    lo_sum[r] = dot(lo_sum[r], lo, bcast4(aq));
                    if (split)
                        hi_sum[r] = dot(hi_sum[r], hi, bcast4(aq + 16));
                    else
                        lo_sum[r] = dot(lo_sum[r], hi, bcast4(aq + 16));
                    if (p & 1) { /* 4 products summed: move them to int32 before they could overflow int16 */
                        isum[r] = _mm256_add_epi32(isum[r], dot_to32(split ? dot_add(lo_sum[r], hi_sum[r]) : lo_sum[r]));
                        lo_sum[r] = hi_sum[r] = _mm256_setzero_si256();
                    }
                }
            }
            UNROLL
            for (int r = 0; r < R; r++)
                isum[r] = _mm256_sub_epi32(isum[r], _mm256_set1_epi32(offset * ((const act_32 *)(act + r * stride) + b)->sum));
        }
        UNROLL
        for (int r = 0; r < R; r++) {
            const act_32 *a = (const act_32 *)(act + r * stride) + b;
            const __m256i total = split ? _mm256_add_epi32(isum[r], isum2[r]) : isum[r];
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(d, _mm256_set1_ps(a->d)), acc[r]);
        }
    }
    x8_store(acc, R, out, ldo, ncols);
}

#endif

/* One instantiation per (format, rows): R is a compile-time constant inside each, so the row
 * arrays live in registers. Then the group_fn (pair_fn) of each format: any number of rows,
 * X8_ROWS at a time. */
#define X8_Q4K(R) q4k_tile(w, gb, nb, act, stride, R, out, ldo, ncols)
#define X8_Q6K(R) q6k_tile(w, gb, nb, act, stride, R, out, ldo, ncols)

#if X8_ROWS != 6 && X8_ROWS != 8
#error "X8_ROWS: tiles are instantiated for 6 or 8 rows"
#endif
#if X8_WIDTH == 512
X8_PAIR_ROWS(x8_q4k, X8_Q4K, X8_ROWS)
X8_PAIR_ROWS(x8_q6k, X8_Q6K, X8_ROWS)

pair_fn X8_GROUP_FN(int type) {
    switch (type) {
    case T_Q4_K: return x8_q4k;
    case T_Q6_K: return x8_q6k;
    default: return NULL;
    }
}
#else
#define X8_Q4_0(R) x32_tile(T_Q4_0, w, nb, act, stride, R, out, ldo, ncols)
#define X8_Q5_0(R) x32_tile(T_Q5_0, w, nb, act, stride, R, out, ldo, ncols)
#define X8_Q8_0(R) x32_tile(T_Q8_0, w, nb, act, stride, R, out, ldo, ncols)
#define X8_GROUP(name, call) X8_GROUP_ROWS(name, call, X8_ROWS)
X8_GROUP(x8_q4k, X8_Q4K)
X8_GROUP(x8_q6k, X8_Q6K)
X8_GROUP(x8_q4_0, X8_Q4_0)
X8_GROUP(x8_q5_0, X8_Q5_0)
X8_GROUP(x8_q8_0, X8_Q8_0)

group_fn X8_GROUP_FN(int type) {
    switch (type) {
    case T_Q4_K: return x8_q4k;
    case T_Q6_K: return x8_q6k;
    case T_Q4_0: return x8_q4_0;
    case T_Q5_0: return x8_q5_0;
    case T_Q8_0: return x8_q8_0;
    default: return NULL;
    }
}
#endif
