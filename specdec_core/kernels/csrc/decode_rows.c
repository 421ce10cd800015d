/* Every decoder layer of a CPU step whose rows are all one-row attention segments (decode rows,
 * drafts, a prompt fed row by row), in one call: what native_decoder.DecoderLayer.forward does
 * with the C row kernels, without returning to Python between the operations.
 *
 * Why: on a small model the operations around the matrix products cost more than the products.
 * A Gemma 3 270M decode step on the 2-core dev machine made ~40 Python-level calls per layer
 * (norms, head norms, rotary, splits, cache writes, attention, residual adds): about a quarter
 * of the step, next to ~4 ms of layer weights to stream.
 *
 * Bits: each operation is the same C function the per-op path calls (sd_rms_norm, sd_rope,
 * sd_attend_rows, sd_block_linear, sd_gate_mul) on the same values, and the float steps in between
 * (residual additions, cache copies) are single IEEE additions or copies, so a row gets
 * exactly the bits the per-op path gives it, in any batch (tests/execution/test_row_layers.py). */
#include <errno.h>
#include <string.h>

#include "decode_rows.h"

static void add_rows(float *x, const float *h, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] + h[i];
}

static int layer(const sd_layer *L, const sd_step *s) {
    const int64_t t = s->tokens, hidden = s->hidden, width = L->qkv.out_features;
    const int heads = s->heads, kv_heads = s->kv_heads, dim = s->head_dim, th = s->threads;
    int rc;

    /* attention: norm, q|k|v, per-head norms, rotation, cache writes, the rows' own keys */
    sd_rms_norm(s->x, t, hidden, hidden, L->input.weight, L->input.eps, s->normed, hidden, th);
    if ((rc = sd_block_linear(&L->qkv, s->normed, t, hidden, s->qkv, th)) != 0) return rc;
    if (L->q.weight)
        for (int64_t r = 0; r < t; r++) {
            float *row = s->qkv + r * width;
            sd_rms_norm(row, heads, dim, dim, L->q.weight, L->q.eps, row, dim, 1);
            sd_rms_norm(row + (int64_t)heads * dim, kv_heads, dim, dim, L->k.weight, L->k.eps,
                        row + (int64_t)heads * dim, dim, 1);
        }
    sd_rope(s->qkv, t, width, heads + kv_heads, dim, s->cos[L->table], s->sin[L->table], dim);
    for (int64_t r = 0; r < t; r++)
        for (int h = 0; h < kv_heads; h++) {
            const float *k = s->qkv + r * width + (int64_t)(heads + h) * dim, *v = k + (int64_t)kv_heads * dim;
            const int64_t at = h * L->head_stride + s->write_index[r] * dim;
            memcpy(L->keys + at, k, sizeof(float) * (size_t)dim);
            memcpy(L->values + at, v, sizeof(float) * (size_t)dim);
        }
    const int w = L->window;
    rc = sd_attend_rows(s->qkv, width, L->keys, L->values, L->head_stride, s->att_rows[w], s->att_kv_len[w],
                        s->att_base[w], s->att_first[w], s->att_index[w], t, heads, kv_heads, dim, s->scale,
                        s->attended, (int64_t)heads * dim, th);
    if (rc != 0) return rc;
    if ((rc = sd_block_linear(&L->o, s->attended, t, (int64_t)heads * dim, s->h, th)) != 0) return rc;
    if (s->sandwich) sd_rms_norm(s->h, t, hidden, hidden, L->post_attention.weight, L->post_attention.eps, s->h, hidden, th);
    add_rows(s->x, s->h, t * hidden);

    /* gated MLP */
    sd_rms_norm(s->x, t, hidden, hidden, L->mlp.weight, L->mlp.eps, s->normed, hidden, th);
    if ((rc = sd_block_linear(&L->gate_up, s->normed, t, hidden, s->gate_up, th)) != 0) return rc;
    const int64_t inner = L->gate_up.out_features / 2;
    sd_gate_mul(s->gate_up, t, inner, 2 * inner, s->act, inner, s->activation, th);
    if ((rc = sd_block_linear(&L->down, s->act, t, inner, s->h, th)) != 0) return rc;
    if (s->sandwich) sd_rms_norm(s->h, t, hidden, hidden, L->post_mlp.weight, L->post_mlp.eps, s->h, hidden, th);
    add_rows(s->x, s->h, t * hidden);
    return 0;
}

/* Runs layers 0..nlayers-1 over step->x in place. 0, or the first kernel's error code. */
int sd_decode_rows(const sd_layer *layers, int32_t nlayers, const sd_step *step) {
    if (step->tokens <= 0 || step->head_dim <= 0 || step->kv_heads <= 0) return -EINVAL;
    for (int i = 0; i < nlayers; i++) {
        const int rc = layer(&layers[i], step);
        if (rc != 0) return rc;
    }
    return 0;
}
