/* bf16 x bf16 -> f32 GEMM with AVX512-BF16 (vdpbf16ps); contract in host/host.h.
 *
 * vdpbf16ps multiplies pairs of bf16 along K and adds both products into an f32 lane, so
 * both operands are read with K in pairs: a packed A panel holds, for each pair p, the
 * 32-bit words (A[i][2p], A[i][2p+1]) of its MR rows; a packed B panel holds, for each p,
 * the words (B[2p][j], B[2p+1][j]) of its NR columns. An odd K gets a zero partner; rows
 * and columns past M and N are zero and never stored. Row-major A with an even K needs
 * no packing (its pairs already are 32-bit words of its rows) and is read in place. The
 * microkernel keeps an MR x NR block of C in 24 zmm accumulators, broadcasting one A word
 * per row against NV B vectors per pair.
 *
 * Loops: the output is cut into tasks that the pool shares out: column strips of at most
 * NC columns spanning all rows (at most MC), cut further only to give every thread work
 * (tpu__split_tasks). Within a task, for each K block of kcp pairs (kp split evenly into
 * blocks of at most KCP), the task packs its B panels into its thread's buffer (kcp x nc
 * words, which stays in L2) just before use, so every B panel is packed once and never
 * goes out to memory; then each NR-column B micro-panel meets every MR-row A micro-panel
 * of the task, A streaming from L3 (A that is not read in place is packed whole up front,
 * in a parallel region of its own); the microkernel prefetches the C tile for writing
 * before its K loop. With at most SMALL_M rows, B is not packed at all (gemm_small:
 * reading B once is the whole cost there).
 *
 * Measured on Zen 4 (2 cores, 1 MiB L2 each) at the bench's LLM shapes (512 x 1024 x
 * 3072, 512 x 1024 x 4096, 512 x 4096 x 1024, 1024^3): 90-94% of the vdpbf16ps peak at 1
 * and 2 threads, as PyTorch CPU (oneDNN); the microkernel alone, B in L2, runs at ~99%.
 * The rest is packing B and waiting on its source (TLB misses: B's K rows are N elements
 * apart on 4 KiB pages; with the operands on 2 MiB pages the C harness ran 3-5% faster)
 * and the C write-back.
 *
 * Every function here is compiled for AVX-512 and AVX512-BF16 (BF16_TARGET); host/linalg.c
 * calls in only after tpu__gemm_bf16_supported(), its cpuid check. */
#include <immintrin.h>
#include <string.h>

#include "host/avx512.h"
#include "host/host.h"

/* On every function of this file (not a file-wide flag: the library's other code and the
 * cpuid check keep the baseline ISA). */
#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

#define MR TPU_TILE_MR
#define NV TPU_TILE_NV             /* zmm vectors of 16 f32 per C row */
#define NR (16 * NV)
/* Block sizes, measured on Zen 4 (32 KiB L1, 1 MiB L2, AVX-512 double-pumped) at the
 * bench's LLM shapes, 1 thread: KCP 512 beat 256 by ~2% (half the passes over C: each
 * pass after the first loads and stores the C tile), 384 and 128 were no better; NC 128
 * beat 64, 192, 256 and 512 (B block of 256 KiB next to the streaming A); tasks of all
 * rows (B packed once, in L2) beat 192-row tasks with B packed whole up front by ~8%. */
#define KCP 512          /* K pairs per block at most (1024 K values) */
#define NC 128           /* task columns at most */
#define MC 2048          /* task rows at most (bounds the A block streamed per B panel) */

BF16_TARGET static inline uint32_t pair_at(const uint16_t* p, int64_t second) {
  return (uint32_t)p[0] | (uint32_t)p[second] << 16;
}

/* tpu__transpose_words16 (host.h). */
BF16_TARGET void tpu__transpose_words16(uint32_t* t) {
  __m512i r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(t + 16 * i);
  tpu__avx512_transpose16(r);
  for (int i = 0; i < 16; ++i) _mm512_storeu_si512(t + 16 * i, r[i]);
}

/* tpu__bf16_pack_pairs (host.h): one packed panel of `lanes` words per pair. */
BF16_TARGET void tpu__bf16_pack_pairs(uint32_t* dst, int lanes, const uint16_t* base, int64_t sl,
                                      int64_t sk, int n, int64_t K) {
  int64_t kp = (K + 1) / 2, full = K / 2;
  /* every path below writes all lanes of every pair when n == lanes */
  if (n < lanes) memset(dst, 0, (size_t)(kp * lanes) * sizeof(uint32_t));
  if (sk == 1 && lanes % 16 == 0) {
    /* pairs adjacent in memory (transposed B: a linear layer's weight): 32-bit words
     * transposed 16 x 16 in registers */
    for (int l0 = 0; l0 < n; l0 += 16)
      for (int64_t p0 = 0; p0 < full; p0 += 16) {
        __mmask16 m = full - p0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (full - p0)) - 1);
        __m512i r[16];
        for (int l = 0; l < 16; ++l)
          r[l] = l0 + l < n ? _mm512_maskz_loadu_epi32(m, base + (l0 + l) * sl + 2 * p0)
                            : _mm512_setzero_si512();
        tpu__avx512_transpose16(r);
        for (int c = 0; c < 16 && p0 + c < full; ++c)
          _mm512_storeu_si512(dst + (p0 + c) * lanes + l0, r[c]);
      }
    if (K & 1)
      for (int l = 0; l < n; ++l) dst[full * lanes + l] = base[l * sl + K - 1];
    return;
  }
  if (sl == 1 && lanes % 16 == 0) {
    /* lines adjacent in memory (row-major B): interleave two K rows */
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                         23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int64_t p = 0; p < kp; ++p) {
      const uint16_t* r0 = base + 2 * p * sk;
      bool has1 = 2 * p + 1 < K;
      for (int v = 0; v * 16 < n; ++v) {
        int cnt = n - v * 16 < 16 ? n - v * 16 : 16;
        __mmask16 m = (__mmask16)((1u << cnt) - 1);
        __m256i x0 = _mm256_maskz_loadu_epi16(m, r0 + v * 16);
        __m256i x1 = has1 ? _mm256_maskz_loadu_epi16(m, r0 + sk + v * 16) : _mm256_setzero_si256();
        __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(x0), x1, 1);
        _mm512_storeu_si512(dst + p * lanes + v * 16, _mm512_permutexvar_epi16(idx, both));
      }
    }
    return;
  }
  /* any other layout (A panels with neither unit stride: pack_a_group and pack_a_cols
   * take the others) */
  for (int64_t p = 0; p < kp; ++p)
    for (int l = 0; l < n; ++l) {
      const uint16_t* src = base + l * sl + 2 * p * sk;
      dst[p * lanes + l] = 2 * p + 1 < K ? pair_at(src, sk) : src[0];
    }
}

/* tpu__bf16_pack_rows (host.h). Row-major B (columns adjacent): np pairs of K rows (kb K
 * values) by n columns, panels of `lanes` columns pstride words apart (dst and pstride
 * 64-byte aligned). Pair by pair across all the columns, so each K row is read as one run,
 * with the rows PACK_AHEAD pairs ahead prefetched: rows N elements apart are not followed
 * by the hardware prefetcher (without it the LLM shapes ran ~3% slower). Whole runs of
 * 32 columns are interleaved from two 64-byte loads by two vpermt2w (+1% at the LLM
 * shapes, +6-8% at 12..24 rows, where packing is ~40% of the time, over two masked
 * 32-byte loads, an insert and a vpermw per 16 columns, which the tail still takes).
 * Lanes past n, to the end of the last panel, are zero. */
#define PACK_AHEAD 4
BF16_TARGET void tpu__bf16_pack_rows(uint32_t* dst, int lanes, int64_t pstride, int64_t np, const uint16_t* base,
                                     int64_t sk, int n, int64_t kb) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                       23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  /* two rows of 32 columns: words of columns 0..15 and 16..31 */
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                      39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  int sh = __builtin_ctz((unsigned)lanes), cols = (n + lanes - 1) / lanes * lanes; /* whole panels */
  /* the word of pair p, column l */
#define AT(l) (dst + ((int64_t)(l) >> sh) * pstride + p * lanes + ((l) & (lanes - 1)))
  for (int64_t p = 0; p < np; ++p) {
    const uint16_t* r0 = base + 2 * p * sk;
    bool has1 = 2 * p + 1 < kb;
    if (2 * (p + PACK_AHEAD) + 1 < kb)
      for (int l = 0; l < n; l += 32) {
        _mm_prefetch((const char*)(r0 + 2 * PACK_AHEAD * sk + l), _MM_HINT_T0);
        _mm_prefetch((const char*)(r0 + (2 * PACK_AHEAD + 1) * sk + l), _MM_HINT_T0);
      }
    int l = 0;
    if (has1)
      for (; l + 32 <= n; l += 32) {
        __m512i x0 = _mm512_loadu_si512(r0 + l), x1 = _mm512_loadu_si512(r0 + sk + l);
        _mm512_store_si512(AT(l), _mm512_permutex2var_epi16(x0, lo, x1));
        _mm512_store_si512(AT(l + 16), _mm512_permutex2var_epi16(x0, hi, x1));
      }
    for (; l < cols; l += 16) {
      int cnt = n - l < 0 ? 0 : n - l < 16 ? n - l : 16;
      __mmask16 m = (__mmask16)((1u << cnt) - 1);
      __m256i x0 = _mm256_maskz_loadu_epi16(m, r0 + l);
      __m256i x1 = has1 ? _mm256_maskz_loadu_epi16(m, r0 + sk + l) : _mm256_setzero_si256();
      __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(x0), x1, 1);
      _mm512_store_si512(AT(l), _mm512_permutexvar_epi16(idx, both));
    }
  }
#undef AT
}

typedef struct bf16_gemm_s {
  int64_t M, N, K, kp;
  const uint16_t *a, *b;
  int64_t sam, sak, sbk, sbn; /* strides in elements */
  float alpha, beta;
  float* c;
  int64_t ldc;
  uint32_t* pa;       /* packed A panels, kp * MR words each */
  uint32_t* pbt;      /* per thread: one K block of a task's B panels, kcp * nc words */
  int64_t kcp;        /* K pairs per block: kp split evenly into blocks of at most KCP */
  int64_t mc, nc;     /* task size: multiples of MR and NR */
  int64_t ntasks;     /* tasks per row of tasks */
} bf16_gemm_t;

BF16_TARGET static void pack_a_panel(void* ctx, int64_t i, int tid) {
  bf16_gemm_t* g = ctx;
  int64_t r0 = i * MR;
  int n = (int)(g->M - r0 < MR ? g->M - r0 : MR);
  tpu__bf16_pack_pairs(g->pa + i * g->kp * MR, MR, g->a + r0 * g->sam, g->sam, g->sak, n, g->K);
}

/* Row-major A (pairs adjacent in memory) in groups of 48 rows, 8 whole panels: blocks of
 * 16 rows x 16 pairs are transposed in registers and each column (one pair of 16 rows)
 * is stored into the panels its rows fall in with masked stores; rows past M read as
 * zero. A lane l of column c goes to (panel of row l) + c * MR + (row l mod MR). */
#define A_GROUP (8 * MR)

BF16_TARGET static void pack_a_group(void* ctx, int64_t grp, int tid) {
  bf16_gemm_t* g = ctx;
  int64_t r0 = grp * A_GROUP, kp = g->kp, full = g->K / 2;
  int64_t rend = (g->M + MR - 1) / MR * MR; /* rows up to the end of the last panel */
  if (rend > r0 + A_GROUP) rend = r0 + A_GROUP;
  const uint16_t* a = g->a;
  for (int64_t rb = r0; rb < rend; rb += 16) {
    int nrow = (int)(rend - rb < 16 ? rend - rb : 16);
    for (int64_t p0 = 0; p0 < full; p0 += 16) {
      __mmask16 m = full - p0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (full - p0)) - 1);
      __m512i r[16];
      for (int l = 0; l < 16; ++l)
        r[l] = l < nrow && rb + l < g->M ? _mm512_maskz_loadu_epi32(m, a + (rb + l) * g->sam + 2 * p0)
                                         : _mm512_setzero_si512();
      tpu__avx512_transpose16(r);
      for (int l0 = 0; l0 < nrow;) {
        int64_t row = rb + l0, panel = row / MR;
        int lane = (int)(row % MR), cnt = MR - lane < nrow - l0 ? MR - lane : nrow - l0;
        __mmask16 lanes = (__mmask16)(((1u << cnt) - 1) << l0);
        uint32_t* base = g->pa + panel * kp * MR + lane - l0; /* lane l0 lands on `lane` */
        for (int c = 0; c < 16 && p0 + c < full; ++c)
          _mm512_mask_storeu_epi32(base + (p0 + c) * MR, lanes, r[c]);
        l0 += cnt;
      }
    }
    if (g->K & 1)
      for (int l = 0; l < nrow; ++l) {
        int64_t row = rb + l;
        g->pa[row / MR * kp * MR + full * MR + row % MR] = row < g->M ? a[row * g->sam + g->K - 1] : 0;
      }
  }
}

/* Column-major A (rows adjacent in memory: a transposed operand, as dY^T in a weight
 * gradient), A_COLS_PAIRS pairs of K columns per work item, all rows, in groups of 48: for
 * each pair, 16 rows of the two K columns are interleaved into 16 words in a register
 * (as tpu__bf16_pack_rows does) and stored into the panels their rows fall in with masked
 * stores; rows past M read as zero. An item reads its columns whole, one after another
 * (items of 48 rows over all K, each load on another page when M is large, were ~2%
 * slower). (It replaced tpu__bf16_pack_pairs's element-by-element loop here: +3-5% at the LLM
 * shapes with A transposed.) */
#define A_COLS_PAIRS 64
BF16_TARGET static void pack_a_cols(void* ctx, int64_t item, int tid) {
  bf16_gemm_t* g = ctx;
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                       23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  int64_t kp = g->kp, p0 = item * A_COLS_PAIRS, p1 = p0 + A_COLS_PAIRS < kp ? p0 + A_COLS_PAIRS : kp;
  int64_t rows = (g->M + MR - 1) / MR * MR; /* rows up to the end of the last panel */
  for (int64_t r0 = 0; r0 < rows; r0 += A_GROUP) {
    int64_t rend = rows < r0 + A_GROUP ? rows : r0 + A_GROUP;
    /* per 16-row vector: its load mask and the panels its lanes go to (at most 4) */
    int nvec = (int)((rend - r0 + 15) / 16), nseg[3] = {0, 0, 0};
    __mmask16 load[3], segm[3][4];
    uint32_t* segp[3][4];
    for (int v = 0; v < nvec; ++v) {
      int64_t rb = r0 + 16 * v, valid = g->M - rb < 0 ? 0 : g->M - rb < 16 ? g->M - rb : 16;
      int nrow = (int)(rend - rb < 16 ? rend - rb : 16);
      load[v] = (__mmask16)((1u << valid) - 1);
      for (int l0 = 0; l0 < nrow;) {
        int64_t row = rb + l0;
        int lane = (int)(row % MR), cnt = MR - lane < nrow - l0 ? MR - lane : nrow - l0;
        segm[v][nseg[v]] = (__mmask16)(((1u << cnt) - 1) << l0);
        segp[v][nseg[v]++] = g->pa + row / MR * kp * MR + lane - l0; /* lane l0 lands on `lane` */
        l0 += cnt;
      }
    }
    for (int64_t p = p0; p < p1; ++p) {
      const uint16_t* k0 = g->a + r0 + 2 * p * g->sak;
      bool has1 = 2 * p + 1 < g->K;
      for (int v = 0; v < nvec; ++v) {
        __m256i x0 = _mm256_maskz_loadu_epi16(load[v], k0 + 16 * v);
        __m256i x1 = has1 ? _mm256_maskz_loadu_epi16(load[v], k0 + g->sak + 16 * v) : _mm256_setzero_si256();
        __m512i w = _mm512_permutexvar_epi16(idx, _mm512_inserti64x4(_mm512_castsi256_si512(x0), x1, 1));
        for (int sg = 0; sg < nseg[v]; ++sg) _mm512_mask_storeu_epi32(segp[v][sg] + p * MR, segm[v][sg], w);
      }
    }
  }
}

/* C[mr, nr] (row stride ldc) = alpha * acc + beta * C on the first K block (C not read
 * when beta is 0), C += alpha * acc on later ones. A's word for row r and pair p is at
 * byte a + r * ars + p * aps: a packed panel (4, 4 MR) or row-major A read in place
 * (row stride, 4), whose rows from ar_rows on repeat the last (their sums are not stored).
 * Inlined into each caller, so the packed call keeps constant offsets. */
BF16_TARGET static inline __attribute__((always_inline)) void microkernel(
    int64_t np, const char* a, int64_t ars, int64_t aps, int ar_rows, const uint32_t* b, float* c,
    int64_t ldc, int mr, int nr, float alpha, float beta, bool first) {
  const char* ar[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) ar[r] = a + (r < ar_rows ? r : ar_rows - 1) * ars;
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  tpu__avx512_tile_prefetch(c, ldc, mr);
  for (int64_t p = 0; p < np; ++p) {
    __m512bh bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(b + p * NR + v * 16);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      uint32_t w;
      /* rows read in place: six streams, fetched 32 pairs (two lines) ahead */
      if (aps == 4) _mm_prefetch(ar[r] + (p + 32) * 4, _MM_HINT_T0);
      memcpy(&w, ar[r] + p * aps, sizeof w);
      __m512bh av = (__m512bh)_mm512_set1_epi32((int)w);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  tpu__avx512_tile_store(acc, c, ldc, mr, nr, alpha, beta, first);
}

/* Task t: an mc x nc block of C, row-major over the grid of tasks. For each K block the
 * task packs its B panels into its thread's buffer (kcp x nc words, which stays in L2)
 * right before using them; each NR-column B micro-panel then meets every MR-row A
 * micro-panel of the task. (Prefetching the next block's B source into L2 from the
 * microkernel's K loop gained ~1% while A was packed, and lost ~1% once A was read in
 * place: not kept.) */
BF16_TARGET static void run_task(void* ctx, int64_t t, int tid) {
  bf16_gemm_t* g = ctx;
  int64_t m0 = t / g->ntasks * g->mc, n0 = t % g->ntasks * g->nc;
  int64_t m1 = m0 + g->mc < g->M ? m0 + g->mc : g->M, n1 = n0 + g->nc < g->N ? n0 + g->nc : g->N;
  uint32_t* pbt = g->pbt + (int64_t)tid * g->kcp * g->nc;
  for (int64_t p0 = 0; p0 < g->kp; p0 += g->kcp) {
    int64_t np = g->kp - p0 < g->kcp ? g->kp - p0 : g->kcp;
    int64_t kb = g->K - 2 * p0 < 2 * np ? g->K - 2 * p0 : 2 * np; /* K values in the block */
    if (g->sbn == 1)
      tpu__bf16_pack_rows(pbt, NR, np * NR, np, g->b + n0 + 2 * p0 * g->sbk, g->sbk, (int)(n1 - n0), kb);
    else
      for (int64_t j = n0; j < n1; j += NR)
        tpu__bf16_pack_pairs(pbt + (j - n0) / NR * np * NR, NR, g->b + j * g->sbn + 2 * p0 * g->sbk, g->sbn, g->sbk,
                   (int)(n1 - j < NR ? n1 - j : NR), kb);
    for (int64_t j = n0; j < n1; j += NR) {
      const uint32_t* pb = pbt + (j - n0) / NR * np * NR;
      int nr = (int)(n1 - j < NR ? n1 - j : NR);
      for (int64_t i = m0; i < m1; i += MR) {
        int mr = (int)(m1 - i < MR ? m1 - i : MR);
        float* c = g->c + i * g->ldc + j;
        if (g->pa)
          microkernel(np, (const char*)(g->pa + (i / MR) * g->kp * MR + p0 * MR), 4, 4 * MR, MR, pb, c,
                      g->ldc, mr, nr, g->alpha, g->beta, p0 == 0);
        else
          microkernel(np, (const char*)(g->a + i * g->sam + 2 * p0), 2 * g->sam, 4, mr, pb, c, g->ldc, mr, nr,
                      g->alpha, g->beta, p0 == 0);
      }
    }
  }
}

/* ---- few rows (M <= SMALL_M): no packed B ---------------------------------------------
 * With a handful of rows (a linear layer at decode) packing B costs more than the product,
 * which is bound by reading B once. A's rows are copied dense (f32 for the row-major B
 * kernel, bf16 zero-padded to whole vectors for the transposed one) and B is read in
 * place: row-major B by f32 FMAs on widened B rows (products of bf16 are exact in f32, as
 * in vdpbf16ps), transposed B (K contiguous) by vdpbf16ps dot products. */
#define SMALL_M 4
#define SMALL_JT 4 /* transposed B: output columns per step */

typedef struct bf16_small_s {
  int64_t M, N, K, kv;      /* kv: K rounded up to whole 32-element vectors */
  const uint16_t* b;
  int64_t sbk, sbn;
  float alpha, beta;
  float* c;
  int64_t ldc;
  const void* a;            /* [M][K] f32 (row-major B) or [M][kv] bf16 (transposed B) */
} bf16_small_t;

BF16_TARGET static inline void small_store(const bf16_small_t* s, float* c, float v) {
  *c = s->beta != 0.0f ? s->alpha * v + s->beta * *c : s->alpha * v;
}

/* Row-major B (unit column stride): columns [j0, j0 + 64) of every row. */
BF16_TARGET static void small_rows_block(void* ctx, int64_t blk, int tid) {
  const bf16_small_t* s = ctx;
  int64_t j0 = blk * 64;
  int nr = (int)(s->N - j0 < 64 ? s->N - j0 : 64);
  const float* a = s->a;
  __m512 acc[SMALL_M][4];
  for (int i = 0; i < SMALL_M; ++i)
    for (int v = 0; v < 4; ++v) acc[i][v] = _mm512_setzero_ps();
  __mmask16 m[4];
  for (int v = 0; v < 4; ++v) m[v] = tpu__avx512_lanes(nr - 16 * v);
  for (int64_t k = 0; k < s->K; ++k) {
    const uint16_t* br = s->b + k * s->sbk + j0;
    __m512 bv[4];
    for (int v = 0; v < 4; ++v) { /* bf16 -> f32: the 16 bits become the high half */
      __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m[v], br + 16 * v));
      bv[v] = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    }
    for (int i = 0; i < s->M; ++i) {
      __m512 av = _mm512_set1_ps(a[i * s->K + k]);
      for (int v = 0; v < 4; ++v) acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);
    }
  }
  float out[64];
  for (int i = 0; i < s->M; ++i) {
    for (int v = 0; v < 4; ++v) _mm512_storeu_ps(out + 16 * v, acc[i][v]);
    for (int j = 0; j < nr; ++j) small_store(s, s->c + i * s->ldc + j0 + j, out[j]);
  }
}

/* Transposed B (unit K stride): output columns [16 blk, 16 blk + 16), SMALL_JT at a time. */
BF16_TARGET static void small_cols_block(void* ctx, int64_t blk, int tid) {
  const bf16_small_t* s = ctx;
  int64_t j0 = blk * 16, j1 = j0 + 16 < s->N ? j0 + 16 : s->N;
  const uint16_t* a = s->a;
  for (int64_t j = j0; j < j1; j += SMALL_JT) {
    int nj = (int)(j1 - j < SMALL_JT ? j1 - j : SMALL_JT);
    __m512 acc[SMALL_M][SMALL_JT];
    for (int i = 0; i < SMALL_M; ++i)
      for (int t = 0; t < SMALL_JT; ++t) acc[i][t] = _mm512_setzero_ps();
    for (int64_t k = 0; k < s->kv; k += 32) {
      __mmask32 m = s->K - k >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << (s->K - k)) - 1);
      __m512bh bv[SMALL_JT];
      for (int t = 0; t < SMALL_JT; ++t)
        bv[t] = (__m512bh)(t < nj ? _mm512_maskz_loadu_epi16(m, s->b + (j + t) * s->sbn + k)
                                  : _mm512_setzero_si512());
      for (int i = 0; i < s->M; ++i) {
        __m512bh av = (__m512bh)_mm512_loadu_si512(a + i * s->kv + k);
        for (int t = 0; t < SMALL_JT; ++t) acc[i][t] = _mm512_dpbf16_ps(acc[i][t], av, bv[t]);
      }
    }
    for (int i = 0; i < s->M; ++i)
      for (int t = 0; t < nj; ++t)
        small_store(s, s->c + i * s->ldc + j + t, _mm512_reduce_add_ps(acc[i][t]));
  }
}

BF16_TARGET static tpu_status_t gemm_small(int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* a,
                               int64_t sam, int64_t sak, const uint16_t* b, int64_t sbk, int64_t sbn,
                               float beta, float* c, int64_t ldc) {
  bool cols = sbk == 1; /* else sbn == 1 */
  bf16_small_t s = {.M = M, .N = N, .K = K, .kv = (K + 31) / 32 * 32, .b = b, .sbk = sbk, .sbn = sbn,
                    .alpha = alpha, .beta = beta, .c = c, .ldc = ldc};
  uint64_t bytes;
  if (!tpu__mul_ok((uint64_t)M, (uint64_t)(cols ? s.kv * 2 : K * 4), &bytes) || bytes > SIZE_MAX)
    return TPU_HOST_NOMEM();
  void* buf = tpu__malloc((size_t)bytes);
  if (!buf) return TPU_HOST_NOMEM();
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < (cols ? s.kv : K); ++k) {
      uint16_t x = k < K ? a[i * sam + k * sak] : 0;
      if (cols) ((uint16_t*)buf)[i * s.kv + k] = x;
      else ((float*)buf)[i * K + k] = tpu__bf16_to_f32(x);
    }
  s.a = buf;
  /* bound by reading B: worth a region once B is a few hundred KiB */
  int threads = (double)K * (double)N < 8.0 * TPU_PARALLEL_MIN_WORK ? 1 : tpu__num_threads();
  tpu_status_t st = cols ? tpu__run_items(&s, small_cols_block, (N + 15) / 16, threads)
                         : tpu__run_items(&s, small_rows_block, (N + 63) / 64, threads);
  tpu__free(buf);
  return st;
}

/* Few rows: dot products win up to 4 rows, the widened-row FMAs (half the vdpbf16ps rate)
 * up to 2 (measured against the packed path). */
static bool small_product(int64_t M, int64_t sbk, int64_t sbn) { return sbk == 1 ? M <= SMALL_M : sbn == 1 && M <= 2; }

/* tpu__gemm_bf16_out16 (host.h): the AMX path, which takes every product past a few rows. */
bool tpu__gemm_bf16_out16(int64_t M, int64_t sbk, int64_t sbn) {
  return !small_product(M, sbk, sbn) && tpu__gemm_bf16_amx();
}

BF16_TARGET tpu_status_t tpu__gemm_bf16(int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* a,
                            int64_t sam, int64_t sak, const uint16_t* b, int64_t sbk, int64_t sbn,
                            float beta, float* c, uint16_t* c16, int64_t ldc) {
  bf16_gemm_t g = {.M = M, .N = N, .K = K, .kp = (K + 1) / 2, .a = a, .b = b, .sam = sam,
                   .sak = sak, .sbk = sbk, .sbn = sbn, .alpha = alpha, .beta = beta, .c = c,
                   .ldc = ldc};
  if (M <= 0 || N <= 0 || K <= 0) return NULL; /* the caller handles empty products */
  if (tpu__gemm_bf16_out16(M, sbk, sbn)) return tpu__gemm_amx(M, N, K, alpha, a, sam, sak, b, sbk, sbn, beta, c, c16, ldc);
  if (small_product(M, sbk, sbn)) return gemm_small(M, N, K, alpha, a, sam, sak, b, sbk, sbn, beta, c, ldc);
  int64_t ma = (M + MR - 1) / MR;
  /* below the BLAS threshold a region's wake-up costs more than it saves */
  bool serial = 2.0 * (double)M * (double)N * (double)K < TPU_GEMM_SPLIT_FLOPS;
  int threads = serial ? 1 : tpu__num_threads();
  int64_t tasks = tpu__split_tasks(M, N, MR, NR, MC, NC, threads, &g.mc, &g.nc, &g.ntasks);
  int64_t kblocks = tpu__cdiv(g.kp, KCP);
  g.kcp = tpu__cdiv(g.kp, kblocks);
  /* Row-major A with an even K is read in place, each pair a 32-bit word of its row (an
   * odd K's last pair would read past the row): measured 1-3% faster than packing it. */
  bool direct_a = sak == 1 && K % 2 == 0;
  uint64_t na = 0, nbw;
  /* packed A, then a B buffer per pool thread (tasks index theirs by tid) */
  if ((!direct_a && !tpu__mul_ok((uint64_t)(ma * MR), (uint64_t)g.kp * sizeof(uint32_t), &na)) ||
      na > SIZE_MAX / 2 ||
      !tpu__mul_ok((uint64_t)threads * (uint64_t)(g.kcp * g.nc), sizeof(uint32_t), &nbw) ||
      na + nbw > SIZE_MAX - 128)
    return TPU_HOST_NOMEM();
  na = (na + 63) / 64 * 64;
  /* one buffer, 64-byte aligned: the B buffers and B panels (kcp x NR words) start on a
   * cache line */
  char* buf = tpu__malloc((size_t)(na + nbw) + 64);
  if (!buf) return TPU_HOST_NOMEM();
  char* base = (char*)(((uintptr_t)buf + 63) & ~(uintptr_t)63);
  g.pa = direct_a ? NULL : (uint32_t*)base;
  g.pbt = (uint32_t*)(base + na);
  tpu_status_t st = direct_a ? NULL
                    : sak == 1 ? tpu__run_items(&g, pack_a_group, (M + A_GROUP - 1) / A_GROUP, threads)
                    : sam == 1 ? tpu__run_items(&g, pack_a_cols, tpu__cdiv(g.kp, A_COLS_PAIRS), threads)
                               : tpu__run_items(&g, pack_a_panel, ma, threads);
  if (!st) st = tpu__run_items(&g, run_task, tasks, threads);
  tpu__free(buf);
  return st;
}

