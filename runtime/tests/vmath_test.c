/* The vectorizable float32 transcendentals of host/vmath.h against double libm: error
 * in float32 ulps over dense sweeps of their whole domains, and the special values. */
#include <float.h>
#include <math.h>

#include "check.h"
#include "host/vmath.h"

/* Error of got against the exact value, in ulps of the exact value (float spacing). */
static double ulps(float got, double exact) {
  if (exact == 0) return got == 0 ? 0 : INFINITY;
  double ulp = ldexp(1.0, ilogb(exact) - 23);
  if (fabs(exact) < FLT_MIN) ulp = ldexp(1.0, -149);
  return fabs((double)got - exact) / ulp;
}

static double one_plus_erf(double x) { return x < 0 ? erfc(-x) : 1.0 + erf(x); }
static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double gelu(double x) { return 0.5 * x * erfc(-x / sqrt(2.0)); }
static double gelu_grad(double x) { return 0.5 * erfc(-x / sqrt(2.0)) + x * exp(-0.5 * x * x) / sqrt(2 * M_PI); }

static double gt_u(double x) { return 0.79788456080286535588 * (x + 0.044715 * x * x * x); }
static double gelu_tanh(double x) { return x / (1.0 + exp(-2.0 * gt_u(x))); }
static double gelu_tanh_grad(double x) {
  double s = 1.0 / (1.0 + exp(-2.0 * gt_u(x)));
  return s + 2.0 * x * s * (1.0 - s) * 0.79788456080286535588 * (1.0 + 3.0 * 0.044715 * x * x);
}

/* The gradient crosses zero near x = -0.75, where no float formula keeps relative
 * accuracy: its error is measured in ulps of its larger term, the CDF. */
static double worst_grad(float (*f)(float), double (*ref)(double), double (*big)(double), float lo, float hi) {
  double w = 0;
  for (int i = 0; i <= 2000000; ++i) {
    float x = lo + (hi - lo) * (float)i / 2000000.0f;
    double e = ref((double)x), b = big((double)x);
    double scale = fabs(e) > b ? fabs(e) : b;
    double ulp = ldexp(1.0, ilogb(scale) - 23);
    if (scale < FLT_MIN) ulp = ldexp(1.0, -149);
    double u = fabs((double)f(x) - e) / ulp;
    if (u > w) w = u;
  }
  return w;
}
static double worst(float (*f)(float), double (*ref)(double), float lo, float hi) {
  double w = 0;
  for (int i = 0; i <= 2000000; ++i) {
    float x = lo + (hi - lo) * (float)i / 2000000.0f;
    double e = ref((double)x);
    if (!isfinite(e) || fabs(e) > FLT_MAX) continue;
    double u = ulps(f(x), e);
    if (u > w) w = u;
  }
  return w;
}
static double gelu_cdf(double x) { return 0.5 * erfc(-x / sqrt(2.0)); }
static double gelu_tanh_s(double x) { return 1.0 / (1.0 + exp(-2.0 * gt_u(x))); }

int main(void) {
  double w;
  CHECK((w = worst(tpu__vexpf, exp, -103.9f, 88.7f)) <= 2); printf("exp    %.2f ulp\n", w);
  CHECK((w = worst(tpu__vtanhf, tanh, -12.0f, 12.0f)) <= 3); printf("tanh   %.2f ulp\n", w);
  CHECK((w = worst(tpu__verff, erf, -6.0f, 6.0f)) <= 3); printf("erf    %.2f ulp\n", w);
  CHECK((w = worst(tpu__vsigmoidf, sigmoid, -80.0f, 80.0f)) <= 3); printf("sigmoid %.2f ulp\n", w);
  /* 1 + erf keeps relative accuracy in the negative tail (no cancellation); e^{-x^2} uses
   * x^2 rounded to float, so the error grows like x^2 / 2 ulp far out. */
  CHECK((w = worst(tpu__vone_plus_erff, one_plus_erf, -3.0f, 6.0f)) <= 12); printf("1+erf  %.2f ulp\n", w);
  CHECK((w = worst(tpu__vone_plus_erff, one_plus_erf, -10.0f, -3.0f)) <= 80); printf("1+erf  %.2f ulp (x < -3)\n", w);
  /* GELU from x (x^2 / 2 formed exactly), forward down to where it underflows */
  CHECK((w = worst(tpu__vgeluf, gelu, -15.0f, 8.0f)) <= 8); printf("gelu   %.2f ulp\n", w);
  CHECK((w = worst_grad(tpu__vgelu_gradf, gelu_grad, gelu_cdf, -15.0f, 8.0f)) <= 8);
  printf("gelu'  %.2f ulp (of the larger term)\n", w);
  /* GELU's tanh form as x / (1 + e^{-2u}): below x = -2 the result is x e^{2u} with |2u|
   * up to 88 rounded to float, so the error grows like |2u| / 2 ulp (0.5 (1 + tanh u) in
   * float, the formula before, lost every digit there: 1.7e7 ulp) */
  CHECK((w = worst(tpu__vgelu_tanhf, gelu_tanh, -2.0f, 10.0f)) <= 8); printf("gelu_tanh %.2f ulp\n", w);
  CHECK((w = worst(tpu__vgelu_tanhf, gelu_tanh, -10.0f, -2.0f)) <= 240); printf("gelu_tanh %.2f ulp (x < -2)\n", w);
  CHECK((w = worst_grad(tpu__vgelu_tanh_gradf, gelu_tanh_grad, gelu_tanh_s, -2.0f, 10.0f)) <= 12);
  printf("gelu_tanh' %.2f ulp (of the larger term)\n", w);
  CHECK((w = worst_grad(tpu__vgelu_tanh_gradf, gelu_tanh_grad, gelu_tanh_s, -10.0f, -2.0f)) <= 240);
  printf("gelu_tanh' %.2f ulp (of the larger term, x < -2)\n", w);
  /* near zero: relative accuracy, not just absolute */
  CHECK(worst(tpu__verff, erf, -1e-3f, 1e-3f) <= 3); /* 2/sqrt(pi) itself is 0.5 ulp off in float */
  CHECK(worst(tpu__vtanhf, tanh, -1e-3f, 1e-3f) <= 2);
  /* special values */
  CHECK(tpu__vexpf(INFINITY) == INFINITY && tpu__vexpf(-INFINITY) == 0 && isnan(tpu__vexpf(NAN)));
  CHECK(tpu__vexpf(89.0f) == INFINITY && tpu__vexpf(-105.0f) == 0 && tpu__vexpf(0) == 1);
  CHECK(tpu__vexpf(-100.0f) > 0 && tpu__vexpf(-100.0f) < FLT_MIN); /* subnormal results */
  CHECK(tpu__vtanhf(INFINITY) == 1 && tpu__vtanhf(-INFINITY) == -1 && isnan(tpu__vtanhf(NAN)));
  CHECK(tpu__verff(INFINITY) == 1 && tpu__verff(-INFINITY) == -1 && isnan(tpu__verff(NAN)));
  CHECK(tpu__vsigmoidf(-INFINITY) == 0 && tpu__vsigmoidf(INFINITY) == 1 && isnan(tpu__vsigmoidf(NAN)));
  CHECK(tpu__vone_plus_erff(-INFINITY) == 0 && tpu__vone_plus_erff(INFINITY) == 2);
  CHECK(signbit(tpu__verff(-0.0f)) && signbit(tpu__vtanhf(-0.0f)));
  /* -inf * 0 in the formula, as in PyTorch's CPU kernels (which give NaN at +inf too) */
  CHECK(tpu__vgeluf(INFINITY) == INFINITY && isnan(tpu__vgeluf(-INFINITY)) && tpu__vgeluf(0) == 0);
  CHECK(isnan(tpu__vgelu_gradf(INFINITY)) && isnan(tpu__vgelu_gradf(-INFINITY)) && tpu__vgelu_gradf(0) == 0.5f);
  CHECK(tpu__vgelu_tanhf(INFINITY) == INFINITY && isnan(tpu__vgelu_tanhf(-INFINITY)) && tpu__vgelu_tanhf(0) == 0);
  CHECK(tpu__vgelu_tanhf(-30.0f) == 0 && tpu__vgelu_tanh_gradf(-30.0f) == 0 && tpu__vgelu_tanh_gradf(0) == 0.5f);
  CHECK(isnan(tpu__vgelu_tanh_gradf(INFINITY)) && isnan(tpu__vgelu_tanh_gradf(-INFINITY)));
  /* NaNs with payload bits (the exponent-field add in e^x must not turn them into numbers) */
  uint32_t nan_bits[4] = {0x7fc00000u, 0xffc00000u, 0x7fc00003u, 0x7fffffffu};
  for (int i = 0; i < 4; ++i) {
    float q = tpu__f32_from_bits(nan_bits[i]);
    CHECK(isnan(tpu__vexpf(q)) && isnan(tpu__verff(q)) && isnan(tpu__vtanhf(q)) && isnan(tpu__vsigmoidf(q)));
    CHECK(isnan(tpu__vone_plus_erff(q)) && isnan(tpu__vgeluf(q)) && isnan(tpu__vgelu_gradf(q)));
    CHECK(isnan(tpu__vgelu_tanhf(q)) && isnan(tpu__vgelu_tanh_gradf(q)));
  }
  TEST_MAIN_END();
}
