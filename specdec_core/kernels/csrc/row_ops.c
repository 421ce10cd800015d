/* The row-wise float32 operations of a Llama-family layer between its matrix products: RMS
 * norm, rotary embedding, gated product (SiLU or tanh-approximated GELU).
 *
 * Why our own: on the 2-core dev machine each is 3-9 torch ops of 5-40 us for a one-token step
 * (nearly all per-op overhead: an RMS norm of 1,536 values costs ~75 us as pow/mean/rsqrt/mul),
 * about 250 ops and 16 ms per step of the 1.5B, against ~60 ms of weights to stream. Each is
 * one call here. Every row is computed by one thread with one instruction sequence, so a row's
 * result never depends on the other rows of the call. Compiled without FP contraction: the
 * rotary embedding computes exactly what its torch form (x * cos + rotate_half(x) * sin) does. */
#include <math.h>
#include <stdint.h>

#include "gguf_kernels.h"
#include "row_math.h"

/* the activation of sd_gate_mul (row_kernels.ACTIVATIONS names them in the same order) */
#define SD_ACT_SILU 0
#define SD_ACT_GELU_TANH 1

#define PARALLEL_ROWS 16 /* fewer rows than this run on the calling thread alone (sd_run_parts with 1 thread) */

typedef struct {
    const float *x, *w;
    float *out;
    int64_t n, x_stride, out_stride;
    float eps;
} norm_job;

static void norm_row(const void *job, int part) {
    const norm_job *j = job;
    const int64_t r = part;
    const float *x = j->x + r * j->x_stride;
    float *out = j->out + r * j->out_stride;
    float lanes[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= j->n; i += 8)
        for (int l = 0; l < 8; l++) lanes[l] += x[i + l] * x[i + l];
    float ss = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    for (; i < j->n; i++) ss += x[i] * x[i];
    const float inv = 1.0f / sqrtf(ss / (float)j->n + j->eps);
    for (i = 0; i < j->n; i++) out[i] = j->w[i] * (x[i] * inv);
}

/* out[r] = w * x[r] / sqrt(mean(x[r]^2) + eps) for rows r < rows of n values. */
void sd_rms_norm(const float *x, int64_t rows, int64_t n, int64_t x_stride, const float *w, float eps, float *out,
                 int64_t out_stride, int threads) {
    const norm_job job = {x, w, out, n, x_stride, out_stride, eps};
    sd_run_parts(norm_row, &job, (int)rows, rows < PARALLEL_ROWS ? 1 : threads);
}

/* In place, for rows r < rows and heads h < heads of head_dim values at x + r * x_stride + h *
 * head_dim: x = x * cos[r] + rotate_half(x) * sin[r], rotate_half(a, b) = (-b, a), with cos/sin
 * rows of head_dim values cs_stride apart (the table row of the token's position). */
void sd_rope(float *x, int64_t rows, int64_t x_stride, int heads, int head_dim, const float *cos, const float *sin,
             int64_t cs_stride) {
    const int half = head_dim / 2;
    for (int64_t r = 0; r < rows; r++) {
        const float *c = cos + r * cs_stride, *s = sin + r * cs_stride;
        for (int h = 0; h < heads; h++) {
            float *a = x + r * x_stride + (int64_t)h * head_dim, *b = a + half;
            for (int i = 0; i < half; i++) {
                const float ai = a[i], bi = b[i];
                a[i] = ai * c[i] + -bi * s[i];
                b[i] = bi * c[half + i] + ai * s[half + i];
            }
        }
    }
}

typedef struct {
    const float *gate_up;
    float *out;
    int64_t n, in_stride, out_stride;
    int act;
} gate_job;

/* Both activations are x / (1 + exp(a)): SiLU with a = -x, tanh-approximated GELU
 * 0.5 x (1 + tanh(y)) = x / (1 + exp(-2y)) with y = sqrt(2/pi) (x + 0.044715 x^3). */
#define GELU_K (-1.5957691216057308f) /* -2 sqrt(2/pi) */
#define GELU_C 0.044715f

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2,fma"))) static int64_t gate_avx2(const float *g, const float *u, float *out, int64_t n,
                                                             int act) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    const __m256 k = _mm256_set1_ps(GELU_K), c = _mm256_set1_ps(GELU_C);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 gi = _mm256_loadu_ps(g + i);
        __m256 a;
        if (act == SD_ACT_SILU) {
            a = _mm256_sub_ps(zero, gi);
        } else {
            const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(gi, gi), gi);
            a = _mm256_mul_ps(k, _mm256_add_ps(gi, _mm256_mul_ps(c, cube)));
        }
        const __m256 e = exp_poly8(a);
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(gi, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
    return i;
}
#endif

static void gate_row(const void *job, int part) {
    const gate_job *j = job;
    const int64_t r = part;
    const float *g = j->gate_up + r * j->in_stride, *u = g + j->n;
    float *out = j->out + r * j->out_stride;
    int64_t i = 0;
#if defined(__x86_64__) || defined(__i386__)
    if (!sd_use_scalar()) i = gate_avx2(g, u, out, j->n, j->act);
#endif
    for (; i < j->n; i++) {
        const float x = g[i];
        const float a = j->act == SD_ACT_SILU ? -x : GELU_K * (x + GELU_C * ((x * x) * x));
        out[i] = x / (1.0f + exp_poly(a)) * u[i];
    }
}

/* out[r] = act(gate) * up for rows r < rows of [gate (n values) | up (n values)]; act is
 * SD_ACT_SILU or SD_ACT_GELU_TANH. */
void sd_gate_mul(const float *gate_up, int64_t rows, int64_t n, int64_t in_stride, float *out, int64_t out_stride,
                 int act, int threads) {
    const gate_job job = {gate_up, out, n, in_stride, out_stride, act};
    sd_run_parts(gate_row, &job, (int)rows, rows < PARALLEL_ROWS ? 1 : threads);
}
