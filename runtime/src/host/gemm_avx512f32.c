/* f32 GEMM with AVX-512 FMAs; contract in host/host.h (tpu__gemm_f32).
 *
 * The same loops as the bf16 kernel (host/gemm_avx512bf16.c), one K value per step
 * instead of a pair: the output is cut into tasks that the pool shares out (column strips
 * of at most NC columns spanning all rows, cut further only to give every thread work,
 * tpu__split_tasks). Within a task, for each K block of kc values (K split evenly into
 * blocks of at most KC), the task packs its B panels into its thread's buffer (kc x nc
 * floats, which stays in L2) just before use; then each NR-column B micro-panel meets
 * every MR-row micro-panel of A. A is never packed: the microkernel broadcasts its
 * elements from wherever they are (row-major A: six row streams, prefetched ahead; a
 * transposed A: the six rows of one K value are adjacent), so the product costs one pass
 * over B's packing and none over A's. The microkernel keeps an MR x NR block of C in 24
 * zmm accumulators: per K value, NV loads of B, MR broadcasts of A, MR * NV FMAs.
 *
 * Each element of C is the sum over K in K blocks of fixed size, each block summed in K
 * order in runs of KFOLD products added one after another (on the dot-product path
 * below, of 16 lane sums, each in K order in such runs), whatever the task shape or
 * thread count: results do not depend on how many threads run the product.
 *
 * Every function here is compiled for AVX-512 (AVX512_TARGET); host/linalg.c calls in
 * only after tpu__gemm_f32_supported(), its cpuid check. */
#include <string.h>

#include "host/avx512.h"
#include "host/host.h"

#define MR TPU_TILE_MR
#define NV TPU_TILE_NV             /* zmm vectors of 16 f32 per C row */
#define NR (16 * NV)
#define KC 512           /* K values per block at most */
#define NC 128           /* task columns at most */
#define MC 2048          /* task rows at most */
#define PACK_AHEAD 4     /* row-major B: rows prefetched ahead while packing */
/* A running sum takes at most KFOLD products before it is added into the element's total
 * (into C itself on the packed path). Rounding error grows with the length of a running
 * sum, since each addition rounds at the sum's magnitude: summing a whole K block (up to
 * 512 products; on the few-rows path all of K) in one register gave 1.1-4.4x the rms
 * error vs float64 of PyTorch CPU's matmul and made a 512-channel Winograd convolution
 * 3.0x as far off as CPU's direct one; folding every 128 gives 0.57-0.88x and 1.6x, for
 * about 2% of the packed path's speed (bench/gemm_accuracy.py; docs/benchmarks.md, stop
 * 35, "GEMM accuracy"). */
#define KFOLD 128

/* tot[i] += acc[i], then acc[i] = 0, for n accumulators */
AVX512_TARGET static inline __attribute__((always_inline)) void fold(__m512* tot, __m512* acc, int n) {
#pragma GCC unroll 32
  for (int i = 0; i < n; ++i) {
    tot[i] = _mm512_add_ps(tot[i], acc[i]);
    acc[i] = _mm512_setzero_ps();
  }
}

/* Fewer rows than this take the few-rows kernels below where their layout allows. */
#define F32_MIN_PACKED_M 8

typedef struct f32_gemm_s {
  int64_t M, N, K;
  const float *a, *b;
  int64_t sam, sak, sbk, sbn; /* strides in elements */
  float alpha, beta;
  float* c;
  int64_t ldc;
  float* pbt;         /* per thread: one K block of a task's B panels, kc * nc floats */
  int64_t kc;         /* K values per block: K split evenly into blocks of at most KC */
  int64_t mc, nc;     /* task size: multiples of MR and NR */
  int64_t ntasks;     /* tasks per row of tasks */
} f32_gemm_t;

/* Packs kb K values of n columns of B, starting at base (element (k, j) at
 * base[k * sk + j * sn]), into panels of NR columns pstride floats apart, each panel
 * K-major (NR floats per K value). Columns past n, to the end of the last panel, are
 * zero. dst and pstride are 64-byte aligned. */
AVX512_TARGET static void pack_b(float* dst, int64_t pstride, const float* base, int64_t sk, int64_t sn, int n,
                                 int64_t kb) {
  int cols = (n + NR - 1) / NR * NR;
#define AT(k, l) (dst + (int64_t)((l) / NR) * pstride + (k) * NR + (l) % NR)
  if (sn == 1) {
    /* row-major B: each K row is one run of n floats */
    for (int64_t k = 0; k < kb; ++k) {
      const float* r = base + k * sk;
      if (k + PACK_AHEAD < kb)
        for (int l = 0; l < n; l += 16) _mm_prefetch((const char*)(r + PACK_AHEAD * sk + l), _MM_HINT_T0);
      for (int l = 0; l < cols; l += 16) {
        int cnt = n - l < 0 ? 0 : n - l < 16 ? n - l : 16;
        _mm512_store_ps(AT(k, l), _mm512_maskz_loadu_ps((__mmask16)((1u << cnt) - 1), r + l));
      }
    }
  } else if (sk == 1) {
    /* transposed B (a linear layer's weight): K runs adjacent in memory, 16 columns x 16
     * K values transposed in registers */
    for (int l0 = 0; l0 < cols; l0 += 16)
      for (int64_t k0 = 0; k0 < kb; k0 += 16) {
        __mmask16 m = kb - k0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (kb - k0)) - 1);
        __m512i r[16];
        for (int l = 0; l < 16; ++l)
          r[l] = l0 + l < n ? _mm512_maskz_loadu_epi32(m, base + (l0 + l) * sn + k0) : _mm512_setzero_si512();
        tpu__avx512_transpose16(r);
        for (int c = 0; c < 16 && k0 + c < kb; ++c) _mm512_store_si512(AT(k0 + c, l0), r[c]);
      }
  } else {
    for (int64_t k = 0; k < kb; ++k)
      for (int l = 0; l < cols; ++l) *AT(k, l) = l < n ? base[k * sk + l * sn] : 0.0f;
  }
#undef AT
}

/* C[mr, nr] (row stride ldc) = alpha * acc + beta * C on the first K block (C not read
 * when beta is 0), C += alpha * acc on later ones. A's element (r, k) is a[r * ars + k *
 * aks], rows from mr on repeating the last (their sums are not stored). Inlined into
 * each caller, so the row-major call keeps a unit K stride. */
AVX512_TARGET static inline __attribute__((always_inline)) void microkernel(
    int64_t kc, const float* a, int64_t ars, int64_t aks, const float* b, float* c, int64_t ldc, int mr, int nr,
    float alpha, float beta, bool first) {
  const float* ar[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) ar[r] = a + (r < mr ? r : mr - 1) * ars;
  tpu__avx512_tile_prefetch(c, ldc, mr);
  for (int64_t k0 = 0; k0 < kc; k0 += KFOLD) {
    int64_t k1 = kc - k0 < KFOLD ? kc : k0 + KFOLD;
    __m512 acc[MR][NV];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
    for (int64_t k = k0; k < k1; ++k) {
      __m512 bv[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) bv[v] = _mm512_load_ps(b + k * NR + v * 16);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        /* row-major A: six streams, each fetched a line ahead once per line */
        if (aks == 1 && (k & 15) == 0) _mm_prefetch((const char*)(ar[r] + k + 64), _MM_HINT_T0);
        __m512 av = _mm512_set1_ps(ar[r][k * aks]);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
      }
    }
    tpu__avx512_tile_store(acc, c, ldc, mr, nr, alpha, beta, first && k0 == 0);
  }
}

/* Task t: an mc x nc block of C, row-major over the grid of tasks. */
AVX512_TARGET static void run_task(void* ctx, int64_t t, int tid) {
  f32_gemm_t* g = ctx;
  int64_t m0 = t / g->ntasks * g->mc, n0 = t % g->ntasks * g->nc;
  int64_t m1 = m0 + g->mc < g->M ? m0 + g->mc : g->M, n1 = n0 + g->nc < g->N ? n0 + g->nc : g->N;
  float* pbt = g->pbt + (int64_t)tid * g->kc * g->nc;
  for (int64_t k0 = 0; k0 < g->K; k0 += g->kc) {
    int64_t kb = g->K - k0 < g->kc ? g->K - k0 : g->kc;
    pack_b(pbt, kb * NR, g->b + k0 * g->sbk + n0 * g->sbn, g->sbk, g->sbn, (int)(n1 - n0), kb);
    for (int64_t j = n0; j < n1; j += NR) {
      const float* pb = pbt + (j - n0) / NR * kb * NR;
      int nr = (int)(n1 - j < NR ? n1 - j : NR);
      for (int64_t i = m0; i < m1; i += MR) {
        int mr = (int)(m1 - i < MR ? m1 - i : MR);
        const float* a = g->a + i * g->sam + k0 * g->sak;
        float* c = g->c + i * g->ldc + j;
        if (g->sak == 1)
          microkernel(kb, a, g->sam, 1, pb, c, g->ldc, mr, nr, g->alpha, g->beta, k0 == 0);
        else
          microkernel(kb, a, g->sam, g->sak, pb, c, g->ldc, mr, nr, g->alpha, g->beta, k0 == 0);
      }
    }
  }
}

/* ---- few rows (M <= SMALL_M): B read in place ------------------------------------------
 * With a handful of rows (a linear layer at decode) the product is bound by reading B
 * once, and packing B would read it twice more. Row-major B: each K row's 64-column run
 * is loaded once and multiplied by every row's broadcast A element (A at any strides).
 * Transposed B with row-major A (a linear layer's weight) runs as dot products (below).
 * Column blocks go over the pool once B is past 256K elements (1 MiB). */
#define SMALL_M 6

typedef struct f32_small_s {
  int64_t M, N, K;
  const float *a, *b;
  int64_t sam, sak, sbk, sbn;
  float alpha, beta;
  float* c;
  int64_t ldc;
} f32_small_t;

AVX512_TARGET static inline void small_store(const f32_small_t* s, float* c, __mmask16 m, __m512 acc) {
  __m512 x = _mm512_mul_ps(acc, _mm512_set1_ps(s->alpha));
  if (s->beta != 0.0f) x = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, c), _mm512_set1_ps(s->beta), x);
  _mm512_mask_storeu_ps(c, m, x);
}

/* Row-major B (unit column stride): columns [64 blk, 64 blk + 64) of every row. */
AVX512_TARGET static void small_rows_block(void* ctx, int64_t blk, int tid) {
  const f32_small_t* s = ctx;
  int64_t j0 = blk * NR;
  int nr = (int)(s->N - j0 < NR ? s->N - j0 : NR);
  __mmask16 m[NV];
  for (int v = 0; v < NV; ++v) m[v] = tpu__avx512_lanes(nr - 16 * v);
  __m512 acc[SMALL_M][NV];
  __m512 tot[SMALL_M][NV];
#pragma GCC unroll 8
  for (int i = 0; i < SMALL_M; ++i)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[i][v] = tot[i][v] = _mm512_setzero_ps();
  for (int64_t k0 = 0; k0 < s->K; k0 += KFOLD) {
    int64_t k1 = s->K - k0 < KFOLD ? s->K : k0 + KFOLD;
    for (int64_t k = k0; k < k1; ++k) {
      const float* br = s->b + k * s->sbk + j0;
      __m512 bv[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) bv[v] = _mm512_maskz_loadu_ps(m[v], br + 16 * v);
#pragma GCC unroll 8
      for (int i = 0; i < SMALL_M; ++i) {
        if (i >= s->M) break;
        __m512 av = _mm512_set1_ps(s->a[i * s->sam + k * s->sak]);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);
      }
    }
    fold(&tot[0][0], &acc[0][0], SMALL_M * NV);
  }
#pragma GCC unroll 8
  for (int i = 0; i < SMALL_M; ++i) {
    if (i >= s->M) break;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      if (m[v]) small_store(s, s->c + i * s->ldc + j0 + 16 * v, m[v], tot[i][v]);
  }
}

/* ---- dot products: both operands K-contiguous ------------------------------------------
 * Row-major A with transposed B (a linear layer's weight at decode; a convolution's
 * weight gradient, go [Cout, L] times im2col [Cin * kk, L] transposed) makes every
 * element of C the dot product of two contiguous K runs. With few rows, or with fewer
 * columns than one 64-column tile, packing B would read it twice more or waste lanes (27
 * of 64 for the weight gradient of a 3-channel 3x3 convolution): here a DOT_MR x DOT_NJ
 * block of dot products takes 16 K values per step (the tail masked) straight from both
 * operands, and each row's DOT_NJ sums are reduced together at the end (sum4). Each
 * element is the sum of 16 lane sums, lane l summing the K values k = l mod 16 in order:
 * fixed by the shape, not by the thread count. A task is 16 columns by DOT_MB rows. */
#define DOT_MR 6
#define DOT_NJ 4
#define DOT_MB 48

/* The four sums of a0..a3's lanes, in that order. */
AVX512_TARGET static inline __m128 sum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  __m512 t01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  __m512 t23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  __m512d p01 = _mm512_castps_pd(t01), p23 = _mm512_castps_pd(t23);
  /* 128-bit lane j: the sums of a0..a3 over their lanes 4j..4j+3 */
  __m512 t = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(p01, p23)),
                           _mm512_castpd_ps(_mm512_unpackhi_pd(p01, p23)));
  t = _mm512_add_ps(t, _mm512_shuffle_f32x4(t, t, _MM_SHUFFLE(1, 0, 3, 2)));
  t = _mm512_add_ps(t, _mm512_shuffle_f32x4(t, t, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_castps512_ps128(t);
}

AVX512_TARGET static inline __attribute__((always_inline)) void dot_step(
    __m512 acc[DOT_MR][DOT_NJ], const float* const ar[DOT_MR], const float* const br[DOT_NJ], int mr, int64_t k,
    __mmask16 m) {
  __m512 bv[DOT_NJ];
#pragma GCC unroll 8
  for (int c = 0; c < DOT_NJ; ++c) bv[c] = _mm512_maskz_loadu_ps(m, br[c] + k);
#pragma GCC unroll 8
  for (int r = 0; r < DOT_MR; ++r) {
    if (r >= mr) break; /* (one row at decode: no loads and FMAs for copies of it) */
    __m512 av = _mm512_maskz_loadu_ps(m, ar[r] + k);
#pragma GCC unroll 8
    for (int c = 0; c < DOT_NJ; ++c) acc[r][c] = _mm512_fmadd_ps(av, bv[c], acc[r][c]);
  }
}

AVX512_TARGET static void dot_block(void* ctx, int64_t t, int tid) {
  (void)tid;
  const f32_small_t* s = ctx;
  int64_t nrb = tpu__cdiv(s->M, DOT_MB), K = s->K;
  int64_t i0 = t % nrb * DOT_MB, i1 = i0 + DOT_MB < s->M ? i0 + DOT_MB : s->M;
  int64_t j0 = t / nrb * 16, j1 = j0 + 16 < s->N ? j0 + 16 : s->N;
  __m128 va = _mm_set1_ps(s->alpha), vb = _mm_set1_ps(s->beta);
  for (int64_t j = j0; j < j1; j += DOT_NJ) {
    int nj = (int)(j1 - j < DOT_NJ ? j1 - j : DOT_NJ);
    __mmask8 cm = (__mmask8)((1u << nj) - 1);
    const float* br[DOT_NJ]; /* columns past nj repeat the last (their sums are not stored) */
    for (int c = 0; c < DOT_NJ; ++c) br[c] = s->b + (j + (c < nj ? c : nj - 1)) * s->sbn;
    for (int64_t i = i0; i < i1; i += DOT_MR) {
      int mr = (int)(i1 - i < DOT_MR ? i1 - i : DOT_MR);
      const float* ar[DOT_MR];
      for (int r = 0; r < DOT_MR; ++r) ar[r] = s->a + (i + (r < mr ? r : mr - 1)) * s->sam;
      __m512 acc[DOT_MR][DOT_NJ], tot[DOT_MR][DOT_NJ]; /* lane l: k = l mod 16, in runs of KFOLD */
#pragma GCC unroll 8
      for (int r = 0; r < DOT_MR; ++r)
#pragma GCC unroll 8
        for (int c = 0; c < DOT_NJ; ++c) acc[r][c] = tot[r][c] = _mm512_setzero_ps();
      int64_t k = 0;
      while (k + 16 <= K) {
        int64_t stop = K - k < 16 * KFOLD ? K : k + 16 * KFOLD;
        for (; k + 16 <= stop; k += 16) dot_step(acc, ar, br, mr, k, (__mmask16)0xFFFF);
        fold(&tot[0][0], &acc[0][0], DOT_MR * DOT_NJ);
      }
      if (k < K) {
        dot_step(acc, ar, br, mr, k, tpu__avx512_lanes((int)(K - k)));
        fold(&tot[0][0], &acc[0][0], DOT_MR * DOT_NJ);
      }
#pragma GCC unroll 8
      for (int r = 0; r < DOT_MR; ++r) {
        if (r >= mr) break;
        float* c = s->c + (i + r) * s->ldc + j;
        __m128 v = _mm_mul_ps(sum4(tot[r][0], tot[r][1], tot[r][2], tot[r][3]), va);
        if (s->beta != 0.0f) v = _mm_add_ps(v, _mm_mul_ps(_mm_maskz_loadu_ps(cm, c), vb));
        _mm_mask_storeu_ps(c, cm, v);
      }
    }
  }
}

static bool small_rows(int64_t M, int64_t sbn) { return M <= SMALL_M && sbn == 1; }
/* both operands K-contiguous, with few rows or fewer columns than a tile (dot_block) */
static bool dot_product(int64_t M, int64_t N, int64_t sak, int64_t sbk) {
  return sak == 1 && sbk == 1 && (M <= SMALL_M || N < NR);
}

bool tpu__gemm_f32_takes(int64_t M, int64_t N, int64_t sak, int64_t sbk, int64_t sbn) {
  return M >= F32_MIN_PACKED_M || dot_product(M, N, sak, sbk) || small_rows(M, sbn);
}

AVX512_TARGET tpu_status_t tpu__gemm_f32(int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t sam,
                                         int64_t sak, const float* b, int64_t sbk, int64_t sbn, float beta, float* c,
                                         int64_t ldc) {
  f32_gemm_t g = {.M = M, .N = N, .K = K, .a = a, .b = b, .sam = sam, .sak = sak, .sbk = sbk, .sbn = sbn,
                  .alpha = alpha, .beta = beta, .c = c, .ldc = ldc};
  if (M <= 0 || N <= 0 || K <= 0) return NULL; /* the caller handles empty products */
  bool dot = dot_product(M, N, sak, sbk);
  if (dot || small_rows(M, sbn)) {
    f32_small_t sm = {.M = M, .N = N, .K = K, .a = a, .b = b, .sam = sam, .sak = sak, .sbk = sbk, .sbn = sbn,
                      .alpha = alpha, .beta = beta, .c = c, .ldc = ldc};
    if (dot) {
      /* over the pool past the split threshold, or once B is past 256K elements (1 MiB):
       * with few rows the product is bound by reading B */
      bool big = 2.0 * (double)M * (double)N * (double)K >= TPU_GEMM_SPLIT_FLOPS ||
                 (double)K * (double)N >= 8.0 * TPU_PARALLEL_MIN_WORK;
      int threads = big ? tpu__num_threads() : 1;
      return tpu__run_items(&sm, dot_block, tpu__cdiv(N, 16) * tpu__cdiv(M, DOT_MB), threads);
    }
    int threads = (double)K * (double)N < 8.0 * TPU_PARALLEL_MIN_WORK ? 1 : tpu__num_threads(); /* as above */
    return tpu__run_items(&sm, small_rows_block, (N + NR - 1) / NR, threads);
  }
  /* below the split threshold a region's wake-up costs more than it saves */
  bool serial = 2.0 * (double)M * (double)N * (double)K < TPU_GEMM_SPLIT_FLOPS;
  int threads = serial ? 1 : tpu__num_threads();
  int64_t tasks = tpu__split_tasks(M, N, MR, NR, MC, NC, threads, &g.mc, &g.nc, &g.ntasks);
  g.kc = tpu__cdiv(K, tpu__cdiv(K, KC));
  uint64_t nbw;
  if (!tpu__mul_ok((uint64_t)threads * (uint64_t)(g.kc * g.nc), sizeof(float), &nbw) || nbw > SIZE_MAX - 128)
    return TPU_HOST_NOMEM();
  /* 64-byte aligned: the B buffers and panels (kc x NR floats) start on a cache line */
  char* buf = tpu__malloc((size_t)nbw + 64);
  if (!buf) return TPU_HOST_NOMEM();
  g.pbt = (float*)(((uintptr_t)buf + 63) & ~(uintptr_t)63);
  tpu_status_t st = tpu__run_items(&g, run_task, tasks, threads);
  tpu__free(buf);
  return st;
}
