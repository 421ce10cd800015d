/* Attention of single query rows over a request's own cached keys, float32 (the CPU's decode and
 * draft rows: every attention segment of one row).
 *
 * Why our own: on the 2-core dev machine a one-query torch call (scaled_dot_product_attention,
 * or bmm/softmax/bmm) costs 80-165 us for 12 heads over 256 keys, almost all of it per-op
 * overhead, and a step of the 1.5B makes 28 such calls per row (5 rows to verify 4 drafts). Here
 * one call per layer covers every single row of the forward.
 *
 * A row's result depends only on its own query, keys and values: each (row, key/value head) is
 * one part computed by one thread, and each query head with the same instruction sequence
 * whatever the batch, so a draft row gets exactly the bits the same token gets when it is
 * decoded alone later.
 *
 * softmax(q.K^T * scale) V per head, with the exp of row_math.h (no libm call per key). */
#include <math.h>
#include <stdint.h>
#include "gguf_kernels.h"
#include "row_math.h"

#define MAX_HEAD_DIM 512
#define TILE 64 /* keys per tile of the AVX2 kernel: 32 KB of a 128-dim head's keys and values */
#define MAX_GROUP 8 /* query heads per key/value head computed in one pass over the keys */

typedef struct {
    const float *q, *keys, *values;
    float *out;
    const int64_t *rows, *kv_len, *base, *first, *index;
    int64_t q_row_stride, out_row_stride, head_stride;
    int heads, kv_heads, head_dim;
    float scale;
} attend_job;

static inline const float *key_row(const attend_job *j, const float *cache, int64_t r, int64_t pos, int kvh) {
    const int64_t at = j->first[r] < 0 ? j->base[r] + pos : j->index[j->first[r] + pos];
    return cache + kvh * j->head_stride + at * j->head_dim;
}

static inline const float *query(const attend_job *j, int64_t r, int h) {
    return j->q + j->rows[r] * j->q_row_stride + (int64_t)h * j->head_dim;
}

static inline float *output(const attend_job *j, int64_t r, int h) {
    return j->out + j->rows[r] * j->out_row_stride + (int64_t)h * j->head_dim;
}

/* Online softmax, one key at a time: the running maximum m, the sum of exp(s - m) and the
 * weighted values are rescaled whenever m grows, so no buffer of scores is needed. */
static void head_scalar(const attend_job *j, int64_t r, int h) {
    const int d = j->head_dim, kvh = h / (j->heads / j->kv_heads);
    const float *q = query(j, r, h);
    float acc[MAX_HEAD_DIM], m = -INFINITY, sum = 0.0f;
    for (int i = 0; i < d; i++) acc[i] = 0.0f;
    for (int64_t t = 0; t < j->kv_len[r]; t++) {
        const float *k = key_row(j, j->keys, r, t, kvh), *v = key_row(j, j->values, r, t, kvh);
        float s = 0.0f;
        for (int i = 0; i < d; i++) s += q[i] * k[i];
        s *= j->scale;
        if (s > m) {
            const float f = exp_poly(m - s);
            for (int i = 0; i < d; i++) acc[i] *= f;
            sum *= f;
            m = s;
        }
        const float e = exp_poly(s - m);
        sum += e;
        for (int i = 0; i < d; i++) acc[i] += e * v[i];
    }
    float *out = output(j, r, h);
    for (int i = 0; i < d; i++) out[i] = acc[i] / sum;
}

#if defined(__x86_64__) || defined(__i386__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>

#include "avx2_common.h"

/* s[c] = q . k_c for 4 keys at once (each key's products summed in one fixed order; a key
 * scored alone is passed four times, so every key of a row is scored the same way). */
static inline __m128 dot4(const float *q, const float *k0, const float *k1, const float *k2, const float *k3, int d) {
    __m256 a[8];
    for (int c = 0; c < 8; c++) a[c] = _mm256_setzero_ps();
    for (int i = 0; i < d; i += 16) {
        const __m256 qa = _mm256_loadu_ps(q + i), qb = _mm256_loadu_ps(q + i + 8);
        a[0] = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k0 + i), a[0]);
        a[1] = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k1 + i), a[1]);
        a[2] = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k2 + i), a[2]);
        a[3] = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k3 + i), a[3]);
        a[4] = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k0 + i + 8), a[4]);
        a[5] = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k1 + i + 8), a[5]);
        a[6] = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k2 + i + 8), a[6]);
        a[7] = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k3 + i + 8), a[7]);
    }
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[1], a[5])),
                                    _mm256_hadd_ps(_mm256_add_ps(a[2], a[6]), _mm256_add_ps(a[3], a[7])));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* acc[i .. i + 8 w) += sum over the tile's keys c of e[c] * value_c[i ..], the accumulators in
 * registers (w is a constant at every call: 8 or 2). */
static inline __attribute__((always_inline)) void add_values(const float *const *vrow, int cnt, const float *e,
                                                             float *acc, int i, const int w) {
    __m256 o[8];
    for (int b = 0; b < w; b++) o[b] = _mm256_load_ps(acc + i + 8 * b);
    for (int c = 0; c < cnt; c++) {
        const float *v = vrow[c] + i;
        const __m256 ec = _mm256_set1_ps(e[c]);
        for (int b = 0; b < w; b++) o[b] = _mm256_fmadd_ps(ec, _mm256_loadu_ps(v + 8 * b), o[b]);
    }
    for (int b = 0; b < w; b++) _mm256_store_ps(acc + i + 8 * b, o[b]);
}

/* Flash-attention style over tiles of TILE keys, for the query heads [h0, h0 + hn) that share
 * one key/value head: a tile is read from memory once and then from the cache for every head.
 * Per head, the tile's scores, their maximum and exps are computed in a stack buffer, then its
 * values are added to the output 64 (or 16) dims at a time with the accumulators in registers; a head's
 * running sum and output are rescaled when its maximum grows. A head's arithmetic does not
 * depend on the other heads of the group. head_dim is a multiple of 16 (64, 128, ...). */
static void heads_avx2(const attend_job *j, int64_t r, int kvh, int h0, int hn) {
    const int d = j->head_dim;
    const int64_t n = j->kv_len[r];
    float acc[MAX_GROUP][MAX_HEAD_DIM] __attribute__((aligned(32)));
    float s[MAX_GROUP][TILE] __attribute__((aligned(32))), m[MAX_GROUP];
    __m256 vsum[MAX_GROUP];
    for (int hh = 0; hh < hn; hh++) {
        m[hh] = -INFINITY;
        vsum[hh] = _mm256_setzero_ps();
        for (int i = 0; i < d; i += 8) _mm256_store_ps(acc[hh] + i, _mm256_setzero_ps());
    }
    const float *krow[TILE], *vrow[TILE];
    for (int64_t t0 = 0; t0 < n; t0 += TILE) {
        const int cnt = n - t0 < TILE ? (int)(n - t0) : TILE;
        for (int c = 0; c < cnt; c++) {
            krow[c] = key_row(j, j->keys, r, t0 + c, kvh);
            vrow[c] = key_row(j, j->values, r, t0 + c, kvh);
        }
        for (int hh = 0; hh < hn; hh++) {
            const float *q = query(j, r, h0 + hh);
            float *sc = s[hh], tm = -INFINITY;
            int c = 0;
            for (; c + 4 <= cnt; c += 4)
                _mm_store_ps(sc + c, dot4(q, krow[c], krow[c + 1], krow[c + 2], krow[c + 3], d));
            for (; c < cnt; c++) sc[c] = _mm_cvtss_f32(dot4(q, krow[c], krow[c], krow[c], krow[c], d));
            for (c = 0; c < cnt; c++) {
                sc[c] *= j->scale;
                if (sc[c] > tm) tm = sc[c];
            }
            if (tm > m[hh]) {
                const __m256 f = _mm256_set1_ps(exp_poly(m[hh] - tm));
                for (int i = 0; i < d; i += 8) _mm256_store_ps(acc[hh] + i, _mm256_mul_ps(_mm256_load_ps(acc[hh] + i), f));
                vsum[hh] = _mm256_mul_ps(vsum[hh], f);
                m[hh] = tm;
            }
            const __m256 vm = _mm256_set1_ps(m[hh]);
            for (c = 0; c + 8 <= cnt; c += 8) {
                const __m256 e = exp_poly8(_mm256_sub_ps(_mm256_load_ps(sc + c), vm));
                _mm256_store_ps(sc + c, e);
                vsum[hh] = _mm256_add_ps(vsum[hh], e);
            }
            for (; c < cnt; c++) {
                sc[c] = exp_poly(sc[c] - m[hh]);
                vsum[hh] = _mm256_add_ps(vsum[hh], _mm256_setr_ps(sc[c], 0, 0, 0, 0, 0, 0, 0));
            }
        }
        for (int hh = 0; hh < hn; hh++) {
            if (d % 64 == 0)
                for (int i = 0; i < d; i += 64) add_values(vrow, cnt, s[hh], acc[hh], i, 8);
            else
                for (int i = 0; i < d; i += 16) add_values(vrow, cnt, s[hh], acc[hh], i, 2);
        }
    }
    for (int hh = 0; hh < hn; hh++) {
        float *out = output(j, r, h0 + hh);
        const __m256 sum = _mm256_set1_ps(hsum8(vsum[hh]));
        for (int i = 0; i < d; i += 8) _mm256_storeu_ps(out + i, _mm256_div_ps(_mm256_load_ps(acc[hh] + i), sum));
    }
}
#pragma GCC pop_options
#endif

/* Part = (row, key/value head): its query heads read the same keys. */
static void attend_part(const void *job, int part) {
    const attend_job *j = job;
    const int64_t r = part / j->kv_heads;
    const int kvh = part % j->kv_heads, group = j->heads / j->kv_heads;
    for (int h = kvh * group; h < (kvh + 1) * group; h += MAX_GROUP) {
        const int hn = (kvh + 1) * group - h < MAX_GROUP ? (kvh + 1) * group - h : MAX_GROUP;
#if defined(__x86_64__) || defined(__i386__)
        if (j->head_dim % 16 == 0 && !sd_use_scalar()) {
            heads_avx2(j, r, kvh, h, hn);
            continue;
        }
#endif
        for (int hh = h; hh < h + hn; hh++) head_scalar(j, r, hh);
    }
}

/* out[rows[r], h, :] = softmax(q[rows[r], h, :] . K^T * scale) V for every row r < nrows and head
 * h, over the row's kv_len[r] keys: cache rows base[r] + t, or index[first[r] + t] where
 * first[r] >= 0. keys/values: one layer's cache [kv_heads, cache_rows, head_dim] (head_stride
 * floats between heads). Returns 0, or -2 for shapes it does not take. */
int sd_attend_rows(const float *q, int64_t q_row_stride, const float *keys, const float *values, int64_t head_stride,
                   const int64_t *rows, const int64_t *kv_len, const int64_t *base, const int64_t *first,
                   const int64_t *index, int64_t nrows, int heads, int kv_heads, int head_dim, float scale,
                   float *out, int64_t out_row_stride, int threads) {
    if (heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 || head_dim <= 0 || head_dim > MAX_HEAD_DIM) return -2;
    for (int64_t r = 0; r < nrows; r++)
        if (kv_len[r] <= 0) return -2;
    const attend_job job = {q, keys, values, out, rows, kv_len, base, first, index,
                            q_row_stride, out_row_stride, head_stride, heads, kv_heads, head_dim, scale};
    sd_run_parts(attend_part, &job, (int)(nrows * kv_heads), threads);
    return 0;
}
