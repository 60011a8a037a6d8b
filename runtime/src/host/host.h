/* Host driver internals shared by the kernel families: the elementwise tile engine,
 * pack/unpack between strided operands and dense compute buffers, and conversions.
 *
 * Compute dtypes: float32 (for f32/bf16/f16), float64, int64 (integers and bool). Every
 * kernel works on dense buffers of one compute dtype; loads and stores convert. */
#ifndef TPURT_HOST_HOST_H_
#define TPURT_HOST_HOST_H_

#include <pthread.h>

#include "core/internal.h"

typedef tpu_status_t (*tpu_host_kernel_fn)(tpu_node_t* node);

/* Each family registers its kernels into the table indexed by tpu_kind_t. */
/* True on a pool thread, and on the calling thread while its region runs. */
bool tpu__in_parallel_region(void);

#define TPU_HOST_FAMILIES(X) X(elementwise) X(reduce) X(linalg) X(nn) X(index) X(random) X(norm) X(resample) X(gated) X(complex) X(vision) X(optim) X(lapack)
#define TPU__DECL_REG(f) void tpu__host_register_##f(tpu_host_kernel_fn* table);
TPU_HOST_FAMILIES(TPU__DECL_REG)
#undef TPU__DECL_REG

/* Fusion (host/fuse.c): which nodes a fused tile loop can run, and the loop itself. */
bool tpu__host_can_fuse(tpu_driver_t* d, const tpu_node_t* node);
tpu_status_t tpu__host_run_group(tpu_driver_t* d, tpu_node_t* const* nodes, int k,
                                 const uint8_t* internal);
bool tpu__host_can_end_group(tpu_driver_t* d, const tpu_node_t* producer, const tpu_node_t* node);

/* A row reduction that ends a fused group: a reduction over the last dim of its input
 * (softmax, log_softmax, layer norm over the last dim) whose input is the float32 output
 * of a group member. The group computes one row at a time in tiles, then hands the
 * whole row to row(), which writes that row's outputs exactly as the reduction's own
 * kernel would. scratch holds 2 * k doubles for the calling thread. */
typedef struct tpu_row_end_s tpu_row_end_t;
struct tpu_row_end_s {
  const tpu_node_t* node;
  int64_t k;   /* row length */
  void* state; /* per-run data (layer norm: weight and bias in f64) */
  void (*row)(const tpu_row_end_t* e, const float* x, int64_t r, double* scratch);
};
/* Per family: whether node can end a group, and setting up a run (free state with
 * tpu__free afterwards). */
bool tpu__softmax_row_end_ok(const tpu_node_t* node);
tpu_status_t tpu__softmax_row_end_open(const tpu_node_t* node, tpu_row_end_t* e);
bool tpu__layer_norm_row_end_ok(const tpu_node_t* node);
tpu_status_t tpu__layer_norm_row_end_open(const tpu_node_t* node, tpu_row_end_t* e);

/* Tile engine: output 0 and all inputs are broadcast to output 0's shape; fn sees
 * contiguous tiles in `compute` dtype (scalars arrive as constant tiles). The output
 * tile is converted to output 0's dtype on store. n_in <= 8. A tile function computes
 * out[i] from the inputs' elements i alone, reading them before it writes out[i], so the
 * output tile may be the same memory as an input tile (in-place ops, donated buffers). */
typedef void (*tpu_tile_fn)(int64_t n, void* out, const void* const* in, const tpu_node_t* node);
/* The pure tile function of an elementwise node (NULL if its kernel is not one). */
tpu_tile_fn tpu__elementwise_tile_fn(const tpu_node_t* node);

tpu_status_t tpu__tile_run(tpu_node_t* node, tpu_dtype_t compute, tpu_tile_fn fn);
/* Same with explicit input operand list and output operand (for multi-output kernels). */
tpu_status_t tpu__tile_run_ops(const tpu_node_t* node, tpu_operand_t* out,
                               const tpu_operand_t* const* ins, int n_in,
                               tpu_dtype_t compute, tpu_tile_fn fn);

/* Dense conversions between a strided run and a contiguous buffer. */
void tpu__convert_run(void* dst, tpu_dtype_t dst_dtype, int64_t dst_stride,
                      const void* src, tpu_dtype_t src_dtype, int64_t src_stride, int64_t n);

/* dst = src elementwise over an nd-dim shape, both strided (in elements of esz bytes;
 * a zero src stride broadcasts), no dtype conversion. dst must not overlap src. Large
 * copies split over the pool by rows. */
void tpu__strided_copy(int nd, const int64_t* sizes, void* dst, const int64_t* dst_strides,
                       const void* src, const int64_t* src_strides, size_t esz);

/* Bytes of cpu0's data (or unified) cache of this level (1, 2, 3), or of its last level
 * for level 0, as sysfs lists it; 0 where sysfs does not say. Callers fall back to
 * sysconf, which is not asked first: on a 2-core VM it reported the package's 256 MiB of
 * L3 where the core's slice is 32 MiB. Reads files: call it once, not per op. */
int64_t tpu__cache_bytes(int level);

/* Streaming stores for copies too big to stay in the cache. Below this many bytes (the
 * last-level cache from sysfs, else 32 MiB; TORCHTPU_STREAM_MIN_BYTES sets it, 0 turns
 * streaming off) a copy's destination is written with ordinary stores, since the next op
 * may still find it cached; from it on, stores bypass the cache (non-temporal), which
 * saves the read of every destination line that an ordinary store makes first. Used by
 * same-dtype dense copies (clone, copy_), float layer-norm rows into new outputs, and
 * the float32 outputs of memory-bound elementwise kernels (tpu__tile_stream below).
 * Measured on 2 AVX2 cores, 16M f32, streaming off vs on, medians of 8 alternated runs:
 * clone 17.75 -> 24.95 GB/s; layer norm 12.9 -> 14.4 (4 runs). Elementwise kernels store
 * from registers (tpu__stream8_f32), 32 results at a time: neg, add, x * s and relu
 * 1.1-1.4x faster (host/elementwise.c). Computing a whole tile into its buffer and
 * streaming that out had gained nothing for add, mul, neg (19.25 -> 20.65, 19.5 -> 19.6,
 * 18.9 -> 18.6 GB/s); gelu, sigmoid and tanh lose either way, as did softmax rows (bound
 * by their exponentials), so they keep ordinary stores.
 * tpu__stream_copy(dst, src, n) copies n bytes so; a thread that used it calls
 * tpu__stream_fence() before another thread reads them. */
int64_t tpu__stream_min_bytes(void);
void tpu__stream_copy(void* dst, const void* src, size_t n);
void tpu__stream_fence(void);

/* Pack: copies operand op (strided, any dtype) into dense row-major `dst` of dtype,
 * with dimensions permuted by perm (perm may be NULL = identity). A scalar operand fills
 * numel(shape) copies — pass its broadcast shape via op->sizes. */
void tpu__pack(const tpu_operand_t* op, const int* perm, tpu_dtype_t dtype, void* dst);
/* Allocates and packs; returns NULL on host OOM. Caller frees with tpu__free. */
void* tpu__pack_alloc(const tpu_operand_t* op, tpu_dtype_t dtype);
/* Unpack: writes dense row-major src (dtype) into operand op (strided, any dtype). */
void tpu__unpack(tpu_operand_t* op, const void* src, tpu_dtype_t dtype);
/* op's elements as a dense row-major array of dtype, to read: op's own memory when it is
 * one already (*owned = NULL), else a packed copy (*owned = the copy, for tpu__free).
 * NULL on host OOM. */
const void* tpu__dense_in(const tpu_operand_t* op, tpu_dtype_t dtype, void** owned);
/* Where a kernel writes op's elements densely in dtype: op's own memory when that is
 * dense in dtype and no input reads the same value (*owned = NULL; cleared first if zero
 * is set, for kernels that accumulate), else a zeroed scratch array (*owned) that
 * tpu__dense_out_done unpacks into op. NULL on host OOM. */
void* tpu__dense_out(const tpu_node_t* n, tpu_operand_t* op, tpu_dtype_t dtype, bool zero, void** owned);
void tpu__dense_out_done(tpu_operand_t* op, void* owned, tpu_dtype_t dtype);

/* Element load/store by dtype (slow path, one element). */
double tpu__load_f64(const void* p, tpu_dtype_t dtype);
int64_t tpu__load_i64(const void* p, tpu_dtype_t dtype);
void tpu__store_f64(void* p, tpu_dtype_t dtype, double v);
void tpu__store_i64(void* p, tpu_dtype_t dtype, int64_t v);


/* Rounds float32 values in place through a narrower float dtype (bf16, f16; others: no
 * change), as a store to that dtype and a load back would (host/tile.c, built per ISA). */
void tpu__round_f32_run(float* v, int64_t n, tpu_dtype_t dt);
/* tpu__round_f32_run to bf16 that also stores the bf16 values in d (dense): one pass. */
void tpu__round_store_bf16(float* v, uint16_t* d, int64_t n);

/* ---- thread pool (host/pool.c) ----------------------------------------------------
 * A process-wide pool of persistent workers: TORCHTPU_NUM_THREADS threads if set, else
 * one per online CPU, the calling thread included. Thread-safe. */
typedef tpu_status_t (*tpu_parallel_fn)(void* ctx, int64_t begin, int64_t end, int tid);
/* Threads in the pool (>= 1), the caller counted. Starts the pool on first use. */
int tpu__num_threads(void);
/* How many chunks tpu__parallel_for(n, grain, ...) splits into: min(threads, ceil(n/grain)). */
int tpu__parallel_chunks(int64_t n, int64_t grain);
/* Runs fn over [0, n) split into tpu__parallel_chunks(n, grain) fixed contiguous chunks;
 * the caller (thread 0) and the pool's threads claim chunks as they get to them, and fn
 * gets the running thread's index as tid, so kernels index per-thread scratch by tid
 * (< tpu__num_threads()); a thread may run several chunks, one after another, and a
 * chunk's range never depends on who runs it. Runs serially, as chunk 0 = [0, n),
 * when there is one chunk or when called from inside a region (nested). When another
 * thread holds the pool the same chunks run one after another on the caller. Returns the
 * first error in chunk order (the others are freed). BLAS runs single-threaded
 * (host/linalg.c), so a region's chunks may call it. */
tpu_status_t tpu__parallel_for(int64_t n, int64_t grain, tpu_parallel_fn fn, void* ctx);
/* The same over n independent items of similar cost (GEMM blocks), each its own chunk
 * (at most 256 chunks): a thread that the OS takes off its core for a while (2 cores:
 * the Python thread records the next ops while the pool runs) holds one item, not half of
 * them, and the others' threads take the rest. Only for kernels whose result does not
 * depend on the partition. */
tpu_status_t tpu__parallel_items(int64_t n, tpu_parallel_fn fn, void* ctx);
/* The chunks of a region run in order on the caller (used when the pool is busy). */
tpu_status_t tpu__parallel_serial(int64_t n, int chunks, tpu_parallel_fn fn, void* ctx);
/* Work (in elements touched) below which kernels stay serial: a region costs a few
 * microseconds of wake-up, which this much work amortizes. */
#define TPU_PARALLEL_MIN_WORK 32768

static inline int64_t tpu__cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* OpenBLAS runs single-threaded (set on first use; call before any BLAS call). */
void tpu__blas_prepare(void);
/* Row-major C = alpha op(A) op(B) + beta C in f32 or f64 (cd), split over the pool in
 * blocks of C above TPU_GEMM_SPLIT_FLOPS, outside a region; one BLAS call otherwise. A
 * region costs a few microseconds; 4 MFLOP is ~40 us of one core (measured on 2 cores:
 * 64x512x512, 128x256x256 and 256x128x384 products ran single-threaded at half of PyTorch
 * CPU's speed under the former 32 MFLOP bound). */
#define TPU_GEMM_SPLIT_FLOPS (4.0 * 1024 * 1024)
/* Batched products below this many FLOPs each run whole, batches over the pool; larger
 * ones split inside each GEMM. */
#define TPU_BLAS_SERIAL_FLOPS (32.0 * 1024 * 1024)
void tpu__gemm(tpu_dtype_t cd, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
               const void* A, int64_t lda, const void* B, int64_t ldb, double beta, void* C, int64_t ldc);

/* f32 GEMM with AVX-512 FMAs (host/gemm_avx512f32.c): row-major f32 C[M, N] (row stride
 * ldc) = alpha * A B + beta * C, C not read when beta is 0; element (i, k) of A is
 * a[i * sam + k * sak], element (k, j) of B is b[k * sbk + j * sbn] (any strides, in
 * elements). M, N, K > 0. Splits work over the pool (serial for small products or inside
 * a region); calls no BLAS. tpu__gemm takes it for f32 products where
 * tpu__gemm_f32_supported(): the CPU has AVX512F/BW/VL/DQ and TORCHTPU_F32_GEMM is not
 * "blas" (host/linalg.c reads it, once), and tpu__gemm_f32_takes the shape: 8 rows or
 * more at any strides; fewer with a unit-stride B row (row-major B) or unit-stride K in
 * both A and B (a linear layer's transposed weight), read in place. Products with
 * unit-stride K in both operands and few rows or fewer than 64 columns run as dot
 * products (each element a sum of 16 lane sums), all others as K-ordered sums. */
bool tpu__gemm_f32_supported(void);
bool tpu__gemm_f32_takes(int64_t M, int64_t N, int64_t sak, int64_t sbk, int64_t sbn);
tpu_status_t tpu__gemm_f32(int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t sam,
                           int64_t sak, const float* b, int64_t sbk, int64_t sbn, float beta, float* c,
                           int64_t ldc);

/* One f32 attention head (host/attn_avx512f32.c), for host/nn.c's fused attention when
 * the CPU has AVX-512: q [L, E], k [S, E], v [S, Ev], each row-major with a row stride
 * (ld*) and unit stride along its last dim; causal: row i sees keys [0, i + 1), applied
 * after the bias (if any). Forward of query rows [r0, r1) (r0 a multiple of
 * TPU_ATTN_ROWS; a row's result does not depend on the range): out [L, Ev] (row stride
 * ldo) and lse [L], the rows' logsumexp. Backward, from grad_out, out and lse: dq [L, E]
 * is written, dk [S, E] and dv [S, Ev] accumulate (+=: the heads of a GQA group add into
 * one). Single-threaded: callers run heads (and forward row ranges) in parallel.
 * scratch: tpu__attn_f32_scratch floats, no alignment needed. */
#define TPU_ATTN_ROWS 32 /* query rows per block: a causal block multiplies only the keys it sees */
typedef struct tpu_attn_f32_s {
  int64_t L, S, E, Ev;
  float scale;
  bool causal;
  const float *q, *k, *v;
  int64_t ldq, ldk, ldv;
  /* Optional bias of the scores, element (i, j) at bias[i * bias_sr + j * bias_sc]
   * (broadcast strides 0): float added (TPU_DTYPE_F32), or bool keeping the scores it
   * marks true, the rest -inf (TPU_DTYPE_BOOL); NULL: none. */
  const void* bias;
  tpu_dtype_t bias_dtype;
  int64_t bias_sr, bias_sc;
} tpu_attn_f32_t;
size_t tpu__attn_f32_scratch(int64_t S, int64_t E, int64_t Ev);
void tpu__attn_f32_fwd(const tpu_attn_f32_t* h, int64_t r0, int64_t r1, float* out, int64_t ldo, float* lse,
                       float* scratch);
void tpu__attn_f32_bwd(const tpu_attn_f32_t* h, const float* go, int64_t ldgo, const float* o, int64_t ldo,
                       const float* lse, float* dq, int64_t lddq, float* dk, int64_t lddk, float* dv,
                       int64_t lddv, float* scratch);

/* bf16 GEMM with AVX512-BF16 (host/gemm_avx512bf16.c). Row-major f32 C[M, N] (row stride
 * ldc) = alpha * A B + beta * C, with C not read when beta is 0; element (i, k) of A is
 * a[i * sam + k * sak], element (k, j) of B is b[k * sbk + j * sbn] (any strides, in
 * elements). Products are exact in f32 and accumulate in f32 (vdpbf16ps: denormals flush
 * to zero); only the summation order differs from widening to f32 and calling sgemm.
 * M, N, K > 0. Splits work over the pool (serial for small products or inside a
 * region); calls no BLAS. Call only when tpu__gemm_bf16_supported(), which is false on
 * CPUs without AVX512-BF16 and when TORCHTPU_BF16_GEMM=widen. */
bool tpu__gemm_bf16_supported(void);
/* The same product on AMX tiles (host/gemm_amx.c), which tpu__gemm_bf16 takes for more
 * than a few rows where tpu__gemm_bf16_amx(): the CPU has AMX-BF16, the kernel granted
 * this process the tile state (tpu__amx_bf16_available, asked once) and
 * TORCHTPU_BF16_GEMM is not avx512 or widen (host/linalg.c reads it, once). */
bool tpu__gemm_bf16_amx(void);
bool tpu__amx_bf16_available(void);
tpu_status_t tpu__gemm_amx(int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* a, int64_t sam,
                           int64_t sak, const uint16_t* b, int64_t sbk, int64_t sbn, float beta, float* c,
                           uint16_t* c16, int64_t ldc);
/* c16: when not NULL (then beta is 0 and c unused), the result is rounded to bf16 (to
 * nearest even, as a store of the f32 result would) and stored there, row stride ldc;
 * only where tpu__gemm_bf16_out16(M, sbk, sbn), i.e. on the AMX path (the other paths
 * store f32, their callers round). */
bool tpu__gemm_bf16_out16(int64_t M, int64_t sbk, int64_t sbn);
tpu_status_t tpu__gemm_bf16(int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* a,
                            int64_t sam, int64_t sak, const uint16_t* b, int64_t sbk, int64_t sbn,
                            float beta, float* c, uint16_t* c16, int64_t ldc);
/* Packs `n` (<= lanes) lines of a bf16 operand for a K-pair dot product, `lanes` 32-bit
 * words per pair: word (p, l) = (X[l][2p], X[l][2p+1]) where X[l][k] = base[l * sl +
 * k * sk]; an odd K's last pair has a zero partner, lanes past n are zero. Vectorized
 * for lines or pairs adjacent in memory. AVX512-BF16 CPUs only (host/gemm_avx512bf16.c);
 * also the layout of AMX B tiles with lanes = 16. */
void tpu__bf16_pack_pairs(uint32_t* dst, int lanes, const uint16_t* base, int64_t sl, int64_t sk, int n,
                          int64_t K);
/* Transposes a 16 x 16 block of 32-bit words in place (AVX512-BF16 CPUs only). */
void tpu__transpose_words16(uint32_t* t);
/* The same words for row-major B (columns adjacent in memory), read one K row at a time:
 * np pairs of rows 2p, 2p + 1 (sk elements apart; kb K values, an odd kb's last pair has a
 * zero partner) by n columns, into panels of `lanes` columns (a power of two, at least
 * 16) pstride words apart: word (p, l) at dst + (l / lanes) * pstride + p * lanes +
 * l % lanes; lanes past n to the end of the last panel are zero. dst and pstride * 4
 * 64-byte aligned. AVX512-BF16 CPUs only. */
void tpu__bf16_pack_rows(uint32_t* dst, int lanes, int64_t pstride, int64_t np, const uint16_t* base,
                         int64_t sk, int n, int64_t kb);

/* Tile functions cannot return a status: one that meets a fault (integer division by
 * zero) calls tpu__tile_fault(); the kernel that ran the tile engine reads and clears it
 * with tpu__tile_take_fault() after tpu__tile_run* returns, on the same thread. Faults
 * raised on pool threads are carried back to the caller. */
void tpu__tile_fault(void);
bool tpu__tile_take_fault(void);

/* Set by the tile engine while a tile function writes a tile of a float output past the
 * last-level cache (tpu__stream_min_bytes) in place: tile functions of memory-bound
 * kernels then store it with non-temporal stores (host/elementwise.c, TILE_FS). */
extern _Thread_local bool tpu__tile_stream;

#define TPU_HOST_NOMEM() tpu_status_make(TPU_OUT_OF_MEMORY, "host out of memory in kernel scratch")

#endif /* TPURT_HOST_HOST_H_ */
