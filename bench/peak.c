/* Machine limits for docs/benchmarks.md: peak f32 FLOP/s from an FMA loop (1 thread and
 * all threads), peak bf16 FLOP/s from a vdpbf16ps loop where the build has AVX512-BF16
 * and from an AMX tdpbf16ps loop where it has AMX-BF16 and the kernel grants the tile
 * state (0 otherwise), and memory bandwidth (STREAM-style copy and triad). Built and run by
 * bench/machine.py with the system cc: cc -O3 -march=native -pthread bench/peak.c.
 * Prints one JSON object. The FMA loop is timed in thread CPU time (see cpu_now). */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The FMA loop is timed in thread CPU time, so other processes sharing the cores do not
 * lower the peak (time the thread spends descheduled is not counted). */
static double cpu_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#if defined(__AVX512F__)
typedef __m512 vf;
#define VW 16
#define VSET(x) _mm512_set1_ps(x)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VSUM(v) _mm512_reduce_add_ps(v)
#elif defined(__FMA__)
typedef __m256 vf;
#define VW 8
#define VSET(x) _mm256_set1_ps(x)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
static float VSUM(__m256 v) { float t[8]; _mm256_storeu_ps(t, v); float s = 0; for (int i = 0; i < 8; ++i) s += t[i]; return s; }
#else
typedef __m128 vf;
#define VW 4
#define VSET(x) _mm_set1_ps(x)
#define VFMA(a, b, c) _mm_add_ps(_mm_mul_ps(a, b), c) /* no FMA: mul + add = 2 flops */
static float VSUM(__m128 v) { float t[4]; _mm_storeu_ps(t, v); return t[0] + t[1] + t[2] + t[3]; }
#endif

#define ACC 12 /* independent chains: covers FMA latency x 2 ports */
static const long ITERS = 200000000L / (VW * ACC) * 8;

typedef struct { double secs; float sink; } fma_res_t;

static void* fma_thread(void* arg) {
  fma_res_t* r = arg;
  vf acc[ACC];
  for (int i = 0; i < ACC; ++i) acc[i] = VSET(1.0f + (float)i * 1e-3f);
  vf m = VSET(0.999999f), a = VSET(1e-7f);
  double t0 = cpu_now();
  for (long it = 0; it < ITERS; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < ACC; ++i) acc[i] = VFMA(acc[i], m, a);
  }
  r->secs = cpu_now() - t0;
  float s = 0;
  for (int i = 0; i < ACC; ++i) s += VSUM(acc[i]);
  r->sink = s;
  return NULL;
}

#if defined(__AVX512BF16__)
/* bf16 peak: vdpbf16ps multiplies 16 pairs of bf16 and adds both products to 16 f32
 * lanes (64 FLOP per instruction), on independent chains like the FMA loop. */
static const long BF16_ITERS = 200000000L / (32 * ACC) * 8;

static void* bf16_thread(void* arg) {
  fma_res_t* r = arg;
  __m512 acc[ACC];
  for (int i = 0; i < ACC; ++i) acc[i] = _mm512_set1_ps(1.0f + (float)i * 1e-3f);
  __m512bh m = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(-1e-3f));
  __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.5f));
  double t0 = cpu_now();
  for (long it = 0; it < BF16_ITERS; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < ACC; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], m, x);
  }
  r->secs = cpu_now() - t0;
  float s = 0;
  for (int i = 0; i < ACC; ++i) s += _mm512_reduce_add_ps(acc[i]);
  r->sink = s;
  return NULL;
}
#endif

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
/* AMX bf16 peak: tdpbf16ps multiplies a 16 x 32 bf16 tile by a 32 x 16 one (K in pairs)
 * into a 16 x 16 f32 tile, 16 * 16 * 32 * 2 = 16,384 FLOP per instruction. Four C tiles
 * from two A and two B tiles loaded once, so the loop touches no memory. Linux hands out
 * the tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA). */
static const long AMX_ITERS = 2000000L;

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tilecfg_t;

static int amx_granted(void) {
  return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
}

static void* amx_thread(void* arg) {
  fma_res_t* r = arg;
  tilecfg_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
  _tile_loadconfig(&cfg);
  static const uint16_t src[16 * 32] = {0}; /* bf16 zeros: the rate does not depend on values */
  _tile_loadd(4, src, 64);
  _tile_loadd(5, src, 64);
  _tile_loadd(6, src, 64);
  _tile_loadd(7, src, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  double t0 = cpu_now();
  for (long it = 0; it < AMX_ITERS; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  r->secs = cpu_now() - t0;
  float out[16 * 16];
  _tile_stored(0, out, 64);
  r->sink = out[0];
  _tile_release();
  return NULL;
}
#endif

/* Best of 3 runs; all threads run at once and the slowest one sets the rate. kind 0 the
 * FMA loop, 1 the vdpbf16ps loop, 2 the AMX loop (only called where built). */
static double peak_flops(int threads, int kind) {
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    pthread_t th[256];
    fma_res_t res[256];
    void* (*fn)(void*) = fma_thread;
    double flop_per_iter = ACC * VW * 2.0;
    long iters = ITERS;
#if defined(__AVX512BF16__)
    if (kind == 1) { fn = bf16_thread; flop_per_iter = ACC * 64.0; iters = BF16_ITERS; }
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
    if (kind == 2) { fn = amx_thread; flop_per_iter = 4 * 16384.0; iters = AMX_ITERS; }
#endif
    for (int t = 0; t < threads; ++t) pthread_create(&th[t], NULL, fn, &res[t]);
    for (int t = 0; t < threads; ++t) pthread_join(th[t], NULL);
    double worst = 0;
    for (int t = 0; t < threads; ++t) worst = res[t].secs > worst ? res[t].secs : worst;
    double f = (double)threads * (double)iters * flop_per_iter / worst;
    best = f > best ? f : best;
  }
  return best;
}

typedef struct { float *a, *b, *c; long n; int kind; double secs; } bw_arg_t;

static void* bw_thread(void* p) {
  bw_arg_t* w = p;
  double t0 = now();
  if (w->kind == 0) memcpy(w->c, w->a, (size_t)w->n * sizeof(float));
  else for (long i = 0; i < w->n; ++i) w->a[i] = w->b[i] + 3.0f * w->c[i];
  w->secs = now() - t0;
  return NULL;
}

/* bytes moved per element: copy 8 (read + write), triad 12 (two reads, one write) */
static double bandwidth(int threads, int kind, float* a, float* b, float* c, long n) {
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    pthread_t th[256];
    bw_arg_t args[256];
    double t0 = now();
    for (int t = 0; t < threads; ++t) {
      long s = n * t / threads, e = n * (t + 1) / threads;
      args[t] = (bw_arg_t){a + s, b + s, c + s, e - s, kind, 0};
      pthread_create(&th[t], NULL, bw_thread, &args[t]);
    }
    for (int t = 0; t < threads; ++t) pthread_join(th[t], NULL);
    double dt = now() - t0;
    best = dt < best ? dt : best;
  }
  return (double)n * (kind == 0 ? 8.0 : 12.0) / best;
}

int main(void) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores < 1) cores = 1;
  if (cores > 256) cores = 256;
  double f1 = peak_flops(1, 0), fn = peak_flops((int)cores, 0);
#if defined(__AVX512BF16__)
  double b1 = peak_flops(1, 1), bn = peak_flops((int)cores, 1);
#else
  double b1 = 0, bn = 0; /* no vdpbf16ps in this build: reported as absent */
#endif
  double x1 = 0, xn = 0; /* AMX: absent unless built and granted */
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if (amx_granted()) { x1 = peak_flops(1, 2); xn = peak_flops((int)cores, 2); }
#endif
  long n = 32L << 20; /* 128 MiB per array: far beyond the caches */
  float *a = aligned_alloc(64, (size_t)n * 4), *b = aligned_alloc(64, (size_t)n * 4), *c = aligned_alloc(64, (size_t)n * 4);
  for (long i = 0; i < n; ++i) { a[i] = 1.0f; b[i] = 2.0f; c[i] = 0.5f; }
  double copy1 = bandwidth(1, 0, a, b, c, n), copyn = bandwidth((int)cores, 0, a, b, c, n);
  double triad1 = bandwidth(1, 1, a, b, c, n), triadn = bandwidth((int)cores, 1, a, b, c, n);
  printf("{\"cores\": %ld, \"vector_width\": %d, \"fma\": %s, \"flops_1\": %.6g, \"flops_all\": %.6g, "
         "\"bf16_flops_1\": %.6g, \"bf16_flops_all\": %.6g, \"amx_bf16_flops_1\": %.6g, \"amx_bf16_flops_all\": %.6g, "
         "\"copy_1\": %.6g, \"copy_all\": %.6g, \"triad_1\": %.6g, \"triad_all\": %.6g}\n",
         cores, VW,
#if defined(__FMA__)
         "true",
#else
         "false",
#endif
         f1, fn, b1, bn, x1, xn, copy1, copyn, triad1, triadn);
  free(a); free(b); free(c);
  return 0;
}
