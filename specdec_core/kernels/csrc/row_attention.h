/* The vector kernels of row attention (row_attention.c), one set per instruction set in
 * row_attention_vec.c: row_attention.c picks a set, walks the tiles and keeps the online softmax;
 * a set only scores queries against a tile's keys and adds a tile's weighted values. Both sets
 * give every score and output the same bits (the order of their multiply-adds is row_attention.c's
 * docstring). */
#ifndef SPECDEC_ROW_ATTENTION_H
#define SPECDEC_ROW_ATTENTION_H
#if defined(__x86_64__) || defined(__i386__)

/* The vector kernels score P queries against a tile's keys, 4 keys at a time (scores_fn: s_p[c]
 * for the blocks of four covering c < n, krow padded to them), and add a tile's weighted values
 * to P outputs (values_fn: keys c0 .. c1 - 1); head_dim is a multiple of 16. */
typedef void (*scores_fn)(const float *const *q, const float *const *krow, int d, float *const *s, int n);
typedef void (*values_fn)(const float *const *vrow, int c0, int c1, const float *const *e, float *const *acc, int d);
typedef struct {
    int sp, vp;              /* queries of `scores`, outputs of `values` */
    scores_fn scores, score; /* sp queries; one query */
    values_fn values, value; /* vp outputs; one output */
} vec_kernels;

extern const vec_kernels sd_attend_avx2;   /* 2 queries, 2 outputs at a time; 256-bit registers */
extern const vec_kernels sd_attend_avx512; /* 4 queries, 4 outputs at a time; 512-bit registers */

#endif
#endif
