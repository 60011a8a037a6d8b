/* A C model of how a fused group runs AdamW's foreach chain (host/fuse.c): each member
 * op is a loop over one tile of its operands, and the tile flows through the 8 ops
 * before the next tile starts. Compares tile lengths with one hand-fused loop (the
 * shape of host/optim.c's ADAM_STEP), and reading four streams one after another in
 * 4 KiB bursts with reading them in one loop. One thread, 16M floats per array.
 *
 *   cc -O3 -march=native -fno-math-errno -fno-trapping-math bench/tile_streams.c -lm \
 *      -o /tmp/tile_streams && /tmp/tile_streams
 *
 * Times are the best of 3 rounds; compare rows of one run (docs/benchmarks.md, "Fused
 * groups: tiles and streams"). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define N (1L << 24)
#define NI __attribute__((noinline))

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Tile functions as the group calls them: every input is a tile, constants included. */
NI static void mul(long n, float* r, const float* a, const float* b) { for (long i = 0; i < n; i++) r[i] = a[i] * b[i]; }
NI static void lerp(long n, float* r, const float* a, const float* b, const float* c) {
  for (long i = 0; i < n; i++) r[i] = fabsf(c[i]) < 0.5f ? a[i] + c[i] * (b[i] - a[i]) : b[i] - (b[i] - a[i]) * (1 - c[i]);
}
NI static void addcmul(long n, float* r, const float* a, const float* b, const float* c, float p0) {
  for (long i = 0; i < n; i++) r[i] = a[i] + p0 * b[i] * c[i];
}
NI static void sqrt_(long n, float* r, const float* a) { for (long i = 0; i < n; i++) r[i] = sqrtf(a[i]); }
NI static void div_(long n, float* r, const float* a, const float* b) { for (long i = 0; i < n; i++) r[i] = a[i] / b[i]; }
NI static void add(long n, float* r, const float* a, const float* b) { for (long i = 0; i < n; i++) r[i] = a[i] + b[i]; }
NI static void addcdiv(long n, float* r, const float* a, const float* b, const float* c, float p0) {
  for (long i = 0; i < n; i++) r[i] = a[i] + p0 * (b[i] / c[i]);
}
/* The same ops with their constants as scalars. */
NI static void mul_s(long n, float* r, const float* a, float b) { for (long i = 0; i < n; i++) r[i] = a[i] * b; }
NI static void lerp_s(long n, float* r, const float* a, const float* b, float c) {
  for (long i = 0; i < n; i++) r[i] = fabsf(c) < 0.5f ? a[i] + c * (b[i] - a[i]) : b[i] - (b[i] - a[i]) * (1 - c);
}
NI static void div_s(long n, float* r, const float* a, float b) { for (long i = 0; i < n; i++) r[i] = a[i] / b; }
NI static void add_s(long n, float* r, const float* a, float b) { for (long i = 0; i < n; i++) r[i] = a[i] + b; }
NI static void sum4(long n, float* r, const float* a, const float* b, const float* c, const float* d) {
  for (long i = 0; i < n; i++) r[i] = a[i] + b[i] + c[i] + d[i];
}

/* One pass per block of 512, the shape of ADAM_STEP's kernel. */
NI static void adam_block(long n, float* restrict p, const float* restrict g, float* restrict m, float* restrict v) {
  const float b1 = 0.9f, b2 = 0.999f, c1 = 0.1f, c2 = 0.001f, decay = 0.99f, step = 0.001f, bc2 = 0.5f, eps = 1e-8f;
  for (long i = 0; i < n; i++) p[i] = p[i] * decay;
  for (long i = 0; i < n; i++) {
    m[i] = m[i] * b1 + g[i] * c1;
    v[i] = v[i] * b2 + g[i] * g[i] * c2;
  }
  for (long i = 0; i < n; i++) p[i] = p[i] - step * m[i] / (sqrtf(v[i]) / bc2 + eps);
}

static float *p, *m, *g, *v, *S, *C;

static void group(long T, int scalars) {
  for (long t = 0; t < N; t += T) {
    if (scalars) mul_s(T, S, p + t, 0.99f), lerp_s(T, m + t, m + t, g + t, 0.1f), mul_s(T, S + T, v + t, 0.999f);
    else mul(T, S, p + t, C), lerp(T, m + t, m + t, g + t, C + T), mul(T, S + T, v + t, C + 2 * T);
    addcmul(T, v + t, S + T, g + t, g + t, 0.001f);
    sqrt_(T, S + 2 * T, v + t);
    if (scalars) div_s(T, S + 3 * T, S + 2 * T, 0.5f), add_s(T, S + 4 * T, S + 3 * T, 1e-8f);
    else div_(T, S + 3 * T, S + 2 * T, C + 3 * T), add(T, S + 4 * T, S + 3 * T, C + 4 * T);
    addcdiv(T, p + t, S, m + t, S + 4 * T, -0.001f);
  }
}

static double best(void (*f)(long, int), long a, int b) {
  double t = 1e9;
  for (int r = 0; r < 3; r++) {
    double t0 = now();
    f(a, b);
    double d = now() - t0;
    if (d < t) t = d;
  }
  return t;
}

static void adam(long unused, int unused2) {
  (void)unused; (void)unused2;
  for (long t = 0; t < N; t += 512) adam_block(512, p + t, g + t, m + t, v + t);
}

static void streams(long T, int together) {
  for (long t = 0; t < N; t += T) {
    if (together) sum4(T, S, p + t, m + t, g + t, v + t);
    else mul(T, S, p + t, C), mul(T, S + T, m + t, C), mul(T, S + 2 * T, g + t, C), mul(T, S + 3 * T, v + t, C);
  }
}

int main(void) {
  float** arrays[] = {&p, &m, &g, &v};
  for (int k = 0; k < 4; k++) {
    *arrays[k] = aligned_alloc(64, N * sizeof(float));
    if (!*arrays[k]) return 1;
    for (long i = 0; i < N; i++) (*arrays[k])[i] = 1.0f;
  }
  S = aligned_alloc(64, 8 * 1024 * sizeof(float));
  C = aligned_alloc(64, 8 * 1024 * sizeof(float));
  for (int i = 0; i < 8 * 1024; i++) C[i] = 0.5f;
  double ref = best(adam, 0, 0);
  printf("hand-fused loop (ADAM_STEP's shape)   %7.1f ms\n", ref * 1e3);
  long tiles[] = {1024, 512, 256, 128};
  for (int i = 0; i < 4; i++) {
    double t = best(group, tiles[i], 0);
    printf("group, %4ld-element tiles            %7.1f ms  %.2fx\n", tiles[i], t * 1e3, t / ref);
  }
  double t = best(group, 128, 1);
  printf("group, 128, constants as scalars      %7.1f ms  %.2fx\n", t * 1e3, t / ref);
  double a = best(streams, 1024, 0), b = best(streams, 1024, 1);
  printf("4 streams read in 4 KiB bursts        %7.1f GB/s\n", 4.0 * N * 4 / a / 1e9);
  printf("4 streams read in one loop            %7.1f GB/s\n", 4.0 * N * 4 / b / 1e9);
  return 0;
}
