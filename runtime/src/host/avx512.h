/* Shared by the AVX-512 GEMM kernels (host/gemm_avx512f32.c, host/gemm_avx512bf16.c):
 * their target attribute, an in-register 16 x 16 transpose of 32-bit words, the C tile's
 * prefetch and store, and a runner that shares work items out over the pool. Compiled for AVX512F/BW/VL/DQ: a caller
 * compiled for a superset (AVX512-BF16) inlines them. Include only from files whose
 * AVX-512 code runs after a cpuid check. */
#ifndef TPURT_HOST_AVX512_H_
#define TPURT_HOST_AVX512_H_

#include <immintrin.h>
#include <stdatomic.h>

#include "host/host.h"

#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

/* In-register transpose of 16 rows of 16 32-bit words: afterwards r[c] holds column c. */
AVX512_TARGET static inline void tpu__avx512_transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  /* r[4i + j], 128-bit lane k: rows 4i..4i+3 of column 4k + j */
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    t[j] = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x88);
    t[4 + j] = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xdd);
    t[8 + j] = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x88);
    t[12 + j] = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xdd);
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0xdd);
    r[4 + j] = _mm512_shuffle_i32x4(t[4 + j], t[12 + j], 0x88);
    r[12 + j] = _mm512_shuffle_i32x4(t[4 + j], t[12 + j], 0xdd);
  }
}

/* The lanes of a 16-float vector that hold one of cnt remaining columns. */
static inline __mmask16 tpu__avx512_lanes(int cnt) {
  return cnt >= 16 ? (__mmask16)0xFFFF : cnt > 0 ? (__mmask16)((1u << cnt) - 1) : 0;
}

/* The C tile both GEMM microkernels keep in registers: TPU_TILE_MR rows of TPU_TILE_NV
 * zmm vectors (6 x 64 floats, 24 accumulators). */
#define TPU_TILE_MR 6
#define TPU_TILE_NV 4

/* Fetches the tile's first mr rows of C (row stride ldc) for writing, while the K loop
 * runs: between K blocks it has usually left L2, and a load that misses at the write-back
 * stalls the core (measured: ~5% of the product at 6 x 64 x 512 bf16 pairs). */
AVX512_TARGET static inline __attribute__((always_inline)) void tpu__avx512_tile_prefetch(const float* c, int64_t ldc,
                                                                                         int mr) {
#pragma GCC unroll 16
  for (int r = 0; r < TPU_TILE_MR; ++r) {
    if (r >= mr) break;
#pragma GCC unroll 8
    for (int v = 0; v < TPU_TILE_NV; ++v) __builtin_prefetch(c + r * ldc + v * 16, 1, 3);
  }
}

/* C[mr, nr] = alpha * acc + beta * C on a product's first K block (C not read when beta
 * is 0), C += alpha * acc on later ones. Inlined with the rows unrolled behind a guard,
 * so the accumulators stay in registers. */
AVX512_TARGET static inline __attribute__((always_inline)) void tpu__avx512_tile_store(
    __m512 acc[TPU_TILE_MR][TPU_TILE_NV], float* c, int64_t ldc, int mr, int nr, float alpha, float beta,
    bool first) {
  __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  __mmask16 mk[TPU_TILE_NV];
#pragma GCC unroll 8
  for (int v = 0; v < TPU_TILE_NV; ++v) mk[v] = tpu__avx512_lanes(nr - v * 16);
#pragma GCC unroll 16
  for (int r = 0; r < TPU_TILE_MR; ++r) {
    if (r >= mr) break;
    float* cr = c + r * ldc;
#pragma GCC unroll 8
    for (int v = 0; v < TPU_TILE_NV; ++v) {
      __m512 x = _mm512_mul_ps(acc[r][v], va);
      if (!first) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(mk[v], cr + v * 16));
      else if (beta != 0.0f) x = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk[v], cr + v * 16), vb, x);
      _mm512_mask_storeu_ps(cr + v * 16, mk[v], x);
    }
  }
}

/* Work items (panels to pack, tasks) go to whichever pool thread asks next rather than in
 * static chunks: on cores shared with other processes a thread that is descheduled for a
 * while then does less, instead of the whole product waiting on its fixed share. Each item
 * is computed whole by one thread in a fixed order, so results do not depend on who. */
typedef void (*tpu_item_fn)(void* ctx, int64_t item, int tid);

typedef struct tpu_items_s {
  void* ctx;
  tpu_item_fn fn;
  int64_t n;
  atomic_int_fast64_t next;
} tpu_items_t;

static inline tpu_status_t tpu__items_worker(void* arg, int64_t b, int64_t e, int tid) {
  tpu_items_t* w = arg;
  (void)b;
  (void)e;
  for (int64_t i; (i = atomic_fetch_add(&w->next, 1)) < w->n;) w->fn(w->ctx, i, tid);
  return NULL;
}

static inline tpu_status_t tpu__run_items(void* ctx, tpu_item_fn fn, int64_t n, int threads) {
  tpu_items_t w = {.ctx = ctx, .fn = fn, .n = n};
  atomic_init(&w.next, 0);
  return tpu__parallel_for(threads < n ? threads : n, 1, tpu__items_worker, &w);
}

/* Cuts an M x N output into tasks of at most mc_max x nc_max (multiples of mr x nr), of
 * even sizes, and at least 4 per thread where the matrix allows, so the threads finish
 * close together: columns are split first (down to one micro-panel), since a task
 * spanning all rows packs its B panels once, then rows. Sets *mc, *nc and *ntasks (tasks
 * per row of tasks); returns the task count. */
static inline int64_t tpu__split_tasks(int64_t M, int64_t N, int64_t mr, int64_t nr, int64_t mc_max,
                                       int64_t nc_max, int threads, int64_t* mc, int64_t* nc, int64_t* ntasks) {
  int64_t mb = tpu__cdiv(M, mc_max), nb = tpu__cdiv(N, nc_max);
  while (threads > 1 && mb * nb < 4 * threads) {
    if (tpu__cdiv(N, nb) >= 2 * nr) nb *= 2;
    else if (tpu__cdiv(M, mb) >= 2 * mr) mb *= 2;
    else break;
  }
  *mc = tpu__cdiv(tpu__cdiv(M, mb), mr) * mr;
  *nc = tpu__cdiv(tpu__cdiv(N, nb), nr) * nr;
  *ntasks = tpu__cdiv(N, *nc);
  return tpu__cdiv(M, *mc) * *ntasks;
}

#endif /* TPURT_HOST_AVX512_H_ */
