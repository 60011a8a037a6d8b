/* Reduce family: reductions, scans and softmax through tpu_op_prepare, checked against
 * hand-computed values, plus the error classes PyTorch's CPU raises. */
#include <string.h>

#include "check.h"

#define MAXOUT 4

typedef struct tens_s {
  tpu_storage_t* s;
  tpu_view_t v;
} tens_t;

static size_t dsize(tpu_dtype_t dt) { return tpu_dtype_size(dt); }

static void store(void* p, tpu_dtype_t dt, double x) {
  switch (dt) {
    case TPU_DTYPE_F32: *(float*)p = (float)x; break;
    case TPU_DTYPE_F64: *(double*)p = x; break;
    case TPU_DTYPE_F16: *(_Float16*)p = (_Float16)x; break;
    case TPU_DTYPE_BF16: { float f = (float)x; uint32_t u; memcpy(&u, &f, 4); *(uint16_t*)p = (uint16_t)(u >> 16); break; }
    case TPU_DTYPE_I64: *(int64_t*)p = (int64_t)x; break;
    case TPU_DTYPE_I32: *(int32_t*)p = (int32_t)x; break;
    case TPU_DTYPE_I8: *(int8_t*)p = (int8_t)x; break;
    case TPU_DTYPE_U8: *(uint8_t*)p = (uint8_t)x; break;
    case TPU_DTYPE_BOOL: *(uint8_t*)p = x != 0; break;
    default: break;
  }
}

static double load(const void* p, tpu_dtype_t dt) {
  switch (dt) {
    case TPU_DTYPE_F32: return *(const float*)p;
    case TPU_DTYPE_F64: return *(const double*)p;
    case TPU_DTYPE_F16: return (double)*(const _Float16*)p;
    case TPU_DTYPE_BF16: { uint32_t u = (uint32_t)*(const uint16_t*)p << 16; float f; memcpy(&f, &u, 4); return f; }
    case TPU_DTYPE_I64: return (double)*(const int64_t*)p;
    case TPU_DTYPE_I32: return *(const int32_t*)p;
    case TPU_DTYPE_I8: return *(const int8_t*)p;
    case TPU_DTYPE_U8: case TPU_DTYPE_BOOL: return *(const uint8_t*)p;
    default: return NAN;
  }
}

static tens_t mk(tpu_dtype_t dt, int nd, const int64_t* sizes, const double* vals) {
  tens_t t = {0};
  int64_t n = 1;
  for (int i = 0; i < nd; ++i) n *= sizes[i];
  CHECK_OK(tpu_storage_create(0, (uint64_t)(n ? n : 1) * dsize(dt), &t.s));
  t.v = check_view(t.s, dt, nd, sizes);
  if (n && vals) {
    char* buf = malloc((size_t)n * dsize(dt));
    for (int64_t i = 0; i < n; ++i) store(buf + i * (int64_t)dsize(dt), dt, vals[i]);
    CHECK_OK(tpu_copy_from_host(&t.v, buf));
    free(buf);
  }
  return t;
}

static void rd(const tpu_view_t* v, double* out) {
  int64_t n = tpu_view_numel(v);
  char* buf = malloc((size_t)(n ? n : 1) * dsize(v->dtype));
  CHECK_OK(tpu_copy_to_host(v, buf));
  for (int64_t i = 0; i < n; ++i) out[i] = load(buf + i * (int64_t)dsize(v->dtype), v->dtype);
  free(buf);
}

static tpu_arg_t A_T(const tpu_view_t* v) { tpu_arg_t a = {0}; a.kind = TPU_ARG_TENSOR; a.tensor = *v; return a; }
static tpu_arg_t A_I(int64_t i) { tpu_arg_t a = {0}; a.kind = TPU_ARG_INT; a.v.i = i; return a; }
static tpu_arg_t A_B(bool b) { tpu_arg_t a = {0}; a.kind = TPU_ARG_BOOL; a.v.b = b; return a; }
static tpu_arg_t A_N(void) { tpu_arg_t a = {0}; a.kind = TPU_ARG_NONE; return a; }
static tpu_arg_t A_L(const int64_t* l, int n) {
  tpu_arg_t a = {0}; a.kind = TPU_ARG_INTLIST; a.list = l; a.list_len = n; return a;
}
static tpu_arg_t A_S(double d) {
  tpu_arg_t a = {0}; a.kind = TPU_ARG_SCALAR; a.scalar_kind = TPU_SCALAR_FLOAT; a.v.d = d; return a;
}

/* Runs a functional op: new contiguous outputs in outs[]. Returns the status of prepare
 * or submit; outputs are valid only on success. */
static tpu_status_t run(const char* name, tpu_arg_t* args, int nargs, tens_t* outs, int* nout) {
  int idx = check_op_index(name);
  if (idx < 0) return tpu_status_make(TPU_INTERNAL, "no op %s", name);
  tpu_node_t* n;
  TPU_RETURN_IF_ERROR(tpu_op_prepare(idx, TPU_VARIANT_FUNCTIONAL, args, nargs, &n));
  int k = tpu_node_output_count(n);
  for (int i = 0; i < k; ++i) {
    tpu_dtype_t dt; int32_t nd; int64_t sz[TPU_MAX_DIMS];
    tpu_node_output_meta(n, i, &dt, &nd, sz);
    outs[i] = mk(dt, nd, sz, NULL);
    tpu_status_t st = tpu_node_bind_output(n, i, &outs[i].v);
    if (st) { tpu_node_discard(n); return st; }
  }
  if (nout) *nout = k;
  TPU_RETURN_IF_ERROR(tpu_node_submit(n));
  return tpu_device_synchronize(0);
}

static void rel(tens_t* t, int n) { for (int i = 0; i < n; ++i) tpu_storage_release(t[i].s); }

static bool near_all(const double* got, const double* want, int n, double tol) {
  for (int i = 0; i < n; ++i) {
    if (isnan(want[i]) ? !isnan(got[i]) : fabs(got[i] - want[i]) > tol * (1 + fabs(want[i]))) {
      fprintf(stderr, "  element %d: got %.9g want %.9g\n", i, got[i], want[i]);
      return false;
    }
  }
  return true;
}

static const double M23[6] = {1, 2, 3, 4, 5, 6};
static const int64_t S23[2] = {2, 3};

static void test_sum(void) {
  tens_t x = mk(TPU_DTYPE_F32, 2, S23, M23), o[MAXOUT];
  int64_t d1[1] = {1}, d0[1] = {-2};
  double got[8];
  tpu_arg_t a[4] = {A_T(&x.v), A_L(d1, 1), A_B(false), A_N()};
  CHECK_OK(run("sum.dim_IntList", a, 4, o, NULL));
  CHECK(o[0].v.ndim == 1 && o[0].v.sizes[0] == 2 && o[0].v.dtype == TPU_DTYPE_F32);
  rd(&o[0].v, got);
  CHECK(got[0] == 6 && got[1] == 15);
  rel(o, 1);
  /* keepdim, negative dim */
  a[1] = A_L(d0, 1); a[2] = A_B(true);
  CHECK_OK(run("sum.dim_IntList", a, 4, o, NULL));
  CHECK(o[0].v.ndim == 2 && o[0].v.sizes[0] == 1 && o[0].v.sizes[1] == 3);
  rd(&o[0].v, got);
  CHECK(got[0] == 5 && got[1] == 7 && got[2] == 9);
  rel(o, 1);
  /* None and [] reduce everything; dtype= changes the result dtype */
  a[1] = A_N(); a[2] = A_B(false); a[3] = A_I(TPU_DTYPE_F64);
  CHECK_OK(run("sum.dim_IntList", a, 4, o, NULL));
  CHECK(o[0].v.ndim == 0 && o[0].v.dtype == TPU_DTYPE_F64);
  rd(&o[0].v, got);
  CHECK(got[0] == 21);
  rel(o, 1);
  a[1] = A_L(NULL, 0); a[3] = A_N();
  CHECK_OK(run("sum.dim_IntList", a, 4, o, NULL));
  rd(&o[0].v, got);
  CHECK(o[0].v.ndim == 0 && got[0] == 21);
  rel(o, 1);
  /* non-contiguous: the transpose of x, reduced over its dim 1 (= x's dim 0) */
  tpu_view_t t = x.v;
  t.sizes[0] = 3; t.sizes[1] = 2; t.strides[0] = 1; t.strides[1] = 3;
  a[0] = A_T(&t); a[1] = A_L(d1, 1);
  CHECK_OK(run("sum.dim_IntList", a, 4, o, NULL));
  rd(&o[0].v, got);
  CHECK(got[0] == 5 && got[1] == 7 && got[2] == 9);
  rel(o, 1);
  /* errors: duplicate dim, dim out of range */
  int64_t dup[2] = {0, -2}, bad[1] = {2};
  a[0] = A_T(&x.v); a[1] = A_L(dup, 2);
  CHECK_CODE(run("sum.dim_IntList", a, 4, o, NULL), TPU_INVALID_ARGUMENT);
  a[1] = A_L(bad, 1);
  CHECK_CODE(run("sum.dim_IntList", a, 4, o, NULL), TPU_INDEX_ERROR);
  tpu_storage_release(x.s);

  /* integers promote to int64 and wrap; bool counts */
  double big[3] = {2147483647.0, 1, 5};
  int64_t s3[1] = {3};
  tens_t xi = mk(TPU_DTYPE_I32, 1, s3, big);
  tpu_arg_t b[2] = {A_T(&xi.v), A_N()};
  CHECK_OK(run("sum", b, 2, o, NULL));
  CHECK(o[0].v.dtype == TPU_DTYPE_I64);
  rd(&o[0].v, got);
  CHECK(got[0] == 2147483653.0);
  rel(o, 1);
  /* dtype=bool casts first: 0.5 is true */
  double half[2] = {0.5, 0};
  int64_t s2[1] = {2};
  tens_t xh = mk(TPU_DTYPE_F32, 1, s2, half);
  b[0] = A_T(&xh.v); b[1] = A_I(TPU_DTYPE_BOOL);
  CHECK_OK(run("prod", b, 2, o, NULL));
  rd(&o[0].v, got);
  CHECK(o[0].v.dtype == TPU_DTYPE_BOOL && got[0] == 0);
  rel(o, 1);
  CHECK_OK(run("sum", b, 2, o, NULL));
  rd(&o[0].v, got);
  CHECK(o[0].v.dtype == TPU_DTYPE_BOOL && got[0] == 1);
  rel(o, 1);
  /* bf16 accumulates wider than bf16: 256 + 1 + 1 ... */
  double vals[65];
  vals[0] = 256;
  for (int i = 1; i < 65; ++i) vals[i] = 1;
  int64_t s65[1] = {65};
  tens_t xb = mk(TPU_DTYPE_BF16, 1, s65, vals);
  b[0] = A_T(&xb.v); b[1] = A_N();
  CHECK_OK(run("sum", b, 2, o, NULL));
  rd(&o[0].v, got);
  CHECK(o[0].v.dtype == TPU_DTYPE_BF16 && got[0] == 320);
  rel(o, 1);
  /* empty: sum 0, prod 1, mean nan */
  int64_t s0[2] = {0, 3};
  tens_t xe = mk(TPU_DTYPE_F32, 2, s0, NULL);
  int64_t dz[1] = {0};
  tpu_arg_t c[4] = {A_T(&xe.v), A_L(dz, 1), A_B(false), A_N()};
  CHECK_OK(run("sum.dim_IntList", c, 4, o, NULL));
  rd(&o[0].v, got);
  CHECK(o[0].v.sizes[0] == 3 && got[0] == 0 && got[2] == 0);
  rel(o, 1);
  CHECK_OK(run("mean.dim", c, 4, o, NULL));
  rd(&o[0].v, got);
  CHECK(isnan(got[1]));
  rel(o, 1);
  tpu_arg_t p[4] = {A_T(&xe.v), A_I(0), A_B(false), A_N()};
  CHECK_OK(run("prod.dim_int", p, 4, o, NULL));
  rd(&o[0].v, got);
  CHECK(got[0] == 1);
  rel(o, 1);
  tpu_storage_release(xi.s); tpu_storage_release(xh.s); tpu_storage_release(xb.s); tpu_storage_release(xe.s);
}

static void test_mean_prod(void) {
  tens_t x = mk(TPU_DTYPE_F64, 2, S23, M23), xi = mk(TPU_DTYPE_I64, 2, S23, M23), o[MAXOUT];
  int64_t d0[1] = {0};
  double got[8];
  tpu_arg_t a[4] = {A_T(&x.v), A_L(d0, 1), A_B(false), A_N()};
  CHECK_OK(run("mean.dim", a, 4, o, NULL));
  rd(&o[0].v, got);
  CHECK(got[0] == 2.5 && got[1] == 3.5 && got[2] == 4.5);
  rel(o, 1);
  a[0] = A_T(&xi.v);
  tpu_status_t st = run("mean.dim", a, 4, o, NULL);
  CHECK(tpu_status_code(st) == TPU_INVALID_ARGUMENT);
  CHECK(st && strstr(tpu_status_message(st), "mean.dim") && strstr(tpu_status_message(st), "Long"));
  tpu_status_free(st);
  a[3] = A_I(TPU_DTYPE_I64);
  CHECK_CODE(run("mean.dim", a, 4, o, NULL), TPU_INVALID_ARGUMENT);
  a[3] = A_I(TPU_DTYPE_F32);
  CHECK_OK(run("mean.dim", a, 4, o, NULL));
  rd(&o[0].v, got);
  CHECK(o[0].v.dtype == TPU_DTYPE_F32 && got[2] == 4.5);
  rel(o, 1);
  tpu_arg_t p[4] = {A_T(&xi.v), A_I(1), A_B(true), A_N()};
  CHECK_OK(run("prod.dim_int", p, 4, o, NULL));
  rd(&o[0].v, got);
  CHECK(o[0].v.dtype == TPU_DTYPE_I64 && o[0].v.ndim == 2 && got[0] == 6 && got[1] == 120);
  rel(o, 1);
  tpu_storage_release(x.s); tpu_storage_release(xi.s);
}

static void test_minmax(void) {
  double v[6] = {3, 1, 3, NAN, 0, NAN};
  tens_t x = mk(TPU_DTYPE_F32, 2, S23, v), o[MAXOUT];
  double got[8], gi[4];
  int64_t d1[1] = {1};
  tpu_arg_t a[3] = {A_T(&x.v), A_L(d1, 1), A_B(false)};
  CHECK_OK(run("amax", a, 3, o, NULL));
  rd(&o[0].v, got);
  CHECK(got[0] == 3 && isnan(got[1]));
  rel(o, 1);
  tpu_arg_t m[3] = {A_T(&x.v), A_I(1), A_B(false)};
  int k;
  CHECK_OK(run("max.dim", m, 3, o, &k));
  CHECK(k == 2 && o[1].v.dtype == TPU_DTYPE_I64);
  rd(&o[0].v, got); rd(&o[1].v, gi);
  CHECK(got[0] == 3 && gi[0] == 0 && isnan(got[1]) && gi[1] == 0);
  rel(o, 2);
  CHECK_OK(run("min.dim", m, 3, o, &k));
  rd(&o[0].v, got); rd(&o[1].v, gi);
  CHECK(got[0] == 1 && gi[0] == 1 && isnan(got[1]) && gi[1] == 0);
  rel(o, 2);
  tpu_arg_t g[3] = {A_T(&x.v), A_N(), A_B(false)};
  CHECK_OK(run("argmax", g, 3, o, NULL));
  rd(&o[0].v, gi);
  CHECK(o[0].v.ndim == 0 && gi[0] == 3);
  rel(o, 1);
  g[2] = A_B(true);
  CHECK_OK(run("argmin", g, 3, o, NULL));
  CHECK(o[0].v.ndim == 2 && o[0].v.sizes[0] == 1 && o[0].v.sizes[1] == 1);
  rel(o, 1);
  /* integers and bool */
  double iv[6] = {5, -7, 5, 1, 1, 0};
  tens_t xi = mk(TPU_DTYPE_I8, 2, S23, iv), xb = mk(TPU_DTYPE_BOOL, 2, S23, iv);
  m[0] = A_T(&xi.v);
  CHECK_OK(run("max.dim", m, 3, o, &k));
  rd(&o[0].v, got); rd(&o[1].v, gi);
  CHECK(o[0].v.dtype == TPU_DTYPE_I8 && got[0] == 5 && gi[0] == 0 && got[1] == 1 && gi[1] == 0);
  rel(o, 2);
  tpu_arg_t f[1] = {A_T(&xi.v)};
  CHECK_OK(run("min", f, 1, o, NULL));
  rd(&o[0].v, got);
  CHECK(got[0] == -7);
  rel(o, 1);
  f[0] = A_T(&xb.v);
  CHECK_OK(run("max", f, 1, o, NULL));
  rd(&o[0].v, got);
  CHECK(o[0].v.dtype == TPU_DTYPE_BOOL && got[0] == 1);
  rel(o, 1);
  g[0] = A_T(&xb.v);
  CHECK_CODE(run("argmax", g, 3, o, NULL), TPU_INVALID_ARGUMENT);
  /* empty: IndexError along a zero-size dim, RuntimeError for a full reduction */
  int64_t s0[2] = {0, 3};
  tens_t xe = mk(TPU_DTYPE_F32, 2, s0, NULL);
  tpu_arg_t e[3] = {A_T(&xe.v), A_I(0), A_B(false)};
  CHECK_CODE(run("max.dim", e, 3, o, NULL), TPU_INDEX_ERROR);
  e[1] = A_I(1);
  CHECK_OK(run("max.dim", e, 3, o, NULL));
  CHECK(o[0].v.sizes[0] == 0);
  rel(o, 2);
  f[0] = A_T(&xe.v);
  CHECK_CODE(run("max", f, 1, o, NULL), TPU_INVALID_ARGUMENT);
  tpu_arg_t ea[3] = {A_T(&xe.v), A_L(NULL, 0), A_B(false)};
  CHECK_CODE(run("amax", ea, 3, o, NULL), TPU_INVALID_ARGUMENT);
  int64_t dz[1] = {0};
  ea[1] = A_L(dz, 1);
  CHECK_CODE(run("amin", ea, 3, o, NULL), TPU_INDEX_ERROR);
  tpu_arg_t eg[3] = {A_T(&xe.v), A_N(), A_B(false)};
  CHECK_CODE(run("argmax", eg, 3, o, NULL), TPU_INDEX_ERROR);
  tpu_storage_release(x.s); tpu_storage_release(xi.s); tpu_storage_release(xb.s); tpu_storage_release(xe.s);
}

static void test_var(void) {
  tens_t x = mk(TPU_DTYPE_F32, 2, S23, M23), o[MAXOUT];
  double got[8], gm[4];
  int64_t d1[1] = {1};
  tpu_arg_t a[4] = {A_T(&x.v), A_L(d1, 1), A_N(), A_B(false)};
  CHECK_OK(run("var.correction", a, 4, o, NULL));
  rd(&o[0].v, got);
  CHECK_NEAR(got[0], 1.0, 1e-6);
  CHECK_NEAR(got[1], 1.0, 1e-6);
  rel(o, 1);
  a[1] = A_N(); a[2] = A_S(0);
  CHECK_OK(run("std.correction", a, 4, o, NULL));
  rd(&o[0].v, got);
  CHECK_NEAR(got[0], sqrt(17.5 / 6), 1e-6);
  rel(o, 1);
  a[1] = A_L(d1, 1); a[2] = A_S(1.5);
  int k;
  CHECK_OK(run("var_mean.correction", a, 4, o, &k));
  CHECK(k == 2);
  rd(&o[0].v, got); rd(&o[1].v, gm);
  CHECK_NEAR(got[0], 2.0 / 1.5, 1e-6);
  CHECK(gm[0] == 2 && gm[1] == 5);
  rel(o, 2);
  /* N - correction <= 0 divides by zero like CPU */
  a[2] = A_S(3);
  CHECK_OK(run("var.correction", a, 4, o, NULL));
  rd(&o[0].v, got);
  CHECK(isinf(got[0]));
  rel(o, 1);
  tens_t xi = mk(TPU_DTYPE_I64, 2, S23, M23);
  a[0] = A_T(&xi.v);
  CHECK_CODE(run("var.correction", a, 4, o, NULL), TPU_INVALID_ARGUMENT);
  CHECK_CODE(run("std_mean.correction", a, 4, o, NULL), TPU_INVALID_ARGUMENT);
  tpu_storage_release(x.s); tpu_storage_release(xi.s);
}

static void test_anyall(void) {
  double v[6] = {0.5, 0, 0, 0, 0, NAN};
  tens_t x = mk(TPU_DTYPE_F32, 2, S23, v), o[MAXOUT];
  double got[8];
  tpu_arg_t a[3] = {A_T(&x.v), A_I(1), A_B(false)};
  CHECK_OK(run("any.dim", a, 3, o, NULL));
  rd(&o[0].v, got);
  CHECK(o[0].v.dtype == TPU_DTYPE_BOOL && got[0] == 1 && got[1] == 1);
  rel(o, 1);
  a[1] = A_I(0);
  CHECK_OK(run("all.dim", a, 3, o, NULL));
  rd(&o[0].v, got);
  CHECK(got[0] == 0 && got[1] == 0 && got[2] == 0);
  rel(o, 1);
  double u[6] = {0, 2, 0, 0, 0, 0};
  tens_t xu = mk(TPU_DTYPE_U8, 2, S23, u);
  tpu_arg_t f[1] = {A_T(&xu.v)};
  CHECK_OK(run("any", f, 1, o, NULL));
  rd(&o[0].v, got);
  CHECK(o[0].v.dtype == TPU_DTYPE_U8 && got[0] == 1);
  rel(o, 1);
  /* any.dims with [] reduces nothing */
  tpu_arg_t d[3] = {A_T(&x.v), A_L(NULL, 0), A_B(false)};
  CHECK_OK(run("any.dims", d, 3, o, NULL));
  CHECK(o[0].v.ndim == 2);
  rd(&o[0].v, got);
  CHECK(got[0] == 1 && got[1] == 0);
  rel(o, 1);
  tpu_storage_release(x.s); tpu_storage_release(xu.s);
}

static void test_lse_norm(void) {
  double v[6] = {INFINITY, 1, 0, -INFINITY, -INFINITY, -INFINITY};
  tens_t x = mk(TPU_DTYPE_F32, 2, S23, v), o[MAXOUT];
  double got[8];
  int64_t d1[1] = {1};
  tpu_arg_t a[3] = {A_T(&x.v), A_L(d1, 1), A_B(false)};
  CHECK_OK(run("logsumexp", a, 3, o, NULL));
  rd(&o[0].v, got);
  CHECK(isinf(got[0]) && got[0] > 0 && isinf(got[1]) && got[1] < 0);
  rel(o, 1);
  tens_t y = mk(TPU_DTYPE_I64, 2, S23, M23);
  a[0] = A_T(&y.v);
  CHECK_OK(run("logsumexp", a, 3, o, NULL));
  rd(&o[0].v, got);
  CHECK(o[0].v.dtype == TPU_DTYPE_F32);
  CHECK_NEAR(got[0], log(exp(1) + exp(2) + exp(3)), 1e-5);
  rel(o, 1);
  double w[3] = {3, -4, 0};
  int64_t s3[1] = {3};
  tens_t z = mk(TPU_DTYPE_F64, 1, s3, w);
  const double ords[6] = {2, 1, 0, INFINITY, -INFINITY, 0.5};
  const double want[6] = {5, 7, 2, 4, 0, pow(sqrt(3) + 2, 2)};
  for (int i = 0; i < 6; ++i) {
    tpu_arg_t n[5] = {A_T(&z.v), A_S(ords[i]), A_N(), A_B(false), A_N()};
    CHECK_OK(run("linalg_vector_norm", n, 5, o, NULL));
    rd(&o[0].v, got);
    CHECK_NEAR(got[0], want[i], 1e-12);
    rel(o, 1);
  }
  tpu_arg_t n[5] = {A_T(&y.v), A_S(2), A_N(), A_B(false), A_N()};
  CHECK_CODE(run("linalg_vector_norm", n, 5, o, NULL), TPU_INVALID_ARGUMENT);
  /* dtype narrower than the input is refused */
  n[0] = A_T(&z.v); n[4] = A_I(TPU_DTYPE_F32);
  CHECK_CODE(run("linalg_vector_norm", n, 5, o, NULL), TPU_INVALID_ARGUMENT);
  int64_t s0[1] = {0};
  tens_t e = mk(TPU_DTYPE_F32, 1, s0, NULL);
  tpu_arg_t ne[5] = {A_T(&e.v), A_S(INFINITY), A_N(), A_B(false), A_N()};
  CHECK_CODE(run("linalg_vector_norm", ne, 5, o, NULL), TPU_INVALID_ARGUMENT);
  ne[1] = A_S(2);
  CHECK_OK(run("linalg_vector_norm", ne, 5, o, NULL));
  rd(&o[0].v, got);
  CHECK(got[0] == 0);
  rel(o, 1);
  tpu_storage_release(x.s); tpu_storage_release(y.s); tpu_storage_release(z.s); tpu_storage_release(e.s);
}

static void test_scans(void) {
  tens_t x = mk(TPU_DTYPE_I32, 2, S23, M23), o[MAXOUT];
  double got[6];
  tpu_arg_t a[3] = {A_T(&x.v), A_I(0), A_N()};
  CHECK_OK(run("cumsum", a, 3, o, NULL));
  rd(&o[0].v, got);
  CHECK(o[0].v.dtype == TPU_DTYPE_I64);
  const double w0[6] = {1, 2, 3, 5, 7, 9};
  CHECK(near_all(got, w0, 6, 0));
  rel(o, 1);
  /* transposed f32 input along dim 1 of the transpose */
  tens_t xf = mk(TPU_DTYPE_F32, 2, S23, M23);
  tpu_view_t t = xf.v;
  t.sizes[0] = 3; t.sizes[1] = 2; t.strides[0] = 1; t.strides[1] = 3;
  a[0] = A_T(&t); a[1] = A_I(-1);
  CHECK_OK(run("cumprod", a, 3, o, NULL));
  rd(&o[0].v, got);
  const double w1[6] = {1, 4, 2, 10, 3, 18};
  CHECK(near_all(got, w1, 6, 0));
  rel(o, 1);
  /* in place into self */
  int idx = check_op_index("cumsum_");
  tpu_node_t* n;
  a[0] = A_T(&xf.v); a[1] = A_I(1);
  CHECK_OK(tpu_op_prepare(idx, TPU_VARIANT_INPLACE, a, 3, &n));
  CHECK_OK(tpu_node_bind_output(n, 0, &xf.v));
  CHECK_OK(tpu_node_submit(n));
  rd(&xf.v, got);
  const double w2[6] = {1, 3, 6, 4, 9, 15};
  CHECK(near_all(got, w2, 6, 0));
  a[2] = A_I(TPU_DTYPE_F64);
  CHECK_CODE(tpu_op_prepare(idx, TPU_VARIANT_INPLACE, a, 3, &n), TPU_INVALID_ARGUMENT);
  /* cummax: ties move the index forward */
  double v[4] = {1, 3, 3, 2};
  int64_t s4[1] = {4};
  tens_t c = mk(TPU_DTYPE_F32, 1, s4, v);
  tpu_arg_t cm[2] = {A_T(&c.v), A_I(0)};
  int k;
  CHECK_OK(run("cummax", cm, 2, o, &k));
  double gi[8];
  rd(&o[0].v, got); rd(&o[1].v, gi);
  CHECK(k == 2 && got[3] == 3 && gi[1] == 1 && gi[2] == 2 && gi[3] == 2);
  rel(o, 2);
  CHECK_CODE(run("cumsum", (tpu_arg_t[]){A_T(&c.v), A_I(1), A_N()}, 3, o, NULL), TPU_INDEX_ERROR);
  tpu_storage_release(x.s); tpu_storage_release(xf.s); tpu_storage_release(c.s);
}

static void test_softmax(void) {
  double v[6] = {1, 2, 3, -INFINITY, 0, 0};
  tens_t x = mk(TPU_DTYPE_F32, 2, S23, v), o[MAXOUT], lo[MAXOUT];
  double got[6], lg[6];
  tpu_arg_t a[3] = {A_T(&x.v), A_I(1), A_B(false)};
  CHECK_OK(run("_softmax", a, 3, o, NULL));
  CHECK_OK(run("_log_softmax", a, 3, lo, NULL));
  rd(&o[0].v, got); rd(&lo[0].v, lg);
  double s = exp(1) + exp(2) + exp(3);
  CHECK_NEAR(got[0], exp(1) / s, 1e-7);
  CHECK(got[3] == 0);
  CHECK_NEAR(got[4], 0.5, 1e-7);
  CHECK_NEAR(lg[2], 3 - log(s), 1e-6);
  CHECK(isinf(lg[3]) && lg[3] < 0);
  /* backward: softmax y*(g - sum(g*y)); log_softmax g - exp(y)*sum(g) */
  double gv[6] = {1, 0, 0, 0, 1, -1};
  tens_t gr = mk(TPU_DTYPE_F32, 2, S23, gv), gi[MAXOUT];
  tpu_arg_t b[4] = {A_T(&gr.v), A_T(&o[0].v), A_I(1), A_I(TPU_DTYPE_F32)};
  CHECK_OK(run("_softmax_backward_data", b, 4, gi, NULL));
  double r[6];
  rd(&gi[0].v, r);
  double dot = got[0];
  CHECK_NEAR(r[0], got[0] * (1 - dot), 1e-6);
  CHECK_NEAR(r[1], got[1] * (0 - dot), 1e-6);
  CHECK_NEAR(r[4], 0.5 * 1, 1e-6);
  rel(gi, 1);
  b[1] = A_T(&lo[0].v);
  CHECK_OK(run("_log_softmax_backward_data", b, 4, gi, NULL));
  rd(&gi[0].v, r);
  CHECK_NEAR(r[0], 1 - got[0], 1e-6);
  CHECK_NEAR(r[4], 1 - 0.5 * 0, 1e-6);
  rel(gi, 1);
  /* errors */
  a[2] = A_B(true);
  CHECK_CODE(run("_softmax", a, 3, o + 1, NULL), TPU_INVALID_ARGUMENT);
  tens_t xi = mk(TPU_DTYPE_I64, 2, S23, M23);
  a[0] = A_T(&xi.v); a[2] = A_B(false);
  CHECK_CODE(run("_softmax", a, 3, o + 1, NULL), TPU_UNIMPLEMENTED);
  a[0] = A_T(&x.v); a[1] = A_I(2);
  CHECK_CODE(run("_log_softmax", a, 3, o + 1, NULL), TPU_INDEX_ERROR);
  tpu_view_t part = gr.v;
  part.sizes[0] = 1;
  b[0] = A_T(&part);
  CHECK_CODE(run("_softmax_backward_data", b, 4, gi, NULL), TPU_INVALID_ARGUMENT);
  rel(o, 1); rel(lo, 1);
  tpu_storage_release(x.s); tpu_storage_release(gr.s); tpu_storage_release(xi.s);
}

/* out= forms: the dim= sum reduces in the out tensor's dtype, amax insists on a match. */
static void test_out_variants(void) {
  double v[4] = {0.5, 0.7, 1.5, -0.7};
  int64_t s22[2] = {2, 2}, d0[1] = {0};
  tens_t x = mk(TPU_DTYPE_F32, 2, s22, v);
  int64_t s2[1] = {2};
  tens_t out = mk(TPU_DTYPE_I64, 1, s2, NULL);
  tpu_arg_t a[5] = {A_T(&x.v), A_L(d0, 1), A_B(false), A_N(), A_T(&out.v)};
  int idx = check_op_index("sum.IntList_out");
  tpu_node_t* n;
  CHECK_OK(tpu_op_prepare(idx, TPU_VARIANT_OUT, a, 5, &n));
  CHECK_OK(tpu_node_bind_output(n, 0, &out.v));
  CHECK_OK(tpu_node_submit(n));
  double got[8];
  rd(&out.v, got);
  CHECK(got[0] == 1 && got[1] == 0);
  tpu_arg_t m[4] = {A_T(&x.v), A_L(d0, 1), A_B(false), A_T(&out.v)};
  CHECK_CODE(tpu_op_prepare(check_op_index("amax.out"), TPU_VARIANT_OUT, m, 4, &n), TPU_INVALID_ARGUMENT);
  tpu_arg_t g[4] = {A_T(&x.v), A_I(0), A_B(false), A_T(&x.v)};
  CHECK_CODE(tpu_op_prepare(check_op_index("argmax.out"), TPU_VARIANT_OUT, g, 4, &n), TPU_INVALID_ARGUMENT);
  tpu_storage_release(x.s); tpu_storage_release(out.s);
}

/* A larger f32 sum matches a double reference tightly (accumulation is wide). */
static void test_accuracy(void) {
  enum { N = 100003 };
  double* v = malloc(N * sizeof *v);
  double ref = 0;
  uint32_t seed = 12345;
  for (int i = 0; i < N; ++i) {
    seed = seed * 1664525u + 1013904223u;
    v[i] = (float)((seed >> 8) / 16777216.0 - 0.3);
    ref += v[i];
  }
  int64_t s[1] = {N};
  tens_t x = mk(TPU_DTYPE_F32, 1, s, v), o[MAXOUT];
  tpu_arg_t a[2] = {A_T(&x.v), A_N()};
  CHECK_OK(run("sum", a, 2, o, NULL));
  double got;
  rd(&o[0].v, &got);
  CHECK(fabs(got - ref) <= 1e-6 * fabs(ref));
  rel(o, 1);
  tpu_storage_release(x.s);
  free(v);
}

int main(void) {
  test_sum();
  test_mean_prod();
  test_minmax();
  test_var();
  test_anyall();
  test_lse_norm();
  test_scans();
  test_softmax();
  test_out_variants();
  test_accuracy();
  CHECK_OK(tpu_device_synchronize(0));
  TEST_MAIN_END();
}
