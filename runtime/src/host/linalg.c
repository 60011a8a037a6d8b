/* Host kernels of the linalg family: GEMM and triangular solves through OpenBLAS (bf16
 * GEMM through host/gemm_avx512bf16.c where the CPU has AVX512-BF16),
 * convolution as im2col + GEMM over blocks of images, and 2-d / 3-d pooling.
 *
 * Node layouts (set by aten/linalg.c):
 *  GEMM      in[0] A viewed [batch, M, K], in[1] B viewed [batch, K, N], in[2] C (the
 *            added tensor, broadcast to the output) or absent. da[0]/da[1] = alpha/beta,
 *            ia[1]/ia[2] the same as integers, ia[0] = 1 to sum over the batch (addbmm).
 *            The output holds batch*M*N (or M*N) elements in row-major order.
 *  TRSM      in[0] A [batch..., n, n], in[1] B [batch..., rows, cols] (viewed at the
 *            broadcast batch shape), ia[0] upper, ia[1] left, ia[2] unit diagonal,
 *            ia[3] transpose A; compute = A's dtype (f32/f64). Output 0 the solution,
 *            output 1 (triangular_solve) A itself.
 *  CONV      in[0] input [N, C, *S], in[1] weight, in[2] bias or absent. ia[0] = spatial
 *            dims, ia[1] = groups, ia[2] = transposed; ilist = stride, padding, dilation.
 *  CONV_BWD  in[0] grad_output, in[1] input, in[2] weight; ia as CONV, ia[3..5] = mask.
 *  pools     (2-d and 3-d, fixed and adaptive windows) in[0] input (forward) or
 *            grad_output, in[1] input, in[2] indices (max backward); ia[0..2] = kernel,
 *            ia[3..5] = stride, ia[6..8] = padding, ia[9..11] = dilation, each (D, H, W)
 *            with depth (1, 1, 0, 1) for 2-d pools; ia[12] = count_include_pad,
 *            ia[13] = divisor_override (0: none), ia[14] = spatial dims (2 or 3).
 *            Output sizes come from the operands.
 *
 * Floating inputs compute in f32 (f32/bf16/f16) or f64, integers in wrapping int64. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/host.h"
#include "host/vmath.h"

/* OpenBLAS always runs single-threaded: its own thread server spins between calls and,
 * on a small machine, competes for the cores with the Python thread, the queue thread and
 * the pool (measured on 2 cores: a third of the time of a stream of 512x128x384 GEMMs went
 * to its spinning threads). Large products are split over the runtime's pool instead,
 * one single-threaded call per block of C (tpu__gemm). */
static atomic_bool blas_single;

void tpu__blas_prepare(void) {
  if (!atomic_exchange(&blas_single, true)) scipy_openblas_set_num_threads(1);
}

static bool fits_blasint(int64_t v) { return v >= 0 && v <= INT32_MAX; }

static void blas_gemm(tpu_dtype_t cd, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                      const void* A, int64_t lda, const void* B, int64_t ldb, double beta, void* C,
                      int64_t ldc) {
  tpu__blas_prepare();
  if (cd == TPU_DTYPE_F32)
    scipy_cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                      (blasint)M, (blasint)N, (blasint)K, (float)alpha, A, (blasint)lda, B,
                      (blasint)ldb, (float)beta, C, (blasint)ldc);
  else
    scipy_cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                      (blasint)M, (blasint)N, (blasint)K, alpha, A, (blasint)lda, B, (blasint)ldb,
                      beta, C, (blasint)ldc);
}

/* Blocks of C's rows (split_m) or columns, one BLAS call each. Every element of C is
 * still one call's sum over the whole K in the same order, and the blocks do not depend
 * on how many threads run them (a serial run, with one thread or inside a region, makes
 * the same calls one after another): an OpenBLAS kernel may sum an edge block's rows in
 * another order than a whole product's (measured on an AVX2 EPYC, whose kernel differs
 * from the AVX-512 one: 500x700x900 gave other bits with 1 thread than with 2), so the
 * result does not depend on the thread count. */
typedef struct pgemm_s {
  tpu_dtype_t cd;
  bool ta, tb, split_m;
  int64_t M, N, K, lda, ldb, ldc, block;
  double alpha, beta;
  const char *A, *B;
  char* C;
} pgemm_t;

/* Each call packs the other operand whole (B for a row block, A for a column block), so
 * blocks are long enough to amortize that: measured on 2 cores (AVX2 EPYC), 512x1024x4096
 * at 1 thread 49-52 GFLOP/s with 32-row blocks, 71 with 64, 75 with 128. */
#define GEMM_ROW_BLOCK 128
#define GEMM_COL_BLOCK 256

static tpu_status_t pgemm_blocks(void* arg, int64_t b, int64_t e, int tid) {
  pgemm_t* g = arg;
  size_t es = tpu_dtype_size(g->cd);
  int64_t dim = g->split_m ? g->M : g->N;
  for (int64_t blk = b; blk < e; ++blk) {
    int64_t lo = blk * g->block, hi = lo + g->block < dim ? lo + g->block : dim;
    if (g->split_m)
      blas_gemm(g->cd, g->ta, g->tb, hi - lo, g->N, g->K, g->alpha, g->A + (size_t)(g->ta ? lo : lo * g->lda) * es,
                g->lda, g->B, g->ldb, g->beta, g->C + (size_t)(lo * g->ldc) * es, g->ldc);
    else
      blas_gemm(g->cd, g->ta, g->tb, g->M, hi - lo, g->K, g->alpha, g->A, g->lda,
                g->B + (size_t)(g->tb ? lo * g->ldb : lo) * es, g->ldb, g->beta, g->C + (size_t)lo * es, g->ldc);
  }
  return NULL;
}

/* Whether f32 products run on host/gemm_avx512f32.c, resolved once: the CPU has the
 * AVX-512 subset it is compiled for and TORCHTPU_F32_GEMM is not "blas" (to compare the
 * two, or to test the BLAS path on a CPU that has the instructions). */
bool tpu__gemm_f32_supported(void) {
  static atomic_int cached = -1;
  int v = atomic_load(&cached);
  if (v < 0) {
    const char* e = getenv("TORCHTPU_F32_GEMM");
    v = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && !(e && strcmp(e, "blas") == 0);
    atomic_store(&cached, v);
  }
  return v > 0;
}

void tpu__gemm(tpu_dtype_t cd, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
               const void* A, int64_t lda, const void* B, int64_t ldb, double beta, void* C, int64_t ldc) {
  if (cd == TPU_DTYPE_F32 && K > 0 && alpha != 0 && tpu__gemm_f32_supported() &&
      tpu__gemm_f32_takes(M, N, ta ? lda : 1, tb ? 1 : ldb, tb ? ldb : 1)) {
    /* ta: A stored [K][M]; tb: B stored [N][K]. (alpha == 0 stays on BLAS, which skips
     * the product: NaN or inf in A or B does not reach C.) */
    tpu_status_t st = tpu__gemm_f32(M, N, K, (float)alpha, A, ta ? 1 : lda, ta ? lda : 1, B, tb ? 1 : ldb,
                                    tb ? ldb : 1, (float)beta, C, ldc);
    if (!st) return;
    tpu_status_free(st); /* host OOM for its B buffers: BLAS packs less */
  }
  if (2.0 * (double)M * (double)N * (double)K < TPU_GEMM_SPLIT_FLOPS) {
    blas_gemm(cd, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  /* Rows when there are at least two row blocks or the product is tall, else columns
   * (from the shape alone, not the thread count: see above). */
  bool split_m = M >= 2 * GEMM_ROW_BLOCK || M >= N;
  int64_t dim = split_m ? M : N, most = split_m ? GEMM_ROW_BLOCK : GEMM_COL_BLOCK;
  /* Equal blocks of at most `most`, rounded up to 16, and at least two: a product of one
   * block's size (the weight gradient 128x512x128 of a d=128 layer) would otherwise run on
   * one thread. */
  int64_t nblk = (dim + most - 1) / most;
  if (nblk < 2) nblk = 2;
  int64_t block = ((dim + nblk - 1) / nblk + 15) / 16 * 16;
  pgemm_t g = {cd, ta, tb, split_m, M, N, K, lda, ldb, ldc, block, alpha, beta, A, B, C};
  tpu_status_free(tpu__parallel_items((dim + block - 1) / block, pgemm_blocks, &g));
}

/* Row-major C[M,N] = alpha * op(A) op(B) + beta * C over dense compute buffers. Integer
 * products wrap like PyTorch's int64 arithmetic. */
static void gemm_dense(tpu_dtype_t cd, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                       double alpha, const void* A, int64_t lda, const void* B, int64_t ldb,
                       double beta, void* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    /* BLAS rejects a zero leading dimension; the product is empty, only beta applies. */
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        if (cd == TPU_DTYPE_F32) { float* c = (float*)C + i * ldc + j; *c = beta == 0 ? 0.0f : *c * (float)beta; }
        else if (cd == TPU_DTYPE_F64) { double* c = (double*)C + i * ldc + j; *c = beta == 0 ? 0.0 : *c * beta; }
        else { int64_t* c = (int64_t*)C + i * ldc + j; *c = (int64_t)((uint64_t)*c * (uint64_t)(int64_t)beta); }
      }
    return;
  }
  if (cd != TPU_DTYPE_I64) {
    tpu__gemm(cd, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  } else {
    const uint64_t* a = A;
    const uint64_t* b = B;
    uint64_t* c = C;
    uint64_t al = (uint64_t)(int64_t)alpha, be = (uint64_t)(int64_t)beta;
    for (int64_t i = 0; i < M; ++i) {
      uint64_t* ci = c + i * ldc;
      for (int64_t j = 0; j < N; ++j) ci[j] *= be;
      for (int64_t k = 0; k < K; ++k) {
        uint64_t av = al * (ta ? a[k * lda + i] : a[i * lda + k]);
        if (tb) for (int64_t j = 0; j < N; ++j) ci[j] += av * b[j * ldb + k];
        else for (int64_t j = 0; j < N; ++j) ci[j] += av * b[k * ldb + j];
      }
    }
  }
}

/* ---- GEMM ---------------------------------------------------------------------------- */

/* How one [batch, rows, cols] operand is handed to BLAS: in place when its strides are
 * a (possibly transposed) row-major matrix, else packed. */
typedef struct mat_s {
  const char* ptr;
  bool trans;
  int64_t ld, bstride; /* elements */
  void* owned;
} mat_t;

static bool mat_direct(const tpu_operand_t* op, mat_t* m) {
  int64_t r = op->sizes[1], c = op->sizes[2];
  int64_t sr = op->strides[1], sc = op->strides[2];
  if (c == 1) sc = 1;
  if (r == 1) sr = c > 1 ? c : 1;
  if (sc == 1 && sr >= (c > 1 ? c : 1) && fits_blasint(sr)) {
    m->trans = false; m->ld = sr;
  } else if (sr == 1 && sc >= (r > 1 ? r : 1) && fits_blasint(sc)) {
    m->trans = true; m->ld = sc;
  } else {
    return false;
  }
  m->ptr = tpu__operand_ptr(op);
  m->bstride = op->sizes[0] > 1 ? op->strides[0] : 0;
  m->owned = NULL;
  return true;
}

static tpu_status_t mat_get(const tpu_operand_t* op, tpu_dtype_t want, mat_t* m) {
  if (op->dtype == want && mat_direct(op, m)) return NULL;
  m->owned = tpu__pack_alloc(op, want);
  if (!m->owned) return TPU_HOST_NOMEM();
  m->ptr = m->owned;
  m->trans = false;
  m->ld = op->sizes[2] > 1 ? op->sizes[2] : 1;
  m->bstride = op->sizes[1] * op->sizes[2];
  return NULL;
}

/* A copy of op aligned to (nd, sizes) with zero strides on broadcast dims. */
static tpu_operand_t broadcast_to(const tpu_operand_t* op, int nd, const int64_t* sizes) {
  tpu_operand_t b = *op;
  b.ndim = nd;
  for (int d = 0; d < nd; ++d) {
    int sd = d - (nd - op->ndim);
    b.sizes[d] = sizes[d];
    b.strides[d] = sd >= 0 && op->sizes[sd] != 1 ? op->strides[sd] : 0;
  }
  return b;
}

/* Which bf16 x bf16 kernel runs, resolved once: 2 AMX tiles (host/gemm_amx.c), 1 the
 * AVX512-BF16 kernel, 0 neither (widen to f32 + sgemm). TORCHTPU_BF16_GEMM=avx512 stops
 * at the AVX512-BF16 kernel and =widen at sgemm (to compare them, or to test a fallback on
 * a CPU that has the instructions). One cpuid check per kernel (libgcc's also checks that
 * the OS saves zmm state); AMX also needs the kernel's grant of the tile state.
 * Sanitizer builds run the kernels too. */
static int bf16_gemm_kind(void) {
  static atomic_int cached = -1;
  int v = atomic_load(&cached);
  if (v < 0) {
    const char* e = getenv("TORCHTPU_BF16_GEMM");
    if (!__builtin_cpu_supports("avx512bf16") || (e && strcmp(e, "widen") == 0)) v = 0;
    else v = !(e && strcmp(e, "avx512") == 0) && tpu__amx_bf16_available() ? 2 : 1;
    atomic_store(&cached, v);
  }
  return v;
}

bool tpu__gemm_bf16_supported(void) { return bf16_gemm_kind() > 0; }
bool tpu__gemm_bf16_amx(void) { return bf16_gemm_kind() == 2; }

/* bf16 x bf16 products run natively (host/gemm_avx512bf16.c) where the CPU has
 * AVX512-BF16, reading the operands in place at any strides. alpha == 0 stays on the BLAS
 * path, which skips the product (NaN or inf in A or B does not reach C). */
static bool gemm_native_bf16(const tpu_node_t* n, double alpha) {
  return n->in[0].dtype == TPU_DTYPE_BF16 && n->in[1].dtype == TPU_DTYPE_BF16 &&
         n->compute == TPU_DTYPE_F32 && (float)alpha != 0.0f && tpu__gemm_bf16_supported();
}

static const uint16_t* bf16_matrix(const tpu_operand_t* op, int64_t i) {
  return (const uint16_t*)tpu__operand_ptr(op) + (op->sizes[0] > 1 ? i * op->strides[0] : 0);
}

/* Batches [ib, ie) of a (batched) product: the native bf16 kernel on the operands in
 * place, or BLAS / the integer loop on their dense compute copies a and b. */
typedef struct bgemm_s {
  const tpu_node_t* n;
  tpu_dtype_t cd;
  const mat_t *a, *b;
  bool native, out16; /* out16: the native kernel stores bf16 results into acc */
  char* acc;
  int64_t M, N, K;
  bool reduce;
  tpu_dtype_t out_dtype;
  double alpha, beta;
} bgemm_t;

static tpu_status_t gemm_batches(void* arg, int64_t ib, int64_t ie, int tid) {
  bgemm_t* g = arg;
  const tpu_operand_t *A = &g->n->in[0], *B = &g->n->in[1];
  size_t csz = tpu_dtype_size(g->cd);
  int64_t M = g->M, N = g->N;
  for (int64_t i = ib; i < ie; ++i) {
    char* ci = g->acc + (size_t)((g->reduce ? 0 : i) * M * N) * (g->out16 ? sizeof(uint16_t) : csz);
    /* beta scales C once; later batches of addbmm accumulate with beta 1. */
    double bb = g->reduce && i > 0 ? 1.0 : g->beta;
    if (g->native) {
      TPU_RETURN_IF_ERROR(tpu__gemm_bf16(M, N, g->K, (float)g->alpha, bf16_matrix(A, i), A->strides[1],
                                         A->strides[2], bf16_matrix(B, i), B->strides[1], B->strides[2],
                                         (float)bb, g->out16 ? NULL : (float*)ci,
                                         g->out16 ? (uint16_t*)ci : NULL, N));
    } else {
      const char* pa = g->a->ptr + (size_t)(i * g->a->bstride) * csz;
      const char* pb = g->b->ptr + (size_t)(i * g->b->bstride) * csz;
      gemm_dense(g->cd, g->a->trans, g->b->trans, M, N, g->K, g->alpha, pa, g->a->ld, pb, g->b->ld, bb, ci, N);
    }
    /* PyTorch's addbmm is a loop of addmm_ into the output: a bf16/f16 result is
     * rounded after every batch. */
    if (g->reduce && g->cd == TPU_DTYPE_F32) tpu__round_f32_run((float*)ci, M * N, g->out_dtype);
  }
  return NULL;
}

static tpu_status_t gemm_kernel(tpu_node_t* n) {
  const tpu_operand_t *A = &n->in[0], *B = &n->in[1], *C = &n->in[2];
  tpu_operand_t* out = &n->out[0];
  int64_t bt = A->sizes[0], M = A->sizes[1], K = A->sizes[2], N = B->sizes[2];
  bool reduce = n->ia[0] != 0;
  int64_t bo = reduce ? 1 : bt;
  tpu_dtype_t cd = n->compute;
  size_t csz = tpu_dtype_size(cd);
  if (!fits_blasint(M) || !fits_blasint(N) || !fits_blasint(K))
    return tpu_status_make(TPU_UNIMPLEMENTED, "%s: matrix dimension exceeds 2^31-1",
                           tpu__node_describe(n));
  uint64_t total;
  if (!tpu__mul_ok((uint64_t)(bo * M), (uint64_t)N * csz, &total)) return TPU_HOST_NOMEM();
  if (total == 0) return NULL;
  double beta = n->da[1];
  bool use_c = C->value && (tpu_dtype_is_floating(cd) ? beta != 0 : n->ia[2] != 0);
  bool product = K > 0 && bt > 0 && M > 0 && N > 0;
  double alpha = tpu_dtype_is_floating(cd) ? n->da[0] : (double)n->ia[1];
  bool native = product && gemm_native_bf16(n, alpha);
  /* The product accumulates straight into a dense output of the compute dtype that no
   * input shares; otherwise into a scratch buffer that is then unpacked. The AMX kernel
   * also rounds a plain bf16 product (no C, no sum over batches) as it stores it. */
  bool unshared = tpu__operand_is_contiguous(out) && out->value != A->value && out->value != B->value &&
                  (!use_c || out->value != C->value);
  bool out16 = unshared && native && !use_c && !reduce && out->dtype == TPU_DTYPE_BF16 &&
               tpu__gemm_bf16_out16(M, B->strides[1], B->strides[2]);
  bool direct = unshared && (out16 || out->dtype == cd);
  char* acc = direct ? tpu__operand_ptr(out) : tpu__malloc((size_t)total);
  if (!acc) return TPU_HOST_NOMEM();
  if (use_c) {
    tpu_operand_t cb = broadcast_to(C, out->ndim, out->sizes);
    tpu__pack(&cb, NULL, cd, acc);
  }
  tpu_status_t st = NULL;
  mat_t a = {0}, b = {0};
  if (product) {
    /* Off the native bf16 kernel, bf16/f16 operands widen to f32 (the pinned OpenBLAS
     * exports no sbgemm). Either way the f32 accumulation and single final rounding match
     * PyTorch's CPU result. */
    if (!native) st = mat_get(A, cd, &a);
    if (!st && !native) st = mat_get(B, cd, &b);
    if (!st) {
      bgemm_t g = {n, cd, &a, &b, native, out16, acc, M, N, K, reduce, out->dtype, alpha,
                   use_c ? (tpu_dtype_is_floating(cd) ? beta : (double)n->ia[2]) : 0.0};
      /* Small products of a batch run whole on pool threads (a chunk does at least ~4
       * MFLOP, which amortizes waking a thread); a large one splits inside its GEMM
       * instead. addbmm's sum over batches stays in order. */
      double flops = 2.0 * (double)M * (double)N * (double)K;
      bool by_batch = !reduce && bt > 1 && flops < TPU_BLAS_SERIAL_FLOPS;
      st = by_batch ? tpu__parallel_for(bt, (int64_t)(4e6 / flops) + 1, gemm_batches, &g)
                    : gemm_batches(&g, 0, bt, 0);
    }
  } else if (use_c && tpu_dtype_is_floating(cd)) {
    for (uint64_t i = 0; i < total / csz; ++i) {
      if (cd == TPU_DTYPE_F32) ((float*)acc)[i] *= (float)beta;
      else ((double*)acc)[i] *= beta;
    }
  } else if (use_c) {
    for (uint64_t i = 0; i < total / csz; ++i)
      ((int64_t*)acc)[i] = (int64_t)((uint64_t)((int64_t*)acc)[i] * (uint64_t)n->ia[2]);
  } else {
    memset(acc, 0, (size_t)total);
  }
  if (!st && !direct) tpu__unpack(out, acc, cd);
  tpu__free(a.owned);
  tpu__free(b.owned);
  if (!direct) tpu__free(acc);
  return st;
}

/* ---- triangular solves ---------------------------------------------------------------------- */

/* TRSM: solves op(A) X = B (left) or X op(A) = B per batch with BLAS trsm, in place in a
 * dense copy of B in A's dtype (f32 or f64). Output 1, when present, is A broadcast. */
static tpu_status_t trsm_kernel(tpu_node_t* n) {
  const tpu_operand_t *A = &n->in[0], *B = &n->in[1];
  tpu_operand_t* X = &n->out[0];
  tpu_dtype_t cd = n->compute;
  int nd = X->ndim;
  int64_t m = X->sizes[nd - 2], k = X->sizes[nd - 1], an = A->sizes[nd - 1];
  int64_t mats = m * k > 0 ? tpu__operand_numel(X) / (m * k) : 0;
  if (!fits_blasint(m) || !fits_blasint(k))
    return tpu_status_make(TPU_UNIMPLEMENTED, "%s: matrix dimension exceeds 2^31-1", tpu__node_describe(n));
  void* a = tpu__pack_alloc(A, cd);
  void* x = tpu__pack_alloc(B, cd);
  tpu_status_t st = NULL;
  if (!a || !x) { st = TPU_HOST_NOMEM(); goto done; }
  enum CBLAS_SIDE side = n->ia[1] ? CblasLeft : CblasRight;
  enum CBLAS_UPLO uplo = n->ia[0] ? CblasUpper : CblasLower;
  enum CBLAS_TRANSPOSE tr = n->ia[3] ? CblasTrans : CblasNoTrans;
  enum CBLAS_DIAG diag = n->ia[2] ? CblasUnit : CblasNonUnit;
  if (mats > 0) tpu__blas_prepare();
  for (int64_t i = 0; i < mats; ++i) {
    if (cd == TPU_DTYPE_F32)
      scipy_cblas_strsm(CblasRowMajor, side, uplo, tr, diag, (blasint)m, (blasint)k, 1.0f,
                        (const float*)a + i * an * an, (blasint)an, (float*)x + i * m * k, (blasint)k);
    else
      scipy_cblas_dtrsm(CblasRowMajor, side, uplo, tr, diag, (blasint)m, (blasint)k, 1.0,
                        (const double*)a + i * an * an, (blasint)an, (double*)x + i * m * k, (blasint)k);
  }
  tpu__unpack(X, x, cd);
  if (n->n_out > 1 && !tpu__output_absent(&n->out[1])) tpu__unpack(&n->out[1], a, cd);
done:
  tpu__free(a);
  tpu__free(x);
  return st;
}

/* ---- convolution ------------------------------------------------------------------------ */

typedef struct conv_geom_s {
  int nd;
  int64_t img[3], pos[3], k[3], s[3], p[3], d[3];
  int64_t kk, npos, nimg;
} conv_geom_t;

typedef struct i2c_s {
  tpu_dtype_t cd;
  const conv_geom_t* g;
  void *img, *col;
  int64_t ld; /* col's row stride (elements) */
  bool add;
} i2c_t;

/* The rows of col for channels [cb, ce). Along the last dim, the in-image run of
 * positions [xa, xb) depends only on the kernel offset, so it is found once per row; each
 * output line then copies that run (short runs as a loop: a memcpy call costs more than
 * the 8 or 16 elements of a small feature map) and clears the padding around it. */
/* Clears the columns outside [xa, xb) between the in-image lines oa..ob-1 of an im2col
 * row (line ends of all but the last line, line starts of all but the first): a loop over
 * lines inside a loop over columns, as per-line loops of 0 to 2 elements became a
 * memset call each. */
#define I2C_CLEAR_EDGES(cl)                                                                     \
  do {                                                                                          \
    for (int64_t x = 0; x < xa; ++x)                                                            \
      for (int64_t o = oa + 1; o < ob; ++o) (cl)[o * inner + x] = 0;                            \
    for (int64_t x = xb; x < inner; ++x)                                                        \
      for (int64_t o = oa; o < ob - 1; ++o) (cl)[o * inner + x] = 0;                            \
  } while (0)
/* For outputs of at most I2C_TABLE_MAX (kernel offset, position) pairs that the flat
 * path below does not take (strided convolutions of small images: 3x3 at stride 2 onto
 * 4x4 to 16x16 outputs), tab[k * npos + q] = the offset in a channel plane that kernel
 * offset k reads for output position q, or -1 in the padding. One table serves every
 * channel and image, so a row is one gather loop; col2im adds in the same order as the
 * line-by-line path (offset, then position). The line-by-line path spent a fifth of
 * 16x256x8x8 -> 512x4x4 stride 2 on per-line bounds for lines of 4 elements. */
#define I2C_TABLE_MAX 4096
/* The next multi-index of idx[0..nd) in row-major order within sizes. */
static void odometer_next(int64_t* idx, const int64_t* sizes, int nd) {
  for (int d = nd - 1; d >= 0; --d) {
    if (++idx[d] < sizes[d]) return;
    idx[d] = 0;
  }
}
static void i2c_table(const conv_geom_t* g, int32_t* tab) {
  int nd = g->nd;
  int64_t kv[3] = {0, 0, 0};
  for (int64_t k = 0; k < g->kk; ++k) {
    if (k > 0) odometer_next(kv, g->k, nd);
    int64_t ov[3] = {0, 0, 0};
    for (int64_t q = 0; q < g->npos; ++q) {
      if (q > 0) odometer_next(ov, g->pos, nd);
      int64_t off = 0;
      for (int d = 0; d < nd && off >= 0; ++d) {
        int64_t iv = ov[d] * g->s[d] - g->p[d] + kv[d] * g->d[d];
        off = iv < 0 || iv >= g->img[d] ? -1 : off * g->img[d] + iv;
      }
      tab[k * g->npos + q] = (int32_t)off;
    }
  }
}
#define I2C_ROWS(T, SFX, ACC)                                                                   \
  TPU_ISA_CLONES static void i2c_rows_##SFX(const i2c_t* ic, int64_t cb, int64_t ce) {         \
    const conv_geom_t* g = ic->g;                                                               \
    T *img = ic->img, *col = ic->col;                                                           \
    int nd = g->nd, ld = nd - 1;                                                                \
    int64_t inner = g->pos[ld], outer = g->npos / (inner ? inner : 1);                          \
    int64_t sw = g->s[ld], W = g->img[ld];                                                      \
    bool flat = nd == 2 && g->s[0] == 1 && sw == 1 && inner == W;                               \
    if (!flat && g->kk * g->npos <= I2C_TABLE_MAX && g->nimg <= INT32_MAX) {                    \
      /* small outputs (strided): one table of plane offsets serves every channel */         \
      int32_t tab[I2C_TABLE_MAX];                                                               \
      i2c_table(g, tab);                                                                        \
      for (int64_t ch = cb; ch < ce; ++ch) {                                                    \
        T* plane = img + ch * g->nimg;                                                          \
        for (int64_t k = 0; k < g->kk; ++k) {                                                   \
          T* cl = col + (ch * g->kk + k) * ic->ld;                                              \
          const int32_t* t = tab + k * g->npos;                                                 \
          if (ic->add) {                                                                        \
            for (int64_t q = 0; q < g->npos; ++q)                                               \
              if (t[q] >= 0) ACC(plane[t[q]], cl[q]);                                           \
          } else {                                                                              \
            for (int64_t q = 0; q < g->npos; ++q) cl[q] = t[q] >= 0 ? plane[t[q]] : (T)0;       \
          }                                                                                     \
        }                                                                                       \
      }                                                                                         \
      return;                                                                                   \
    }                                                                                           \
    int64_t c = cb, kv[3] = {0, 0, 0}; /* row r = (channel c, kernel offset kv) */           \
    for (int64_t r = cb * g->kk; r < ce * g->kk; ++r) {                                         \
      if (r > cb * g->kk) { /* next offset, odometer-wise (no divisions per row) */           \
        int d = nd - 1;                                                                         \
        while (d >= 0 && ++kv[d] == g->k[d]) kv[d--] = 0;                                       \
        if (d < 0) ++c;                                                                         \
      }                                                                                         \
      /* positions [xa, xb) of the line read inside the image (iw = w0 + x*sw in [0, W)) */    \
      int64_t w0 = -g->p[ld] + kv[ld] * g->d[ld];                                               \
      /* (no division at stride 1: it was a tenth of a small image's im2col) */                \
      int64_t xa = w0 >= 0 ? 0 : sw == 1 ? -w0 : (-w0 + sw - 1) / sw;                           \
      int64_t xb = W - w0 <= 0 ? 0 : sw == 1 ? W - w0 : (W - w0 + sw - 1) / sw;                  \
      if (xb > inner) xb = inner;                                                               \
      if (xa > xb) xa = xb;                                                                     \
      if (flat) { /* 2-d, stride 1, output as wide as the image: lines in a row line up */  \
        int64_t top = kv[0] * g->d[0] - g->p[0]; /* image line of output line 0 */           \
        int64_t oa = top >= 0 ? 0 : -top, ob = g->img[0] - top < outer ? g->img[0] - top : outer; \
        T* cl = col + r * ic->ld;                                                               \
        int64_t ib = c * g->nimg + top * W + w0; /* img index of line 0's position 0 */     \
        if (ob <= oa) { oa = ob = 0; }                                                          \
        if (ic->add) {                                                                          \
          /* col's padding entries inside the run are cleared (col is scratch): the run */   \
          /* then adds as one loop, the cleared entries landing on neighbouring lines */      \
          if (ob <= oa || xb <= xa) continue;                                                   \
          I2C_CLEAR_EDGES(cl);                                                                  \
          T* restrict dst = img + ib + oa * W + xa;                                             \
          const T* restrict src = cl + oa * inner + xa;                                         \
          for (int64_t i = 0; i < (ob - oa - 1) * inner + xb - xa; ++i) ACC(dst[i], src[i]);    \
          continue;                                                                             \
        }                                                                                       \
        /* the in-image part of every line in one copy, then the padding cleared */          \
        if (ob > oa && xb > xa)                                                                 \
          memcpy(cl + oa * inner + xa, img + ib + oa * W + xa,                                   \
                 sizeof(T) * (size_t)((ob - oa - 1) * inner + xb - xa));                        \
        if (ob <= oa || xb <= xa) { memset(cl, 0, sizeof(T) * (size_t)(outer * inner)); continue; } \
        memset(cl, 0, sizeof(T) * (size_t)(oa * inner + xa));                                  \
        I2C_CLEAR_EDGES(cl);                                                                    \
        memset(cl + (ob - 1) * inner + xb, 0, sizeof(T) * (size_t)((outer - ob + 1) * inner - xb)); \
        continue;                                                                               \
      }                                                                                         \
      int64_t ov[3] = {0, 0, 0}; /* multi-index over dims 0..nd-2 of outer position o */       \
      for (int64_t o = 0; o < outer; ++o) {                                                     \
        if (o > 0)                                                                              \
          for (int d = nd - 2; d >= 0; --d) {                                                   \
            if (++ov[d] < g->pos[d]) break;                                                     \
            ov[d] = 0;                                                                          \
          }                                                                                     \
        bool ok = true;                                                                         \
        int64_t off = 0;                                                                        \
        for (int d = 0; d < ld; ++d) {                                                          \
          int64_t iv = ov[d] * g->s[d] - g->p[d] + kv[d] * g->d[d];                             \
          if (iv < 0 || iv >= g->img[d]) { ok = false; break; }                                 \
          off = off * g->img[d] + iv;                                                           \
        }                                                                                       \
        T* cl = col + r * ic->ld + o * inner;                                                   \
        const int64_t a = ok ? xa : 0, b = ok ? xb : 0;                                         \
        T* im = img + c * g->nimg + off * W;                                                    \
        if (ic->add) {                                                                          \
          for (int64_t x = a; x < b; ++x) ACC(im[w0 + x * sw], cl[x]);                          \
          continue;                                                                             \
        }                                                                                       \
        for (int64_t x = 0; x < a; ++x) cl[x] = 0;                                              \
        if (sw == 1 && b - a >= 64) memcpy(cl + a, im + w0 + a, sizeof(T) * (size_t)(b - a));   \
        else if (sw == 1) for (int64_t x = a; x < b; ++x) cl[x] = im[w0 + x];                   \
        else if (sw == 2) { /* a constant stride: the loads vectorize (even lanes of pairs) */ \
          const T* restrict src = im + w0;                                                      \
          for (int64_t x = a; x < b; ++x) cl[x] = src[2 * x];                                   \
        } else for (int64_t x = a; x < b; ++x) cl[x] = im[w0 + x * sw];                         \
        for (int64_t x = b; x < inner; ++x) cl[x] = 0;                                          \
      }                                                                                         \
    }                                                                                           \
  }
#define ACC_ADD(d, v) ((d) += (v))
#define ACC_WRAP(d, v) ((d) = (int64_t)((uint64_t)(d) + (uint64_t)(v)))
I2C_ROWS(float, f32, ACC_ADD)
I2C_ROWS(double, f64, ACC_ADD)
I2C_ROWS(int64_t, i64, ACC_WRAP)
#undef ACC_ADD
#undef ACC_WRAP
#undef I2C_CLEAR_EDGES

/* Channels [cb, ce): their rows of col and their planes of img belong to no other
 * channel, so col2im's accumulation never crosses threads. */
static tpu_status_t im2col_channels(void* arg, int64_t cb, int64_t ce, int tid) {
  const i2c_t* ic = arg;
  if (ic->cd == TPU_DTYPE_F32) i2c_rows_f32(ic, cb, ce);
  else if (ic->cd == TPU_DTYPE_F64) i2c_rows_f64(ic, cb, ce);
  else i2c_rows_i64(ic, cb, ce);
  return NULL;
}

/* col[(c, kernel offset), position] = img[c, position*s - p + offset*d] (0 outside), col's
 * rows ld elements apart. With add set, the reverse: img += col at those places (col2im). */
static void im2col(tpu_dtype_t cd, const conv_geom_t* g, int64_t C, void* img, void* col, int64_t ld, bool add) {
  if (g->npos == 0) return;
  i2c_t ic = {cd, g, img, col, ld, add};
  if (C > 1 && C * g->kk * g->npos >= TPU_PARALLEL_MIN_WORK)
    tpu_status_free(tpu__parallel_for(C, TPU_PARALLEL_MIN_WORK / (g->kk * g->npos) + 1, im2col_channels, &ic));
  else
    im2col_channels(&ic, 0, C, 0);
}

/* Geometry with the image on `img_op`'s spatial dims and positions on `pos_op`'s. */
static void conv_geom(const tpu_node_t* n, const tpu_operand_t* img_op, const tpu_operand_t* pos_op,
                      const tpu_operand_t* w, conv_geom_t* g) {
  int nd = (int)n->ia[0];
  g->nd = nd;
  g->kk = 1; g->npos = 1; g->nimg = 1;
  for (int d = 0; d < nd; ++d) {
    g->img[d] = img_op->sizes[2 + d];
    g->pos[d] = pos_op->sizes[2 + d];
    g->k[d] = w->sizes[2 + d];
    g->s[d] = n->ilist[d];
    g->p[d] = n->ilist[nd + d];
    g->d[d] = n->ilist[2 * nd + d];
    g->kk *= g->k[d]; g->npos *= g->pos[d]; g->nimg *= g->img[d];
  }
}

static bool conv_is_identity(const conv_geom_t* g) {
  for (int d = 0; d < g->nd; ++d)
    if (g->k[d] != 1 || g->s[d] != 1 || g->p[d] != 0 || g->img[d] != g->pos[d]) return false;
  return true;
}

/* n elements of esz bytes, cleared or not; NULL on overflow or OOM. */
static void* alloc_elems(int64_t n, size_t esz, bool clear) {
  uint64_t bytes;
  if (n < 0 || !tpu__mul_ok((uint64_t)n, esz, &bytes)) return NULL;
  return clear ? tpu__calloc(1, (size_t)(bytes ? bytes : 1)) : tpu__malloc((size_t)(bytes ? bytes : 1));
}

static bool conv_dims_fit(const conv_geom_t* g, int64_t a, int64_t b) {
  return fits_blasint(g->kk * a) && fits_blasint(g->npos) && fits_blasint(g->nimg) && fits_blasint(b);
}

/* Convolution runs on blocks of images: a block of nb images is one GEMM with nb *
 * positions columns (im2col writes the images' columns side by side; channel planes are
 * gathered into, and scattered out of, [channels, nb * L] matrices), so small images
 * still make GEMMs of useful width. Blocks are split into `parts` fixed by the shape,
 * not by the thread count, and the parts run over the pool (each one's GEMMs single-
 * threaded; a single part runs on the caller with GEMMs split over the pool instead).
 * The weight gradient is summed per part and the part sums are added in part order, so
 * the result does not depend on how many threads ran them. */
#define CONV_BLOCK_COLS 1024                 /* target GEMM width of a block */
#define CONV_TILE_COLS 64                    /* the f32/bf16 GEMM kernels' column tile */
#define CONV_MIN_BLOCK_COLS 128              /* narrowest block batching may leave */
#define CONV_COL_BYTES (4 << 20)             /* cap on one block's im2col matrix */
#define CONV_MAX_PARTS 16
#define CONV_PARTIAL_BYTES ((int64_t)32 << 20) /* cap on the weight-gradient part sums */

typedef struct conv_s {
  tpu_dtype_t cd;
  size_t csz;
  conv_geom_t g;
  bool transposed, ident, need_gi, need_gw;
  bool gw_t;                   /* weight-gradient parts accumulate as [kc, Cout_g] per group */
  int64_t N, groups, Cin, Cout, Cin_g, Cout_g, L_in, L_out;
  int64_t kc;                  /* rows of the im2col matrix */
  int64_t nb, nblocks, parts;
  const char *x, *w, *go, *bias;
  char *y, *gi;                /* forward output / input gradient */
  char** gw;                   /* weight gradient sum of each part (gw[0] is the output) */
} conv_t;

static void conv_blocks(conv_t* c, bool need_gw, int64_t per_image_cols) {
  int64_t Lp = c->g.npos;
  /* An image whose positions fill whole column tiles (8x8, 16x16, ...) makes a GEMM
   * that wastes no lanes on its own; as its own block it is read and written in place,
   * with no gather into and scatter out of block matrices (medians of five runs, 2
   * threads: conv 64x3x16x16 -> 16 forward 334 us instead of 373, backward 451 instead
   * of 488; 64x16x8x8 -> 32 backward 809 instead of 881; 14x14 images ran 25-40% slower
   * alone, on 196 of 256 lanes: their blocks stay). */
  int64_t nb = Lp >= CONV_BLOCK_COLS || Lp % CONV_TILE_COLS == 0 ? 1 : CONV_BLOCK_COLS / (Lp ? Lp : 1);
  int64_t spread = (c->N + 7) / 8; /* leave at least 8 blocks where the batch allows, */
  int64_t min_nb = (CONV_MIN_BLOCK_COLS + Lp - 1) / (Lp ? Lp : 1); /* but none narrower */
  if (spread < min_nb) spread = min_nb;
  int64_t fit = CONV_COL_BYTES / (int64_t)c->csz / (per_image_cols ? per_image_cols : 1);
  if (nb > spread) nb = spread;
  if (nb > fit) nb = fit;
  if (nb < 1) nb = 1;
  c->nblocks = (c->N + nb - 1) / nb;
  c->nb = (c->N + c->nblocks - 1) / c->nblocks; /* blocks of even width */
  c->nblocks = (c->N + c->nb - 1) / c->nb;
  int64_t parts = c->nblocks;
  if (need_gw) {
    int64_t gw_bytes = (c->transposed ? c->Cin * c->Cout_g : c->Cout * c->Cin_g) * c->g.kk * (int64_t)c->csz;
    if (parts > CONV_MAX_PARTS) parts = CONV_MAX_PARTS;
    while (parts > 1 && parts * gw_bytes > CONV_PARTIAL_BYTES) parts--;
  }
  c->parts = parts;
}

/* dst [Cg, nb * L] <- channels [c0, c0 + Cg) of images [b0, b0 + nb) of src [N, Ctot, L]
 * (to_blk), or the reverse. */
static void blk_move(size_t csz, char* img, int64_t Ctot, int64_t c0, int64_t Cg, int64_t L,
                     int64_t b0, int64_t nb, char* blk, bool to_blk) {
  size_t row = (size_t)L * csz;
  for (int64_t c = 0; c < Cg; ++c)
    for (int64_t j = 0; j < nb; ++j) {
      char* ip = img + (size_t)(((b0 + j) * Ctot + c0 + c) * L) * csz;
      char* bp = blk + (size_t)((c * nb + j) * L) * csz;
      if (to_blk) memcpy(bp, ip, row); else memcpy(ip, bp, row);
    }
}

/* Channels [c0, c0 + Cg) of images [b0, b0 + nb) of a [N, Ctot, L] tensor as a
 * [Cg, nb * L] matrix: in place for one image, else gathered into buf. */
static const char* blk_in(const conv_t* c, const char* t, int64_t Ctot, int64_t c0, int64_t Cg,
                          int64_t L, int64_t b0, int64_t nb, char* buf) {
  if (nb == 1) return t + (size_t)((b0 * Ctot + c0) * L) * c->csz;
  blk_move(c->csz, (char*)t, Ctot, c0, Cg, L, b0, nb, buf, true);
  return buf;
}

/* Where a [Cg, nb * L] result goes: straight into the tensor for one image, else buf
 * (then blk_out scatters it). */
static char* blk_dst(const conv_t* c, char* t, int64_t Ctot, int64_t c0, int64_t L, int64_t b0,
                     int64_t nb, char* buf) {
  return nb == 1 ? t + (size_t)((b0 * Ctot + c0) * L) * c->csz : buf;
}
static void blk_out(const conv_t* c, char* t, int64_t Ctot, int64_t c0, int64_t Cg, int64_t L,
                    int64_t b0, int64_t nb, char* buf) {
  if (nb > 1) blk_move(c->csz, t, Ctot, c0, Cg, L, b0, nb, buf, false);
}

/* im2col (or col2im with add) of each image of the block into its columns of col. */
static void blk_im2col(const conv_t* c, int64_t C, char* t, int64_t Ctot, int64_t c0, int64_t Limg,
                       int64_t b0, int64_t nb, char* col, bool add) {
  for (int64_t j = 0; j < nb; ++j)
    im2col(c->cd, &c->g, C, t + (size_t)(((b0 + j) * Ctot + c0) * Limg) * c->csz,
           col + (size_t)(j * c->g.npos) * c->csz, nb * c->g.npos, add);
}

static void add_bias_rows(tpu_dtype_t cd, char* y, const char* bias, int64_t b0, int64_t nb, int64_t C, int64_t L) {
  for (int64_t i = b0 * C; i < (b0 + nb) * C; ++i) {
    int64_t ch = i % C;
    if (cd == TPU_DTYPE_F32) { float* p = (float*)y + i * L; float b = ((const float*)bias)[ch]; for (int64_t l = 0; l < L; ++l) p[l] += b; }
    else if (cd == TPU_DTYPE_F64) { double* p = (double*)y + i * L; double b = ((const double*)bias)[ch]; for (int64_t l = 0; l < L; ++l) p[l] += b; }
    else { int64_t* p = (int64_t*)y + i * L; int64_t b = ((const int64_t*)bias)[ch]; for (int64_t l = 0; l < L; ++l) p[l] = (int64_t)((uint64_t)p[l] + (uint64_t)b); }
  }
}

/* Scratch of one part: the im2col matrix and two [channels, nb * L] matrices. */
typedef struct conv_scratch_s { char *col, *a, *b; } conv_scratch_t;

static bool scratch_open(const conv_t* c, conv_scratch_t* s) {
  int64_t cols = c->nb * c->g.npos;
  int64_t ch = c->Cin_g > c->Cout_g ? c->Cin_g : c->Cout_g;
  int64_t wide = (c->L_in > c->L_out ? c->L_in : c->L_out) * c->nb;
  *s = (conv_scratch_t){NULL, NULL, NULL};
  /* (every element is written before it is read: no clearing) */
  if (c->nb > 1 || !c->ident) s->col = alloc_elems(c->kc * cols, c->csz, false);
  if (c->nb > 1) { s->a = alloc_elems(ch * wide, c->csz, false); s->b = alloc_elems(ch * wide, c->csz, false); }
  return (s->col || (c->nb == 1 && c->ident)) && (c->nb == 1 || (s->a && s->b));
}
static void scratch_close(conv_scratch_t* s) { tpu__free(s->col); tpu__free(s->a); tpu__free(s->b); }

static void part_range(const conv_t* c, int64_t p, int64_t* blk0, int64_t* blk1) {
  *blk0 = p * c->nblocks / c->parts;
  *blk1 = (p + 1) * c->nblocks / c->parts;
}

static tpu_status_t conv_fwd_parts(void* arg, int64_t pb, int64_t pe, int tid) {
  const conv_t* c = arg;
  conv_scratch_t s;
  if (!scratch_open(c, &s)) { scratch_close(&s); return TPU_HOST_NOMEM(); }
  tpu_dtype_t cd = c->cd;
  size_t csz = c->csz;
  int64_t kk = c->g.kk, Cin_g = c->Cin_g, Cout_g = c->Cout_g;
  for (int64_t p = pb; p < pe; ++p) {
    int64_t blk0, blk1;
    part_range(c, p, &blk0, &blk1);
    for (int64_t blk = blk0; blk < blk1; ++blk) {
      int64_t b0 = blk * c->nb, nb = c->N - b0 < c->nb ? c->N - b0 : c->nb, cols = nb * c->g.npos;
      for (int64_t gi = 0; gi < c->groups; ++gi) {
        if (!c->transposed) {
          /* y_g[Cout_g, cols] = w_g[Cout_g, Cin_g*kk] @ col[Cin_g*kk, cols] */
          const char* wg = c->w + (size_t)(gi * Cout_g * Cin_g * kk) * csz;
          const char* cm;
          if (c->ident) cm = blk_in(c, c->x, c->Cin, gi * Cin_g, Cin_g, c->L_in, b0, nb, s.col);
          else { blk_im2col(c, Cin_g, (char*)c->x, c->Cin, gi * Cin_g, c->L_in, b0, nb, s.col, false); cm = s.col; }
          char* out = blk_dst(c, c->y, c->Cout, gi * Cout_g, c->L_out, b0, nb, s.a);
          gemm_dense(cd, false, false, Cout_g, cols, Cin_g * kk, 1.0, wg, Cin_g * kk, cm, cols, 0.0, out,
                     nb == 1 ? c->L_out : cols);
          blk_out(c, c->y, c->Cout, gi * Cout_g, Cout_g, c->L_out, b0, nb, s.a);
        } else {
          /* col[Cout_g*kk, cols] = w_g^T @ x_g, w_g = [Cin_g, Cout_g*kk]; then col2im */
          const char* wg = c->w + (size_t)(gi * Cin_g * Cout_g * kk) * csz;
          const char* xb = blk_in(c, c->x, c->Cin, gi * Cin_g, Cin_g, c->L_in, b0, nb, s.a);
          char* out = c->ident ? blk_dst(c, c->y, c->Cout, gi * Cout_g, c->L_out, b0, nb, s.b) : s.col;
          gemm_dense(cd, true, false, Cout_g * kk, cols, Cin_g, 1.0, wg, Cout_g * kk, xb, cols, 0.0, out,
                     c->ident && nb == 1 ? c->L_out : cols);
          if (c->ident) blk_out(c, c->y, c->Cout, gi * Cout_g, Cout_g, c->L_out, b0, nb, s.b);
          else blk_im2col(c, Cout_g, c->y, c->Cout, gi * Cout_g, c->L_out, b0, nb, s.col, true);
        }
      }
      if (c->bias) add_bias_rows(cd, c->y, c->bias, b0, nb, c->Cout, c->L_out);
    }
  }
  scratch_close(&s);
  return NULL;
}

static tpu_status_t conv_bwd_parts(void* arg, int64_t pb, int64_t pe, int tid) {
  const conv_t* c = arg;
  conv_scratch_t s;
  if (!scratch_open(c, &s)) { scratch_close(&s); return TPU_HOST_NOMEM(); }
  tpu_dtype_t cd = c->cd;
  size_t csz = c->csz;
  int64_t kk = c->g.kk, Cin_g = c->Cin_g, Cout_g = c->Cout_g;
  for (int64_t p = pb; p < pe; ++p) {
    char* gw = c->need_gw ? c->gw[p] : NULL;
    int64_t blk0, blk1;
    part_range(c, p, &blk0, &blk1);
    for (int64_t blk = blk0; blk < blk1; ++blk) {
      int64_t b0 = blk * c->nb, nb = c->N - b0 < c->nb ? c->N - b0 : c->nb, cols = nb * c->g.npos;
      for (int64_t gr = 0; gr < c->groups; ++gr) {
        if (!c->transposed) {
          size_t woff = (size_t)(gr * Cout_g * Cin_g * kk) * csz;
          const char* gob = blk_in(c, c->go, c->Cout, gr * Cout_g, Cout_g, c->L_out, b0, nb, s.a);
          if (c->need_gi) {
            /* col = w_g^T @ go_g; col2im into grad_input */
            char* out = c->ident ? blk_dst(c, c->gi, c->Cin, gr * Cin_g, c->L_in, b0, nb, s.b) : s.col;
            gemm_dense(cd, true, false, Cin_g * kk, cols, Cout_g, 1.0, c->w + woff, Cin_g * kk, gob, cols,
                       0.0, out, c->ident && nb == 1 ? c->L_in : cols);
            if (c->ident) blk_out(c, c->gi, c->Cin, gr * Cin_g, Cin_g, c->L_in, b0, nb, s.b);
            else blk_im2col(c, Cin_g, c->gi, c->Cin, gr * Cin_g, c->L_in, b0, nb, s.col, true);
          }
          if (c->need_gw) {
            /* gw_g += go_g @ col(x_g)^T */
            const char* cm;
            if (c->ident) cm = blk_in(c, c->x, c->Cin, gr * Cin_g, Cin_g, c->L_in, b0, nb, s.b);
            else { blk_im2col(c, Cin_g, (char*)c->x, c->Cin, gr * Cin_g, c->L_in, b0, nb, s.col, false); cm = s.col; }
            if (c->gw_t) /* gw_g^T += col(x_g) @ go_g^T */
              gemm_dense(cd, false, true, Cin_g * kk, Cout_g, cols, 1.0, cm, cols, gob, cols, 1.0, gw + woff,
                         Cout_g);
            else
              gemm_dense(cd, false, true, Cout_g, Cin_g * kk, cols, 1.0, gob, cols, cm, cols, 1.0, gw + woff,
                         Cin_g * kk);
          }
        } else {
          size_t woff = (size_t)(gr * Cin_g * Cout_g * kk) * csz;
          const char* cm;
          if (c->ident) cm = blk_in(c, c->go, c->Cout, gr * Cout_g, Cout_g, c->L_out, b0, nb, s.a);
          else { blk_im2col(c, Cout_g, (char*)c->go, c->Cout, gr * Cout_g, c->L_out, b0, nb, s.col, false); cm = s.col; }
          if (c->need_gi) { /* gi_g[Cin_g, cols] = w_g[Cin_g, Cout_g*kk] @ col */
            char* out = blk_dst(c, c->gi, c->Cin, gr * Cin_g, c->L_in, b0, nb, s.b);
            gemm_dense(cd, false, false, Cin_g, cols, Cout_g * kk, 1.0, c->w + woff, Cout_g * kk, cm, cols,
                       0.0, out, nb == 1 ? c->L_in : cols);
            blk_out(c, c->gi, c->Cin, gr * Cin_g, Cin_g, c->L_in, b0, nb, s.b);
          }
          if (c->need_gw) { /* gw_g += x_g[Cin_g, cols] @ col^T */
            const char* xb = blk_in(c, c->x, c->Cin, gr * Cin_g, Cin_g, c->L_in, b0, nb, s.b);
            gemm_dense(cd, false, true, Cin_g, Cout_g * kk, cols, 1.0, xb, cols, cm, cols, 1.0, gw + woff,
                       Cout_g * kk);
          }
        }
      }
    }
  }
  scratch_close(&s);
  return NULL;
}

/* Shared set-up of forward and backward: geometry (the image is the larger side: the
 * input of a convolution, the output of a transposed one) and blocking. */
static tpu_status_t conv_open(const tpu_node_t* n, const tpu_operand_t* X, const tpu_operand_t* Y,
                              const tpu_operand_t* W, bool need_gw, conv_t* c) {
  memset(c, 0, sizeof *c);
  c->cd = n->compute;
  c->csz = tpu_dtype_size(c->cd);
  c->groups = n->ia[1];
  c->transposed = n->ia[2] != 0;
  c->N = X->sizes[0]; c->Cin = X->sizes[1]; c->Cout = Y->sizes[1];
  c->Cin_g = c->Cin / c->groups; c->Cout_g = c->Cout / c->groups;
  if (c->transposed) conv_geom(n, Y, X, W, &c->g);
  else conv_geom(n, X, Y, W, &c->g);
  if (!conv_dims_fit(&c->g, c->transposed ? c->Cout_g : c->Cin_g, c->Cout_g))
    return tpu_status_make(TPU_UNIMPLEMENTED, "%s: convolution too large for BLAS", tpu__node_describe(n));
  c->L_in = 1; c->L_out = 1;
  for (int d = 0; d < c->g.nd; ++d) { c->L_in *= X->sizes[2 + d]; c->L_out *= Y->sizes[2 + d]; }
  c->ident = conv_is_identity(&c->g);
  c->kc = (c->transposed ? c->Cout_g : c->Cin_g) * c->g.kk;
  int64_t ch = c->Cin_g > c->Cout_g ? c->Cin_g : c->Cout_g;
  int64_t per_image = c->kc * c->g.npos + 2 * ch * (c->L_in > c->L_out ? c->L_in : c->L_out);
  conv_blocks(c, need_gw, per_image);
  if (!fits_blasint(c->nb * c->g.npos) || !fits_blasint(c->nb * c->L_in) || !fits_blasint(c->nb * c->L_out))
    return tpu_status_make(TPU_UNIMPLEMENTED, "%s: convolution too large for BLAS", tpu__node_describe(n));
  return NULL;
}

/* ---- Winograd F(2x2, 3x3): f32 3x3 convolutions at stride 1 -------------------------------
 * Each 2x2 block of outputs comes from a 4x4 patch of input: v = B^T d B per patch and
 * channel, u = G g G^T per weight, then for each of the 16 positions of the 4x4 transform
 * one GEMM U[i] (Cout x Cin) x V[i] (Cin x tiles), and y = A^T m A. That is 16 products
 * per 4 outputs where im2col + GEMM does 36, and the transformed input is 4x the input
 * where im2col's matrix is 9x. Over 8x256x14x14 with 256 channels it took 7.0-8.8 ms
 * where im2col took 12.2-12.7 (bench/conv.py). The GEMMs have K = Cin, so with fewer
 * than 128 channels on either side the 16 short products lose to im2col's one long one
 * (64x32x16x16 with 32 channels: 3.6-3.8 ms against 2.6). Rounding differs from the
 * direct sum by a few ulps of the transforms' adds (within the f32 tolerances); every
 * output is computed the same way whatever the thread count. TORCHTPU_CONV_WINOGRAD=0
 * keeps im2col. */
#define WINO_MIN_CH 128
#define WINO_BYTES ((int64_t)32 << 20) /* transformed input and products per block of images */

static bool conv_wino_ok(const conv_t* c) {
  static int enabled = -1;
  if (enabled < 0) {
    const char* e = getenv("TORCHTPU_CONV_WINOGRAD");
    enabled = !(e && *e == '0');
  }
  const conv_geom_t* g = &c->g;
  return enabled && c->cd == TPU_DTYPE_F32 && !c->transposed && c->groups == 1 && g->nd == 2 &&
         g->k[0] == 3 && g->k[1] == 3 && g->s[0] == 1 && g->s[1] == 1 && g->d[0] == 1 && g->d[1] == 1 &&
         c->Cin >= WINO_MIN_CH && c->Cout >= WINO_MIN_CH && g->npos > 0;
}

typedef struct wino_s {
  const conv_t* c;
  int64_t H, W, OH, OW, TH, TW, P; /* image, output, tiles per column / row / image */
  int64_t b0, nb, T;               /* the block's first image, its images, its tiles */
  bool flip;                       /* weights [Cin][Cout] turned half a turn (grad_input) */
  float *u, *v, *m;                /* [16][Cout][Cin], [16][Cin][T], [16][Cout][T] */
  float* gw;                       /* the weight gradient (u is then its transform) */
} wino_t;

/* u = G g G^T, G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1], for weights [co0, co1):
 * 16 input channels at a time, their 3x3 weights turned to [9][16] first so that the
 * transform runs across channels in vector lanes */
enum { WINO_WL = 16 };

TPU_ISA_CLONES static tpu_status_t wino_weights(void* arg, int64_t co0, int64_t co1, int tid) {
  (void)tid;
  const wino_t* w = arg;
  int64_t Cin = w->c->Cin, Cout = w->c->Cout;
  float k[9][WINO_WL], t[4][3][WINO_WL], u[16][WINO_WL];
  for (int64_t co = co0; co < co1; ++co)
    for (int64_t ci0 = 0; ci0 < Cin; ci0 += WINO_WL) {
      int64_t n = Cin - ci0 < WINO_WL ? Cin - ci0 : WINO_WL;
      const float* g = (const float*)w->c->w;
      if (w->flip) {
        g += (ci0 * Cout + co) * 9;
        for (int64_t l = 0; l < n; ++l)
          for (int e = 0; e < 9; ++e) k[e][l] = g[l * Cout * 9 + 8 - e];
      } else {
        g += (co * Cin + ci0) * 9;
        for (int64_t l = 0; l < n; ++l)
          for (int e = 0; e < 9; ++e) k[e][l] = g[l * 9 + e];
      }
      for (int j = 0; j < 3; ++j)
        for (int l = 0; l < WINO_WL; ++l) {
          t[0][j][l] = k[j][l];
          t[1][j][l] = 0.5f * (k[j][l] + k[3 + j][l] + k[6 + j][l]);
          t[2][j][l] = 0.5f * (k[j][l] - k[3 + j][l] + k[6 + j][l]);
          t[3][j][l] = k[6 + j][l];
        }
      for (int i = 0; i < 4; ++i)
        for (int l = 0; l < WINO_WL; ++l) {
          u[4 * i][l] = t[i][0][l];
          u[4 * i + 1][l] = 0.5f * (t[i][0][l] + t[i][1][l] + t[i][2][l]);
          u[4 * i + 2][l] = 0.5f * (t[i][0][l] - t[i][1][l] + t[i][2][l]);
          u[4 * i + 3][l] = t[i][2][l];
        }
      for (int i = 0; i < 16; ++i) {
        float* d = w->u + (i * Cout + co) * Cin + ci0;
        if (n == WINO_WL) memcpy(d, u[i], sizeof u[i]); /* one vector store */
        else memcpy(d, u[i], sizeof(float) * (size_t)n);
      }
    }
  return NULL;
}

/* v = B^T d B, B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], for channels [c0, c1). Per
 * row of tiles: its four input lines, zero-padded (no bounds tests after), combined down
 * the columns (B^T from the left) and split into even and odd columns, so that the loop
 * over the row's tiles (B from the right) reads and writes only contiguous runs. */
TPU_ISA_CLONES static tpu_status_t wino_input(void* arg, int64_t c0, int64_t c1, int tid) {
  (void)tid;
  const wino_t* w = arg;
  const conv_t* c = w->c;
  int64_t H = w->H, W = w->W, TW = w->TW, T = w->T, Cin = c->Cin, pw = 2 * TW + 2, st = Cin * T;
  int64_t ph = c->g.p[0], pl = c->g.p[1];
  float* buf = tpu__malloc(sizeof(float) * (size_t)(4 * pw + 8 * (TW + 1)));
  if (!buf) return TPU_HOST_NOMEM();
  float* ln[4] = {buf, buf + pw, buf + 2 * pw, buf + 3 * pw};
  float *ev = buf + 4 * pw, *od = ev + 4 * (TW + 1); /* [4][TW + 1] each */
  for (int64_t ci = c0; ci < c1; ++ci)
    for (int64_t b = 0; b < w->nb; ++b) {
      const float* img = (const float*)c->x + ((w->b0 + b) * Cin + ci) * H * W;
      for (int64_t ty = 0; ty < w->TH; ++ty) {
        for (int r = 0; r < 4; ++r) { /* line column x holds image column x - pl */
          int64_t ih = 2 * ty - ph + r;
          memset(ln[r], 0, sizeof(float) * (size_t)pw);
          if (ih >= 0 && ih < H) memcpy(ln[r] + pl, img + ih * W, sizeof(float) * (size_t)W);
        }
        for (int64_t k = 0; k <= TW; ++k)
          for (int par = 0; par < 2; ++par) {
            int64_t x = 2 * k + par;
            float* dst = par ? od : ev;
            dst[k] = ln[0][x] - ln[2][x];
            dst[TW + 1 + k] = ln[1][x] + ln[2][x];
            dst[2 * (TW + 1) + k] = ln[2][x] - ln[1][x];
            dst[3 * (TW + 1) + k] = ln[1][x] - ln[3][x];
          }
        float* vt = w->v + ci * T + b * w->P + ty * TW;
        for (int i = 0; i < 4; ++i) {
          const float* restrict e = ev + i * (TW + 1);
          const float* restrict o = od + i * (TW + 1);
          float* restrict v0 = vt + (4 * i) * st;
          float* restrict v1 = v0 + st;
          float* restrict v2 = v1 + st;
          float* restrict v3 = v2 + st;
          for (int64_t tx = 0; tx < TW; ++tx) {
            v0[tx] = e[tx] - e[tx + 1];
            v1[tx] = o[tx] + e[tx + 1];
            v2[tx] = e[tx + 1] - o[tx];
            v3[tx] = o[tx] - o[tx + 1];
          }
        }
      }
    }
  tpu__free(buf);
  return NULL;
}

/* y = A^T m A + bias, A^T = [1 1 1 0; 0 1 -1 -1], for output channels [k0, k1): a row of
 * tiles' outputs in even and odd columns first, then interleaved into the output lines. */
TPU_ISA_CLONES static tpu_status_t wino_output(void* arg, int64_t k0, int64_t k1, int tid) {
  (void)tid;
  const wino_t* w = arg;
  const conv_t* c = w->c;
  int64_t OH = w->OH, OW = w->OW, TW = w->TW, T = w->T, Cout = c->Cout, st = Cout * T;
  float* buf = tpu__malloc(sizeof(float) * (size_t)(6 * TW));
  if (!buf) return TPU_HOST_NOMEM();
  float *s = buf, *restrict y = buf + 4 * TW; /* s: [4][TW], one output row's A^T m; y: the row */
  for (int64_t k = k0; k < k1; ++k) {
    float bias = c->bias ? ((const float*)c->bias)[k] : 0.0f;
    for (int64_t b = 0; b < w->nb; ++b) {
      float* out = (float*)c->y + ((w->b0 + b) * Cout + k) * OH * OW;
      for (int64_t ty = 0; ty < w->TH; ++ty) {
        const float* mt = w->m + k * T + b * w->P + ty * TW;
        for (int r = 0; r < 2 && 2 * ty + r < OH; ++r) {
          for (int j = 0; j < 4; ++j) { /* A^T from the left: row r of the 2 x 4 */
            const float* restrict m0 = mt + (4 * (r ? 1 : 0) + j) * st;
            const float* restrict m1 = mt + (4 * (r ? 2 : 1) + j) * st;
            const float* restrict m2 = mt + (4 * (r ? 3 : 2) + j) * st;
            float* restrict sj = s + j * TW;
            if (r == 0) for (int64_t tx = 0; tx < TW; ++tx) sj[tx] = m0[tx] + m1[tx] + m2[tx];
            else for (int64_t tx = 0; tx < TW; ++tx) sj[tx] = m0[tx] - m1[tx] - m2[tx];
          }
          const float *restrict a0 = s, *restrict a1 = s + TW, *restrict a2 = s + 2 * TW, *restrict a3 = s + 3 * TW;
          for (int64_t tx = 0; tx < TW; ++tx) { /* A from the right */
            y[2 * tx] = a0[tx] + a1[tx] + a2[tx] + bias;
            y[2 * tx + 1] = a1[tx] - a2[tx] - a3[tx] + bias;
          }
          memcpy(out + (2 * ty + r) * OW, y, sizeof(float) * (size_t)OW);
        }
      }
    }
  }
  tpu__free(buf);
  return NULL;
}

/* The weight gradient by the same transforms: with y = A^T (U . V) A per tile and
 * U = G g G^T, dL/dU = sum over tiles of (A dy A^T) . V and dL/dg = G^T (dL/dU) G. So per
 * block of images the input is transformed as in the forward, grad_output's 2x2 tiles to
 * 4x4 (M = A dy A^T, A = [1 0; 1 1; 1 -1; 0 -1]; outputs past the edge are zeros, as
 * the forward cropped them), and dU[i] += M[i] (Cout x tiles) x V[i]^T: K = the block's
 * tiles. Then g = G^T dU G per weight, added to the gradient. */
TPU_ISA_CLONES static tpu_status_t wino_gout(void* arg, int64_t k0, int64_t k1, int tid) {
  (void)tid;
  const wino_t* w = arg;
  const conv_t* c = w->c;
  int64_t OH = w->OH, OW = w->OW, TW = w->TW, T = w->T, Cout = c->Cout, st = Cout * T;
  static const float ca[4] = {1, 1, 1, 0}, cb[4] = {0, 1, -1, -1}; /* rows of A */
  float* buf = tpu__malloc(sizeof(float) * (size_t)(6 * TW + 2));
  if (!buf) return TPU_HOST_NOMEM();
  float* ln = buf; /* one output line, zero-padded to 2 TW + 2 */
  float* eo[4] = {buf + 2 * TW + 2, buf + 3 * TW + 2, buf + 4 * TW + 2, buf + 5 * TW + 2}; /* lines 0, 1: even, odd */
  for (int64_t k = k0; k < k1; ++k)
    for (int64_t b = 0; b < w->nb; ++b) {
      const float* g = (const float*)c->go + ((w->b0 + b) * Cout + k) * OH * OW;
      for (int64_t ty = 0; ty < w->TH; ++ty) {
        for (int r = 0; r < 2; ++r) {
          memset(ln, 0, sizeof(float) * (size_t)(2 * TW + 2));
          if (2 * ty + r < OH) memcpy(ln, g + (2 * ty + r) * OW, sizeof(float) * (size_t)OW);
          for (int64_t tx = 0; tx < TW; ++tx) { eo[2 * r][tx] = ln[2 * tx]; eo[2 * r + 1][tx] = ln[2 * tx + 1]; }
        }
        float* mt = w->m + k * T + b * w->P + ty * TW;
        for (int a = 0; a < 4; ++a) { /* A from the left, then A^T from the right */
          float* restrict m0 = mt + (4 * a) * st;
          float* restrict m1 = m0 + st;
          float* restrict m2 = m1 + st;
          float* restrict m3 = m2 + st;
          const float *restrict e0 = eo[0], *restrict o0 = eo[1], *restrict e1 = eo[2], *restrict o1 = eo[3];
          float p = ca[a], q = cb[a];
          for (int64_t tx = 0; tx < TW; ++tx) {
            float e = p * e0[tx] + q * e1[tx], o = p * o0[tx] + q * o1[tx];
            m0[tx] = e;
            m1[tx] = e + o;
            m2[tx] = e - o;
            m3[tx] = -o;
          }
        }
      }
    }
  tpu__free(buf);
  return NULL;
}

TPU_ISA_CLONES static tpu_status_t wino_wgrad(void* arg, int64_t co0, int64_t co1, int tid) {
  (void)tid;
  const wino_t* w = arg;
  int64_t Cin = w->c->Cin, Cout = w->c->Cout;
  float d[16][WINO_WL], t[3][4][WINO_WL], g[9][WINO_WL];
  for (int64_t co = co0; co < co1; ++co)
    for (int64_t ci0 = 0; ci0 < Cin; ci0 += WINO_WL) {
      int64_t n = Cin - ci0 < WINO_WL ? Cin - ci0 : WINO_WL;
      for (int i = 0; i < 16; ++i) {
        const float* src = w->u + (i * Cout + co) * Cin + ci0;
        if (n == WINO_WL) memcpy(d[i], src, sizeof d[i]);
        else { memset(d[i], 0, sizeof d[i]); memcpy(d[i], src, sizeof(float) * (size_t)n); }
      }
      for (int j = 0; j < 4; ++j) /* G^T from the left */
        for (int l = 0; l < WINO_WL; ++l) {
          float h = 0.5f * (d[4 + j][l] + d[8 + j][l]);
          t[0][j][l] = d[j][l] + h;
          t[1][j][l] = 0.5f * (d[4 + j][l] - d[8 + j][l]);
          t[2][j][l] = h + d[12 + j][l];
        }
      for (int a = 0; a < 3; ++a) /* G from the right */
        for (int l = 0; l < WINO_WL; ++l) {
          float h = 0.5f * (t[a][1][l] + t[a][2][l]);
          g[3 * a][l] = t[a][0][l] + h;
          g[3 * a + 1][l] = 0.5f * (t[a][1][l] - t[a][2][l]);
          g[3 * a + 2][l] = h + t[a][3][l];
        }
      float* gw = w->gw + (co * Cin + ci0) * 9;
      for (int64_t l = 0; l < n; ++l)
        for (int e = 0; e < 9; ++e) gw[l * 9 + e] += g[e][l];
    }
  return NULL;
}

/* The transform buffers (up to WINO_BYTES) are kept for the next call: freed and
 * allocated again they came back as fresh pages from the kernel each call (glibc maps
 * blocks this large), and faulting them in took a quarter of a 56x56 layer's time. One
 * buffer is kept; a call that finds it taken (another device's queue) allocates its own. */
static _Atomic(float*) wino_kept;
static _Atomic int64_t wino_kept_n;

static float* wino_take(int64_t n) {
  float* p = atomic_exchange(&wino_kept, NULL);
  if (p && atomic_load(&wino_kept_n) >= n) return p;
  tpu__free(p);
  p = alloc_elems(n, sizeof(float), false);
  if (p) atomic_store(&wino_kept_n, n);
  return p;
}

static void wino_give(float* p, int64_t n) {
  if (!p) return;
  float* old = atomic_load(&wino_kept);
  if (old || n * (int64_t)sizeof(float) > 2 * WINO_BYTES || !atomic_compare_exchange_strong(&wino_kept, &old, p)) {
    tpu__free(p);
    return;
  }
  atomic_store(&wino_kept_n, n);
}

/* c's forward by Winograd; with flip, c's weights are [Cin][Cout] and used turned half a
 * turn (the input gradient of the convolution with c's x and y swapped); with gw, the
 * weight gradient added to gw instead. */
static tpu_status_t conv_wino_run(const conv_t* c, bool flip, float* gw) {
  wino_t w = {.c = c, .H = c->g.img[0], .W = c->g.img[1], .OH = c->g.pos[0], .OW = c->g.pos[1], .flip = flip,
              .gw = gw};
  w.TH = (w.OH + 1) / 2; w.TW = (w.OW + 1) / 2; w.P = w.TH * w.TW;
  int64_t per_image = 16 * (c->Cin + c->Cout) * w.P * (int64_t)sizeof(float);
  int64_t nbw = WINO_BYTES / per_image;
  nbw = nbw < 1 ? 1 : nbw > c->N ? c->N : nbw;
  if (!fits_blasint(nbw * w.P)) return tpu_status_make(TPU_UNIMPLEMENTED, "convolution: too many Winograd tiles");
  int64_t Cin = c->Cin, Cout = c->Cout;
  int64_t nu = 16 * Cout * Cin, nv = 16 * Cin * nbw * w.P, total = nu + nv + 16 * Cout * nbw * w.P;
  float* buf = wino_take(total);
  if (!buf) return TPU_HOST_NOMEM();
  w.u = buf; w.v = buf + nu; w.m = buf + nu + nv;
  tpu_status_t st = gw ? NULL : tpu__parallel_for(Cout, 1, wino_weights, &w);
  for (w.b0 = 0; w.b0 < c->N && !st; w.b0 += nbw) {
    w.nb = c->N - w.b0 < nbw ? c->N - w.b0 : nbw;
    w.T = w.nb * w.P;
    st = tpu__parallel_for(Cin, 1, wino_input, &w);
    if (!st && gw) st = tpu__parallel_for(Cout, 1, wino_gout, &w);
    for (int i = 0; i < 16 && !st; ++i) {
      float *u = w.u + (int64_t)i * Cout * Cin, *v = w.v + (int64_t)i * Cin * w.T, *m = w.m + (int64_t)i * Cout * w.T;
      if (gw) gemm_dense(TPU_DTYPE_F32, false, true, Cout, Cin, w.T, 1.0, m, w.T, v, w.T, w.b0 ? 1.0 : 0.0, u, Cin);
      else gemm_dense(TPU_DTYPE_F32, false, false, Cout, w.T, Cin, 1.0, u, Cin, v, w.T, 0.0, m, w.T);
    }
    if (!st && !gw) st = tpu__parallel_for(Cout, 1, wino_output, &w);
  }
  if (!st && gw) st = tpu__parallel_for(Cout, 1, wino_wgrad, &w);
  wino_give(buf, total);
  return st;
}

static tpu_status_t conv_kernel(tpu_node_t* n) {
  const tpu_operand_t *X = &n->in[0], *W = &n->in[1], *Bs = &n->in[2];
  tpu_operand_t* Y = &n->out[0];
  conv_t c;
  TPU_RETURN_IF_ERROR(conv_open(n, X, Y, W, false, &c));
  if (tpu__operand_numel(Y) == 0) return NULL;
  /* dense operands are read (and a dense output written) in place */
  void *xo, *wo, *yo;
  c.x = tpu__dense_in(X, c.cd, &xo);
  c.w = tpu__dense_in(W, c.cd, &wo);
  c.y = tpu__dense_out(n, Y, c.cd, c.transposed && !c.ident /* col2im accumulates */, &yo);
  void* bias = Bs->value ? tpu__pack_alloc(Bs, c.cd) : NULL;
  c.bias = bias;
  tpu_status_t st = NULL;
  if (!c.x || !c.w || !c.y || (Bs->value && !bias)) { st = TPU_HOST_NOMEM(); goto done; }
  st = conv_wino_ok(&c) ? conv_wino_run(&c, false, NULL) : tpu__parallel_for(c.parts, 1, conv_fwd_parts, &c);
  if (!st) tpu__dense_out_done(Y, yo, c.cd);
done:
  tpu__free(xo); tpu__free(wo); tpu__free(yo); tpu__free(bias);
  return st;
}

/* The weight gradient of a convolution over small images (fewer than CONV_GW_APART_POS
 * positions) with a large gradient (at least CONV_GW_APART_BYTES): per image, its GEMM
 * has only the image's positions as K, so each image re-read and re-wrote the whole
 * gradient (8 x 512 x 7 x 7 with 3x3 weights: 9.4 MiB per image), and each part of the
 * batch summed into a gradient of its own (allocated per call). Here it is one product
 * per block of images (the im2col matrices side by side, CONV_GW_COL_BYTES at most), K =
 * the block's positions, split over the pool by the GEMM, summed into the gradient in
 * block order: the result does not depend on the thread count. */
#define CONV_GW_APART_POS 256
#define CONV_GW_APART_BYTES ((int64_t)1 << 20)
#define CONV_GW_COL_BYTES ((int64_t)16 << 20)

static bool conv_gw_apart(const conv_t* c) {
  return !c->transposed && c->g.npos < CONV_GW_APART_POS &&
         c->Cout * c->kc * (int64_t)c->csz >= CONV_GW_APART_BYTES;
}

static tpu_status_t conv_gw_blocks(const conv_t* c, char* gw) {
  int64_t L = c->g.npos, kc = c->kc, Cout_g = c->Cout_g, Cin_g = c->Cin_g;
  int64_t nbw = CONV_GW_COL_BYTES / ((int64_t)c->csz * kc * L);
  nbw = nbw < 1 ? 1 : nbw > c->N ? c->N : nbw;
  if (!fits_blasint(nbw * L)) nbw = 1;
  char* col = c->ident && nbw == 1 ? NULL : alloc_elems(kc * nbw * L, c->csz, false);
  char* gob = nbw > 1 ? alloc_elems(Cout_g * nbw * L, c->csz, false) : NULL;
  tpu_status_t st = NULL;
  if ((!col && !(c->ident && nbw == 1)) || (nbw > 1 && !gob)) { st = TPU_HOST_NOMEM(); goto done; }
  for (int64_t b0 = 0; b0 < c->N && !st; b0 += nbw) {
    int64_t nb = c->N - b0 < nbw ? c->N - b0 : nbw, cols = nb * L;
    for (int64_t gr = 0; gr < c->groups; ++gr) {
      const char* a = blk_in(c, c->go, c->Cout, gr * Cout_g, Cout_g, c->L_out, b0, nb, gob);
      const char* cm;
      if (c->ident) cm = blk_in(c, c->x, c->Cin, gr * Cin_g, Cin_g, c->L_in, b0, nb, col);
      else { blk_im2col(c, Cin_g, (char*)c->x, c->Cin, gr * Cin_g, c->L_in, b0, nb, col, false); cm = col; }
      gemm_dense(c->cd, false, true, Cout_g, kc, cols, 1.0, a, cols, cm, cols, 1.0,
                 gw + (size_t)(gr * Cout_g * kc) * c->csz, kc);
    }
  }
done:
  tpu__free(col);
  tpu__free(gob);
  return st;
}

/* At stride 1 and dilation 1, grad_input is the convolution of grad_output, padded by
 * k - 1 - p, with the weights transposed and turned half a turn: for 3x3 weights with
 * padding up to 2 it runs Winograd as the forward does. */
static bool conv_wino_gi_ok(const conv_t* c) {
  return conv_wino_ok(c) && c->g.p[0] <= 2 && c->g.p[1] <= 2;
}

/* The weight gradient only where the tiles cover the outputs with little waste (at least
 * 8/9 of their positions): 8x512x7x7's 16 tiles per image cover 49 of 64 and its
 * gradient was slower by Winograd (20.6-25.7 ms against 19.8-23.5 through im2col), with
 * 16 x 512 x 512 transformed sums to write and read for 128 tiles; 14x14 (all 49 tiles
 * full) took 13.8-17.3 ms against 19.3-23.3. */
static bool conv_wino_gw_ok(const conv_t* c) {
  int64_t tiles = ((c->g.pos[0] + 1) / 2) * ((c->g.pos[1] + 1) / 2);
  return conv_wino_ok(c) && 9 * c->g.npos >= 32 * tiles;
}

static tpu_status_t conv_wino_gi(const conv_t* c) {
  conv_t v = *c;
  v.Cin = c->Cout; v.Cout = c->Cin;
  v.x = c->go; v.y = c->gi; v.bias = NULL;
  for (int d = 0; d < 2; ++d) {
    v.g.img[d] = c->g.pos[d];
    v.g.pos[d] = c->g.img[d];
    v.g.p[d] = 2 - c->g.p[d];
  }
  return conv_wino_run(&v, true, NULL);
}

/* A plane's sum in double (the bias gradient of a convolution). */
TPU_ISA_CLONES static double plane_sum_f32(const float* p, int64_t n) { return tpu__v8_sum_f32(p, n); }
TPU_ISA_CLONES static double plane_sum_f64(const double* p, int64_t n) { return tpu__v8_sum_f64(p, n); }

/* gw += the weight-gradient parts other than gw itself, in part order (so the result does
 * not depend on the thread count); parts accumulated transposed (gw_t) hold [kc, Cout_g]
 * per group and are all separate from gw. */
#define GW_ADD_PARTS(T, ADD)                                                                \
  for (int64_t p = c->gw_t ? 0 : 1; p < c->parts; ++p) {                                    \
    const T* q = (const T*)parts[p];                                                        \
    T* d = (T*)gw;                                                                          \
    if (!c->gw_t) {                                                                         \
      for (int64_t i = 0; i < n; ++i) d[i] = ADD(d[i], q[i]);                               \
      continue;                                                                             \
    }                                                                                       \
    for (int64_t g = 0; g < c->groups; ++g)                                                 \
      for (int64_t co = 0; co < Cg; ++co)                                                   \
        for (int64_t k = 0; k < kc; ++k)                                                    \
          d[(g * Cg + co) * kc + k] = ADD(d[(g * Cg + co) * kc + k], q[(g * kc + k) * Cg + co]); \
  }
#define GW_ADD(a, b) ((a) + (b))
#define GW_WRAP(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
static void conv_gw_add_parts(const conv_t* c, char* gw, char* const* parts, int64_t n) {
  int64_t Cg = c->Cout_g, kc = c->kc;
  if (c->cd == TPU_DTYPE_F32) { GW_ADD_PARTS(float, GW_ADD) }
  else if (c->cd == TPU_DTYPE_F64) { GW_ADD_PARTS(double, GW_ADD) }
  else { GW_ADD_PARTS(int64_t, GW_WRAP) }
}
#undef GW_ADD_PARTS
#undef GW_ADD
#undef GW_WRAP

static tpu_status_t conv_bwd_kernel(tpu_node_t* n) {
  const tpu_operand_t *GO = &n->in[0], *X = &n->in[1], *W = &n->in[2];
  bool need_gi = n->ia[3] != 0, need_gw = n->ia[4] != 0, need_gb = n->ia[5] != 0;
  conv_t c;
  TPU_RETURN_IF_ERROR(conv_open(n, X, GO, W, need_gw, &c));
  /* The weight gradient by Winograd or apart, and grad_input by Winograd, leave the
   * parts the rest (then blocked for grad_input only). */
  bool gw_wino = need_gw && conv_wino_gw_ok(&c);
  bool gw_apart = need_gw && !gw_wino && conv_gw_apart(&c);
  if (gw_wino || gw_apart) TPU_RETURN_IF_ERROR(conv_open(n, X, GO, W, false, &c));
  bool gi_wino = need_gi && conv_wino_gi_ok(&c);
  c.need_gi = need_gi && !gi_wino; c.need_gw = need_gw && !gw_apart && !gw_wino;
  tpu_dtype_t cd = c.cd;
  int64_t L_out = c.L_out, Cout = c.Cout;
  /* Outputs output_mask did not ask for are absent (never bound) and not written. */
  /* Dense operands are read, and dense outputs accumulated, in place. */
  void *goo = NULL, *xo = NULL, *wo = NULL, *gio = NULL, *gwo = NULL, *gbo = NULL;
  char* parts[CONV_MAX_PARTS] = {NULL};
  c.go = tpu__dense_in(GO, cd, &goo); /* (read only, as x and w) */
  c.x = need_gw ? tpu__dense_in(X, cd, &xo) : NULL;
  c.w = need_gi ? tpu__dense_in(W, cd, &wo) : NULL;
  c.gi = need_gi ? tpu__dense_out(n, &n->out[0], cd, !gi_wino, &gio) : NULL;
  char* gw = need_gw ? tpu__dense_out(n, &n->out[1], cd, true, &gwo) : NULL;
  char* gb = need_gb ? tpu__dense_out(n, &n->out[2], cd, true, &gbo) : NULL;
  int64_t gw_n = need_gw ? tpu__operand_numel(&n->out[1]) : 0;
  tpu_status_t st = NULL;
  bool ok = c.go && (!need_gw || (c.x && gw)) && (!need_gi || (c.w && c.gi)) && (!need_gb || gb);
  /* 64 output channels against a tall im2col matrix over wide blocks (ResNet's stem: 64
   * x 147, 4,096 positions per image): the GEMM runs as gw^T = col @ go^T, whose 64
   * columns fill one column tile of the kernels (64 x 65536 x 147 ran at 139 GFLOP/s,
   * 147 x 65536 x 64 at 233; the stem's weight gradient, 16x3x128x128, 7.2-8.1 ms ->
   * 5.9-6.1); the parts then all accumulate transposed and are added into gw at the end,
   * in part order as always. Measured slower: kc under 128 (a 3x3 stem's 27), 32
   * channels (half a tile) over 256-column blocks (1.31-1.57 -> 1.82-1.88 ms). */
  c.gw_t = c.need_gw && !c.transposed && c.Cout_g == CONV_TILE_COLS && c.kc >= 2 * c.Cout_g &&
           c.nb * c.g.npos >= CONV_BLOCK_COLS;
  if (ok && c.need_gw) {
    parts[0] = c.gw_t ? NULL : gw;
    for (int64_t p = c.gw_t ? 0 : 1; p < c.parts && ok; ++p) ok = (parts[p] = alloc_elems(gw_n, c.csz, true)) != NULL;
    c.gw = parts;
  }
  if (!ok) { st = TPU_HOST_NOMEM(); goto done; }
  if (c.need_gi || c.need_gw) st = tpu__parallel_for(c.parts, 1, conv_bwd_parts, &c);
  if (!st && gw_apart) st = conv_gw_blocks(&c, gw);
  if (!st && gi_wino) st = conv_wino_gi(&c);
  if (!st && gw_wino) st = conv_wino_run(&c, false, (float*)gw);
  if (st) goto done;
  if (c.need_gw) conv_gw_add_parts(&c, gw, parts, gw_n);
  if (need_gb) {
    for (int64_t i = 0; i < c.N * Cout; ++i) {
      int64_t ch = i % Cout;
      if (cd == TPU_DTYPE_F32) ((float*)gb)[ch] += (float)plane_sum_f32((const float*)c.go + i * L_out, L_out);
      else if (cd == TPU_DTYPE_F64) ((double*)gb)[ch] += plane_sum_f64((const double*)c.go + i * L_out, L_out);
      else { const int64_t* p = (const int64_t*)c.go + i * L_out; uint64_t s = 0; for (int64_t l = 0; l < L_out; ++l) s += (uint64_t)p[l]; ((int64_t*)gb)[ch] = (int64_t)((uint64_t)((int64_t*)gb)[ch] + s); }
    }
  }
  if (need_gi) tpu__dense_out_done(&n->out[0], gio, cd);
  if (need_gw) tpu__dense_out_done(&n->out[1], gwo, cd);
  if (need_gb) tpu__dense_out_done(&n->out[2], gbo, cd);
done:
  tpu__free(goo); tpu__free(xo); tpu__free(wo); tpu__free(gio); tpu__free(gwo); tpu__free(gbo);
  for (int64_t p = c.gw_t ? 0 : 1; p < CONV_MAX_PARTS; ++p) tpu__free(parts[p]);
  return st;
}

/* ---- pooling ----------------------------------------------------------------------------- */

/* Pooling geometry: planes are every dim before the last ns (ia[14]: 2 or 3) spatial
 * dims; a 2-d pool is a 3-d pool of depth 1 (its depth window is k 1, s 1, p 0, d 1). */
typedef struct plane_s { int64_t P, D, H, W, OD, OH, OW; } plane_t;

static plane_t planes(const tpu_node_t* n, const tpu_operand_t* in, const tpu_operand_t* out) {
  plane_t p;
  int nd = in->ndim, ns = (int)n->ia[14];
  p.P = 1;
  for (int d = 0; d < nd - ns; ++d) p.P *= in->sizes[d];
  p.D = ns == 3 ? in->sizes[nd - 3] : 1;
  p.OD = ns == 3 ? out->sizes[nd - 3] : 1;
  p.H = in->sizes[nd - 2]; p.W = in->sizes[nd - 1];
  p.OH = out->sizes[nd - 2]; p.OW = out->sizes[nd - 1];
  return p;
}

/* One dim's window [*b, *e) step *st of output position o: PyTorch's adaptive rule
 * [floor(o*in/out), ceil((o+1)*in/out)), or the dilated kernel window clipped to the
 * input (a start inside the padding moves to the first tap inside the input). */
typedef struct win_s { int64_t b, e, st, f; } win_t; /* f: average pools' divisor factor */

static win_t max_win(const tpu_node_t* n, int dim, bool adaptive, int64_t o, int64_t in, int64_t out) {
  win_t w = {0, 0, 1, 0};
  if (adaptive) {
    w.b = o * in / out; w.e = ((o + 1) * in + out - 1) / out; w.st = 1;
    return w;
  }
  int64_t k = n->ia[dim], s = n->ia[3 + dim], p = n->ia[6 + dim], d = n->ia[9 + dim];
  w.b = o * s - p; w.e = w.b + (k - 1) * d + 1; w.st = d;
  while (w.b < 0) w.b += d;
  if (w.e > in) w.e = in;
  return w;
}

typedef struct pool_ctx_s {
  const tpu_node_t* n;
  plane_t p;
  const win_t* win; /* windows of every output position: OD, then OH, then OW entries */
  tpu_dtype_t cd;
  bool adaptive;
  const void* x; /* forward input or grad_output, dense in cd */
  void* y;       /* forward output or grad_input, dense in cd */
  int64_t* ind;  /* max pooling indices (per plane, into D*H*W) */
  tpu_dtype_t st; /* storage dtype (bf16/f16 round in cpu_order) */
  bool cpu_order; /* adaptive 3-d average pools: CPU's arithmetic, below */
  bool rows;      /* f32 2-d pool swept by rows (pool_by_rows) */
  const double* div; /* f32 2-d average pool: each output position's divisor, 0 for an
                        empty window (avgpool2d_f32_planes) */
  bool pairs;        /* ... and every window is rows [2 oh, 2 oh + 2) x columns [2 ow, 2 ow + 2) */
  int64_t lo, hi; /* with rows: the output columns whose windows lie inside the input */
} pool_ctx_t;

/* CPU's adaptive_avg_pool3d (forward and backward) computes in the tensor's own dtype:
 * the window sum rounds after every add and the mean divides by the window's depth,
 * height and width one at a time, each rounded. In bf16/f16 that differs from one f32
 * sum and one division by more than the tolerance, so these pools follow it: sums in
 * the compute dtype (f32 or f64), rounded through the storage dtype after each step. */
static inline float round_to(float v, tpu_dtype_t st) {
  if (st == TPU_DTYPE_BF16) return tpu__bf16_to_f32(tpu__f32_to_bf16(v));
  if (st == TPU_DTYPE_F16) return (float)(_Float16)v;
  return v;
}

static int64_t pool_grain(const plane_t* p, int64_t per_out) {
  int64_t work = p->OD * p->OH * p->OW * (per_out > 0 ? per_out : 1);
  return TPU_PARALLEL_MIN_WORK / (work > 0 ? work : 1) + 1;
}

/* f32 2-d max pools (MaxPool2d, no dilation) sweep each output row tap column by tap
 * column: for one window row and one tap column, the inner loop runs over the row's
 * output columns (vectorized for kernel 2/3, stride 1/2), instead of each output looping
 * over its 2-3 taps in scalar code (4.2 ns per output of MaxPool2d(2) on one core, slower
 * than CPU; now 1.3 ns). Each output still sees its taps in (h, w) order, so values and
 * indices are the same; columns whose windows cross the border (padding) take the
 * per-output path. Rows narrower than a vector run the scalar remainder loop. */
static bool pool_by_rows(const tpu_node_t* n, bool adaptive) {
  return n->compute == TPU_DTYPE_F32 && n->ia[14] == 2 && !adaptive && n->ia[10] == 1 && n->ia[11] == 1;
}

static void interior_cols(pool_ctx_t* c) {
  int64_t k = c->n->ia[2], s = c->n->ia[5], pad = c->n->ia[8];
  int64_t hi = c->p.W - k + pad >= 0 ? (c->p.W - k + pad) / s + 1 : 0, lo = (pad + s - 1) / s;
  c->hi = hi < c->p.OW ? hi : c->p.OW;
  c->lo = lo < c->hi ? lo : c->hi;
}

/* One output of a max pool: NaN wins, ties keep the first (CPU's rule). */
static void maxpool_one(const pool_ctx_t* c, int64_t pl, int64_t od, int64_t oh, int64_t ow) {
  const plane_t* p = &c->p;
  int64_t HW = p->H * p->W, V = p->D * HW;
  win_t wd = c->win[od], wh = c->win[p->OD + oh], ww = c->win[p->OD + p->OH + ow];
  int64_t o = ((pl * p->OD + od) * p->OH + oh) * p->OW + ow;
  int64_t best_i = wd.b * HW + wh.b * p->W + ww.b;
#define MAX_TAPS(T, init, better)                                        \
  {                                                                      \
    const T* xp = (const T*)c->x + pl * V;                               \
    T best = init;                                                       \
    for (int64_t d = wd.b; d < wd.e; d += wd.st)                         \
      for (int64_t h = wh.b; h < wh.e; h += wh.st)                       \
        for (int64_t w = ww.b; w < ww.e; w += ww.st) {                   \
          int64_t i = d * HW + h * p->W + w;                             \
          T v = xp[i];                                                   \
          if (better) { best = v; best_i = i; }                          \
        }                                                                \
    ((T*)c->y)[o] = best;                                                \
  }
  if (c->cd == TPU_DTYPE_I64) MAX_TAPS(int64_t, INT64_MIN, v > best)
  else if (c->cd == TPU_DTYPE_F32) MAX_TAPS(float, -INFINITY, v > best || v != v)
  else MAX_TAPS(double, -INFINITY, v > best || isnan(v))
#undef MAX_TAPS
  c->ind[o] = best_i;
}

/* One window row of a row of outputs, tap columns K and stride S fixed so the loop over
 * output columns vectorizes: best values in y, and per output the winning tap as a code
 * r * K + j (window row r, tap column j) in an int32 lane beside its float. */
#define MAXPOOL_WROW(K, S)                                                                     \
  TPU_ISA_CLONES static void maxpool_wrow_k##K##s##S(const float* restrict xr, int64_t n, int32_t r, \
                                                     float* restrict y, int32_t* restrict tap) {  \
    for (int64_t ow = 0; ow < n; ++ow) {                                                       \
      float b = y[ow];                                                                         \
      int32_t t = tap[ow];                                                                     \
      for (int32_t j = 0; j < K; ++j) {                                                        \
        float v = xr[ow * S + j];                                                              \
        bool take = (v > b) | (v != v);                                                        \
        b = take ? v : b;                                                                      \
        t = take ? r * K + j : t;                                                              \
      }                                                                                        \
      y[ow] = b;                                                                               \
      tap[ow] = t;                                                                             \
    }                                                                                          \
  }
MAXPOOL_WROW(2, 2)
MAXPOOL_WROW(3, 2)
MAXPOOL_WROW(2, 1)
MAXPOOL_WROW(3, 1)
#undef MAXPOOL_WROW

/* The interior columns [lo, hi) of one output row of an f32 2-d max pool (pool_by_rows):
 * window row by window row, tap column by tap column. tap is scratch for hi - lo codes. */
static void maxpool_row_f32(const pool_ctx_t* c, int64_t pl, int64_t oh, int32_t* tap) {
  const plane_t* p = &c->p;
  int64_t k = c->n->ia[2], s = c->n->ia[5], pad = c->n->ia[8], W = p->W, n = c->hi - c->lo;
  win_t wh = c->win[p->OD + oh];
  int64_t o0 = (pl * p->OH + oh) * p->OW + c->lo, c0 = c->lo * s - pad; /* first tap column */
  float* restrict y = (float*)c->y + o0;
  int64_t* restrict ind = c->ind + o0;
  for (int64_t i = 0; i < n; ++i) { y[i] = -INFINITY; tap[i] = 0; }
  for (int64_t h = wh.b; h < wh.e; ++h) {
    const float* xr = (const float*)c->x + pl * p->H * W + h * W + c0;
    int32_t r = (int32_t)(h - wh.b);
    if (k == 2 && s == 2) maxpool_wrow_k2s2(xr, n, r, y, tap);
    else if (k == 3 && s == 2) maxpool_wrow_k3s2(xr, n, r, y, tap);
    else if (k == 2 && s == 1) maxpool_wrow_k2s1(xr, n, r, y, tap);
    else if (k == 3 && s == 1) maxpool_wrow_k3s1(xr, n, r, y, tap);
    else
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < k; ++j) {
          float v = xr[i * s + j];
          if (v > y[i] || v != v) { y[i] = v; tap[i] = (int32_t)(r * k + j); }
        }
  }
  for (int64_t i = 0; i < n; ++i) ind[i] = (wh.b + tap[i] / k) * W + c0 + i * s + tap[i] % k;
}

/* max_pool{2,3}d_with_indices and adaptive_max_pool{2,3}d over planes [b, e). */
static tpu_status_t maxpool_planes(void* arg, int64_t b, int64_t e, int tid) {
  (void)tid;
  const pool_ctx_t* c = arg;
  const plane_t* p = &c->p;
  int32_t* tap = c->rows ? tpu__malloc(sizeof(int32_t) * (size_t)(c->hi - c->lo + 1)) : NULL;
  if (c->rows && !tap) return TPU_HOST_NOMEM();
  for (int64_t pl = b; pl < e; ++pl)
    for (int64_t od = 0; od < p->OD; ++od)
      for (int64_t oh = 0; oh < p->OH; ++oh) {
        if (c->rows) maxpool_row_f32(c, pl, oh, tap);
        for (int64_t ow = 0; ow < p->OW; ++ow)
          if (!c->rows || ow < c->lo || ow >= c->hi) maxpool_one(c, pl, od, oh, ow);
      }
  tpu__free(tap);
  return NULL;
}

static win_t avg_win(const tpu_node_t* n, int dim, bool adaptive, int64_t o, int64_t in, int64_t out);

/* The windows of every output position of each dim: they do not depend on the plane, so
 * a node computes them once instead of per output element. NULL on host OOM. */
static win_t* pool_windows(const tpu_node_t* n, const plane_t* p, bool adaptive, bool avg) {
  const int64_t in[3] = {p->D, p->H, p->W}, out[3] = {p->OD, p->OH, p->OW};
  win_t* t = tpu__malloc(sizeof(win_t) * (size_t)(out[0] + out[1] + out[2] + 1));
  if (!t) return NULL;
  win_t* w = t;
  for (int d = 0; d < 3; ++d)
    for (int64_t o = 0; o < out[d]; ++o)
      *w++ = avg ? avg_win(n, d, adaptive, o, in[d], out[d]) : max_win(n, d, adaptive, o, in[d], out[d]);
  return t;
}

static tpu_status_t maxpool_run(tpu_node_t* n, bool adaptive) {
  const tpu_operand_t* X = &n->in[0];
  pool_ctx_t c = {n, planes(n, X, &n->out[0]), NULL, n->compute, adaptive, NULL, NULL, NULL, n->out[0].dtype, false};
  int64_t no = c.p.P * c.p.OD * c.p.OH * c.p.OW;
  if (no == 0) return NULL;
  void *xo, *yo, *io;
  c.x = tpu__dense_in(X, c.cd, &xo);
  c.y = tpu__dense_out(n, &n->out[0], c.cd, false, &yo);
  c.ind = tpu__dense_out(n, &n->out[1], TPU_DTYPE_I64, false, &io);
  win_t* win = pool_windows(n, &c.p, adaptive, false);
  c.win = win;
  c.rows = pool_by_rows(n, adaptive);
  if (c.rows) interior_cols(&c);
  tpu_status_t st = NULL;
  if (!c.x || !c.y || !c.ind || !win) { st = TPU_HOST_NOMEM(); goto done; }
  int64_t taps = adaptive ? 1 : n->ia[0] * n->ia[1] * n->ia[2];
  st = tpu__parallel_for(c.p.P, pool_grain(&c.p, taps), maxpool_planes, &c);
  if (st) goto done;
  tpu__dense_out_done(&n->out[0], yo, c.cd);
  tpu__dense_out_done(&n->out[1], io, TPU_DTYPE_I64);
done:
  tpu__free(xo); tpu__free(yo); tpu__free(io); tpu__free(win);
  return st;
}

static tpu_status_t maxpool_kernel(tpu_node_t* n) { return maxpool_run(n, false); }
static tpu_status_t adaptive_maxpool_kernel(tpu_node_t* n) { return maxpool_run(n, true); }

/* Scatter-add of one plane range of grad_output at the saved indices, in CPU's order and,
 * for bf16/f16, rounded after every add as CPU's loop in the tensor's dtype does; an
 * index outside its plane (a hand-made indices tensor) is an error. Each range clears
 * its own planes of grad_input first, so the clearing runs in parallel and leaves the
 * planes in cache for the adds. */
static tpu_status_t maxpool_bwd_planes(void* arg, int64_t b, int64_t e, int tid) {
  (void)tid;
  const pool_ctx_t* c = arg;
  const plane_t* p = &c->p;
  int64_t V = p->D * p->H * p->W, OV = p->OD * p->OH * p->OW;
  size_t csz = tpu_dtype_size(c->cd);
  memset((char*)c->y + (size_t)(b * V) * csz, 0, (size_t)((e - b) * V) * csz);
  for (int64_t pl = b; pl < e; ++pl) {
    const int64_t* restrict ind = c->ind + pl * OV;
    for (int64_t k = 0; k < OV; ++k)
      if (ind[k] < 0 || ind[k] >= V)
        return tpu_status_make(TPU_INDEX_ERROR, "%s: index %lld out of range for a plane of %lld elements",
                               tpu__node_describe(c->n), (long long)ind[k], (long long)V);
    if (c->cd == TPU_DTYPE_F32 && c->st == TPU_DTYPE_F32) {
      float* restrict y = (float*)c->y + pl * V;
      const float* restrict g = (const float*)c->x + pl * OV;
      for (int64_t k = 0; k < OV; ++k) y[ind[k]] += g[k];
    } else if (c->cd == TPU_DTYPE_F32) {
      float* restrict y = (float*)c->y + pl * V;
      const float* restrict g = (const float*)c->x + pl * OV;
      for (int64_t k = 0; k < OV; ++k) y[ind[k]] = round_to(y[ind[k]] + g[k], c->st);
    } else if (c->cd == TPU_DTYPE_F64) {
      double* restrict y = (double*)c->y + pl * V;
      const double* restrict g = (const double*)c->x + pl * OV;
      for (int64_t k = 0; k < OV; ++k) y[ind[k]] += g[k];
    } else {
      int64_t* restrict y = (int64_t*)c->y + pl * V;
      const int64_t* restrict g = (const int64_t*)c->x + pl * OV;
      for (int64_t k = 0; k < OV; ++k) y[ind[k]] = (int64_t)((uint64_t)y[ind[k]] + (uint64_t)g[k]);
    }
  }
  return NULL;
}

/* Backward of all max pools: in[0] grad_output, in[1] input, in[2] indices. Dense
 * operands are read, and a dense grad_input written, in place. */
static tpu_status_t maxpool_bwd_kernel(tpu_node_t* n) {
  const tpu_operand_t *GO = &n->in[0], *X = &n->in[1], *IX = &n->in[2];
  pool_ctx_t c = {n, planes(n, X, GO), NULL, n->compute, false, NULL, NULL, NULL, n->out[0].dtype, false};
  int64_t no = c.p.P * c.p.OD * c.p.OH * c.p.OW;
  void *goo = NULL, *gio = NULL, *io = NULL;
  c.y = tpu__dense_out(n, &n->out[0], c.cd, false /* cleared per plane range */, &gio);
  c.x = no ? tpu__dense_in(GO, c.cd, &goo) : NULL;
  c.ind = no ? (int64_t*)tpu__dense_in(IX, TPU_DTYPE_I64, &io) : NULL;
  tpu_status_t st = NULL;
  if (!c.y || (no && (!c.x || !c.ind))) { st = TPU_HOST_NOMEM(); goto done; }
  st = tpu__parallel_for(c.p.P, pool_grain(&c.p, 1), maxpool_bwd_planes, &c);
  if (!st) tpu__dense_out_done(&n->out[0], gio, c.cd);
done:
  tpu__free(goo); tpu__free(gio); tpu__free(io);
  return st;
}

/* One dim's window of an average pool's output position o, clamped to the input, and
 * its factor of the divisor PyTorch uses: the window's size within the padded input
 * (count_include_pad) or within the input; adaptive pools divide by the window's size.
 * The divisor is divisor_override (non-adaptive) or the product of the three factors. */
static win_t avg_win(const tpu_node_t* n, int dim, bool adaptive, int64_t o, int64_t in, int64_t out) {
  win_t w = {0, 0, 1, 0};
  if (adaptive) {
    w.b = o * in / out;
    w.e = ((o + 1) * in + out - 1) / out;
    w.f = w.e - w.b;
    return w;
  }
  int64_t k = n->ia[dim], s = n->ia[3 + dim], pad = n->ia[6 + dim];
  int64_t b = o * s - pad, e = b + k < in + pad ? b + k : in + pad;
  w.b = b < 0 ? 0 : b;
  w.e = e > in ? in : e;
  w.f = n->ia[12] ? e - b : w.e - w.b;
  return w;
}

/* Output element (pl, od, oh, ow): its index, and its window in each dim into w. */
static inline int64_t pool_out(const pool_ctx_t* c, int64_t pl, int64_t od, int64_t oh, int64_t ow, win_t* w) {
  const plane_t* p = &c->p;
  w[0] = c->win[od];
  w[1] = c->win[p->OD + oh];
  w[2] = c->win[p->OD + p->OH + ow];
  return ((pl * p->OD + od) * p->OH + oh) * p->OW + ow;
}

static int64_t avg_divisor(const pool_ctx_t* c, const win_t* w) {
  if (!c->adaptive && c->n->ia[13]) return c->n->ia[13];
  return w[0].f * w[1].f * w[2].f;
}

static bool win_empty(const win_t* w) { return w[0].b >= w[0].e || w[1].b >= w[1].e || w[2].b >= w[2].e; }

/* f32 2-d average pools outside CPU's own order (c->div set): each output's window and
 * divisor come from tables made once per node, and its sum over the taps in (h, w) order
 * is the same double sum as the general loop below makes. The general loop, which works
 * both out per output, took about 8 ns per output on [64,32,8,8] (one thread: 248 us;
 * this path, with the operands read and written in place: 110 us). AvgPool2d(2)'s
 * windows (c->pairs) take a loop without the window tables that the compiler vectorizes,
 * bit for bit the same: [64,32,8,8] forward 119-138 -> 44-45 us, backward 165-183 ->
 * 44-56; [32,64,56,56] forward 5.9-7.2 -> 1.1-1.3 ms, backward 4.7-6.6 -> 1.6-1.8 (2
 * threads; CPU 123-167 us, 140-211 us, 6.0 ms, 7.2-9.0 ms). */
static tpu_status_t avgpool2d_f32_planes(const pool_ctx_t* c, int64_t b, int64_t e) {
  const plane_t* p = &c->p;
  const win_t* wh = c->win + p->OD;
  const win_t* ww = wh + p->OH;
  for (int64_t pl = b; pl < e; ++pl) {
    const float* xp = (const float*)c->x + pl * p->H * p->W;
    float* y = (float*)c->y + pl * p->OH * p->OW;
    if (c->pairs) { /* AvgPool2d(2): the same sums, in a loop the compiler vectorizes */
      for (int64_t oh = 0; oh < p->OH; ++oh) {
        const float *r0 = xp + 2 * oh * p->W, *r1 = r0 + p->W;
        const double* dv = c->div + oh * p->OW;
        float* yr = y + oh * p->OW;
        for (int64_t ow = 0; ow < p->OW; ++ow) {
          double s = 0; /* from +0, as the general loop: -0 taps sum to +0 */
          s += r0[2 * ow];
          s += r0[2 * ow + 1];
          s += r1[2 * ow];
          s += r1[2 * ow + 1];
          yr[ow] = (float)(s / dv[ow]);
        }
      }
      continue;
    }
    for (int64_t oh = 0; oh < p->OH; ++oh)
      for (int64_t ow = 0; ow < p->OW; ++ow) {
        const double div = c->div[oh * p->OW + ow];
        if (div == 0) continue; /* an empty window stays 0 */
        double s = 0;
        for (int64_t h = wh[oh].b; h < wh[oh].e; ++h)
          for (int64_t x = ww[ow].b; x < ww[ow].e; ++x) s += xp[h * p->W + x];
        y[oh * p->OW + ow] = (float)(s / div);
      }
  }
  return NULL;
}

/* The backward of the same pools: each output's share of its gradient (the same float
 * division as the general loop) added to its taps in the same order, outputs in order,
 * so the values are the general loop's; [64,32,4,4] -> [64,32,8,8] took 196-230 us
 * through the general loop, a scratch gradient and its copy-out, now 104-128 us (2
 * threads). */
static tpu_status_t avgpool2d_bwd_f32_planes(const pool_ctx_t* c, int64_t b, int64_t e) {
  const plane_t* p = &c->p;
  const win_t* wh = c->win + p->OD;
  const win_t* ww = wh + p->OH;
  for (int64_t pl = b; pl < e; ++pl) {
    const float* go = (const float*)c->x + pl * p->OH * p->OW;
    float* gp = (float*)c->y + pl * p->H * p->W;
    if (c->pairs) { /* every tap in one window: its cleared 0 plus the share */
      for (int64_t oh = 0; oh < p->OH; ++oh) {
        float *r0 = gp + 2 * oh * p->W, *r1 = r0 + p->W;
        const float* gr = go + oh * p->OW;
        const double* dv = c->div + oh * p->OW;
        for (int64_t ow = 0; ow < p->OW; ++ow) {
          const float g = gr[ow] / (float)dv[ow];
          r0[2 * ow] += g;
          r0[2 * ow + 1] += g;
          r1[2 * ow] += g;
          r1[2 * ow + 1] += g;
        }
      }
      continue;
    }
    for (int64_t oh = 0; oh < p->OH; ++oh)
      for (int64_t ow = 0; ow < p->OW; ++ow) {
        const double div = c->div[oh * p->OW + ow];
        if (div == 0) continue; /* an empty window has no taps */
        const float g = go[oh * p->OW + ow] / (float)div;
        for (int64_t h = wh[oh].b; h < wh[oh].e; ++h)
          for (int64_t x = ww[ow].b; x < ww[ow].e; ++x) gp[h * p->W + x] += g;
      }
  }
  return NULL;
}

static tpu_status_t avgpool_fwd_planes(void* arg, int64_t b, int64_t e, int tid) {
  (void)tid;
  const pool_ctx_t* c = arg;
  if (c->div) return avgpool2d_f32_planes(c, b, e);
  const plane_t* p = &c->p;
  int64_t HW = p->H * p->W, V = p->D * HW;
  for (int64_t pl = b; pl < e; ++pl)
    for (int64_t od = 0; od < p->OD; ++od)
      for (int64_t oh = 0; oh < p->OH; ++oh)
        for (int64_t ow = 0; ow < p->OW; ++ow) {
          win_t w[3];
          int64_t o = pool_out(c, pl, od, oh, ow, w), div = avg_divisor(c, w);
          if (win_empty(w)) continue; /* stays 0 */
          if (c->cpu_order) {
            int64_t base = pl * V;
            if (c->cd == TPU_DTYPE_F32) {
              const float* xp = (const float*)c->x + base;
              float s = 0;
              for (int64_t d = w[0].b; d < w[0].e; ++d)
                for (int64_t h = w[1].b; h < w[1].e; ++h)
                  for (int64_t x = w[2].b; x < w[2].e; ++x) s = round_to(s + xp[d * HW + h * p->W + x], c->st);
              for (int j = 0; j < 3; ++j) s = round_to(s / (float)(w[j].e - w[j].b), c->st);
              ((float*)c->y)[o] = s;
            } else {
              const double* xp = (const double*)c->x + base;
              double s = 0;
              for (int64_t d = w[0].b; d < w[0].e; ++d)
                for (int64_t h = w[1].b; h < w[1].e; ++h)
                  for (int64_t x = w[2].b; x < w[2].e; ++x) s += xp[d * HW + h * p->W + x];
              for (int j = 0; j < 3; ++j) s /= (double)(w[j].e - w[j].b);
              ((double*)c->y)[o] = s;
            }
            continue;
          }
          if (c->cd == TPU_DTYPE_I64) {
            const int64_t* xp = (const int64_t*)c->x + pl * V;
            uint64_t s = 0;
            for (int64_t d = w[0].b; d < w[0].e; ++d)
              for (int64_t h = w[1].b; h < w[1].e; ++h)
                for (int64_t x = w[2].b; x < w[2].e; ++x) s += (uint64_t)xp[d * HW + h * p->W + x];
            ((int64_t*)c->y)[o] = div ? (int64_t)s / div : 0;
          } else if (c->cd == TPU_DTYPE_F32) {
            const float* xp = (const float*)c->x + pl * V;
            double s = 0;
            for (int64_t d = w[0].b; d < w[0].e; ++d)
              for (int64_t h = w[1].b; h < w[1].e; ++h)
                for (int64_t x = w[2].b; x < w[2].e; ++x) s += xp[d * HW + h * p->W + x];
            ((float*)c->y)[o] = (float)(s / (double)div);
          } else {
            const double* xp = (const double*)c->x + pl * V;
            double s = 0;
            for (int64_t d = w[0].b; d < w[0].e; ++d)
              for (int64_t h = w[1].b; h < w[1].e; ++h)
                for (int64_t x = w[2].b; x < w[2].e; ++x) s += xp[d * HW + h * p->W + x];
            ((double*)c->y)[o] = s / (double)div;
          }
        }
  return NULL;
}

static tpu_status_t avgpool_bwd_planes(void* arg, int64_t b, int64_t e, int tid) {
  (void)tid;
  const pool_ctx_t* c = arg;
  if (c->div) return avgpool2d_bwd_f32_planes(c, b, e);
  const plane_t* p = &c->p;
  int64_t HW = p->H * p->W, V = p->D * HW;
  for (int64_t pl = b; pl < e; ++pl)
    for (int64_t od = 0; od < p->OD; ++od)
      for (int64_t oh = 0; oh < p->OH; ++oh)
        for (int64_t ow = 0; ow < p->OW; ++ow) {
          win_t w[3];
          int64_t o = pool_out(c, pl, od, oh, ow, w), div = avg_divisor(c, w);
          if (c->cpu_order) {
            if (c->cd == TPU_DTYPE_F32) {
              float gd = ((const float*)c->x)[o];
              for (int j = 0; j < 3; ++j) gd = round_to(gd / (float)(w[j].e - w[j].b), c->st);
              float* gp = (float*)c->y + pl * V;
              for (int64_t d = w[0].b; d < w[0].e; ++d)
                for (int64_t h = w[1].b; h < w[1].e; ++h)
                  for (int64_t x = w[2].b; x < w[2].e; ++x) {
                    float* t = gp + d * HW + h * p->W + x;
                    *t = round_to(*t + gd, c->st);
                  }
            } else {
              double gd = ((const double*)c->x)[o];
              for (int j = 0; j < 3; ++j) gd /= (double)(w[j].e - w[j].b);
              double* gp = (double*)c->y + pl * V;
              for (int64_t d = w[0].b; d < w[0].e; ++d)
                for (int64_t h = w[1].b; h < w[1].e; ++h)
                  for (int64_t x = w[2].b; x < w[2].e; ++x) gp[d * HW + h * p->W + x] += gd;
            }
            continue;
          }
          /* the share of grad_output each tap gets, then the taps */
#define AVG_BWD_TAPS(T, share)                                                              \
  {                                                                                         \
    T g = share, *gp = (T*)c->y + pl * V;                                                   \
    for (int64_t d = w[0].b; d < w[0].e; ++d)                                               \
      for (int64_t h = w[1].b; h < w[1].e; ++h)                                             \
        for (int64_t x = w[2].b; x < w[2].e; ++x) gp[d * HW + h * p->W + x] += g;           \
  }
          if (c->cd == TPU_DTYPE_F32) AVG_BWD_TAPS(float, ((const float*)c->x)[o] / (float)div)
          else if (c->cd == TPU_DTYPE_F64) AVG_BWD_TAPS(double, ((const double*)c->x)[o] / (double)div)
          else if (div) AVG_BWD_TAPS(int64_t, ((const int64_t*)c->x)[o] / div)
#undef AVG_BWD_TAPS
        }
  return NULL;
}

static int64_t avg_taps(const tpu_node_t* n, bool adaptive) {
  return adaptive ? 1 : n->ia[0] * n->ia[1] * n->ia[2];
}

/* f32 2-d pools outside CPU's own order: each output position's divisor (0 for an
 * empty window), made once per node for the *_f32_planes loops; NULL elsewhere.
 * *nomem is set when the table could not be allocated. */
static double* avg_div_table(pool_ctx_t* c, bool* nomem) {
  *nomem = false;
  if (c->cd != TPU_DTYPE_F32 || c->n->ia[14] != 2 || c->cpu_order) return NULL;
  double* div = alloc_elems(c->p.OH * c->p.OW, sizeof(double), false);
  if (!div) { *nomem = true; return NULL; }
  c->pairs = true;
  for (int64_t oh = 0; oh < c->p.OH; ++oh)
    for (int64_t ow = 0; ow < c->p.OW; ++ow) {
      win_t w[3];
      pool_out(c, 0, 0, oh, ow, w);
      div[oh * c->p.OW + ow] = win_empty(w) ? 0.0 : (double)avg_divisor(c, w);
      c->pairs &= w[1].b == 2 * oh && w[1].e == 2 * oh + 2 && w[2].b == 2 * ow && w[2].e == 2 * ow + 2;
    }
  return div;
}

static tpu_status_t avgpool_fwd(tpu_node_t* n, bool adaptive) {
  const tpu_operand_t* X = &n->in[0];
  pool_ctx_t c = {n, planes(n, X, &n->out[0]), NULL, n->compute, adaptive, NULL, NULL, NULL, n->out[0].dtype,
                  adaptive && n->ia[14] == 3};
  int64_t no = c.p.P * c.p.OD * c.p.OH * c.p.OW;
  if (no == 0) return NULL;
  void *xo, *yo; /* dense operands are read, and a dense output written, in place */
  c.x = tpu__dense_in(X, c.cd, &xo);
  c.y = tpu__dense_out(n, &n->out[0], c.cd, true /* empty windows stay 0 */, &yo);
  win_t* win = pool_windows(n, &c.p, adaptive, true);
  c.win = win;
  double* div = NULL;
  tpu_status_t st = NULL;
  bool nomem = !c.x || !c.y || !win;
  if (!nomem) c.div = div = avg_div_table(&c, &nomem);
  if (nomem) { st = TPU_HOST_NOMEM(); goto done; }
  st = tpu__parallel_for(c.p.P, pool_grain(&c.p, avg_taps(n, adaptive)), avgpool_fwd_planes, &c);
  if (!st) tpu__dense_out_done(&n->out[0], yo, c.cd);
done:
  tpu__free(xo); tpu__free(yo); tpu__free(win); tpu__free(div);
  return st;
}

static tpu_status_t avgpool_bwd(tpu_node_t* n, bool adaptive) {
  const tpu_operand_t *GO = &n->in[0], *X = &n->in[1];
  pool_ctx_t c = {n, planes(n, X, GO), NULL, n->compute, adaptive, NULL, NULL, NULL, n->out[0].dtype,
                  adaptive && n->ia[14] == 3};
  int64_t no = c.p.P * c.p.OD * c.p.OH * c.p.OW;
  /* dense operands are read, and a dense grad_input written (cleared first: the taps
   * accumulate), in place */
  void *goo = NULL, *gio = NULL;
  c.x = no ? tpu__dense_in(GO, c.cd, &goo) : NULL;
  c.y = tpu__dense_out(n, &n->out[0], c.cd, true, &gio);
  win_t* win = pool_windows(n, &c.p, adaptive, true);
  c.win = win;
  double* div = NULL;
  tpu_status_t st = NULL;
  bool nomem = !c.y || (no && !c.x) || !win;
  if (!nomem) c.div = div = avg_div_table(&c, &nomem);
  if (nomem) { st = TPU_HOST_NOMEM(); goto done; }
  if (no) st = tpu__parallel_for(c.p.P, pool_grain(&c.p, avg_taps(n, adaptive)), avgpool_bwd_planes, &c);
  if (!st) tpu__dense_out_done(&n->out[0], gio, c.cd);
done:
  tpu__free(goo); tpu__free(gio); tpu__free(win); tpu__free(div);
  return st;
}

static tpu_status_t avgpool_kernel(tpu_node_t* n) { return avgpool_fwd(n, false); }
static tpu_status_t avgpool_bwd_kernel(tpu_node_t* n) { return avgpool_bwd(n, false); }
static tpu_status_t adaptive_avgpool_kernel(tpu_node_t* n) { return avgpool_fwd(n, true); }
static tpu_status_t adaptive_avgpool_bwd_kernel(tpu_node_t* n) { return avgpool_bwd(n, true); }

void tpu__host_register_linalg(tpu_host_kernel_fn* table) {
  table[TPU_KIND_GEMM] = gemm_kernel;
  table[TPU_KIND_TRSM] = trsm_kernel;
  table[TPU_KIND_CONV] = conv_kernel;
  table[TPU_KIND_CONV_BWD] = conv_bwd_kernel;
  table[TPU_KIND_MAXPOOL2D] = maxpool_kernel;
  table[TPU_KIND_MAXPOOL2D_BWD] = maxpool_bwd_kernel;
  table[TPU_KIND_AVGPOOL2D] = avgpool_kernel;
  table[TPU_KIND_AVGPOOL2D_BWD] = avgpool_bwd_kernel;
  table[TPU_KIND_ADAPTIVE_AVGPOOL2D] = adaptive_avgpool_kernel;
  table[TPU_KIND_ADAPTIVE_AVGPOOL2D_BWD] = adaptive_avgpool_bwd_kernel;
  table[TPU_KIND_ADAPTIVE_MAXPOOL2D] = adaptive_maxpool_kernel;
}
