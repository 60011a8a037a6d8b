/* bf16 x bf16 -> f32 GEMM on AMX tiles (tdpbf16ps), for tpu__gemm_bf16 on CPUs that have
 * AMX-BF16 (Sapphire Rapids on); contract in host/host.h.
 *
 * A tile register holds up to 16 rows of 64 bytes. tdpbf16ps multiplies an A tile of 16
 * rows x 32 bf16 (K) by a B tile of 16 K-pairs x 16 columns, each row holding the pairs
 * (B[2p][j], B[2p+1][j]) of its 16 columns, and adds into a 16 x 16 f32 C tile. Both
 * operands are packed, at any strides, into 1 KiB tiles zero-padded past M, N and K, and
 * into an even number of row and column tiles, so every C block is 2 x 2 tiles (32 x 32):
 * four accumulators, two A and two B tiles per K step, the eight tile registers. Padding
 * contributes zeros and is never stored. Blocks are shared out over the pool in an order
 * that holds chunks of the larger operand in cache while the smaller one streams past
 * them (block_at). A is packed whole up front; B too when it is the streamed operand,
 * and when it is the held one each thread packs a chunk into its own buffer just before
 * the chunk's first block, so packed B never goes out to memory. A block goes between
 * its tiles and an f32 C directly (alpha 1, beta 0 or 1), or through a small buffer that
 * scales, adds beta C or rounds to bf16 (c16). Like vdpbf16ps, tdpbf16ps treats denormal
 * inputs as zero; products are exact in f32 and only the summation order differs from
 * the other paths. Every element of C is one block's sum over its K pass (long K runs
 * in passes of 1024, added up in f32: tpu__gemm_amx), whichever thread runs it, so
 * results do not depend on the thread count.
 *
 * Linux gives a process the tile state only on request (arch_prctl
 * ARCH_REQ_XCOMP_PERM for XTILEDATA); each thread loads a tile configuration before its
 * blocks and releases the tiles after them. TORCHTPU_BF16_GEMM=avx512 keeps the
 * AVX512-BF16 kernel (to compare the two; host/linalg.c). */
#include <cpuid.h>
#include <immintrin.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "host/host.h"

#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw")))

#define TROWS 16               /* rows of a tile */
#define TK 32                  /* bf16 K values in an A tile row (16 pairs) */
#define TILE_ELEMS (TROWS * TK) /* bf16 elements in a 1 KiB tile */

/* cpuid's AMX-BF16 and AMX-TILE bits, and Linux's grant of the tile state to this
 * process (asked once, by host/linalg.c's bf16_gemm_kind). */
bool tpu__amx_bf16_available(void) {
  unsigned a, b, c, d;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1u) && (d >> 24 & 1u) &&
         syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
}

typedef struct amx_gemm_s {
  int64_t M, N, K, mt, nt, kt; /* tiles along M (even), N (even) and K */
  const uint16_t *a, *b;
  int64_t sam, sak, sbk, sbn;
  uint16_t *pa, *pb; /* packed: tile (i, k) of A at pa + (i * kt + k) * TILE_ELEMS, B alike */
  uint16_t* pbt;     /* held B: per thread, one chunk's tile pairs, packed by run_blocks */
  int64_t pbt_elems;
  float alpha, beta;
  float* c;
  int64_t ldc;
  bool hold_b;  /* blocks ordered to hold B's tile columns in cache (block_at) */
  int64_t chunk; /* held tile-pairs per chunk */
  uint16_t* c16; /* when set, C is bf16 here (row stride ldc), rounded as blocks are stored */
  bool direct; /* f32 C = A B or C += A B (alpha 1, beta 0 or 1): whole blocks start from
                * C's tiles (beta 1) and go from the tiles straight back to C */
} amx_gemm_t;

/* One 16-lane column of whole-K tiles at d (kt tiles, pairs past K zero) from n <= 16
 * lines X[l][k] = base[l * sl + k * sk] (tpu__bf16_pack_pairs); n <= 0: all zero. */
static void pack_pair_tiles(const amx_gemm_t* g, uint32_t* d, const uint16_t* base, int64_t sl, int64_t sk,
                            int64_t n) {
  int64_t words = g->kt * TILE_ELEMS / 2, done = n > 0 ? (g->K + 1) / 2 * TROWS : 0;
  if (n > 0) tpu__bf16_pack_pairs(d, TROWS, base, sl, sk, (int)n, g->K);
  memset(d + done, 0, (size_t)(words - done) * sizeof(uint32_t));
}

/* Row tile i of A: 16 rows x all K tiles, row r of tile (i, k) holding A[16i + r][32k ..].
 * Rows contiguous in K are copied 32 values at a time. Transposed A (rows adjacent: a
 * weight gradient's G^T) is packed as B is (tpu__bf16_pack_pairs, two K rows interleaved
 * into words of 16 rows), which is each tile transposed as 16 x 16 words. */
static tpu_status_t pack_a(void* ctx, int64_t i0, int64_t i1, int tid) {
  (void)tid;
  const amx_gemm_t* g = ctx;
  for (int64_t i = i0; i < i1; ++i) {
    uint16_t* dst = g->pa + i * g->kt * TILE_ELEMS;
    int64_t rows = g->M - i * TROWS < TROWS ? g->M - i * TROWS : TROWS;
    if (g->sam == 1 && g->sak != 1 && rows > 0) {
      pack_pair_tiles(g, (uint32_t*)dst, g->a + i * TROWS, 1, g->sak, rows);
      for (int64_t k = 0; k < g->kt; ++k) tpu__transpose_words16((uint32_t*)(dst + k * TILE_ELEMS));
      continue;
    }
    memset(dst, 0, (size_t)(g->kt * TILE_ELEMS) * sizeof(uint16_t));
    for (int64_t r = 0; r < rows; ++r) {
      const uint16_t* src = g->a + (i * TROWS + r) * g->sam;
      if (g->sak == 1)
        for (int64_t k = 0; k < g->K; k += TK)
          memcpy(dst + (k / TK) * TILE_ELEMS + r * TK, src + k,
                 (size_t)(g->K - k < TK ? g->K - k : TK) * sizeof(uint16_t));
      else
        for (int64_t k = 0; k < g->K; ++k) dst[(k / TK) * TILE_ELEMS + r * TK + k % TK] = src[k * g->sak];
    }
  }
  return NULL;
}

/* Column tiles [j0, j1) of B (j0 even), K tiles [k0, k1), into dst: tile (j, k) at dst +
 * (j - j0) * kt * TILE_ELEMS + k * TILE_ELEMS. Row p of tile (j, k) holds the words
 * (B[32k + 2p][16j + q], B[32k + 2p + 1][16j + q]), q = 0..15: the AVX512-BF16 kernel's
 * packed panel with 16 lanes; pairs past K and columns past N are zero. Row-major B
 * (sbn == 1) goes K tile by K tile, 32 columns at a time, from 64-byte runs of the K
 * tile's 32 rows (tpu__bf16_pack_rows): the rows are read as sequential streams and the
 * stores land in the 2 KiB being written (a column tile at a time read 32 bytes of every
 * K row per tile, and stores that swept all column tiles for one pair of rows, 64 KiB
 * apart at K = 1024, fell into one L1 set). Other layouts take whole K (k0 = 0, k1 = kt),
 * a column tile at a time (tpu__bf16_pack_pairs). */
static void pack_b_part(const amx_gemm_t* g, uint16_t* dst, int64_t j0, int64_t j1, int64_t k0, int64_t k1) {
  int64_t words = g->kt * TILE_ELEMS / 2;
  if (g->sbn != 1) {
    for (int64_t j = j0; j < j1; ++j)
      pack_pair_tiles(g, (uint32_t*)dst + (j - j0) * words, g->b + j * TROWS * g->sbn, g->sbn, g->sbk,
                      g->N - j * TROWS < TROWS ? g->N - j * TROWS : TROWS);
    return;
  }
  for (int64_t k = k0; k < k1; ++k) {
    int64_t kb = g->K - k * TK < TK ? g->K - k * TK : TK, np = (kb + 1) / 2;
    const uint16_t* src = g->b + k * TK * g->sbk;
    for (int64_t j = j0; j < j1; j += 2) {
      uint32_t* d = (uint32_t*)(dst + k * TILE_ELEMS) + (j - j0) * words;
      int64_t n = g->N - j * TROWS < 2 * TROWS ? g->N - j * TROWS : 2 * TROWS;
      if (n > 0) tpu__bf16_pack_rows(d, TROWS, words, np, src + j * TROWS, g->sbk, (int)n, kb);
      for (int64_t t = 0; t < 2; ++t) {
        int64_t from = n > t * TROWS ? np : 0;
        if (from < TK / 2) memset(d + t * words + from * TROWS, 0, (size_t)((TK / 2 - from) * TROWS) * sizeof(uint32_t));
      }
    }
  }
}

/* All of B up front (when A is the held operand), split by K tiles (row-major B) or by
 * column tile pairs. */
static tpu_status_t pack_b_ktiles(void* ctx, int64_t k0, int64_t k1, int tid) {
  (void)tid;
  const amx_gemm_t* g = ctx;
  pack_b_part(g, g->pb, 0, g->nt, k0, k1);
  return NULL;
}
static tpu_status_t pack_b_pairs(void* ctx, int64_t p0, int64_t p1, int tid) {
  (void)tid;
  const amx_gemm_t* g = ctx;
  pack_b_part(g, g->pb + 2 * p0 * g->kt * TILE_ELEMS, 2 * p0, 2 * p1, 0, g->kt);
  return NULL;
}

typedef struct tilecfg_s {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tilecfg_t;

/* Block number blk -> (row pair bi, column pair bj). The larger operand's tile pairs are
 * held: in chunks of `chunk` pairs (about 512 KiB of tiles, which stay in L2), each chunk
 * meets every pair of the smaller operand in turn, and that pair meets the chunk's pairs
 * one after another from L1. So the smaller operand streams once per chunk and the larger
 * once in all (512 x 4096 x 1024: 4 MiB of A against 8 MiB of B, B held). Contiguous
 * runs of blocks, as the pool hands them out, keep this order. Chunks of 512 KiB against
 * 256 KiB / 1 MiB / 1.5 MiB on Emerald Rapids (2 MiB L2), 2 threads, best of three,
 * GFLOP/s: 512x1024x3072 861 vs 708 / 1067 / 623, 512x1024x4096 873 vs 765 / 679 / 487,
 * 512x4096x1024 449 vs 396 / 426 / 445, 1024^3 578 vs 520 / 503 / 469. */
static void block_at(const amx_gemm_t* g, int64_t blk, int64_t* bi, int64_t* bj) {
  int64_t nh = g->hold_b ? g->nt / 2 : g->mt / 2, ns = g->hold_b ? g->mt / 2 : g->nt / 2;
  int64_t full = nh / g->chunk * g->chunk * ns; /* blocks in whole chunks */
  int64_t h, sidx;
  if (blk < full) {
    int64_t c = blk / (g->chunk * ns), r = blk % (g->chunk * ns);
    sidx = r / g->chunk;
    h = c * g->chunk + r % g->chunk;
  } else {
    int64_t w = nh % g->chunk, r = blk - full;
    sidx = r / w;
    h = nh / g->chunk * g->chunk + r % w;
  }
  *bi = g->hold_b ? sidx : h;
  *bj = g->hold_b ? h : sidx;
}

/* C blocks [b0, b1) of 32 x 32 (block_at). */
AMX_TARGET static tpu_status_t run_blocks(void* ctx, int64_t b0, int64_t b1, int tid) {
  const amx_gemm_t* g = ctx;
  tilecfg_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = TROWS;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  const int64_t tstride = g->kt * TILE_ELEMS;
  uint16_t* held = g->pbt ? g->pbt + tid * g->pbt_elems : NULL;
  int64_t have = -1; /* the chunk of B in held */
  float out[2 * TROWS][2 * TROWS];
  for (int64_t blk = b0; blk < b1; ++blk) {
    int64_t bi, bj;
    block_at(g, blk, &bi, &bj);
    const uint16_t* a0 = g->pa + (2 * bi) * tstride;
    const uint16_t* a1 = a0 + tstride;
    const uint16_t* p0;
    if (held) { /* B's chunk packed here, just before its first use: it stays in L2 */
      int64_t c = bj / g->chunk, h0 = c * g->chunk, h1 = h0 + g->chunk < g->nt / 2 ? h0 + g->chunk : g->nt / 2;
      if (c != have) pack_b_part(g, held, 2 * h0, 2 * h1, 0, g->kt);
      have = c;
      p0 = held + 2 * (bj - h0) * tstride;
    } else {
      p0 = g->pb + (2 * bj) * tstride;
    }
    const uint16_t* p1 = p0 + tstride;
    int64_t i0 = bi * 2 * TROWS, j0 = bj * 2 * TROWS;
    int64_t rows = g->M - i0 < 2 * TROWS ? g->M - i0 : 2 * TROWS;
    int64_t cols = g->N - j0 < 2 * TROWS ? g->N - j0 : 2 * TROWS;
    bool direct = g->direct && rows == 2 * TROWS && cols == 2 * TROWS;
    float* c = g->c16 ? NULL : g->c + i0 * g->ldc + j0;
    int64_t ld = g->ldc * (int64_t)sizeof(float);
    if (direct && g->beta != 0.0f) {
      _tile_loadd(0, c, ld);
      _tile_loadd(1, c + TROWS, ld);
      _tile_loadd(2, c + TROWS * g->ldc, ld);
      _tile_loadd(3, c + TROWS * g->ldc + TROWS, ld);
    } else {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
    }
    for (int64_t k = 0; k < g->kt; ++k) {
      _tile_loadd(4, a0 + k * TILE_ELEMS, 64);
      _tile_loadd(5, a1 + k * TILE_ELEMS, 64);
      _tile_loadd(6, p0 + k * TILE_ELEMS, 64);
      _tile_loadd(7, p1 + k * TILE_ELEMS, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    if (direct) { /* the accumulators go straight to C */
      _tile_stored(0, c, ld);
      _tile_stored(1, c + TROWS, ld);
      _tile_stored(2, c + TROWS * g->ldc, ld);
      _tile_stored(3, c + TROWS * g->ldc + TROWS, ld);
      continue;
    }
    _tile_stored(0, &out[0][0], sizeof out[0]);
    _tile_stored(1, &out[0][TROWS], sizeof out[0]);
    _tile_stored(2, &out[TROWS][0], sizeof out[0]);
    _tile_stored(3, &out[TROWS][TROWS], sizeof out[0]);
    /* alpha A B + beta C into C, or into c16 rounded to bf16 (C then holds the f32 sums
     * of earlier K passes, if any); with beta 0, C is not read: NaN there must not reach
     * the result */
    for (int64_t r = 0; r < rows; ++r) {
      const float* prev = g->beta == 0.0f ? NULL : g->c + (i0 + r) * g->ldc + j0;
      float v[2 * TROWS];
      for (int64_t q = 0; q < cols; ++q) v[q] = prev ? g->alpha * out[r][q] + g->beta * prev[q] : g->alpha * out[r][q];
      if (g->c16)
        for (int64_t q = 0; q < cols; ++q) g->c16[(i0 + r) * g->ldc + j0 + q] = tpu__f32_to_bf16(v[q]);
      else
        memcpy(c + r * g->ldc, v, (size_t)cols * sizeof(float));
    }
  }
  _tile_release();
  return NULL;
}

/* One product over all of its K (tpu__gemm_amx splits long K into passes). */
static tpu_status_t amx_pass(int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* a, int64_t sam,
                             int64_t sak, const uint16_t* b, int64_t sbk, int64_t sbn, float beta, float* c,
                             uint16_t* c16, int64_t ldc) {
  amx_gemm_t g = {.M = M, .N = N, .K = K, .a = a, .b = b, .sam = sam, .sak = sak, .sbk = sbk, .sbn = sbn,
                  .alpha = alpha, .beta = beta, .c = c, .c16 = c16, .ldc = ldc};
  g.mt = (M + 2 * TROWS - 1) / (2 * TROWS) * 2;
  g.nt = (N + 2 * TROWS - 1) / (2 * TROWS) * 2;
  g.kt = (K + TK - 1) / TK;
  /* below the BLAS threshold a region's wake-up costs more than it saves */
  bool serial = 2.0 * (double)M * (double)N * (double)K < TPU_GEMM_SPLIT_FLOPS;
  int threads = serial ? 1 : tpu__num_threads();
  uint64_t na, nb, pair;
  if (!tpu__mul_ok((uint64_t)g.mt * (uint64_t)g.kt, TILE_ELEMS * sizeof(uint16_t), &na) ||
      !tpu__mul_ok((uint64_t)g.nt * (uint64_t)g.kt, TILE_ELEMS * sizeof(uint16_t), &nb) || na > SIZE_MAX / 4 ||
      nb > SIZE_MAX / 4)
    return TPU_HOST_NOMEM();
  pair = 2 * (uint64_t)g.kt * TILE_ELEMS * sizeof(uint16_t);
  g.hold_b = nb >= na;
  g.chunk = (512 << 10) / (int64_t)pair;
  if (g.chunk < 1) g.chunk = 1;
  /* held B is packed chunk by chunk into each thread's buffer (run_blocks); A, or B when
   * it is the streamed operand, is packed whole up front */
  bool in_loop = g.hold_b;
  uint64_t nbt = in_loop ? (uint64_t)g.chunk * pair : 0;
  if (in_loop && (nbt > SIZE_MAX / 4 / (uint64_t)threads)) return TPU_HOST_NOMEM();
  uint64_t bytes = na + (in_loop ? nbt * (uint64_t)threads : nb);
  char* buf = tpu__malloc((size_t)bytes + 64);
  if (!buf) return TPU_HOST_NOMEM();
  g.pa = (uint16_t*)(((uintptr_t)buf + 63) & ~(uintptr_t)63); /* tiles on cache lines */
  g.pb = in_loop ? NULL : g.pa + na / sizeof(uint16_t);
  g.pbt = in_loop ? g.pa + na / sizeof(uint16_t) : NULL;
  g.pbt_elems = (int64_t)(nbt / sizeof(uint16_t));
  int64_t blocks = (g.mt / 2) * (g.nt / 2);
  g.direct = !c16 && alpha == 1.0f && (beta == 0.0f || beta == 1.0f);
  tpu_status_t st = serial ? pack_a(&g, 0, g.mt, 0) : tpu__parallel_for(g.mt, 1, pack_a, &g);
  if (!st && !in_loop) {
    tpu_parallel_fn pb = sbn == 1 ? pack_b_ktiles : pack_b_pairs;
    int64_t pn = sbn == 1 ? g.kt : g.nt / 2;
    st = serial ? pb(&g, 0, pn, 0) : tpu__parallel_for(pn, 1, pb, &g);
  }
  if (!st) st = serial ? run_blocks(&g, 0, blocks, 0) : tpu__parallel_for(blocks, 1, run_blocks, &g);
  tpu__free(buf);
  return st;
}

/* Long K runs in passes of at most PASS_KT tiles (1024 values), each a product over its
 * slice of K added into C: pass 1 stores alpha A1 B1 + beta C, the later ones add alpha
 * Ap Bp with beta 1 (whole blocks start from C's tiles). A pass's operands are a quarter
 * of a K = 4096 product's, so a chunk holds four times as many B tile pairs and A streams
 * a quarter as often (512x4096x1024 read 64 MiB of A tiles in one pass). A bf16 result
 * collects the passes in f32 scratch and is rounded by the last one. The passes depend
 * on K alone, so results still do not depend on the thread count. */
#define PASS_KT 32

tpu_status_t tpu__gemm_amx(int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* a, int64_t sam,
                           int64_t sak, const uint16_t* b, int64_t sbk, int64_t sbn, float beta, float* c,
                           uint16_t* c16, int64_t ldc) {
  int64_t kt = (K + TK - 1) / TK, passes = (kt + PASS_KT - 1) / PASS_KT;
  if (passes <= 1) return amx_pass(M, N, K, alpha, a, sam, sak, b, sbk, sbn, beta, c, c16, ldc);
  uint64_t nacc;
  if (c16 && !tpu__mul_ok((uint64_t)M, (uint64_t)ldc * sizeof(float), &nacc)) return TPU_HOST_NOMEM();
  float* acc = c16 ? tpu__malloc((size_t)nacc) : c;
  if (!acc) return TPU_HOST_NOMEM();
  tpu_status_t st = NULL;
  for (int64_t p = 0; p < passes && !st; ++p) {
    int64_t k0 = kt * p / passes * TK, k1 = kt * (p + 1) / passes * TK;
    if (k1 > K) k1 = K;
    bool last = p == passes - 1;
    st = amx_pass(M, N, k1 - k0, alpha, a + k0 * sak, sam, sak, b + k0 * sbk, sbk, sbn,
                  p == 0 ? (c16 ? 0.0f : beta) : 1.0f, acc, last ? c16 : NULL, ldc);
  }
  if (c16) tpu__free(acc);
  return st;
}
