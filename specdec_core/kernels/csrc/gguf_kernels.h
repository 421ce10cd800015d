/* GGUF block formats times per-row 8-bit activations: shared declarations.
 *
 * The weight blocks are the GGUF file's own bytes (layouts as in ggml-common.h). Activations are
 * quantized per row: a row's int8 values and scales depend on that row alone, every output element
 * is computed by one thread with the same instruction sequence whatever the number of rows, and
 * integer partial sums are exact, so a row's result is bit-identical alone or batched.
 */
#ifndef SPECDEC_GGUF_KERNELS_H
#define SPECDEC_GGUF_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#define QK_K 256
#define QK32 32
#define ROW_TILE 4 /* activation rows computed per pass over one weight row */
#ifndef X8_PREFETCH
/* The repacked Q4_K/Q6_K kernels prefetch the super-block this many ahead (2.4 / 3.4 KB): one
 * thread streaming the weights alone reads them 15-25% faster than with the hardware prefetchers
 * only (measured on the 2-core AVX2 dev machine, M=1, 2026-11-24). */
#define X8_PREFETCH 2
#endif

/* GGML type ids (gguf.GGMLQuantizationType). */
enum { T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14 };

typedef struct { uint16_t d; uint8_t qs[16]; } blk_q4_0;
typedef struct { uint16_t d, m; uint8_t qs[16]; } blk_q4_1;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } blk_q5_0;
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } blk_q5_1;
typedef struct { uint16_t d; int8_t qs[32]; } blk_q8_0;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } blk_q4_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } blk_q5_K;
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } blk_q6_K;

/* Activations for the K-quants: one scale per 32 values (d32; ggml's Q8_K has one per 256, which
 * on Qwen2.5-1.5B's outlier channels costs KL 0.15 against fp32 where per-32 costs 0.003), plus
 * exact sums of 16 and of 32 consecutive quantized values for the formats' offsets (Q6_K's -32,
 * Q4_K/Q5_K's mins), and s32 = d32 * bsum32. */
typedef struct { int8_t qs[QK_K]; int16_t bsum16[16]; int16_t bsum32[8]; float d32[8]; float s32[8]; } act_k;
/* Activations for the 32-blocks: one scale per 32 values (like ggml's Q8_0/Q8_1); s = d * sum(qs). */
typedef struct { int8_t qs[QK32]; float d; float s; int32_t sum; } act_32; /* sum = sum(qs) */
/* Activations quantized to 16 bits for Q8_0 weights made at load (SD_ACT16): one scale per 32 values. */
typedef struct { int16_t qs[QK32]; float d; } act_16;

/* Computes out[r * ldo] for r < rows (1..ROW_TILE) of one weight row against `rows` activation rows
 * starting at `act`, each `act_stride` bytes apart; `nb` blocks per row. */
typedef void (*tile_fn)(const uint8_t *w, int nb, const uint8_t *act, size_t act_stride, int rows,
                        float *out, size_t ldo);

float sd_fp16_to_fp32(uint16_t h);
void sd_q4k_scale_min(const uint8_t *scales, uint8_t *sc, uint8_t *mn);

/* Any number of rows of one group of 8 columns of a repacked ("x8") weight; ncols <= 8 of them
 * are stored. */
typedef void (*group_fn)(const uint8_t *w, int nb, const uint8_t *act, size_t stride, int rows, float *out,
                         size_t ldo, int ncols);
#define SD_X8 0x100 /* type flag: the weight is repacked 8 columns at a time (gguf_x8.c) */
/* type flag: the activations are quantized to 16 bits, not 8 (Q8_0 only, either layout; gguf_q8_0_act16.c) */
#define SD_ACT16 0x200

/* The repacked layouts: their sizes (0: not for this type and k), and the packing of the groups of
 * 8 rows g0 <= g < g1 (each group's bytes depend on its own rows only: sd_gguf_x8_repack runs
 * ranges of groups on threads). */
typedef void (*pack_fn)(int type, const uint8_t *raw, int64_t n, int64_t k, uint8_t *dst, int64_t g0, int64_t g1);
int64_t sd_gguf_x8_bytes(int type, int64_t n, int64_t k);
void sd_gguf_x8_pack(int type, const uint8_t *raw, int64_t n, int64_t k, uint8_t *dst, int64_t g0, int64_t g1);
int64_t sd_gguf_x8_32_bytes(int type, int64_t n, int64_t k);
void sd_gguf_x8_32_pack(int type, const uint8_t *raw, int64_t n, int64_t k, uint8_t *dst, int64_t g0, int64_t g1);
int64_t sd_gguf_x8_q6k_bytes(int64_t n, int64_t k);
void sd_gguf_x8_q6k_pack(int type, const uint8_t *raw, int64_t n, int64_t k, uint8_t *dst, int64_t g0, int64_t g1);

/* Rows r < m of x (ldx floats apart) quantized to act + r * stride: act_k blocks when kq, else
 * act_32 (gguf_act_quant.c). */
int64_t sd_act_row_bytes(int kq, int64_t k);
void sd_quantize_rows(int kq, const float *x, int64_t k, int64_t m, int64_t ldx, uint8_t *act, int64_t stride);
tile_fn sd_scalar_tile(int type);
/* SD_ACT16: act_16 rows (gguf_act_quant.c), the same bytes for every kernel set; its tiles
 * (gguf_q8_0_act16.c). */
int64_t sd_act16_row_bytes(int64_t k);
void sd_quantize_rows16(const float *x, int64_t k, int64_t m, int64_t ldx, uint8_t *act, int64_t stride);
tile_fn sd_scalar_act16_tile(int type);
/* The kernel sets, best last; sd_gguf_set_impl picks one for the process (0: the best this CPU
 * runs). A set runs its own kernels where it has them and the next set's elsewhere: AVX-512 VNNI
 * has the repacked formats' tiles and Q8_0's with 16-bit activations (gguf_vnni.c), and takes
 * AVX2's for the rest; AMX-INT8 has tile products for repacked Q4_K, Q6_K and Q8_0 times
 * AMX_MIN_ROWS rows or more (gguf_amx.c) and the 512-bit VNNI tiles for fewer rows of Q4_K and
 * Q6_K (gguf_vnni512.c), and takes the VNNI set's for the rest. */
enum { SD_IMPL_PORTABLE = 1, SD_IMPL_AVX2 = 2, SD_IMPL_VNNI = 3, SD_IMPL_AMX = 4 };
#define AMX_MIN_ROWS 11 /* below it the 512-bit VNNI tiles are as fast (a tile step's fixed cost) */
int sd_gguf_set_impl(int which);
int sd_kernel_impl(void);
/* 1 where the portable scalar kernels run (no AVX2/FMA/F16C, or a test asked for them). */
int sd_use_scalar(void);

/* out[r * ldo + c] for r < m, c < n; w in the file's layout, or repacked when type has SD_X8; x
 * quantized per row to 8 bits, or to 16 when type has SD_ACT16. */
int sd_gguf_gemm(int type, const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, int64_t ldx,
                 float *out, int64_t ldo, int threads);

/* A prepared block linear (gguf_linear.GGUFLinear): its kernel calls write consecutive output
 * columns of one [m, out_features] output; the struct mirrors gguf_linear.BlockCalls. */
#define SD_LINEAR_CALLS 4 /* kernel calls of one fused linear (parts of different block formats) */
typedef struct {
    int32_t codes[SD_LINEAR_CALLS];
    const uint8_t *weights[SD_LINEAR_CALLS];
    int64_t rows[SD_LINEAR_CALLS];
    int32_t calls;
    int64_t in_features, out_features;
    const float *bias; /* NULL: none */
} sd_linear;
int sd_block_linear(const sd_linear *l, const float *x, int64_t m, int64_t ldx, float *out, int threads);

/* sd_cpu_features() bits: what the CPU and the OS support, whether or not kernels use it yet. */
#define SD_CPU_AVX2 1        /* AVX2 + FMA + F16C, YMM state saved */
#define SD_CPU_AVX512 2      /* AVX-512 F/BW/VL/DQ, ZMM and mask state saved */
#define SD_CPU_AVX512_VNNI 4
#define SD_CPU_AMX_INT8 8    /* AMX-TILE + AMX-INT8, tile state saved and granted to this process */
int sd_cpu_features(void);
/* Calls fn(job, p) for every part p < parts on up to `threads` threads (gguf_threads.c). */
typedef void (*part_fn)(const void *job, int part);
void sd_run_parts(part_fn fn, const void *job, int parts, int threads);
int sd_gguf_thread_pool(void);
int sd_gguf_set_pool(int own);

#if defined(__x86_64__) || defined(__i386__)
tile_fn sd_avx2_tile(int type);
tile_fn sd_avx2_act16_tile(int type);
tile_fn sd_vnni_act16_tile(int type);
/* The repacked formats' tiles of each vector set (gguf_x8_tiles.h); NULL for other types. */
group_fn sd_avx2_x8_group(int type);
group_fn sd_vnni_x8_group(int type);
/* ... and Q8_0's with 16-bit activations (gguf_q8_0_act16_tile.h) */
group_fn sd_avx2_act16_group(int type);
group_fn sd_vnni_act16_group(int type);
/* Any number of rows of two adjacent 8-column groups (group_bytes apart) of a repacked weight as
 * AMX tile products; ncols <= 8 columns of the second group are stored. NULL for other types. */
typedef void (*pair_fn)(const uint8_t *w, int64_t group_bytes, int nb, const uint8_t *act, size_t stride, int rows,
                        float *out, size_t ldo, int ncols);
/* The AMX tiles read activation rows 16 at a time: the quantized rows are allocated (not
 * computed) up to the next multiple of AMX_TILE_ROWS. */
#define AMX_TILE_ROWS 16
pair_fn sd_amx_x8_pair(int type);
/* ... and as 512-bit VNNI tiles (gguf_vnni512.c; Q4_K, Q6_K), for fewer rows on the AMX set */
pair_fn sd_vnni512_x8_pair(int type);
#endif

#endif
