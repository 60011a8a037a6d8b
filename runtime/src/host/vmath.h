/* Branch-free float32 transcendentals that the compiler vectorizes inside tile loops.
 *
 * libm's expf/erff/tanhf are scalar calls that stop a loop from vectorizing; PyTorch's
 * CPU kernels use SLEEF's vector functions instead. These are polynomial kernels with
 * every special case folded into selects or clamps. The coefficients were fitted for this
 * file (weighted least squares with Lawson reweighting toward minimax, on Chebyshev
 * nodes). Worst errors against double libm over dense sweeps (runtime/tests/vmath_test.c):
 * exp 1.0 ulp, tanh 1.3, erf 2.5, sigmoid 2.4, 1 + erf 5.0 (also in the negative tail),
 * gelu 6.8, gelu_tanh 5.6 for x >= -2. double keeps libm.
 *
 * Speed (ns per element, one core, AVX-512 clone, a 4096-element loop in L1; before ->
 * after the FMA rewrite): exp 0.53 -> 0.31, erf 1.14 -> 0.69, gelu 1.20 -> 0.61, its
 * backward 1.82 -> 0.68, gelu_tanh 1.27 -> 0.49, its backward 1.44 -> 0.68. These loops
 * are bound by the throughput of the multiply/FMA pipes (about one 512-bit operation a
 * cycle on the Zen 4-class CPU here), not by latency: Estrin's scheme for the exp and
 * erfc polynomials (shorter dependency chains, a few more multiplies) made gelu slower
 * (0.61 -> 0.72) and exp less accurate (1.8 ulp), so the polynomials stay Horner. What
 * counts is operations per element: FMA steps (half of mul + add), one erfc region instead
 * of two evaluated together, the exponent of 2^n added as an integer, no NaN select
 * where NaN propagates anyway. The one division left in erfc costs ~10% of gelu (measured
 * by replacing it with a multiply); a Newton reciprocal costs more FMA-pipe operations.
 * Instructions in the AVX-512 loop per 16 elements: gelu 101 -> 55, its backward
 * 151 -> 58, gelu_tanh 103 -> 41, its backward 114 -> 56, exp 49 -> 34.
 * End to end on 16M floats (CPU time per element of the whole op, one pool thread, which
 * other load on the shared machine hardly moves, unlike wall time): gelu 1.25 -> 0.64 ns,
 * its backward 1.89 -> 0.72, gelu_tanh 1.31 -> 0.51, against 0.33-0.42 for a copy. */
#ifndef TPU_HOST_VMATH_H_
#define TPU_HOST_VMATH_H_

#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

/* Hot float loops are compiled for AVX-512, AVX2+FMA and the baseline; the loader picks
 * one per function from cpuid (GCC function multiversioning, an ifunc per function).
 * Plain C11 does not contract a*b+c into FMA; the polynomial steps below ask for it with
 * TPU_FMAF, which is fmaf: one rounding, the same bits in every variant. The AVX2 and
 * AVX-512 clones turn it into vfmadd; the baseline clone (no FMA in x86-64-v2) calls
 * libm's fmaf instead (correct, not vectorized: that clone runs only on CPUs from before
 * 2013 and under the sanitizers). So results do not depend on the instruction set. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__SANITIZE_THREAD__)
#define TPU_ISA_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TPU_ISA_CLONES
#endif
#define TPU_FMAF(a, b, c) __builtin_fmaf((a), (b), (c))
/* The kernels below must be inlined into the cloned loops that call them: an out-of-line
 * copy would be compiled for the baseline, where TPU_FMAF is a libm call. */
#define TPU_VINLINE static inline __attribute__((always_inline))

static inline float tpu__f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* e^(x + xlo) for x in [-120, 100] (|xlo| a rounding error of x): x = n ln2 + r,
 * |r| <= ln2/2, e^r by a degree-6 polynomial, times 2^n built in two halves, so that
 * results down to the smallest subnormal are exact in exponent, that below -103.97 round
 * to 0, and that above 88.72 overflow to inf. A NaN x gives an unspecified value: callers
 * select NaN themselves or let it through another factor. */
TPU_VINLINE float tpu__vexpf_core(float x, float xlo) {
  /* n = rint(x / ln2) by adding 1.5 * 2^23: n lands in the low mantissa bits, read back as
   * an integer (no round or convert instructions) */
  const float magic = 12582912.0f;
  float nm = TPU_FMAF(x, 1.44269504f, magic);
  float n = nm - magic;
  int32_t ni;
  memcpy(&ni, &nm, 4);
  ni -= 0x4B400000;
  float r = TPU_FMAF(n, -0.693359375f, x); /* ln2 = hi + lo, n * hi exact (hi has 9 bits) */
  r = TPU_FMAF(n, 2.12194440e-4f, r);
  r = r + xlo;
  float p = 1.383684193e-03f;
  p = TPU_FMAF(p, r, 8.374815782e-03f);
  p = TPU_FMAF(p, r, 4.166822564e-02f);
  p = TPU_FMAF(p, r, 1.666642017e-01f);
  p = TPU_FMAF(p, r, 4.999999208e-01f);
  p = TPU_FMAF(p, r, 1.000000036e+00f);
  p = TPU_FMAF(p, r, 1.000000001e+00f);
  /* p 2^n1 by adding n1 to p's exponent field (p is in [0.7, 1.42], |n1| <= 81, so it stays
   * normal), then times 2^n2: one rounding, into the subnormals where the result is one */
  int32_t n1 = ni >> 1, n2 = ni - n1;
  uint32_t pb;
  memcpy(&pb, &p, 4);
  float p1 = tpu__f32_from_bits(pb + ((uint32_t)n1 << 23));
  return p1 * tpu__f32_from_bits((uint32_t)(n2 + 127) << 23);
}

/* e^x for every float: a clamp (0 for -inf, inf for inf) and NaN, which the exponent-field
 * add above could turn into a number when its payload has low bits set. */
TPU_VINLINE float tpu__vexpf(float x) {
  float xc = x < -120.0f ? -120.0f : x;
  xc = xc > 100.0f ? 100.0f : xc;
  float y = tpu__vexpf_core(xc, 0.0f);
  return x != x ? x : y;
}

/* erfc(a) = e^{-a^2} t R(t - 0.5826), t = 1 / (1 + a/2), for 0 <= a <= 10.6, given
 * e = e^{-a^2} (0 from a = 10.2 on, where erfc underflows). R, of degree 9, was fitted
 * for this file on the whole range a in [0, 10.1] (relative error of t R <= 2.5e-7,
 * 4.2 * 2^-24, evaluated in float with the coefficients rounded; 3e-8 in exact
 * arithmetic; degree 8 would give 2.8e-7 and save one FMA). t carries the 1/a-like decay of
 * erfc(a) e^{a^2}, so R varies by less than 2x and Horner in t - 0.5826 is well
 * conditioned. One region, one exp, one division, no select between polynomials. */
TPU_VINLINE float tpu__verfc_r(float t) {
  float u = t - 0.58264464f;
  float q = 1.198191848e-02f;
  q = TPU_FMAF(q, u, -5.881949887e-02f);
  q = TPU_FMAF(q, u, 4.651755560e-03f);
  q = TPU_FMAF(q, u, 1.118815318e-01f);
  q = TPU_FMAF(q, u, -5.008191243e-02f);
  q = TPU_FMAF(q, u, -2.038902193e-01f);
  q = TPU_FMAF(q, u, 8.300500363e-02f);
  q = TPU_FMAF(q, u, 5.875183344e-01f);
  q = TPU_FMAF(q, u, 7.821244597e-01f);
  q = TPU_FMAF(q, u, 5.714730620e-01f);
  return q;
}
TPU_VINLINE float tpu__verfc_e(float a, float e) {
  float t = 1.0f / TPU_FMAF(0.5f, a, 1.0f);
  return e * (t * tpu__verfc_r(t));
}

/* erfc(|x|) for any non-NaN x. */
TPU_VINLINE float tpu__verfc_abs(float x) {
  float a = __builtin_fabsf(x);
  a = a > 10.1f ? 10.1f : a;
  float a2 = a * a; /* e^{-a^2} from a^2 = a2 + a2lo exactly: squaring cost up to a^2 / 2 ulp */
  return tpu__verfc_e(a, tpu__vexpf_core(-a2, -TPU_FMAF(a, a, -a2)));
}

/* erf: x P(x^2) for |x| < 0.9 (relative accuracy near 0), 1 - erfc(|x|) beyond. */
TPU_VINLINE float tpu__verf_small(float x) {
  float z = x * x;
  float p = -6.090496041e-04f;
  p = TPU_FMAF(p, z, 5.011993339e-03f);
  p = TPU_FMAF(p, z, -2.677893385e-02f);
  p = TPU_FMAF(p, z, 1.128214170e-01f);
  p = TPU_FMAF(p, z, -3.761252341e-01f);
  p = TPU_FMAF(p, z, 1.128379154e+00f);
  return x * p;
}

TPU_VINLINE float tpu__verff(float x) {
  float ax = __builtin_fabsf(x);
  float tail = 1.0f - tpu__verfc_abs(x);
  float big = x < 0 ? -tail : tail;
  float y = ax < 0.9f ? tpu__verf_small(x) : big;
  return x != x ? x : y;
}

/* 1 + erf(x) without cancellation for negative x: erfc(|x|) or 2 - erfc(|x|); no small-x
 * polynomial is needed (the sum is >= 1 for x >= 0, and erfc has relative accuracy). */
TPU_VINLINE float tpu__vone_plus_erff(float x) {
  float c = tpu__verfc_abs(x);
  float y = x < 0 ? c : 2.0f - c;
  return x != x ? x : y;
}

/* GELU's pieces from x itself, with x^2 / 2 formed exactly ((x/2) x split by an FMA)
 * rather than squaring the rounded x / sqrt(2): returns 1 + erf(x / sqrt 2) and sets
 * *out_e = e^{-x^2/2}, which is both erfc's factor and the normal density's. NaN
 * propagates through every step, so there is no select for it. */
TPU_VINLINE float tpu__vgelu_cdf2(float hx, float* out_e) {
  float h = __builtin_fabsf(hx);
  h = h > 7.5f ? 7.5f : h; /* e^{-x^2/2} is 0 from |x| = 14.4 on */
  float ax = h + h;
  float x2 = h * ax;
  float e = tpu__vexpf_core(-x2, -TPU_FMAF(h, ax, -x2));
  /* erfc(a) at a = |x| / sqrt 2; 1 + a/2 = 1 + |x| / (2 sqrt 2) */
  float t = 1.0f / TPU_FMAF(0.35355339f, ax, 1.0f);
  float c = e * (t * tpu__verfc_r(t));
  *out_e = e;
  return hx < 0 ? c : 2.0f - c;
}

/* gelu(x) = x/2 (1 + erf(x / sqrt 2)) and its derivative 1/2 (1 + erf) + x e^{-x^2/2} / sqrt(2 pi).
 * They take x/2 (exact), which is what both multiply by. */
TPU_VINLINE float tpu__vgeluf(float x) {
  float e;
  float hx = 0.5f * x;
  return hx * tpu__vgelu_cdf2(hx, &e);
}
TPU_VINLINE float tpu__vgelu_gradf(float x) {
  float e;
  float hx = 0.5f * x;
  float c2 = tpu__vgelu_cdf2(hx, &e);
  return TPU_FMAF(hx * 0.79788456f, e, 0.5f * c2);
}

/* GELU's tanh form, 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), as
 * x s with s = 1 / (1 + e^{-2u}) (the same function: (1 + tanh u) / 2 is the logistic of
 * 2u): one exp and one division, no polynomial for small u and no select, and no
 * cancellation in 1 + tanh u for negative x. -2u = x (-2 beta - 2 beta kappa x^2). The
 * derivative: s + x (1 - tanh^2 u) / 2 * u' = s (1 + 2 x u' e s), since 1 - s = e s. */
TPU_VINLINE float tpu__vgelu_tanh_m2u(float x) {
  return x * TPU_FMAF(x * x, -0.0713548162726f, -1.59576912160573f);
}
TPU_VINLINE float tpu__vgelu_tanhf(float x) {
  float y = x / (1.0f + tpu__vexpf(tpu__vgelu_tanh_m2u(x)));
  return x == -__builtin_inff() ? x - x : y; /* -inf * 0, NaN as in PyTorch's kernel */
}
TPU_VINLINE float tpu__vgelu_tanh_gradf(float x) {
  float m2u = tpu__vgelu_tanh_m2u(x);
  bool tiny = m2u > 88.0f; /* x < -10.3: the gradient is below 2e-36 in size */
  float e = tpu__vexpf(tiny ? 88.0f : m2u);
  float s = 1.0f / (1.0f + e);
  float du = TPU_FMAF(x * x, 0.10703222440890f, 0.79788456080287f); /* beta (1 + 3 kappa x^2) */
  float y = s * TPU_FMAF(2.0f * x * du, e * s, 1.0f);
  y = tiny ? 0.0f : y;
  return __builtin_fabsf(x) == __builtin_inff() ? x - x : y; /* NaN, as PyTorch's formula gives */
}

/* tanh: odd polynomial below 0.625, 1 - 2 / (e^{2|x|} + 1) above (exact 1 past 9.1). */
TPU_VINLINE float tpu__vtanhf(float x) {
  float ax = __builtin_fabsf(x);
  float z = x * x;
  float p = -5.704990410e-03f;
  p = TPU_FMAF(p, z, 2.063909066e-02f);
  p = TPU_FMAF(p, z, -5.373971628e-02f);
  p = TPU_FMAF(p, z, 1.333144222e-01f);
  p = TPU_FMAF(p, z, -3.333328194e-01f);
  float small = TPU_FMAF(x * z, p, x);
  float e = tpu__vexpf_core(2.0f * (ax > 9.1f ? 9.1f : ax), 0.0f);
  float big = 1.0f - 2.0f / (e + 1.0f);
  big = ax > 9.1f ? 1.0f : big;
  big = x < 0 ? -big : big;
  float y = ax < 0.625f ? small : big;
  y = x == 0 ? x : y; /* keeps the sign of zero */
  return x != x ? x : y;
}

TPU_VINLINE float tpu__vsigmoidf(float x) { return 1.0f / (1.0f + tpu__vexpf(-x)); }

/* Lane vectors: eight doubles (v8d) and sixteen floats (v16f), each a pair of 32-byte GCC
 * vectors, for sums in float64 that vectorize where a scalar `s += x` is a chain of
 * dependent adds. A pair, not one 64-byte vector: without AVX-512 a 64-byte GCC vector
 * has no register, and GCC kept it in memory, every operation a store and a reload (on
 * an AVX2 machine a 16M-element sum ran at 3.9 GB/s, a fifth of copy bandwidth). A
 * 32-byte vector is a register on AVX2 and AVX-512 machines alike. v8_total combines the
 * lanes in a fixed order, so results do not depend on the instruction set. */
typedef double v4d __attribute__((vector_size(32)));
typedef int64_t v4l __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef struct v8d_s { v4d lo, hi; } v8d;   /* lanes 0-3, 4-7 */
typedef struct v16f_s { v8f lo, hi; } v16f; /* lanes 0-7, 8-15 */
#define V8D_ZERO ((v8d){{0}, {0}})
#define V16F_ZERO ((v16f){{0}, {0}})
static inline v8d v8_add(v8d a, v8d b) { return (v8d){a.lo + b.lo, a.hi + b.hi}; }
static inline v8d v8_mul(v8d a, v8d b) { return (v8d){a.lo * b.lo, a.hi * b.hi}; }
static inline v8d v8_adds(v8d a, double s) { return (v8d){a.lo + s, a.hi + s}; }
static inline v8d v8_subs(v8d a, double s) { return (v8d){a.lo - s, a.hi - s}; }
static inline v8d v8_muls(v8d a, double s) { return (v8d){a.lo * s, a.hi * s}; }
/* Four floats widened to doubles. Written element by element on purpose: GCC 12 lowers
 * __builtin_convertvector(v4f, v4d) as two halves (vmovlps, two 128-bit vcvtps2pd and a
 * vinsertf128 per four floats, which bounded f32 sums on AVX2), while it turns this form
 * into one vcvtps2pd ymm, reading memory directly. Same values either way. */
TPU_VINLINE v4d cvt4_f32(const float* p) { return (v4d){p[0], p[1], p[2], p[3]}; }
TPU_VINLINE v8d ld8_f32(const float* p) { return (v8d){cvt4_f32(p), cvt4_f32(p + 4)}; }
/* Eight bf16 values widened to doubles (exact: a bf16 is the high half of an f32). */
TPU_VINLINE v8d ld8_bf16(const uint16_t* p) {
  float f[8];
  for (int i = 0; i < 8; ++i) {
    uint32_t u = (uint32_t)p[i] << 16;
    memcpy(&f[i], &u, sizeof u);
  }
  return ld8_f32(f);
}
static inline v8d ld8_f64(const double* p) {
  v8d d;
  memcpy(&d.lo, p, sizeof d.lo);
  memcpy(&d.hi, p + 4, sizeof d.hi);
  return d;
}
static inline void st8_f32(float* p, v8d v) {
  v4f a = __builtin_convertvector(v.lo, v4f), b = __builtin_convertvector(v.hi, v4f);
  memcpy(p, &a, sizeof a);
  memcpy(p + 4, &b, sizeof b);
}
static inline void st8_f64(double* p, v8d v) {
  memcpy(p, &v.lo, sizeof v.lo);
  memcpy(p + 4, &v.hi, sizeof v.hi);
}
/* Eight floats to p (16-byte aligned) with non-temporal stores, which skip the read of
 * the destination line that an ordinary store makes first (host.h, streaming stores).
 * SSE's movntps is in every x86-64 clone, so this compiles in the baseline clone too; the
 * AVX clones store the two halves of a register. Elsewhere, ordinary stores. A thread
 * that used it calls tpu__stream_fence() before another thread reads the data. */
TPU_VINLINE void tpu__stream8_f32(float* p, v8f v) {
#if defined(__SSE2__)
  __m128 lo, hi;
  memcpy(&lo, &v, sizeof lo);
  memcpy(&hi, (const char*)&v + sizeof lo, sizeof hi);
  _mm_stream_ps(p, lo);
  _mm_stream_ps(p + 4, hi);
#else
  memcpy(p, &v, sizeof v);
#endif
}
static inline double v8_total(v8d a) {
  return ((a.lo[0] + a.lo[1]) + (a.lo[2] + a.lo[3])) + ((a.hi[0] + a.hi[1]) + (a.hi[2] + a.hi[3]));
}
static inline v16f v16_add(v16f a, v16f b) { return (v16f){a.lo + b.lo, a.hi + b.hi}; }
static inline v16f v16_mul(v16f a, v16f b) { return (v16f){a.lo * b.lo, a.hi * b.hi}; }
static inline v16f v16_subs(v16f a, float s) { return (v16f){a.lo - s, a.hi - s}; }
static inline v16f v16_muls(v16f a, float s) { return (v16f){a.lo * s, a.hi * s}; }
static inline v16f ld16_f32(const float* p) {
  v16f v;
  memcpy(&v.lo, p, sizeof v.lo);
  memcpy(&v.hi, p + 8, sizeof v.hi);
  return v;
}
/* Lane j of the result: (double)lane j + (double)lane j + 8. */
TPU_VINLINE v8d v16_widen_sum(v16f v) {
  float f[16];
  memcpy(f, &v.lo, sizeof v.lo);
  memcpy(f + 8, &v.hi, sizeof v.hi);
  return (v8d){cvt4_f32(f) + cvt4_f32(f + 8), cvt4_f32(f + 4) + cvt4_f32(f + 12)};
}

/* The sum of a run in double, two vectors in flight. Inline: an ISA-cloned caller gets
 * it compiled for its instruction set. */
#define TPU_V8_SUM(T, SFX)                                                                    \
  static inline double tpu__v8_sum_##SFX(const T* x, int64_t n) {                             \
    v8d a0 = V8D_ZERO, a1 = V8D_ZERO;                                                         \
    int64_t i = 0;                                                                            \
    for (; i + 16 <= n; i += 16) {                                                            \
      a0 = v8_add(a0, ld8_##SFX(x + i));                                                      \
      a1 = v8_add(a1, ld8_##SFX(x + i + 8));                                                  \
    }                                                                                         \
    double s = v8_total(v8_add(a0, a1));                                                      \
    for (; i < n; ++i) s += x[i];                                                             \
    return s;                                                                                 \
  }
TPU_V8_SUM(float, f32)
TPU_V8_SUM(double, f64)
#undef TPU_V8_SUM

/* Type-generic forms for the tile macros: float uses the kernels above, double libm. */
#define TPU_VEXP(x) _Generic((x), float: tpu__vexpf, default: exp)(x)
#define TPU_VERF(x) _Generic((x), float: tpu__verff, default: erf)(x)
#define TPU_VTANH(x) _Generic((x), float: tpu__vtanhf, default: tanh)(x)

#endif /* TPU_HOST_VMATH_H_ */
