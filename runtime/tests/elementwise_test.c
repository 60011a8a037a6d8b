/* Elementwise family: builders (dtype rules, errors) and host kernels, driven through
 * tpu_op_prepare with hand-made arguments and checked against hand-computed values. */
#include <float.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

#define MAXT 1024
static tpu_storage_t* storages[MAXT];
static int n_storages;

/* A contiguous tensor holding `data` (dense, dtype dt). */
static tpu_view_t mk(tpu_dtype_t dt, int nd, const int64_t* sizes, const void* data) {
  int64_t numel = 1;
  for (int i = 0; i < nd; ++i) numel *= sizes[i];
  tpu_storage_t* s = NULL;
  CHECK_OK(tpu_storage_create(0, (uint64_t)(numel ? numel : 1) * tpu_dtype_size(dt), &s));
  if (n_storages < MAXT) storages[n_storages++] = s;
  tpu_view_t v = check_view(s, dt, nd, sizes);
  if (data) CHECK_OK(tpu_copy_from_host(&v, data));
  return v;
}
static tpu_view_t mkf(int n, const float* d) { int64_t s[1] = {n}; return mk(TPU_DTYPE_F32, 1, s, d); }
static tpu_view_t mkd(int n, const double* d) { int64_t s[1] = {n}; return mk(TPU_DTYPE_F64, 1, s, d); }
static tpu_view_t mkl(int n, const int64_t* d) { int64_t s[1] = {n}; return mk(TPU_DTYPE_I64, 1, s, d); }
static tpu_view_t mkb(int n, const uint8_t* d) { int64_t s[1] = {n}; return mk(TPU_DTYPE_BOOL, 1, s, d); }

static tpu_arg_t T_(tpu_view_t v) { tpu_arg_t a = {0}; a.kind = TPU_ARG_TENSOR; a.tensor = v; return a; }
static tpu_arg_t SI(int64_t i) { tpu_arg_t a = {0}; a.kind = TPU_ARG_SCALAR; a.scalar_kind = TPU_SCALAR_INT; a.v.i = i; return a; }
static tpu_arg_t SD(double d) { tpu_arg_t a = {0}; a.kind = TPU_ARG_SCALAR; a.scalar_kind = TPU_SCALAR_FLOAT; a.v.d = d; return a; }
static tpu_arg_t NONE_(void) { tpu_arg_t a = {0}; a.kind = TPU_ARG_NONE; return a; }
static tpu_arg_t STR(const char* s) { tpu_arg_t a = {0}; a.kind = TPU_ARG_STRING; a.s = s; return a; }
static tpu_arg_t B_(bool b) { tpu_arg_t a = {0}; a.kind = TPU_ARG_BOOL; a.v.b = b; return a; }
static tpu_arg_t D_(double d) { tpu_arg_t a = {0}; a.kind = TPU_ARG_DOUBLE; a.v.d = d; return a; }
static tpu_arg_t I_(int64_t i) { tpu_arg_t a = {0}; a.kind = TPU_ARG_INT; a.v.i = i; return a; }

/* Runs op `name`. FUNCTIONAL: allocates *out from the node's metadata. INPLACE/OUT: binds
 * *out. Returns the first error of prepare, bind, submit or the following sync. */
static tpu_status_t run(const char* name, tpu_variant_t var, const tpu_arg_t* args, int nargs, tpu_view_t* out) {
  int idx = check_op_index(name);
  if (idx < 0) return tpu_status_make(TPU_INTERNAL, "no op %s", name);
  tpu_node_t* n;
  TPU_RETURN_IF_ERROR(tpu_op_prepare(idx, var, args, nargs, &n));
  if (var == TPU_VARIANT_FUNCTIONAL) {
    tpu_dtype_t dt; int32_t nd; int64_t sz[TPU_MAX_DIMS];
    tpu_node_output_meta(n, 0, &dt, &nd, sz);
    *out = mk(dt, nd, sz, NULL);
  }
  tpu_status_t st = tpu_node_bind_output(n, 0, out);
  if (st) { tpu_node_discard(n); return st; }
  TPU_RETURN_IF_ERROR(tpu_node_submit(n));
  return tpu_device_synchronize(0);
}

/* Reads a whole view as doubles. */
static void rd(const tpu_view_t* v, double* out) {
  int64_t n = tpu_view_numel(v);
  size_t es = tpu_dtype_size(v->dtype);
  unsigned char* buf = malloc((size_t)n * es + 8);
  CHECK_OK(tpu_copy_to_host(v, buf));
  for (int64_t i = 0; i < n; ++i) {
    const unsigned char* p = buf + i * (int64_t)es;
    switch (v->dtype) {
      case TPU_DTYPE_F32: out[i] = *(const float*)p; break;
      case TPU_DTYPE_F64: out[i] = *(const double*)p; break;
      case TPU_DTYPE_I64: out[i] = (double)*(const int64_t*)p; break;
      case TPU_DTYPE_I32: out[i] = *(const int32_t*)p; break;
      case TPU_DTYPE_BOOL: case TPU_DTYPE_U8: out[i] = *p; break;
      case TPU_DTYPE_I8: out[i] = *(const int8_t*)p; break;
      case TPU_DTYPE_F16: out[i] = (double)*(const _Float16*)p; break;
      case TPU_DTYPE_BF16: { uint32_t u = (uint32_t)(*(const uint16_t*)p) << 16; float f; memcpy(&f, &u, 4); out[i] = f; break; }
      default: out[i] = NAN;
    }
  }
  free(buf);
}

static bool same(double a, double b, double tol) {
  if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
  if (isinf(a) || isinf(b)) return a == b;
  return fabs(a - b) <= tol * (1 + fabs(b));
}
#define CHECK_VALS(v, expect, n, tol)                                              \
  do {                                                                             \
    double got_[64];                                                               \
    rd(&(v), got_);                                                                \
    for (int k_ = 0; k_ < (n); ++k_)                                               \
      if (!same(got_[k_], (expect)[k_], (tol))) {                                  \
        fprintf(stderr, "%s:%d: element %d: got %.17g expected %.17g\n", __FILE__, \
                __LINE__, k_, got_[k_], (double)(expect)[k_]);                     \
        ++check_failures;                                                          \
      }                                                                            \
  } while (0)

/* ---- unary float functions against libm in double ------------------------------------ */
static double sigm(double x) { return 1 / (1 + exp(-x)); }
static double gelu_ref(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }
static double silu_ref(double x) { return x * sigm(x); }
static double mish_ref(double x) { return x * tanh(log1p(exp(x))); }
static double rsqrt_ref(double x) { return 1 / sqrt(x); }
static double recip_ref(double x) { return 1 / x; }
static double frac_ref(double x) { return x - trunc(x); }
static double hsig_ref(double x) { return fmin(fmax(x + 3, 0), 6) / 6; }
static double hswish_ref(double x) { return x * hsig_ref(x); }
static double round_ref(double x) { return nearbyint(x); }

static void test_unary_float(void) {
  struct { const char* name; double (*f)(double); } cases[] = {
      {"sqrt", sqrt}, {"rsqrt", rsqrt_ref}, {"log", log}, {"log1p", log1p}, {"log2", log2},
      {"log10", log10}, {"exp2", exp2}, {"expm1", expm1}, {"sin", sin}, {"cos", cos},
      {"tan", tan}, {"tanh", tanh}, {"sigmoid", sigm}, {"erf", erf}, {"reciprocal", recip_ref},
      {"floor", floor}, {"ceil", ceil}, {"round", round_ref}, {"trunc", trunc}, {"frac", frac_ref},
      {"asin", asin}, {"acos", acos}, {"atan", atan}, {"sinh", sinh}, {"cosh", cosh},
      {"asinh", asinh}, {"atanh", atanh}, {"gelu", gelu_ref}, {"silu", silu_ref}, {"mish", mish_ref},
      {"hardsigmoid", hsig_ref}, {"hardswish", hswish_ref}, {"exp", exp}, {"abs", fabs},
  };
  double x[6] = {0.25, 0.5, 0.75, 0.125, 0.9, 2.5};
  double xm[6];
  for (size_t c = 0; c < sizeof cases / sizeof *cases; ++c) {
    bool unit = !strcmp(cases[c].name, "asin") || !strcmp(cases[c].name, "acos") || !strcmp(cases[c].name, "atanh");
    for (int i = 0; i < 6; ++i) xm[i] = unit && x[i] >= 1 ? 0.5 : x[i];
    double e[6];
    for (int i = 0; i < 6; ++i) e[i] = cases[c].f(xm[i]);
    tpu_view_t in = mkd(6, xm), out;
    tpu_arg_t a[1] = {T_(in)};
    tpu_status_t st = run(cases[c].name, TPU_VARIANT_FUNCTIONAL, a, 1, &out);
    if (st) { fprintf(stderr, "%s: %s\n", cases[c].name, tpu_status_message(st)); ++check_failures; tpu_status_free(st); continue; }
    CHECK(out.dtype == TPU_DTYPE_F64);
    CHECK_VALS(out, e, 6, 1e-12);
  }
  /* acosh needs x >= 1; erfinv round-trips through erf */
  double y[4] = {1.0, 1.5, 3.0, 10.0}, ey[4];
  for (int i = 0; i < 4; ++i) ey[i] = acosh(y[i]);
  tpu_view_t out;
  tpu_arg_t a[1] = {T_(mkd(4, y))};
  CHECK_OK(run("acosh", TPU_VARIANT_FUNCTIONAL, a, 1, &out));
  CHECK_VALS(out, ey, 4, 1e-12);
  double p[7] = {-0.999, -0.5, 0.0, 0.3, 0.99999, 1.0, 1.5}, ep[7] = {0};
  a[0] = T_(mkd(7, p));
  CHECK_OK(run("erfinv", TPU_VARIANT_FUNCTIONAL, a, 1, &out));
  double got[7];
  rd(&out, got);
  for (int i = 0; i < 5; ++i) CHECK_NEAR(erf(got[i]), p[i], 1e-14);
  CHECK(isinf(got[5]) && got[5] > 0);
  CHECK(isnan(got[6]));
  (void)ep;
}

static void test_promotion_and_int_unary(void) {
  int64_t xi[4] = {-3, 0, 4, 9};
  tpu_view_t out;
  tpu_arg_t a[1] = {T_(mkl(4, xi))};
  CHECK_OK(run("sqrt", TPU_VARIANT_FUNCTIONAL, a, 1, &out));
  CHECK(out.dtype == TPU_DTYPE_F32); /* integers promote to the default float */
  double e[4] = {NAN, 0, 2, 3};
  CHECK_VALS(out, e, 4, 1e-7);
  CHECK_OK(run("abs", TPU_VARIANT_FUNCTIONAL, a, 1, &out));
  CHECK(out.dtype == TPU_DTYPE_I64);
  double ea[4] = {3, 0, 4, 9};
  CHECK_VALS(out, ea, 4, 0);
  CHECK_OK(run("sign", TPU_VARIANT_FUNCTIONAL, a, 1, &out));
  double es[4] = {-1, 0, 1, 1};
  CHECK_VALS(out, es, 4, 0);
  CHECK_OK(run("bitwise_not", TPU_VARIANT_FUNCTIONAL, a, 1, &out));
  double eb[4] = {2, -1, -5, -10};
  CHECK_VALS(out, eb, 4, 0);
  /* bitwise_not on bool is logical not, not ~1 == -2 */
  uint8_t bb[3] = {1, 0, 1};
  a[0] = T_(mkb(3, bb));
  CHECK_OK(run("bitwise_not", TPU_VARIANT_FUNCTIONAL, a, 1, &out));
  double enb[3] = {0, 1, 0};
  CHECK(out.dtype == TPU_DTYPE_BOOL);
  CHECK_VALS(out, enb, 3, 0);
  /* in-place float result into an int tensor is refused */
  a[0] = T_(mkl(4, xi));
  tpu_view_t self = a[0].tensor;
  CHECK_CODE(run("sqrt_", TPU_VARIANT_INPLACE, a, 1, &self), TPU_INVALID_ARGUMENT);
}

static void test_int_division(void) {
  int64_t x[5] = {-7, 7, -7, 7, INT64_MIN}, y[5] = {2, 2, -2, -2, -1};
  tpu_arg_t a[3] = {T_(mkl(5, x)), T_(mkl(5, y)), STR("floor")};
  tpu_view_t out;
  CHECK_OK(run("div.Tensor_mode", TPU_VARIANT_FUNCTIONAL, a, 3, &out));
  CHECK(out.dtype == TPU_DTYPE_I64);
  double ef[4] = {-4, 3, 3, -4};
  CHECK_VALS(out, ef, 4, 0);
  a[2] = STR("trunc");
  CHECK_OK(run("div.Tensor_mode", TPU_VARIANT_FUNCTIONAL, a, 3, &out));
  double et[4] = {-3, 3, 3, -3};
  CHECK_VALS(out, et, 4, 0);
  CHECK_OK(run("remainder.Tensor", TPU_VARIANT_FUNCTIONAL, a, 2, &out));
  double er[5] = {1, 1, -1, -1, 0};
  CHECK_VALS(out, er, 5, 0);
  CHECK_OK(run("fmod.Tensor", TPU_VARIANT_FUNCTIONAL, a, 2, &out));
  double em[5] = {-1, 1, -1, 1, 0};
  CHECK_VALS(out, em, 5, 0);
  CHECK_OK(run("floor_divide", TPU_VARIANT_FUNCTIONAL, a, 2, &out));
  CHECK_VALS(out, ef, 4, 0);
  /* float floor division and remainder follow Python's signs */
  double fx[4] = {-7.5, 7.5, -7.5, 7.5}, fy[4] = {2, 2, -2, -2};
  tpu_arg_t af[3] = {T_(mkd(4, fx)), T_(mkd(4, fy)), STR("floor")};
  CHECK_OK(run("div.Tensor_mode", TPU_VARIANT_FUNCTIONAL, af, 3, &out));
  double eff[4] = {-4, 3, 3, -4};
  CHECK_VALS(out, eff, 4, 0);
  CHECK_OK(run("remainder.Tensor", TPU_VARIANT_FUNCTIONAL, af, 2, &out));
  double erf_[4] = {0.5, 1.5, -1.5, -0.5};
  CHECK_VALS(out, erf_, 4, 0);
  /* integer division by zero: the kernel's error surfaces at sync, no crash */
  int64_t z[5] = {1, 0, 1, 1, 1};
  tpu_arg_t az[2] = {T_(mkl(5, x)), T_(mkl(5, z))};
  tpu_status_t st = run("remainder.Tensor", TPU_VARIANT_FUNCTIONAL, az, 2, &out);
  CHECK(tpu_status_code(st) == TPU_INVALID_ARGUMENT);
  CHECK(st && strstr(tpu_status_message(st), "ZeroDivisionError"));
  tpu_status_free(st);
  az[1] = SI(0);
  CHECK_CODE(run("floor_divide.Scalar", TPU_VARIANT_FUNCTIONAL, az, 2, &out), TPU_INVALID_ARGUMENT);
  tpu_arg_t az3[3] = {T_(mkl(5, x)), SI(0), STR("trunc")};
  CHECK_CODE(run("div.Scalar_mode", TPU_VARIANT_FUNCTIONAL, az3, 3, &out), TPU_INVALID_ARGUMENT);
  /* the queue keeps working after the error */
  CHECK_OK(run("fmod.Scalar", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkl(5, x)), SI(3)}, 2, &out));
  /* true division of integers is float and does not fault */
  CHECK_OK(run("div.Tensor", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkl(5, x)), T_(mkl(5, z))}, 2, &out));
  CHECK(out.dtype == TPU_DTYPE_F32);
}

static void test_binary(void) {
  double x[4] = {1, NAN, -2, 3}, y[4] = {2, 1, NAN, -3};
  tpu_arg_t a[2] = {T_(mkd(4, x)), T_(mkd(4, y))};
  tpu_view_t out;
  CHECK_OK(run("maximum", TPU_VARIANT_FUNCTIONAL, a, 2, &out));
  double emax[4] = {2, NAN, NAN, 3};
  CHECK_VALS(out, emax, 4, 0);
  CHECK_OK(run("fmax", TPU_VARIANT_FUNCTIONAL, a, 2, &out));
  double efmax[4] = {2, 1, -2, 3};
  CHECK_VALS(out, efmax, 4, 0);
  CHECK_OK(run("fmin", TPU_VARIANT_FUNCTIONAL, a, 2, &out));
  double efmin[4] = {1, 1, -2, -3};
  CHECK_VALS(out, efmin, 4, 0);
  CHECK_OK(run("copysign.Tensor", TPU_VARIANT_FUNCTIONAL, a, 2, &out));
  double ecs[4] = {1, NAN, 2, -3}; /* NaN carries a positive sign bit */
  CHECK_VALS(out, ecs, 4, 0);
  CHECK_OK(run("logical_and", TPU_VARIANT_FUNCTIONAL, a, 2, &out));
  CHECK(out.dtype == TPU_DTYPE_BOOL);
  double eland[4] = {1, 1, 1, 1};
  CHECK_VALS(out, eland, 4, 0);
  double p[3] = {0, 0, 2}, q[3] = {NAN, 0, M_E};
  CHECK_OK(run("xlogy.Tensor", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkd(3, p)), T_(mkd(3, q))}, 2, &out));
  double exl[3] = {NAN, 0, 2};
  CHECK_VALS(out, exl, 3, 1e-15);
  /* pow: integer powers by squaring, negative exponents of tensors give 0/±1 */
  int64_t b[4] = {2, -1, 3, 1}, e[4] = {10, -3, -1, -5};
  CHECK_OK(run("pow.Tensor_Tensor", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkl(4, b)), T_(mkl(4, e))}, 2, &out));
  double ep[4] = {1024, -1, 0, 1};
  CHECK_VALS(out, ep, 4, 0);
  CHECK_OK(run("pow.Scalar", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){SD(2.0), T_(mkl(4, b))}, 2, &out));
  CHECK(out.dtype == TPU_DTYPE_F32);
  double eps[4] = {4, 0.5, 8, 2};
  CHECK_VALS(out, eps, 4, 0);
  /* rsub and add with alpha, broadcasting a [2,1] against [3] */
  int64_t s21[2] = {2, 1};
  int64_t lhs[2] = {10, 20}, rhs[3] = {1, 2, 3};
  tpu_view_t vl = mk(TPU_DTYPE_I64, 2, s21, lhs);
  CHECK_OK(run("rsub.Tensor", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(vl), T_(mkl(3, rhs)), SI(2)}, 3, &out));
  CHECK(out.ndim == 2 && out.sizes[0] == 2 && out.sizes[1] == 3);
  double ers[6] = {-19, -18, -17, -39, -38, -37};
  CHECK_VALS(out, ers, 6, 0);
  /* bitwise with a scalar on the left */
  CHECK_OK(run("bitwise_xor.Scalar_Tensor", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){SI(6), T_(mkl(3, rhs))}, 2, &out));
  double ebx[3] = {7, 4, 5};
  CHECK_VALS(out, ebx, 3, 0);
}

static void test_ternary(void) {
  uint8_t c[4] = {1, 0, 1, 0};
  float x[4] = {1, 2, 3, 4};
  double y[1] = {-1};
  tpu_view_t out;
  /* where: f32 and f64 promote to f64; the condition broadcasts */
  CHECK_OK(run("where.self", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkb(4, c)), T_(mkf(4, x)), T_(mkd(1, y))}, 3, &out));
  CHECK(out.dtype == TPU_DTYPE_F64);
  double ew[4] = {1, -1, 3, -1};
  CHECK_VALS(out, ew, 4, 0);
  CHECK_CODE(run("where.self", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkf(4, x)), T_(mkf(4, x)), T_(mkf(4, x))}, 3, &out), TPU_INVALID_ARGUMENT);
  /* masked_fill_ on a transposed (strided) self */
  int64_t s22[2] = {2, 2};
  float m[4] = {1, 2, 3, 4};
  tpu_view_t self = mk(TPU_DTYPE_F32, 2, s22, m);
  self.strides[0] = 1; self.strides[1] = 2; /* self^T = [[1,3],[2,4]] */
  uint8_t mk_[2] = {1, 0};
  CHECK_OK(run("masked_fill_.Scalar", TPU_VARIANT_INPLACE, (tpu_arg_t[]){T_(self), T_(mkb(2, mk_)), SD(9.5)}, 3, &self));
  double emf[4] = {9.5, 3, 9.5, 4};
  CHECK_VALS(self, emf, 4, 0);
  CHECK_CODE(run("masked_fill.Scalar", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(self), T_(mkf(4, x)), SD(1)}, 3, &out), TPU_INVALID_ARGUMENT);
  /* masked_fill of an int tensor with a float value truncates */
  int64_t iv[2] = {5, 6};
  CHECK_OK(run("masked_fill.Scalar", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkl(2, iv)), T_(mkb(2, mk_)), SD(2.5)}, 3, &out));
  CHECK(out.dtype == TPU_DTYPE_I64);
  double emi[2] = {2, 6};
  CHECK_VALS(out, emi, 2, 0);
  /* clamp: Tensor min only, Scalar max only, NaN bound, lo > hi gives hi */
  double v[4] = {-2, 0.5, 3, NAN}, lo[4] = {-1, -1, NAN, -1};
  CHECK_OK(run("clamp.Tensor", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkd(4, v)), T_(mkd(4, lo)), NONE_()}, 3, &out));
  double ec[4] = {-1, 0.5, NAN, NAN};
  CHECK_VALS(out, ec, 4, 0);
  CHECK_OK(run("clamp", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkd(4, v)), NONE_(), SI(0)}, 3, &out));
  double ec2[4] = {-2, 0, 0, NAN};
  CHECK_VALS(out, ec2, 4, 0);
  CHECK_OK(run("clamp", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkd(4, v)), SI(3), SI(1)}, 3, &out));
  double ec3[4] = {1, 1, 1, NAN};
  CHECK_VALS(out, ec3, 4, 0);
  CHECK_CODE(run("clamp", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkd(4, v)), NONE_(), NONE_()}, 3, &out), TPU_INVALID_ARGUMENT);
  int64_t li[3] = {-5, 0, 5};
  CHECK_OK(run("clamp_min", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkl(3, li)), SD(0.5)}, 2, &out));
  CHECK(out.dtype == TPU_DTYPE_F32); /* clamp promotes like PyTorch does */
  double ecm[3] = {0.5, 0.5, 5};
  CHECK_VALS(out, ecm, 3, 0);
  /* addcmul / addcdiv / lerp */
  double t0[2] = {1, 2}, t1[2] = {3, 4}, t2[2] = {2, 8};
  CHECK_OK(run("addcmul", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkd(2, t0)), T_(mkd(2, t1)), T_(mkd(2, t2)), SD(0.5)}, 4, &out));
  double eac[2] = {4, 18};
  CHECK_VALS(out, eac, 2, 0);
  CHECK_OK(run("addcdiv", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkd(2, t0)), T_(mkd(2, t1)), T_(mkd(2, t2)), SI(2)}, 4, &out));
  double ead[2] = {4, 3};
  CHECK_VALS(out, ead, 2, 0);
  CHECK_CODE(run("addcdiv", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkd(2, t0)), T_(mkl(3, li)), T_(mkl(3, li)), SI(1)}, 4, &out), TPU_INVALID_ARGUMENT);
  CHECK_OK(run("lerp.Scalar", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkd(2, t0)), T_(mkd(2, t2)), SD(0.75)}, 3, &out));
  double el[2] = {1.75, 6.5};
  CHECK_VALS(out, el, 2, 1e-15);
  CHECK_CODE(run("lerp.Scalar", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkd(2, t0)), T_(mkf(2, x)), SD(0.75)}, 3, &out), TPU_INVALID_ARGUMENT);
  /* addr: 2 * self + 3 * outer(vec1, vec2), self a row broadcast over [2, 2] (f32 and f64
   * promote); beta = 0 ignores a NaN self; in place self must be [n, m] already */
  float srow[2] = {1, NAN};
  int64_t s12[2] = {1, 2};
  CHECK_OK(run("addr", TPU_VARIANT_FUNCTIONAL,
               (tpu_arg_t[]){T_(mk(TPU_DTYPE_F32, 2, s12, srow)), T_(mkd(2, t0)), T_(mkd(2, t1)), SI(0), SI(3)}, 5, &out));
  CHECK(out.dtype == TPU_DTYPE_F64 && out.ndim == 2 && out.sizes[0] == 2 && out.sizes[1] == 2);
  double ear[4] = {9, 12, 18, 24};
  CHECK_VALS(out, ear, 4, 0);
  CHECK_OK(run("addr", TPU_VARIANT_FUNCTIONAL,
               (tpu_arg_t[]){T_(mk(TPU_DTYPE_F32, 2, s12, x)), T_(mkf(2, x)), T_(mkf(2, x + 2)), SI(2), SI(3)}, 5, &out));
  double ear2[4] = {11, 16, 20, 28};
  CHECK_VALS(out, ear2, 4, 0);
  CHECK_CODE(run("addr_", TPU_VARIANT_INPLACE,
                 (tpu_arg_t[]){T_(mk(TPU_DTYPE_F32, 2, s12, x)), T_(mkf(2, x)), T_(mkf(2, x)), SI(1), SI(1)}, 5, &out),
             TPU_INVALID_ARGUMENT);
  CHECK_CODE(run("addr", TPU_VARIANT_FUNCTIONAL,
                 (tpu_arg_t[]){T_(mkl(3, li)), T_(mkl(3, li)), T_(mkl(3, li)), SD(0.5), SI(1)}, 5, &out),
             TPU_INVALID_ARGUMENT);
  /* zero_ on a strided view */
  tpu_view_t z = self;
  CHECK_OK(run("zero_", TPU_VARIANT_INPLACE, (tpu_arg_t[]){T_(z)}, 1, &z));
  double ez[4] = {0, 0, 0, 0};
  CHECK_VALS(z, ez, 4, 0);
}

static void test_activations(void) {
  double x[5] = {-4, -1, 0, 0.5, 30};
  tpu_view_t out, vx = mkd(5, x);
  CHECK_OK(run("hardtanh", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(vx), SD(-2), SD(0.25)}, 3, &out));
  double eh[5] = {-2, -1, 0, 0.25, 0.25};
  CHECK_VALS(out, eh, 5, 0);
  CHECK_OK(run("leaky_relu", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(vx), SD(0.1)}, 2, &out));
  double elr[5] = {-0.4, -0.1, 0, 0.5, 30};
  CHECK_VALS(out, elr, 5, 1e-15);
  CHECK_OK(run("elu", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(vx), SD(2), SD(3), SD(0.5)}, 4, &out));
  double ee[5];
  for (int i = 0; i < 5; ++i) ee[i] = x[i] <= 0 ? (exp(x[i] * 0.5) - 1) * 6 : x[i] * 3;
  CHECK_VALS(out, ee, 5, 1e-14);
  CHECK_OK(run("softplus", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(vx), SD(2), SD(20)}, 3, &out));
  double es[5];
  for (int i = 0; i < 5; ++i) es[i] = x[i] * 2 > 20 ? x[i] : log1p(exp(2 * x[i])) / 2;
  CHECK_VALS(out, es, 5, 1e-14);
  CHECK_OK(run("gelu", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(vx), STR("tanh")}, 2, &out));
  double eg[5];
  for (int i = 0; i < 5; ++i) eg[i] = 0.5 * x[i] * (1 + tanh(sqrt(2 / M_PI) * (x[i] + 0.044715 * pow(x[i], 3))));
  CHECK_VALS(out, eg, 5, 1e-14);
  CHECK_CODE(run("gelu", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(vx), STR("fast")}, 2, &out), TPU_INVALID_ARGUMENT);
  double pl[3] = {0.25, 0.0, 1.5};
  CHECK_OK(run("logit", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkd(3, pl)), D_(0.1)}, 2, &out));
  double elg[3] = {log(0.25 / 0.75), log(0.1 / 0.9), log(0.9 / 0.1)};
  CHECK_VALS(out, elg, 3, 1e-14);
  /* nan_to_num defaults depend on the output dtype */
  double nn[3] = {NAN, INFINITY, -INFINITY};
  tpu_view_t half = mk(TPU_DTYPE_F16, 1, (int64_t[]){3}, NULL);
  { tpu_view_t src = mkd(3, nn); CHECK_OK(tpu_copy(&half, &src)); }
  CHECK_OK(run("nan_to_num", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(half), NONE_(), NONE_(), NONE_()}, 4, &out));
  CHECK(out.dtype == TPU_DTYPE_F16);
  double enn[3] = {0, 65504, -65504};
  CHECK_VALS(out, enn, 3, 0);
  /* round with decimals (half to even), on float only */
  double r[4] = {1.2345, -1.2355, 125, 0.125};
  CHECK_OK(run("round.decimals", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkd(4, r)), I_(2)}, 2, &out));
  double er2[4] = {1.23, -1.24, 125, 0.12};
  CHECK_VALS(out, er2, 4, 1e-15);
  CHECK_OK(run("round.decimals", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkd(4, r)), I_(-1)}, 2, &out));
  double er3[4] = {0, -0, 120, 0};
  CHECK_VALS(out, er3, 4, 0);
}

static void test_backward(void) {
  double g[4] = {1, 2, 3, 4}, x[4] = {-1, 0.5, 2, 4};
  tpu_view_t out, vg = mkd(4, g), vx = mkd(4, x);
  CHECK_OK(run("threshold_backward", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(vg), T_(vx), SD(0.5)}, 3, &out));
  double et[4] = {0, 0, 3, 4};
  CHECK_VALS(out, et, 4, 0);
  CHECK_OK(run("sigmoid_backward", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(vg), T_(vx)}, 2, &out));
  double es[4];
  for (int i = 0; i < 4; ++i) es[i] = g[i] * (1 - x[i]) * x[i];
  CHECK_VALS(out, es, 4, 1e-15);
  /* the GELU derivatives match central differences of the forward functions */
  for (int approx = 0; approx < 2; ++approx) {
    CHECK_OK(run("gelu_backward", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(vg), T_(vx), STR(approx ? "tanh" : "none")}, 3, &out));
    double got[4];
    rd(&out, got);
    for (int i = 0; i < 4; ++i) {
      double h = 1e-6, xp = x[i] + h, xm = x[i] - h, fp, fm;
      if (approx) {
        fp = 0.5 * xp * (1 + tanh(sqrt(2 / M_PI) * (xp + 0.044715 * xp * xp * xp)));
        fm = 0.5 * xm * (1 + tanh(sqrt(2 / M_PI) * (xm + 0.044715 * xm * xm * xm)));
      } else {
        fp = gelu_ref(xp);
        fm = gelu_ref(xm);
      }
      CHECK_NEAR(got[i], g[i] * (fp - fm) / (2 * h), 1e-7);
    }
  }
  double el[4];
  CHECK_OK(run("elu_backward", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(vg), SD(2), SD(1), SD(1), B_(false), T_(vx)}, 6, &out));
  for (int i = 0; i < 4; ++i) el[i] = x[i] <= 0 ? g[i] * 2 * exp(x[i]) : g[i];
  CHECK_VALS(out, el, 4, 1e-15);
  CHECK_CODE(run("leaky_relu_backward", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(vg), T_(vx), SD(-0.1), B_(true)}, 4, &out), TPU_INVALID_ARGUMENT);
  CHECK_OK(run("hardswish_backward", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(vg), T_(vx)}, 2, &out));
  double ehs[4] = {1 * (-1.0 / 3 + 0.5), 2 * (0.5 / 3 + 0.5), 3 * (2.0 / 3 + 0.5), 4};
  CHECK_VALS(out, ehs, 4, 1e-15);
  int64_t li[2] = {1, 2};
  CHECK_CODE(run("sigmoid_backward", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkl(2, li)), T_(mkl(2, li))}, 2, &out), TPU_UNIMPLEMENTED);
}

static void test_errors(void) {
  float x[2] = {1, 2};
  uint8_t b[2] = {1, 0};
  tpu_view_t out, vf = mkf(2, x), vb = mkb(2, b);
  CHECK_CODE(run("bitwise_and.Tensor", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(vf), T_(vf)}, 2, &out), TPU_UNIMPLEMENTED);
  CHECK_CODE(run("sub.Tensor", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(vb), T_(vb), SI(1)}, 3, &out), TPU_UNIMPLEMENTED);
  CHECK_CODE(run("sub.Scalar", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(vb), SI(1), SI(1)}, 3, &out), TPU_UNIMPLEMENTED);
  CHECK_CODE(run("neg", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(vb)}, 1, &out), TPU_UNIMPLEMENTED);
  CHECK_CODE(run("abs", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(vb)}, 1, &out), TPU_UNIMPLEMENTED);
  CHECK_CODE(run("hypot", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(vb), T_(vb)}, 2, &out), TPU_UNIMPLEMENTED);
  CHECK_CODE(run("div.Tensor_mode", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(vf), T_(vf), STR("round")}, 3, &out), TPU_INVALID_ARGUMENT);
  int64_t li[2] = {1, 2};
  CHECK_CODE(run("pow.Tensor_Scalar", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkl(2, li)), SI(-2)}, 2, &out), TPU_INVALID_ARGUMENT);
  CHECK_CODE(run("add.Tensor", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkl(2, li)), T_(mkl(2, li)), SD(0.5)}, 3, &out), TPU_INVALID_ARGUMENT);
  uint8_t u[2] = {1, 2};
  tpu_view_t vu = mk(TPU_DTYPE_U8, 1, (int64_t[]){2}, u);
  CHECK_CODE(run("hardtanh", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(vu), SI(-1), SI(1)}, 3, &out), TPU_INVALID_ARGUMENT);
  CHECK_CODE(run("round.decimals", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkl(2, li)), I_(1)}, 2, &out), TPU_UNIMPLEMENTED);
  /* in-place with a broadcast shape larger than self */
  int64_t s22[2] = {2, 2};
  tpu_view_t big = mk(TPU_DTYPE_F32, 2, s22, NULL);
  tpu_view_t self = vf;
  CHECK_CODE(run("mul_.Tensor", TPU_VARIANT_INPLACE, (tpu_arg_t[]){T_(self), T_(big)}, 2, &self), TPU_INVALID_ARGUMENT);
  /* messages name the op */
  tpu_node_t* n;
  tpu_status_t st = tpu_op_prepare(check_op_index("bitwise_or.Tensor"), TPU_VARIANT_FUNCTIONAL,
                                   (tpu_arg_t[]){T_(vf), T_(vf)}, 2, &n);
  CHECK(st && strstr(tpu_status_message(st), "bitwise_or.Tensor") && strstr(tpu_status_message(st), "'Float'"));
  tpu_status_free(st);
}

static void test_dtypes_roundtrip(void) {
  /* bf16 and f16 inputs compute in f32 and store back rounded */
  float x[3] = {1.5f, -2.25f, 100.0f};
  tpu_view_t vf = mkf(3, x);
  tpu_view_t bf = mk(TPU_DTYPE_BF16, 1, (int64_t[]){3}, NULL), out;
  CHECK_OK(tpu_copy(&bf, &vf));
  CHECK_OK(run("mul.Scalar", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(bf), SI(2)}, 2, &out));
  CHECK(out.dtype == TPU_DTYPE_BF16);
  double e[3] = {3, -4.5, 200};
  CHECK_VALS(out, e, 3, 0);
  /* out= of a wider dtype: arithmetic casts into it; neg wants the result's dtype, as on CPU */
  tpu_view_t o32 = mk(TPU_DTYPE_F32, 1, (int64_t[]){3}, NULL);
  CHECK_OK(run("mul.out", TPU_VARIANT_OUT, (tpu_arg_t[]){T_(bf), T_(bf), T_(o32)}, 3, &o32));
  double em[3] = {2.25, 5.0625, 9984}; /* computed in bfloat16 (10000 rounds to 9984), then widened */
  CHECK_VALS(o32, em, 3, 0);
  CHECK_CODE(run("neg.out", TPU_VARIANT_OUT, (tpu_arg_t[]){T_(bf), T_(o32)}, 2, &o32), TPU_INVALID_ARGUMENT);
  /* comparisons of i8 and u8 compute in int64 and output bool */
  int8_t a8[3] = {-1, 5, 7};
  uint8_t b8[3] = {255, 5, 6};
  tpu_view_t va = mk(TPU_DTYPE_I8, 1, (int64_t[]){3}, a8), vb = mk(TPU_DTYPE_U8, 1, (int64_t[]){3}, b8);
  CHECK_OK(run("lt.Tensor", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(va), T_(vb)}, 2, &out));
  CHECK(out.dtype == TPU_DTYPE_BOOL);
  double elt[3] = {1, 0, 0};
  CHECK_VALS(out, elt, 3, 0);
  CHECK_OK(run("add.Tensor", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(va), T_(vb), SI(1)}, 3, &out));
  CHECK(out.dtype == TPU_DTYPE_I16);
}

static void test_more_ops(void) {
  int64_t a[5] = {1, -1, 5, -8, 3}, sh[5] = {63, 64, -1, 70, 2};
  tpu_view_t out;
  CHECK_OK(run("bitwise_left_shift.Tensor", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkl(5, a)), T_(mkl(5, sh))}, 2, &out));
  double el[5] = {(double)INT64_MIN, 0, 0, 0, 12};
  CHECK_VALS(out, el, 5, 0);
  CHECK_OK(run("bitwise_right_shift.Tensor", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkl(5, a)), T_(mkl(5, sh))}, 2, &out));
  double er[5] = {0, -1, 0, -1, 0};
  CHECK_VALS(out, er, 5, 0);
  /* int8 1 << 7 wraps to -128 when stored */
  int8_t b8[1] = {1};
  tpu_view_t v8 = mk(TPU_DTYPE_I8, 1, (int64_t[]){1}, b8);
  CHECK_OK(run("bitwise_left_shift.Tensor_Scalar", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(v8), SI(7)}, 2, &out));
  double e8[1] = {-128};
  CHECK_VALS(out, e8, 1, 0);
  double h[4] = {-2, 0, 3, NAN}, hv[4] = {7, 7, 7, 7};
  CHECK_OK(run("heaviside", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkd(4, h)), T_(mkd(4, hv))}, 2, &out));
  double eh[4] = {0, 7, 1, 0};
  CHECK_VALS(out, eh, 4, 0);
  CHECK_CODE(run("heaviside", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkd(4, h)), T_(mkf(2, (float[]){1, 2}))}, 2, &out), TPU_INVALID_ARGUMENT);
  double la[3] = {INFINITY, -INFINITY, 1}, lb[3] = {INFINITY, -INFINITY, 1};
  CHECK_OK(run("logaddexp", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkd(3, la)), T_(mkd(3, lb))}, 2, &out));
  double ela[3] = {INFINITY, -INFINITY, 1 + log(2.0)};
  CHECK_VALS(out, ela, 3, 1e-15);
  /* log_sigmoid_forward: two outputs, the second the backward's buffer */
  double x[3] = {-30, 0, 2};
  tpu_arg_t args[1] = {T_(mkd(3, x))};
  tpu_node_t* n;
  CHECK_OK(tpu_op_prepare(check_op_index("log_sigmoid_forward"), TPU_VARIANT_FUNCTIONAL, args, 1, &n));
  CHECK(tpu_node_output_count(n) == 2);
  tpu_view_t o0 = mkd(3, NULL), o1 = mkd(3, NULL);
  CHECK_OK(tpu_node_bind_output(n, 0, &o0));
  CHECK_OK(tpu_node_bind_output(n, 1, &o1));
  CHECK_OK(tpu_node_submit(n));
  double e0[3], e1[3];
  for (int i = 0; i < 3; ++i) { e0[i] = -log1p(exp(-x[i])); e1[i] = exp(-fabs(x[i])); }
  e0[0] = -30 - log1p(exp(-30.0));
  CHECK_VALS(o0, e0, 3, 1e-15);
  CHECK_VALS(o1, e1, 3, 1e-15);
  CHECK_OK(run("deg2rad", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkl(2, (int64_t[]){180, -90}))}, 1, &out));
  CHECK(out.dtype == TPU_DTYPE_F32);
  double ed[2] = {M_PI, -M_PI / 2};
  CHECK_VALS(out, ed, 2, 1e-7);
  /* lgamma of poles and of a negative non-integer */
  double g[3] = {0, -2, -2.5};
  CHECK_OK(run("lgamma", TPU_VARIANT_FUNCTIONAL, (tpu_arg_t[]){T_(mkd(3, g))}, 1, &out));
  double eg[3] = {INFINITY, INFINITY, lgamma(-2.5)};
  CHECK_VALS(out, eg, 3, 1e-14);
}

/* torch._foreach_* entries: every element op resolves, and a call applies the element op
 * at each list position with that position's tensor and scalar. */
static void test_foreach(void) {
  for (int i = 0; i < tpu_aten_op_count(); ++i) {
    if (!tpu_aten_op_is_foreach(i)) continue;
    tpu_node_t* n = NULL;
    tpu_status_t st = tpu_foreach_prepare(i, TPU_VARIANT_FUNCTIONAL, NULL, 0, 0, &n);
    CHECK(st && tpu_status_code(st) != TPU_UNIMPLEMENTED); /* fails in the element op's builder */
    if (st && tpu_status_code(st) == TPU_UNIMPLEMENTED) fprintf(stderr, "%s\n", tpu_status_message(st));
    tpu_status_free(st);
  }
  float a0[2] = {1, 2}, a1[3] = {3, 4, 5};
  tpu_view_t xs[2] = {mkf(2, a0), mkf(3, a1)};
  tpu_arg_t sc[2] = {SD(0.5), SI(3)};
  tpu_arg_t args[2] = {{0}, {0}};
  args[0].kind = TPU_ARG_TENSORLIST;
  args[0].tensors = xs;
  args[0].list_len = 2;
  args[1].kind = TPU_ARG_SCALARLIST;
  args[1].scalars = sc;
  args[1].list_len = 2;
  int idx = check_op_index("_foreach_mul.ScalarList");
  int64_t len = 0;
  CHECK_OK(tpu_foreach_length(idx, args, 2, &len));
  CHECK(len == 2);
  for (int64_t k = 0; k < len; ++k) {
    tpu_node_t* n = NULL;
    CHECK_OK(tpu_foreach_prepare(idx, TPU_VARIANT_FUNCTIONAL, args, 2, k, &n));
    if (!n) continue;
    tpu_dtype_t dt;
    int32_t nd;
    int64_t sizes[TPU_MAX_DIMS];
    tpu_node_output_meta(n, 0, &dt, &nd, sizes);
    tpu_view_t out = mk(dt, nd, sizes, NULL);
    CHECK_OK(tpu_node_bind_output(n, 0, &out));
    CHECK_OK(tpu_node_submit(n));
    double got[3];
    rd(&out, got);
    for (int64_t j = 0; j < sizes[0]; ++j)
      CHECK(same(got[j], (k ? a1[j] * 3 : a0[j] * 0.5), 0));
  }
  args[1].list_len = 1;
  CHECK_CODE(tpu_foreach_length(idx, args, 2, &len), TPU_INVALID_ARGUMENT);
  args[0].list_len = 0;
  CHECK_CODE(tpu_foreach_length(idx, args, 1, &len), TPU_INVALID_ARGUMENT);
  tpu_node_t* n = NULL;
  CHECK_CODE(tpu_op_prepare(idx, TPU_VARIANT_FUNCTIONAL, args, 2, &n), TPU_INTERNAL);
}

int main(void) {
  test_unary_float();
  test_promotion_and_int_unary();
  test_int_division();
  test_binary();
  test_ternary();
  test_activations();
  test_backward();
  test_errors();
  test_dtypes_roundtrip();
  test_more_ops();
  test_foreach();
  for (int i = 0; i < n_storages; ++i) tpu_storage_release(storages[i]);
  TEST_MAIN_END();
}
