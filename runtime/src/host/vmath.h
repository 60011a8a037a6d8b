/* Branch-free float32 transcendentals that the compiler vectorizes inside tile loops.
 *
 * libm's expf/erff/tanhf are scalar calls that stop a loop from vectorizing; PyTorch's
 * CPU kernels use SLEEF's vector functions instead. These are polynomial kernels with
 * every special case folded into selects, accurate to a few float32 ulp (max relative
 * error of the fitted polynomials <= 1.2e-8 before rounding, within 3 ulp after; measured against double
 * libm in runtime/tests/elementwise_test.c). The coefficients were fitted for this file
 * (weighted least squares with Lawson reweighting toward minimax, on Chebyshev nodes).
 * double keeps libm. */
#ifndef TPU_HOST_VMATH_H_
#define TPU_HOST_VMATH_H_

#include <stdint.h>
#include <string.h>

/* Hot float loops are compiled for AVX-512, AVX2+FMA and the baseline; the loader picks
 * one per function from cpuid (GCC function multiversioning, an ifunc per function).
 * Plain C11 does not contract a*b+c into FMA, so every variant computes the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__SANITIZE_THREAD__)
#define TPU_ISA_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TPU_ISA_CLONES
#endif

static inline float tpu__f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* e^x: x = n ln2 + r, |r| <= ln2/2, e^r by a degree-6 polynomial, 2^n built in two
 * halves so that results down to the smallest subnormal are exact in exponent. */
static inline float tpu__vexpf(float x) {
  const float lo = -103.972084f, hi = 88.7228394f;
  float xc = x < lo ? lo : x > hi ? hi : x;
  float n = __builtin_rintf(xc * 1.44269504f);
  float r = xc - n * 0.693359375f; /* ln2 = hi + lo, n * hi exact (hi has 9 bits) */
  r = r - n * -2.12194440e-4f;
  float p = 1.383684193e-03f;
  p = p * r + 8.374815782e-03f;
  p = p * r + 4.166822564e-02f;
  p = p * r + 1.666642017e-01f;
  p = p * r + 4.999999208e-01f;
  p = p * r + 1.000000036e+00f;
  p = p * r + 1.000000001e+00f;
  int32_t ni = (int32_t)n;
  int32_t n1 = ni / 2, n2 = ni - n1;
  float s1 = tpu__f32_from_bits((uint32_t)(n1 + 127) << 23);
  float s2 = tpu__f32_from_bits((uint32_t)(n2 + 127) << 23);
  float y = p * s1 * s2;
  y = x < lo ? 0.0f : y;
  y = x > hi ? __builtin_inff() : y;
  return x != x ? x : y;
}

/* The pieces of erf: for |x| < 0.9, erf(x) = x P(x^2); beyond, erfc(|x|) =
 * e^{-x^2} Q(1 / (1 + |x|/2)) (fitted on [0.9, 10.1]). erf_tail returns erfc(|x|) (valid for |x| >= 0.9). */
static inline float tpu__verf_small(float x) {
  float z = x * x;
  float p = -6.090496041e-04f;
  p = p * z + 5.011993339e-03f;
  p = p * z + -2.677893385e-02f;
  p = p * z + 1.128214170e-01f;
  p = p * z + -3.761252341e-01f;
  p = p * z + 1.128379154e+00f;
  return x * p;
}
static inline float tpu__verfc_tail(float x) {
  float y = __builtin_fabsf(x);
  y = y > 10.1f ? 10.1f : y; /* beyond, e^{-x^2} underflows to 0 */
  float t = 1.0f / (1.0f + 0.5f * y);
  float q = -6.687384997e-02f;
  q = q * t + 3.236892555e-01f;
  q = q * t + -5.674296117e-01f;
  q = q * t + 3.674214121e-01f;
  q = q * t + -8.641626435e-02f;
  q = q * t + 2.276313143e-01f;
  q = q * t + 2.366223289e-01f;
  q = q * t + 2.833848721e-01f;
  q = q * t + 2.820010498e-01f;
  q = q * t + 2.979603358e-06f;
  return tpu__vexpf(-x * x) * q;
}

static inline float tpu__verff(float x) {
  float ax = __builtin_fabsf(x);
  float tail = 1.0f - tpu__verfc_tail(x);
  float big = x < 0 ? -tail : tail;
  float y = ax < 0.9f ? tpu__verf_small(x) : big;
  return x != x ? x : y;
}

/* 1 + erf(x) without cancellation for negative x (GELU's form); below x = -3 the error
 * grows like x^2 / 2 ulp (x^2 is rounded to float before e^{-x^2}). */
static inline float tpu__vone_plus_erff(float x) {
  float tail = tpu__verfc_tail(x);
  float y = __builtin_fabsf(x) < 0.9f ? 1.0f + tpu__verf_small(x) : x < 0 ? tail : 2.0f - tail;
  return x != x ? x : y;
}

/* tanh: odd polynomial below 0.625, 1 - 2 / (e^{2|x|} + 1) above (exact 1 past 9.1). */
static inline float tpu__vtanhf(float x) {
  float ax = __builtin_fabsf(x);
  float z = x * x;
  float p = -5.704990410e-03f;
  p = p * z + 2.063909066e-02f;
  p = p * z + -5.373971628e-02f;
  p = p * z + 1.333144222e-01f;
  p = p * z + -3.333328194e-01f;
  float small = x + x * z * p;
  float e = tpu__vexpf(2.0f * (ax > 9.1f ? 9.1f : ax));
  float big = 1.0f - 2.0f / (e + 1.0f);
  big = ax > 9.1f ? 1.0f : big;
  big = x < 0 ? -big : big;
  float y = ax < 0.625f ? small : big;
  y = x == 0 ? x : y; /* keeps the sign of zero */
  return x != x ? x : y;
}

static inline float tpu__vsigmoidf(float x) { return 1.0f / (1.0f + tpu__vexpf(-x)); }

/* Eight doubles as one GCC vector (float32 runs are widened on load): sums in float64
 * that vectorize, where a scalar `s += x` is a chain of dependent adds. v8_total combines
 * the lanes in a fixed order, so results do not depend on the instruction set. */
typedef double v8d __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
typedef int64_t v8l __attribute__((vector_size(64)));
static inline v8d ld8_f32(const float* p) { v8f f; memcpy(&f, p, sizeof f); return __builtin_convertvector(f, v8d); }
static inline v8d ld8_f64(const double* p) { v8d d; memcpy(&d, p, sizeof d); return d; }
static inline void st8_f32(float* p, v8d v) { v8f f = __builtin_convertvector(v, v8f); memcpy(p, &f, sizeof f); }
static inline void st8_f64(double* p, v8d v) { memcpy(p, &v, sizeof v); }
static inline double v8_total(v8d a) {
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* The sum of a run in double, two vectors in flight. Inline: an ISA-cloned caller gets
 * it compiled for its instruction set. */
#define TPU_V8_SUM(T, SFX)                                                                    \
  static inline double tpu__v8_sum_##SFX(const T* x, int64_t n) {                             \
    v8d a0 = {0}, a1 = {0};                                                                   \
    int64_t i = 0;                                                                            \
    for (; i + 16 <= n; i += 16) { a0 += ld8_##SFX(x + i); a1 += ld8_##SFX(x + i + 8); }      \
    double s = v8_total(a0 + a1);                                                             \
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
