/* Attention of single query rows over a request's own cached keys, float32 (the CPU's decode and
 * draft rows, and prompt rows attended one by one: every attention segment of one row).
 *
 * Why our own: on the 2-core dev machine a one-query torch call (scaled_dot_product_attention,
 * or bmm/softmax/bmm) costs 80-165 us for 12 heads over 256 keys, almost all of it per-op
 * overhead, and a step of the 1.5B makes 28 such calls per row (5 rows to verify 4 drafts). Here
 * one call per layer covers every single row of the forward.
 *
 * Why rows are grouped: the rows of one request (a prompt chunk, a request's drafts) read the
 * same keys, each up to its own position. Attended one at a time, a 512-row prompt chunk at 8k
 * context reads all 8k keys and values of its head from memory once per row, and scoring a key
 * costs more loads than multiply-adds. So consecutive rows that read the same keys (the same
 * gathered list, or the same run of cache rows) form a group of up to ROW_GROUP rows, and a part
 * (one thread's task) is (row group, key/value head): each tile of TILE keys is read from memory
 * once for every row of the group and every query head of the key/value head, and the dot
 * products load each key once for several (row, head) queries and each value once for several
 * outputs. A decode row is a group of its own, as before.
 *
 * Why a row's bits do not change: a row's result depends only on its own query, keys and values,
 * whichever rows share its group, as when it was attended alone. Each row walks the same tiles
 * from position 0, its last tile cut at its own kv_len (a row past its keys stops). A key's score
 * is one fixed sum whatever it is computed beside: per dim i mod 16 a chain of multiply-adds in
 * dim order from zero, then chains 0-7 + chains 8-15 and one fixed tree (reduce4); where a block
 * of four keys runs past a row's keys, its last key is repeated and those scores are never read.
 * A row's scale, tile maximum, rescale, exps and running sum are per tile in the same order; each
 * output value adds the tile's weighted values one key at a time in key order, however many
 * outputs share the loads and however many dims a register holds. The AVX-512 path holds a key's
 * 16 chains in one register where the AVX2 path holds two registers of 8: lane for lane the same
 * multiply-adds, then the same final sum. So a draft row gets exactly the bits the same token
 * gets when it is decoded alone later, and a prompt row the bits decoding that token gives
 * (tests/execution/test_row_kernels.py compares a batch with one call per row, and the AVX2 and
 * AVX-512 paths with each other).
 *
 * softmax(q.K^T * scale) V per head, with the exp of row_math.h (no libm call per key). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "gguf_kernels.h"
#include "row_attention.h"
#include "row_math.h"

#define MAX_HEAD_DIM 512
#define TILE 64 /* keys per tile of the vector kernels: 32 KB of a 128-dim head's keys and values */
#define MAX_GROUP 8 /* query heads per key/value head computed in one pass over the keys */
/* Rows of one request per part: each tile is then read from memory once per 16 rows (more rows
 * gain little once the keys are read less often than they are multiplied). */
#define ROW_GROUP 16
#define MAX_PAIRS (ROW_GROUP * MAX_GROUP) /* (row, query head) pairs of one pass */

typedef struct {
    const float *q, *keys, *values;
    float *out;
    const int64_t *rows, *kv_len, *base, *first, *index;
    const int64_t *group; /* group g: rows group[g] .. group[g + 1] - 1 */
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

/* The floats of a pass's state for np (row, head) pairs: outputs, one tile's scores, running
 * sums (8 lanes) and maxima. */
static inline size_t state_floats(int np, int d) { return (size_t)np * (size_t)(d + TILE + 8 + 1); }

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>

#include "avx2_common.h"

/* Flash-attention style over tiles of TILE keys, for the rows [r0, r0 + nr) (which read the same
 * keys) and the query heads [h0, h0 + hn) that share the key/value head kvh: a tile is read from
 * memory once and then from the cache for every (row, head) pair. Per pair, the tile's scores,
 * their maximum and exps are computed in `state`, then its values are added to the output with
 * the accumulators in registers; a pair's running sum and output are rescaled when its maximum
 * grows. A pair's arithmetic does not depend on the other pairs of the group. A single row (a
 * decode step) takes the one-query forms: its keys mostly come from memory, where sharing the
 * loads between heads made it slower. */
static void rows_vec(const attend_job *j, const vec_kernels *K, int64_t r0, int nr, int kvh, int h0, int hn,
                     float *state) {
    const int d = j->head_dim, np = nr * hn, sp = nr > 1 ? K->sp : 1, vp = nr > 1 ? K->vp : 1;
    float *const acc = state, *const sbuf = state + np * d, *const vsum = sbuf + np * TILE, *const m = vsum + np * 8;
    const float *qp[MAX_PAIRS];
    int cnt[MAX_PAIRS], act[MAX_PAIRS];
    int64_t n = 0;
    for (int ri = 0; ri < nr; ri++) {
        if (j->kv_len[r0 + ri] > n) n = j->kv_len[r0 + ri];
        for (int hh = 0; hh < hn; hh++) {
            const int p = ri * hn + hh;
            qp[p] = query(j, r0 + ri, h0 + hh);
            m[p] = -INFINITY;
            _mm256_store_ps(vsum + 8 * p, _mm256_setzero_ps());
            for (int i = 0; i < d; i += 8) _mm256_store_ps(acc + p * d + i, _mm256_setzero_ps());
        }
    }
    const float *krow[TILE + 3], *vrow[TILE];
    const __m256 vscale = _mm256_set1_ps(j->scale);
    for (int64_t t0 = 0; t0 < n; t0 += TILE) {
        const int cmax = n - t0 < TILE ? (int)(n - t0) : TILE;
        for (int c = 0; c < cmax; c++) {
            krow[c] = key_row(j, j->keys, r0, t0 + c, kvh);
            vrow[c] = key_row(j, j->values, r0, t0 + c, kvh);
        }
        for (int c = cmax; c % 4; c++) krow[c] = krow[cmax - 1]; /* pads the last block of four */
        /* the next tile's keys and values on their way while this one is computed: a decode
         * row's keys mostly come from memory */
        const int next = n - t0 - TILE < TILE ? (int)(n - t0 - TILE) : TILE;
        for (int c = 0; c < next; c++) {
            const char *k = (const char *)key_row(j, j->keys, r0, t0 + TILE + c, kvh);
            const char *v = (const char *)key_row(j, j->values, r0, t0 + TILE + c, kvh);
            for (int b = 0; b < d * (int)sizeof(float); b += 64) {
                _mm_prefetch(k + b, _MM_HINT_T0);
                _mm_prefetch(v + b, _MM_HINT_T0);
            }
        }
        int na = 0; /* the pairs whose rows have keys in this tile, and how many */
        for (int ri = 0; ri < nr; ri++) {
            const int64_t left = j->kv_len[r0 + ri] - t0;
            if (left <= 0) continue;
            for (int hh = 0; hh < hn; hh++) {
                cnt[ri * hn + hh] = left < TILE ? (int)left : TILE;
                act[na++] = ri * hn + hh;
            }
        }
        /* scores: sp pairs at a time over the blocks of four keys the longest of them has */
        int a = 0;
        for (; sp > 1 && a + sp <= na; a += sp) {
            const float *qs[4];
            float *ss[4];
            int most = 0;
            for (int x = 0; x < sp; x++) {
                qs[x] = qp[act[a + x]], ss[x] = sbuf + act[a + x] * TILE;
                if (cnt[act[a + x]] > most) most = cnt[act[a + x]];
            }
            K->scores(qs, krow, d, ss, most);
        }
        for (; a < na; a++) {
            float *ss = sbuf + act[a] * TILE;
            K->score(&qp[act[a]], krow, d, &ss, cnt[act[a]]);
        }
        /* per pair: scale, the tile's maximum, rescale, exps and their sum */
        for (a = 0; a < na; a++) {
            const int p = act[a], cn = cnt[p];
            float *sc = sbuf + p * TILE, *ap = acc + p * d, tm = -INFINITY, lanes[8] __attribute__((aligned(32)));
            int c;
            /* tm = the largest score. Lane-wise max, then over the lanes: the value a scan of
             * `if (s > tm) tm = s` finds, but for the sign of a zero maximum, which changes no
             * bit of the result (exp(+0) = exp(-0) = 1, and x - (+0) = x - (-0)). */
            __m256 top = _mm256_set1_ps(-INFINITY);
            for (c = 0; c + 8 <= cn; c += 8) {
                const __m256 x = _mm256_mul_ps(_mm256_load_ps(sc + c), vscale);
                _mm256_store_ps(sc + c, x);
                top = _mm256_max_ps(x, top); /* x > top ? x : top: a NaN score is passed over */
            }
            _mm256_store_ps(lanes, top);
            for (int l = 0; l < 8; l++)
                if (lanes[l] > tm) tm = lanes[l];
            for (; c < cn; c++) {
                sc[c] *= j->scale;
                if (sc[c] > tm) tm = sc[c];
            }
            __m256 sum = _mm256_load_ps(vsum + 8 * p);
            if (tm > m[p]) {
                const __m256 f = _mm256_set1_ps(exp_poly(m[p] - tm));
                for (int i = 0; i < d; i += 8) _mm256_store_ps(ap + i, _mm256_mul_ps(_mm256_load_ps(ap + i), f));
                sum = _mm256_mul_ps(sum, f);
                m[p] = tm;
            }
            const __m256 vm = _mm256_set1_ps(m[p]);
            for (c = 0; c + 8 <= cn; c += 8) {
                const __m256 e = exp_poly8(_mm256_sub_ps(_mm256_load_ps(sc + c), vm));
                _mm256_store_ps(sc + c, e);
                sum = _mm256_add_ps(sum, e);
            }
            for (; c < cn; c++) {
                sc[c] = exp_poly(sc[c] - m[p]);
                sum = _mm256_add_ps(sum, _mm256_setr_ps(sc[c], 0, 0, 0, 0, 0, 0, 0));
            }
            _mm256_store_ps(vsum + 8 * p, sum);
        }
        /* values: vp pairs at a time over the keys they all have, then each pair's own rest */
        for (a = 0; vp > 1 && a + vp <= na; a += vp) {
            const float *es[4];
            float *accs[4];
            int least = TILE;
            for (int x = 0; x < vp; x++) {
                es[x] = sbuf + act[a + x] * TILE, accs[x] = acc + act[a + x] * d;
                if (cnt[act[a + x]] < least) least = cnt[act[a + x]];
            }
            K->values(vrow, 0, least, es, accs, d);
            for (int x = 0; x < vp; x++)
                if (cnt[act[a + x]] > least) K->value(vrow, least, cnt[act[a + x]], es + x, accs + x, d);
        }
        for (; a < na; a++) {
            const float *es = sbuf + act[a] * TILE;
            float *accs = acc + act[a] * d;
            K->value(vrow, 0, cnt[act[a]], &es, &accs, d);
        }
    }
    for (int p = 0; p < np; p++) {
        float *out = output(j, r0 + p / hn, h0 + p % hn);
        const __m256 sum = _mm256_set1_ps(hsum8(_mm256_load_ps(vsum + 8 * p)));
        for (int i = 0; i < d; i += 8) _mm256_storeu_ps(out + i, _mm256_div_ps(_mm256_load_ps(acc + p * d + i), sum));
    }
}
#pragma GCC pop_options
#endif

/* Part = (row group, key/value head): its rows and query heads read the same keys. */
static void attend_part(const void *job, int part) {
    const attend_job *j = job;
    const int64_t g = part / j->kv_heads, r0 = j->group[g];
    const int nr = (int)(j->group[g + 1] - r0), kvh = part % j->kv_heads, group = j->heads / j->kv_heads;
#if defined(__x86_64__) || defined(__i386__)
    if (j->head_dim % 16 == 0 && !sd_use_scalar()) {
        const vec_kernels *K = sd_kernel_impl() >= SD_IMPL_VNNI ? &sd_attend_avx512 : &sd_attend_avx2;
        /* one row's state on the stack, a group's (up to ROW_GROUP times more) on the heap */
        float one[MAX_GROUP * (MAX_HEAD_DIM + TILE + 8 + 1)] __attribute__((aligned(64)));
        const int most = group < MAX_GROUP ? group : MAX_GROUP;
        float *state = nr == 1 ? one : aligned_alloc(64, (state_floats(nr * most, j->head_dim) * sizeof(float) + 63) / 64 * 64);
        for (int h = kvh * group; h < (kvh + 1) * group; h += MAX_GROUP) {
            const int hn = (kvh + 1) * group - h < MAX_GROUP ? (kvh + 1) * group - h : MAX_GROUP;
            if (state)
                rows_vec(j, K, r0, nr, kvh, h, hn, state);
            else /* no memory for the group's state: its rows one at a time, the same bits */
                for (int ri = 0; ri < nr; ri++) rows_vec(j, K, r0 + ri, 1, kvh, h, hn, one);
        }
        if (state != one) free(state);
        return;
    }
#endif
    for (int h = kvh * group; h < (kvh + 1) * group; h++)
        for (int64_t r = r0; r < r0 + nr; r++) head_scalar(j, r, h);
}

/* Rows r - 1 and r read the same keys: the same gathered list, or the same run of cache rows. */
static int same_keys(const int64_t *base, const int64_t *first, int64_t r) {
    return first[r] == first[r - 1] && (first[r] >= 0 || base[r] == base[r - 1]);
}

/* out[rows[r], h, :] = softmax(q[rows[r], h, :] . K^T * scale) V for every row r < nrows and head
 * h, over the row's kv_len[r] keys: cache rows base[r] + t, or index[first[r] + t] where
 * first[r] >= 0. keys/values: one layer's cache [kv_heads, cache_rows, head_dim] (head_stride
 * floats between heads). Returns 0, -2 for shapes it does not take, -12 without memory. */
int sd_attend_rows(const float *q, int64_t q_row_stride, const float *keys, const float *values, int64_t head_stride,
                   const int64_t *rows, const int64_t *kv_len, const int64_t *base, const int64_t *first,
                   const int64_t *index, int64_t nrows, int heads, int kv_heads, int head_dim, float scale,
                   float *out, int64_t out_row_stride, int threads) {
    if (heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 || head_dim <= 0 || head_dim > MAX_HEAD_DIM) return -2;
    for (int64_t r = 0; r < nrows; r++)
        if (kv_len[r] <= 0) return -2;
    /* Groups of consecutive rows with the same keys, of at most ROW_GROUP rows, and fewer where
     * that would leave threads without a part (a few drafts of one request on several threads). */
    int64_t most = ROW_GROUP;
    if (threads > 1 && (nrows * kv_heads + threads - 1) / threads < most) most = (nrows * kv_heads + threads - 1) / threads;
    if (most < 1) most = 1;
    int64_t small[65], *group = nrows < 65 ? small : malloc(sizeof(int64_t) * (size_t)(nrows + 1));
    if (!group) return -12;
    int64_t ngroups = 0;
    for (int64_t r = 0; r < nrows; r++)
        if (r == 0 || r - group[ngroups - 1] >= most || !same_keys(base, first, r)) group[ngroups++] = r;
    group[ngroups] = nrows;
    const attend_job job = {q, keys, values, out, rows, kv_len, base, first, index, group,
                            q_row_stride, out_row_stride, head_stride, heads, kv_heads, head_dim, scale};
    sd_run_parts(attend_part, &job, (int)(ngroups * kv_heads), threads);
    if (group != small) free(group);
    return 0;
}
