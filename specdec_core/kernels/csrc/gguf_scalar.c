/* Portable reference tiles: exact integer sums per (sub-)block, then one float step per block in a
 * fixed order. Used where AVX2/FMA is absent, and by the tests as a second implementation. */
#include <string.h>

#include "gguf_kernels.h"

float sd_fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal half: normalise */
        exp = 113;
        while (!(man & 0x400)) { man <<= 1; exp--; }
        bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* The 6-bit scales and mins of Q4_K/Q5_K's eight sub-blocks (ggml's get_scale_min_k4). */
void sd_q4k_scale_min(const uint8_t *q, uint8_t *sc, uint8_t *mn) {
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        mn[j] = q[j + 4] & 63;
        sc[j + 4] = (q[j + 8] & 0xF) | ((q[j] >> 6) << 4);
        mn[j + 4] = (q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4);
    }
}

static void tile_q8_0(const uint8_t *w, int nb, const uint8_t *act, size_t stride, int rows, float *out, size_t ldo) {
    const blk_q8_0 *x = (const blk_q8_0 *)w;
    for (int r = 0; r < rows; r++) {
        const act_32 *a = (const act_32 *)(act + r * stride);
        float sum = 0.0f;
        for (int b = 0; b < nb; b++) {
            int32_t isum = 0;
            for (int i = 0; i < QK32; i++) isum += x[b].qs[i] * a[b].qs[i];
            sum += sd_fp16_to_fp32(x[b].d) * a[b].d * (float)isum;
        }
        out[r * ldo] = sum;
    }
}

/* Q4_0/Q4_1/Q5_0/Q5_1: element i < 16 is the low nibble of qs[i], i >= 16 the high nibble of
 * qs[i - 16]; the 5-bit formats add bit i of qh as the fifth bit. */
static void tile_q4q5(int type, const uint8_t *w, int nb, const uint8_t *act, size_t stride, int rows, float *out, size_t ldo) {
    size_t bsize = type == T_Q4_0 ? sizeof(blk_q4_0) : type == T_Q4_1 ? sizeof(blk_q4_1)
                 : type == T_Q5_0 ? sizeof(blk_q5_0) : sizeof(blk_q5_1);
    int has_min = type == T_Q4_1 || type == T_Q5_1, five = type == T_Q5_0 || type == T_Q5_1;
    int offset = has_min ? 0 : (five ? 16 : 8);
    for (int r = 0; r < rows; r++) {
        const act_32 *a = (const act_32 *)(act + r * stride);
        float sum = 0.0f;
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = w + b * bsize;
            uint16_t d16, m16 = 0;
            memcpy(&d16, blk, 2);
            if (has_min) memcpy(&m16, blk + 2, 2);
            uint32_t qh = 0;
            if (five) memcpy(&qh, blk + (has_min ? 4 : 2), 4);
            const uint8_t *qs = blk + bsize - 16;
            int32_t isum = 0;
            for (int i = 0; i < QK32; i++) {
                int q = i < 16 ? (qs[i] & 0xF) : (qs[i - 16] >> 4);
                if (five) q |= (int)((qh >> i) & 1) << 4;
                isum += (q - offset) * a[b].qs[i];
            }
            sum += sd_fp16_to_fp32(d16) * a[b].d * (float)isum;
            if (has_min) sum += sd_fp16_to_fp32(m16) * a[b].s;
        }
        out[r * ldo] = sum;
    }
}

static void tile_q4_0(const uint8_t *w, int nb, const uint8_t *a, size_t s, int rows, float *o, size_t ldo) { tile_q4q5(T_Q4_0, w, nb, a, s, rows, o, ldo); }
static void tile_q4_1(const uint8_t *w, int nb, const uint8_t *a, size_t s, int rows, float *o, size_t ldo) { tile_q4q5(T_Q4_1, w, nb, a, s, rows, o, ldo); }
static void tile_q5_0(const uint8_t *w, int nb, const uint8_t *a, size_t s, int rows, float *o, size_t ldo) { tile_q4q5(T_Q5_0, w, nb, a, s, rows, o, ldo); }
static void tile_q5_1(const uint8_t *w, int nb, const uint8_t *a, size_t s, int rows, float *o, size_t ldo) { tile_q4q5(T_Q5_1, w, nb, a, s, rows, o, ldo); }

/* Q4_K and Q5_K: sub-block s (32 values) = low (s even) or high (s odd) nibbles of qs[32*(s/2)..],
 * plus bit s of qh[] for Q5_K; value = d*sc[s]*q - dmin*mn[s]. */
static void tile_q45k(int five, const uint8_t *w, int nb, const uint8_t *act, size_t stride, int rows, float *out, size_t ldo) {
    for (int r = 0; r < rows; r++) {
        const act_k *a = (const act_k *)(act + r * stride);
        float sum = 0.0f;
        for (int b = 0; b < nb; b++) {
            uint16_t d16, dmin16;
            const uint8_t *scales, *qs, *qh = NULL;
            if (five) {
                const blk_q5_K *x = (const blk_q5_K *)w + b;
                d16 = x->d; dmin16 = x->dmin; scales = x->scales; qs = x->qs; qh = x->qh;
            } else {
                const blk_q4_K *x = (const blk_q4_K *)w + b;
                d16 = x->d; dmin16 = x->dmin; scales = x->scales; qs = x->qs;
            }
            uint8_t sc[8], mn[8];
            sd_q4k_scale_min(scales, sc, mn);
            const float d = sd_fp16_to_fp32(d16), dmin = sd_fp16_to_fp32(dmin16);
            for (int s = 0; s < 8; s++) {
                int32_t dot = 0;
                for (int l = 0; l < 32; l++) {
                    int q = (s & 1) ? (qs[32 * (s / 2) + l] >> 4) : (qs[32 * (s / 2) + l] & 0xF);
                    if (five) q |= ((qh[l] >> s) & 1) << 4;
                    dot += q * a[b].qs[32 * s + l];
                }
                sum += d * a[b].d32[s] * (float)(sc[s] * dot);
                sum -= dmin * (float)mn[s] * a[b].s32[s];
            }
        }
        out[r * ldo] = sum;
    }
}

static void tile_q4_K(const uint8_t *w, int nb, const uint8_t *a, size_t s, int rows, float *o, size_t ldo) { tile_q45k(0, w, nb, a, s, rows, o, ldo); }
static void tile_q5_K(const uint8_t *w, int nb, const uint8_t *a, size_t s, int rows, float *o, size_t ldo) { tile_q45k(1, w, nb, a, s, rows, o, ldo); }

/* Q6_K: value e of a block = d * scales[e/16] * (q - 32), q = 4 bits of ql | 2 bits of qh << 4. */
static void tile_q6_K(const uint8_t *w, int nb, const uint8_t *act, size_t stride, int rows, float *out, size_t ldo) {
    const blk_q6_K *x = (const blk_q6_K *)w;
    for (int r = 0; r < rows; r++) {
        const act_k *a = (const act_k *)(act + r * stride);
        float sum = 0.0f;
        for (int b = 0; b < nb; b++) {
            const float d = sd_fp16_to_fp32(x[b].d);
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = x[b].ql + 64 * h, *qh = x[b].qh + 32 * h;
                for (int g = 0; g < 4; g++) {
                    int32_t dot = 0;
                    for (int l = 0; l < 32; l++) {
                        int lo = (g & 1) ? ql[32 + l] : ql[l];
                        int q = ((g & 2) ? lo >> 4 : lo & 0xF) | (((qh[l] >> (2 * g)) & 3) << 4);
                        int e = 128 * h + 32 * g + l;
                        dot += q * a[b].qs[e];
                        if (l == 15 || l == 31) { /* q - 32: the offset through the exact 16-value sum */
                            const int s = e / 16;
                            sum += d * a[b].d32[s / 2] * (float)(x[b].scales[s] * (dot - 32 * a[b].bsum16[s]));
                            dot = 0;
                        }
                    }
                }
            }
        }
        out[r * ldo] = sum;
    }
}

tile_fn sd_scalar_tile(int type) {
    switch (type) {
    case T_Q4_0: return tile_q4_0;
    case T_Q4_1: return tile_q4_1;
    case T_Q5_0: return tile_q5_0;
    case T_Q5_1: return tile_q5_1;
    case T_Q8_0: return tile_q8_0;
    case T_Q4_K: return tile_q4_K;
    case T_Q5_K: return tile_q5_K;
    case T_Q6_K: return tile_q6_K;
    default: return NULL;
    }
}
