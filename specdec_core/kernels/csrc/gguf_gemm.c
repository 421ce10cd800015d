/* out[m, n] = sum_k x[m, k] * W[n, k] for a GGUF-quantized W, x quantized per row to 8 bits.
 *
 * Work is split over output columns (weight rows) into contiguous ranges, one per thread: every
 * output element is computed by exactly one thread with the same code, so the result does not
 * depend on the thread count nor on the number of rows. The threads are torch's OpenMP team where
 * there is one (gguf_threads.c). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_kernels.h"

#ifndef SD_SOURCES_HASH
#define SD_SOURCES_HASH "unknown"
#endif

/* The hash of the sources this library was built from: Python rebuilds a stale library (an
 * editable install keeps the extension it built, whatever the sources became since). */
const char *sd_gguf_sources_hash(void) { return SD_SOURCES_HASH; }

static int impl = 0; /* SD_IMPL_*; 0: not decided yet */

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

static uint64_t os_saved_state(void) { /* XCR0: the register state the OS saves on a context switch */
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}

/* Linux hands out AMX tile state only to a process that asks (arch_prctl ARCH_REQ_XCOMP_PERM for
 * XFEATURE_XTILEDATA); a tile instruction without it is a SIGILL. */
static int amx_permitted(void) {
#if defined(__linux__) && defined(SYS_arch_prctl)
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
#else
    return 0;
#endif
}
#endif

/* What this CPU and its OS let a kernel use, as SD_CPU_* bits: the instructions (cpuid) and the
 * register state the OS saves for them (XCR0), AMX also its permission. Asked once per process. */
int sd_cpu_features(void) {
    static int features = -1;
    if (features >= 0) return features;
    int found = 0;
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d) && (c & bit_OSXSAVE)) {
        int fma = !!(c & bit_FMA), f16c = !!(c & bit_F16C);
        uint64_t xcr0 = os_saved_state();
        if (__get_cpuid_max(0, 0) >= 7) {
            __cpuid_count(7, 0, a, b, c, d);
            if ((xcr0 & 0x6) == 0x6 && (b & bit_AVX2) && fma && f16c) found |= SD_CPU_AVX2;
            int avx512 = (b & bit_AVX512F) && (b & bit_AVX512BW) && (b & bit_AVX512VL) && (b & bit_AVX512DQ);
            if ((found & SD_CPU_AVX2) && (xcr0 & 0xE0) == 0xE0 && avx512) {
                found |= SD_CPU_AVX512;
                if (c & (1u << 11)) found |= SD_CPU_AVX512_VNNI;
            }
            int amx = (d & (1u << 24)) && (d & (1u << 25)); /* AMX-TILE, AMX-INT8 */
#ifdef SD_AMX_EMULATE /* a build whose tile products are emulated (amx_emulation.h): AVX-512 VNNI is enough */
            if (found & SD_CPU_AVX512_VNNI) found |= SD_CPU_AMX_INT8;
            (void)amx;
#else
            if (amx && (xcr0 & 0x60000) == 0x60000 && amx_permitted()) found |= SD_CPU_AMX_INT8;
#endif
        }
    }
#endif
    features = found;
    return features;
}

/* The best kernel set this CPU and OS run. */
static int best_impl(void) {
    const int features = sd_cpu_features();
    if ((features & SD_CPU_AVX512_VNNI) && (features & SD_CPU_AMX_INT8)) return SD_IMPL_AMX;
    return (features & SD_CPU_AVX512_VNNI) ? SD_IMPL_VNNI : (features & SD_CPU_AVX2) ? SD_IMPL_AVX2 : SD_IMPL_PORTABLE;
}

/* Makes `which` (SD_IMPL_*, or 0: the best this CPU runs) the kernel set of this process and
 * returns it; -1, changing nothing, for a set this CPU lacks (each set needs the ones below it). */
int sd_gguf_set_impl(int which) {
    const int best = best_impl();
    if (which == 0) which = best;
    if (which < SD_IMPL_PORTABLE || which > best) return -1;
    impl = which;
    return impl;
}

int sd_kernel_impl(void) {
    if (!impl) impl = best_impl();
    return impl;
}

int sd_use_scalar(void) { return sd_kernel_impl() == SD_IMPL_PORTABLE; }

static tile_fn select_tile(int type) {
    const int act16 = type & SD_ACT16;
    type &= 0xff;
#if defined(__x86_64__) || defined(__i386__)
    if (sd_kernel_impl() >= SD_IMPL_VNNI && act16) return sd_vnni_act16_tile(type);
    if (!sd_use_scalar()) return act16 ? sd_avx2_act16_tile(type) : sd_avx2_tile(type);
#endif
    return act16 ? sd_scalar_act16_tile(type) : sd_scalar_tile(type);
}

static int block_values(int type) { return type == T_Q4_K || type == T_Q5_K || type == T_Q6_K ? QK_K : QK32; }

/* Bytes of one weight row of k values; 0 when the type is not supported or k does not fit it. */
int64_t sd_gguf_row_bytes(int type, int64_t k) {
    size_t bsize;
    switch (type) {
    case T_Q4_0: bsize = sizeof(blk_q4_0); break;
    case T_Q4_1: bsize = sizeof(blk_q4_1); break;
    case T_Q5_0: bsize = sizeof(blk_q5_0); break;
    case T_Q5_1: bsize = sizeof(blk_q5_1); break;
    case T_Q8_0: bsize = sizeof(blk_q8_0); break;
    case T_Q4_K: bsize = sizeof(blk_q4_K); break;
    case T_Q5_K: bsize = sizeof(blk_q5_K); break;
    case T_Q6_K: bsize = sizeof(blk_q6_K); break;
    default: return 0;
    }
    if (k <= 0 || k % block_values(type)) return 0;
    return (int64_t)(k / block_values(type)) * (int64_t)bsize;
}

typedef struct {
    tile_fn tile;
    group_fn group; /* set for repacked (x8) weights: units of 8 columns */
    pair_fn pair;   /* AMX: two whole groups at a time (set with group; a lone group takes group) */
    const uint8_t *w, *act;
    int64_t n, m, ldo, row_bytes, act_stride, group_bytes;
    int nb, parts;
    float *out;
} job_t;

static void run_part(const void *job, int part) {
    const job_t *j = (const job_t *)job;
    if (j->group) {
        const int64_t groups = (j->n + 7) / 8, g0 = groups * part / j->parts, g1 = groups * (part + 1) / j->parts;
        for (int64_t g = g0; g < g1; g++) {
            const int ncols = (int)(j->n - 8 * g < 8 ? j->n - 8 * g : 8);
            if (j->pair && g + 1 < g1) {
                const int ncols1 = (int)(j->n - 8 * (g + 1) < 8 ? j->n - 8 * (g + 1) : 8);
                j->pair(j->w + g * j->group_bytes, j->group_bytes, j->nb, j->act, (size_t)j->act_stride, (int)j->m,
                        j->out + 8 * g, (size_t)j->ldo, ncols1);
                g++;
                continue;
            }
            j->group(j->w + g * j->group_bytes, j->nb, j->act, (size_t)j->act_stride, (int)j->m, j->out + 8 * g,
                     (size_t)j->ldo, ncols);
        }
        return;
    }
    const int64_t n0 = j->n * part / j->parts, n1 = j->n * (part + 1) / j->parts;
    for (int64_t col = n0; col < n1; col++) {
        const uint8_t *w = j->w + col * j->row_bytes;
        for (int64_t r0 = 0; r0 < j->m; r0 += ROW_TILE) {
            const int rows = (int)(j->m - r0 < ROW_TILE ? j->m - r0 : ROW_TILE);
            j->tile(w, j->nb, j->act + r0 * j->act_stride, (size_t)j->act_stride, rows, j->out + r0 * j->ldo + col, (size_t)j->ldo);
        }
    }
}

/* The repacked layout this library multiplies for `type` (with SD_ACT16 or not) with the active
 * kernels: SD_X8 | type, or 0 when it multiplies the file's own layout only. */
int sd_gguf_x8_type(int type) {
    const int base = type & 0xff, act16 = type & SD_ACT16;
    if (type & ~(0xff | SD_ACT16)) return 0;
    const int repacked = act16 ? base == T_Q8_0
                               : base == T_Q4_K || base == T_Q6_K || base == T_Q4_0 || base == T_Q5_0 || base == T_Q8_0;
    return !sd_use_scalar() && repacked ? (SD_X8 | type) : 0;
}

/* Bytes of the repacked layout of n rows of k values (0: none for this type and k); the layout
 * does not depend on the activations (SD_ACT16). */
int64_t sd_gguf_x8_size(int type, int64_t n, int64_t k) {
    type &= 0xff;
    return type == T_Q4_K ? sd_gguf_x8_bytes(type, n, k)
         : type == T_Q6_K ? sd_gguf_x8_q6k_bytes(n, k) : sd_gguf_x8_32_bytes(type, n, k);
}

typedef struct {
    pack_fn pack;
    int type, parts;
    const uint8_t *raw;
    int64_t n, k;
    uint8_t *dst;
} repack_t;

static void repack_part(const void *job, int part) {
    const repack_t *j = (const repack_t *)job;
    const int64_t groups = (j->n + 7) / 8;
    j->pack(j->type, j->raw, j->n, j->k, j->dst, groups * part / j->parts, groups * (part + 1) / j->parts);
}

/* The repacked layout of n rows of k values into dst (sd_gguf_x8_size bytes), on up to `threads`
 * threads (a model's repacking was ~6 s of a default pair's start on one thread). 0, or -1 when
 * there is no such layout. */
int sd_gguf_x8_repack(int type, const uint8_t *raw, int64_t n, int64_t k, uint8_t *dst, int threads) {
    type &= 0xff;
    if (!sd_gguf_x8_size(type, n, k)) return -1;
    repack_t j = {type == T_Q4_K ? sd_gguf_x8_pack : type == T_Q6_K ? sd_gguf_x8_q6k_pack : sd_gguf_x8_32_pack,
                  type, threads < 1 ? 1 : threads, raw, n, k, dst};
    if ((int64_t)j.parts > (n + 7) / 8) j.parts = (int)((n + 7) / 8);
    sd_run_parts(repack_part, &j, j.parts, j.parts);
    return 0;
}

/* out[r * ldo + c] for r < m, c < n; w in the file's layout, or repacked when type has SD_X8; x
 * quantized per row to 8 bits, or to 16 when type has SD_ACT16. Returns 0, or -EINVAL for an unsupported type, k or layout, -ENOMEM. */
int sd_gguf_gemm(int type, const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, int64_t ldx,
                 float *out, int64_t ldo, int threads) {
    group_fn group = NULL;
    pair_fn pair = NULL;
    int64_t padded = m; /* rows of quantized activations allocated: AMX tiles read 16 at a time */
    const int act16 = type & SD_ACT16;
    if (type & SD_X8) {
        if (sd_gguf_x8_type(type & ~SD_X8) != type || !sd_gguf_x8_size(type, n, k)) return -EINVAL;
        type &= ~SD_X8;
#if defined(__x86_64__) || defined(__i386__)
        const int vnni = sd_kernel_impl() >= SD_IMPL_VNNI, base = type & 0xff;
        group = act16 ? (vnni ? sd_vnni_act16_group(base) : sd_avx2_act16_group(base))
                      : (vnni ? sd_vnni_x8_group(base) : sd_avx2_x8_group(base));
        if (sd_kernel_impl() == SD_IMPL_AMX && !act16) {
            pair = m >= AMX_MIN_ROWS ? sd_amx_x8_pair(base) : NULL;
            if (pair)
                padded = (m + AMX_TILE_ROWS - 1) / AMX_TILE_ROWS * AMX_TILE_ROWS;
            else
                pair = sd_vnni512_x8_pair(base);
        }
#endif
    }
    const int64_t row_bytes = sd_gguf_row_bytes(type & 0xff, k);
    const tile_fn tile = row_bytes ? select_tile(type) : NULL;
    if (!tile || m < 0 || n < 0) return -EINVAL;
    if (m == 0 || n == 0) return 0;
    type &= 0xff;
    const int kq = block_values(type) == QK_K;
    const int64_t act_stride = act16 ? sd_act16_row_bytes(k) : sd_act_row_bytes(kq, k);
    uint8_t *act = aligned_alloc(64, (size_t)((act_stride * padded + 63) / 64 * 64));
    if (!act) return -ENOMEM;
    memset(act + act_stride * m, 0, (size_t)(act_stride * (padded - m))); /* never used: their sums are not read */
    if (act16)
        sd_quantize_rows16(x, k, m, ldx, act, act_stride);
    else
        sd_quantize_rows(kq, x, k, m, ldx, act, act_stride);
    job_t j = {tile, group, pair, w, act, n, m, ldo, row_bytes, act_stride, group ? sd_gguf_x8_size(type, 8, k) : 0,
               (int)(k / block_values(type)), threads < 1 ? 1 : threads, out};
    const int64_t units = group ? (n + 7) / 8 : n;
    if ((int64_t)j.parts > units) j.parts = (int)units;
    sd_run_parts(run_part, &j, j.parts, j.parts);
    free(act);
    return 0;
}

/* out[r] = x[r] @ W.T (+ bias) for r < m: the linear's kernel calls side by side, each into its
 * columns of out ([m, out_features], contiguous). 0, or the first kernel call's error. */
int sd_block_linear(const sd_linear *l, const float *x, int64_t m, int64_t ldx, float *out, int threads) {
    int64_t col = 0;
    for (int c = 0; c < l->calls; c++) {
        const int rc = sd_gguf_gemm(l->codes[c], l->weights[c], l->rows[c], l->in_features, x, m, ldx, out + col,
                                    l->out_features, threads);
        if (rc != 0) return rc;
        col += l->rows[c];
    }
    if (l->bias)
        for (int64_t r = 0; r < m; r++)
            for (int64_t i = 0; i < l->out_features; i++) out[r * l->out_features + i] += l->bias[i];
    return 0;
}
