/* The decoder stack of a step whose rows are all one-row attention segments, as one C call
 * (decode_rows.c). The structs mirror execution/row_layers.py's ctypes Structures field for
 * field: change both together. */
#ifndef SPECDEC_DECODE_ROWS_H
#define SPECDEC_DECODE_ROWS_H

#include <stdint.h>

#include "gguf_kernels.h"

#define SD_STEP_TABLES 4  /* rotary tables of one model (Gemma 3: local and global) */
#define SD_STEP_WINDOWS 4 /* attention layouts of one step (the global one and each sliding window) */

/* The row operations the loop calls (row_ops.c, row_attention.c); the block linears are
 * gguf_kernels.h's sd_block_linear. */
void sd_rms_norm(const float *x, int64_t rows, int64_t n, int64_t x_stride, const float *w, float eps, float *out,
                 int64_t out_stride, int threads);
void sd_rope(float *x, int64_t rows, int64_t x_stride, int heads, int head_dim, const float *cos, const float *sin,
             int64_t cs_stride);
void sd_gate_mul(const float *gate_up, int64_t rows, int64_t n, int64_t in_stride, float *out, int64_t out_stride,
                 int act, int threads);
int sd_attend_rows(const float *q, int64_t q_row_stride, const float *keys, const float *values, int64_t head_stride,
                   const int64_t *rows, const int64_t *kv_len, const int64_t *base, const int64_t *first,
                   const int64_t *index, int64_t nrows, int heads, int kv_heads, int head_dim, float scale,
                   float *out, int64_t out_row_stride, int threads);

/* An RMS norm's effective weight (NULL: the layer has no such norm) and epsilon. */
typedef struct {
    const float *weight;
    float eps;
} sd_norm;

typedef struct {
    sd_linear qkv, o, gate_up, down;
    sd_norm input, q, k, post_attention, mlp, post_mlp;
    float *keys, *values; /* this layer's cache [kv_heads, cache rows, head_dim] */
    int64_t head_stride;  /* floats between two key/value heads of the cache */
    int32_t table;        /* the rotary table it reads (sd_step.cos/sin) */
    int32_t window;       /* the attention layout it reads (sd_step's attention arrays) */
} sd_layer;

/* One step: the rows, their rotary rows, each attention layout (attention.RowAttention) and
 * scratch space for every intermediate. */
typedef struct {
    float *x; /* [tokens, hidden]: the embeddings in, the last layer's hidden states out */
    int64_t tokens, hidden;
    int32_t heads, kv_heads, head_dim, activation, sandwich, threads;
    float scale;
    const int64_t *write_index; /* [tokens] the cache row each token's key and value go to */
    const float *cos[SD_STEP_TABLES], *sin[SD_STEP_TABLES]; /* [tokens, head_dim] */
    const int64_t *att_rows[SD_STEP_WINDOWS], *att_kv_len[SD_STEP_WINDOWS], *att_base[SD_STEP_WINDOWS],
        *att_first[SD_STEP_WINDOWS], *att_index[SD_STEP_WINDOWS];
    float *normed, *qkv, *attended, *h, *gate_up, *act; /* scratch, [tokens, the widest of each] */
} sd_step;

int sd_decode_rows(const sd_layer *layers, int32_t nlayers, const sd_step *step);

#endif
