/* Complex family: dtype rules, the routing of complex arguments (complex builders, or
 * UNIMPLEMENTED for ops without one), copies with conjugation, complex arithmetic, and
 * the FFTs against a direct DFT in long double for every kind of length (radix-2, mixed
 * radix with factors 4, 2, 3, 5, 13, Bluestein for the primes 127 and 67). */
#include <complex.h>
#include <string.h>

#include "check.h"

#define MAXT 256
static tpu_storage_t* storages[MAXT];
static int n_storages;

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

static tpu_arg_t T_(tpu_view_t v) { tpu_arg_t a = {0}; a.kind = TPU_ARG_TENSOR; a.tensor = v; return a; }
static tpu_arg_t I_(int64_t i) { tpu_arg_t a = {0}; a.kind = TPU_ARG_INT; a.v.i = i; return a; }
static tpu_arg_t B_(bool b) { tpu_arg_t a = {0}; a.kind = TPU_ARG_BOOL; a.v.b = b; return a; }
static tpu_arg_t L_(const int64_t* l, int n) {
  tpu_arg_t a = {0}; a.kind = TPU_ARG_INTLIST; a.list = l; a.list_len = n; return a;
}
static tpu_arg_t SC(double re, double im) {
  tpu_arg_t a = {0}; a.kind = TPU_ARG_SCALAR; a.scalar_kind = TPU_SCALAR_COMPLEX; a.v.d = re; a.scalar_im = im;
  return a;
}

static tpu_status_t run(const char* name, const tpu_arg_t* args, int nargs, tpu_view_t* out) {
  int idx = check_op_index(name);
  if (idx < 0) return tpu_status_make(TPU_INTERNAL, "no op %s", name);
  tpu_node_t* n;
  TPU_RETURN_IF_ERROR(tpu_op_prepare(idx, TPU_VARIANT_FUNCTIONAL, args, nargs, &n));
  tpu_dtype_t dt; int32_t nd; int64_t sz[TPU_MAX_DIMS];
  tpu_node_output_meta(n, 0, &dt, &nd, sz);
  *out = mk(dt, nd, sz, NULL);
  tpu_status_t st = tpu_node_bind_output(n, 0, out);
  if (st) { tpu_node_discard(n); return st; }
  TPU_RETURN_IF_ERROR(tpu_node_submit(n));
  return tpu_device_synchronize(0);
}

static void test_dtype_rules(void) {
  CHECK(tpu_dtype_size(TPU_DTYPE_C64) == 8 && tpu_dtype_size(TPU_DTYPE_C128) == 16);
  CHECK(tpu_dtype_is_complex(TPU_DTYPE_C64) && !tpu_dtype_is_complex(TPU_DTYPE_F32));
  CHECK(!tpu_dtype_is_floating(TPU_DTYPE_C64));
  CHECK(strcmp(tpu_dtype_name(TPU_DTYPE_C128), "complex128") == 0);
}

/* x * conj-copy, complex * complex scalar, abs; and an op without a complex builder. */
static void test_arith_and_routing(void) {
  float xs[6] = {1, 2, -3, 0.5f, 0, -1};  /* 1+2i, -3+0.5i, 0-1i */
  int64_t sz[1] = {3};
  tpu_view_t x = mk(TPU_DTYPE_C64, 1, sz, xs);
  tpu_view_t c = mk(TPU_DTYPE_C64, 1, sz, NULL);
  CHECK_OK(tpu_copy_math(&c, &x, true, false));
  tpu_arg_t a[2] = {T_(x), T_(c)};
  tpu_view_t m;
  CHECK_OK(run("mul.Tensor", a, 2, &m));
  float r[6];
  CHECK_OK(tpu_copy_to_host(&m, r));
  for (int k = 0; k < 3; ++k) { /* z conj(z) = |z|^2 */
    CHECK_NEAR(r[2 * k], xs[2 * k] * xs[2 * k] + xs[2 * k + 1] * xs[2 * k + 1], 1e-6);
    CHECK_NEAR(r[2 * k + 1], 0, 1e-6);
  }
  tpu_arg_t s[2] = {T_(x), SC(0, 1)};
  CHECK_OK(run("mul.Tensor", s, 2, &m));
  CHECK_OK(tpu_copy_to_host(&m, r));
  CHECK_NEAR(r[0], -2, 1e-6); CHECK_NEAR(r[1], 1, 1e-6); /* i (1+2i) = -2+i */
  tpu_arg_t u[1] = {T_(x)};
  tpu_view_t ab;
  CHECK_OK(run("abs", u, 1, &ab));
  CHECK(ab.dtype == TPU_DTYPE_F32);
  float av[3];
  CHECK_OK(tpu_copy_to_host(&ab, av));
  CHECK_NEAR(av[0], sqrtf(5.0f), 1e-6); CHECK_NEAR(av[2], 1, 1e-6);
  tpu_view_t e = {0};
  CHECK_CODE(run("exp", u, 1, &e), TPU_UNIMPLEMENTED);          /* no complex builder */
  CHECK_CODE(run("sigmoid", u, 1, &e), TPU_UNIMPLEMENTED);
  /* sum over all dims in double: (1+2i) + (-3+0.5i) + (-i) */
  tpu_arg_t sm[4] = {T_(x), {0}, B_(false), {0}};
  CHECK_OK(run("sum.dim_IntList", sm, 4, &e));
  CHECK(e.dtype == TPU_DTYPE_C64 && e.ndim == 0);
  CHECK_OK(tpu_copy_to_host(&e, r));
  CHECK_NEAR(r[0], -2, 1e-6); CHECK_NEAR(r[1], 1.5, 1e-6);
}

/* Direct DFT in long double: the reference. */
static void dft(const double* x, int64_t n, int sign, double* out) {
  const long double pi = 3.141592653589793238462643383279503L;
  for (int64_t k = 0; k < n; ++k) {
    long double re = 0, im = 0;
    for (int64_t j = 0; j < n; ++j) {
      long double t = sign * 2 * pi * (long double)((j * k) % n) / n;
      re += x[2 * j] * cosl(t) - x[2 * j + 1] * sinl(t);
      im += x[2 * j] * sinl(t) + x[2 * j + 1] * cosl(t);
    }
    out[2 * k] = (double)re;
    out[2 * k + 1] = (double)im;
  }
}

static void test_fft_lengths(void) {
  int64_t lengths[] = {1, 2, 3, 8, 12, 64, 65, 100, 127, 128, 469, 768, 1000};
  for (size_t li = 0; li < sizeof lengths / sizeof *lengths; ++li) {
    int64_t n = lengths[li];
    double* x = malloc(sizeof(double) * 2 * (size_t)n);
    double* want = malloc(sizeof(double) * 2 * (size_t)n);
    double* got = malloc(sizeof(double) * 2 * (size_t)n);
    for (int64_t k = 0; k < 2 * n; ++k) x[k] = sin(0.37 * (double)k + 1.0) + 0.25 * (double)(k % 7);
    int64_t sz[1] = {n}, dims[1] = {0};
    tpu_view_t xv = mk(TPU_DTYPE_C128, 1, sz, x);
    for (int fwd = 0; fwd <= 1; ++fwd) {
      tpu_arg_t a[4] = {T_(xv), L_(dims, 1), I_(2 * !fwd), B_(fwd)};
      tpu_view_t y;
      CHECK_OK(run("_fft_c2c", a, 4, &y));
      CHECK_OK(tpu_copy_to_host(&y, got));
      dft(x, n, fwd ? -1 : 1, want);
      double scale = fwd ? 1.0 : 1.0 / (double)n, err = 0, mag = 0;
      for (int64_t k = 0; k < 2 * n; ++k) {
        err = fmax(err, fabs(got[k] - want[k] * scale));
        mag = fmax(mag, fabs(want[k] * scale));
      }
      if (!(err <= 1e-12 * (1 + mag))) {
        fprintf(stderr, "fft n=%lld forward=%d: max error %g (magnitude %g)\n", (long long)n, fwd, err, mag);
        CHECK(0);
      }
    }
    free(x); free(want); free(got);
  }
}

/* r2c (onesided) then c2r gives the signal back; c2r reads only n/2+1 values. */
static void test_real_roundtrip(void) {
  const int64_t n = 10;
  double x[10], back[10];
  for (int k = 0; k < n; ++k) x[k] = cos(1.3 * k) + 0.1 * k;
  int64_t sz[1] = {n}, dims[1] = {0};
  tpu_view_t xv = mk(TPU_DTYPE_F64, 1, sz, x);
  tpu_arg_t a[4] = {T_(xv), L_(dims, 1), I_(0), B_(true)};
  tpu_view_t h;
  CHECK_OK(run("_fft_r2c", a, 4, &h));
  CHECK(h.dtype == TPU_DTYPE_C128 && h.sizes[0] == n / 2 + 1);
  tpu_arg_t b[4] = {T_(h), L_(dims, 1), I_(2), I_(n)};
  tpu_view_t y;
  CHECK_OK(run("_fft_c2r", b, 4, &y));
  CHECK(y.dtype == TPU_DTYPE_F64 && y.sizes[0] == n);
  CHECK_OK(tpu_copy_to_host(&y, back));
  for (int k = 0; k < n; ++k) CHECK_NEAR(back[k], x[k], 1e-13);
  /* errors: a real input to c2c, a zero-length output */
  tpu_arg_t c[4] = {T_(xv), L_(dims, 1), I_(0), B_(true)};
  CHECK_CODE(run("_fft_c2c", c, 4, &y), TPU_INVALID_ARGUMENT);
  tpu_arg_t d[4] = {T_(h), L_(dims, 1), I_(0), I_(0)};
  CHECK_CODE(run("_fft_c2r", d, 4, &y), TPU_INVALID_ARGUMENT);
}

int main(void) {
  test_dtype_rules();
  test_arith_and_routing();
  test_fft_lengths();
  test_real_roundtrip();
  for (int i = 0; i < n_storages; ++i) tpu_storage_release(storages[i]);
  TEST_MAIN_END();
}
