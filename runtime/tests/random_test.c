/* Random family: Philox known answers, distribution statistics, ranges, reproducibility,
 * stride independence, randperm, multinomial, dropout, and CPU-matching errors. */
#include <string.h>

#include "check.h"
#include "core/internal.h"

void tpu__philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* ---- helpers -------------------------------------------------------------------------- */

static tpu_arg_t a_tensor(tpu_view_t v) { tpu_arg_t a = {0}; a.kind = TPU_ARG_TENSOR; a.tensor = v; return a; }
static tpu_arg_t a_double(double d) { tpu_arg_t a = {0}; a.kind = TPU_ARG_DOUBLE; a.v.d = d; return a; }
static tpu_arg_t a_int(int64_t i) { tpu_arg_t a = {0}; a.kind = TPU_ARG_INT; a.v.i = i; return a; }
static tpu_arg_t a_bool(bool b) { tpu_arg_t a = {0}; a.kind = TPU_ARG_BOOL; a.v.b = b; return a; }
static tpu_arg_t a_none(void) { tpu_arg_t a = {0}; return a; }

static tpu_view_t make_tensor(tpu_dtype_t dt, int nd, const int64_t* sizes) {
  int64_t n = 1;
  for (int i = 0; i < nd; ++i) n *= sizes[i];
  tpu_storage_t* s = NULL;
  CHECK_OK(tpu_storage_create(0, (uint64_t)(n > 0 ? n : 1) * tpu_dtype_size(dt), &s));
  return check_view(s, dt, nd, sizes);
}

static void fill_f64(tpu_view_t v, const double* src) {
  /* host data in f64, converted through a scratch f64 tensor + copy_ would need another
   * family; write the bytes directly in v's dtype instead */
  int64_t n = tpu_view_numel(&v);
  size_t sz = tpu_dtype_size(v.dtype);
  char* buf = malloc((size_t)n * sz + 1);
  for (int64_t i = 0; i < n; ++i) {
    if (v.dtype == TPU_DTYPE_F32) ((float*)buf)[i] = (float)src[i];
    else if (v.dtype == TPU_DTYPE_F64) ((double*)buf)[i] = src[i];
    else if (v.dtype == TPU_DTYPE_BOOL) ((uint8_t*)buf)[i] = src[i] != 0;
    else if (v.dtype == TPU_DTYPE_I64) ((int64_t*)buf)[i] = (int64_t)src[i];
  }
  CHECK_OK(tpu_copy_from_host(&v, buf));
  free(buf);
}

/* Reads any view into doubles (dense, row-major). */
static double* read_f64(const tpu_view_t* v) {
  int64_t n = tpu_view_numel(v);
  size_t sz = tpu_dtype_size(v->dtype);
  char* raw = malloc((size_t)(n > 0 ? n : 1) * sz);
  double* out = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
  CHECK_OK(tpu_copy_to_host(v, raw));
  for (int64_t i = 0; i < n; ++i) {
    char* p = raw + i * (int64_t)sz;
    switch (v->dtype) {
      case TPU_DTYPE_F32: out[i] = *(float*)p; break;
      case TPU_DTYPE_F64: out[i] = *(double*)p; break;
      case TPU_DTYPE_F16: out[i] = (double)*(_Float16*)p; break;
      case TPU_DTYPE_BF16: { uint32_t u = (uint32_t)*(uint16_t*)p << 16; float f; memcpy(&f, &u, 4); out[i] = f; break; }
      case TPU_DTYPE_I64: out[i] = (double)*(int64_t*)p; break;
      case TPU_DTYPE_I32: out[i] = *(int32_t*)p; break;
      case TPU_DTYPE_I16: out[i] = *(int16_t*)p; break;
      case TPU_DTYPE_I8: out[i] = *(int8_t*)p; break;
      case TPU_DTYPE_U8: out[i] = *(uint8_t*)p; break;
      case TPU_DTYPE_BOOL: out[i] = *(uint8_t*)p; break;
      default: out[i] = NAN;
    }
  }
  free(raw);
  return out;
}

/* Runs op `name` with args, binding output i to outs[i] (or fresh contiguous tensors). */
static tpu_status_t run_op(const char* name, tpu_variant_t var, tpu_arg_t* args, int nargs,
                           tpu_view_t* outs, int n_outs) {
  int idx = check_op_index(name);
  if (idx < 0) return tpu_status_make(TPU_INTERNAL, "no op %s", name);
  tpu_node_t* n;
  TPU_RETURN_IF_ERROR(tpu_op_prepare(idx, var, args, nargs, &n));
  for (int i = 0; i < tpu_node_output_count(n) && i < n_outs; ++i) {
    if (!outs[i].storage) {
      tpu_dtype_t dt; int32_t nd; int64_t sz[TPU_MAX_DIMS];
      tpu_node_output_meta(n, i, &dt, &nd, sz);
      outs[i] = make_tensor(dt, nd, sz);
    }
    tpu_status_t st = tpu_node_bind_output(n, i, &outs[i]);
    if (st) { tpu_node_discard(n); return st; }
  }
  TPU_RETURN_IF_ERROR(tpu_node_submit(n));
  return tpu_device_synchronize(0);
}

static void stats(const double* x, int64_t n, double* mean, double* var) {
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  *mean = s / (double)n;
  for (int64_t i = 0; i < n; ++i) s2 += (x[i] - *mean) * (x[i] - *mean);
  *var = s2 / (double)(n - 1);
}

#define N 100000
static const int64_t kN[1] = {N};

/* ---- tests ---------------------------------------------------------------------------- */

static void test_philox_known_answers(void) {
  /* Random123's published known-answer vectors for philox4x32-10 */
  struct { uint32_t ctr[4], key[2], out[4]; } kat[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}, {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (size_t k = 0; k < sizeof kat / sizeof *kat; ++k) {
    uint32_t out[4];
    tpu__philox4x32_10(kat[k].ctr, kat[k].key, out);
    for (int i = 0; i < 4; ++i) CHECK(out[i] == kat[k].out[i]);
  }
}

static void test_uniform(void) {
  tpu_dtype_t dts[] = {TPU_DTYPE_F32, TPU_DTYPE_F64, TPU_DTYPE_BF16, TPU_DTYPE_F16};
  for (size_t d = 0; d < 4; ++d) {
    tpu_view_t t = make_tensor(dts[d], 1, kN);
    tpu_arg_t args[4] = {a_tensor(t), a_double(-2), a_double(3), a_int(1234)};
    tpu_view_t outs[1] = {t};
    CHECK_OK(run_op("uniform_", TPU_VARIANT_INPLACE, args, 4, outs, 1));
    double* x = read_f64(&t);
    double mn = 1e9, mx = -1e9, mean, var;
    for (int i = 0; i < N; ++i) { mn = x[i] < mn ? x[i] : mn; mx = x[i] > mx ? x[i] : mx; }
    stats(x, N, &mean, &var);
    CHECK(mn >= -2 && mx < 3);
    CHECK(mn < -1.9 && mx > 2.9);
    CHECK_NEAR(mean, 0.5, 0.05);
    CHECK_NEAR(var, 25.0 / 12, 0.1);
    free(x);
    tpu_storage_release(t.storage);
  }
  /* from == to fills the constant; [0, 1) in bf16 never yields 1 */
  tpu_view_t t = make_tensor(TPU_DTYPE_BF16, 1, kN);
  tpu_arg_t args[4] = {a_tensor(t), a_double(0.99), a_double(1), a_int(5)};
  tpu_view_t outs[1] = {t};
  CHECK_OK(run_op("uniform_", TPU_VARIANT_INPLACE, args, 4, outs, 1));
  double* x = read_f64(&t);
  int bad = 0;
  for (int i = 0; i < N; ++i) bad += !(x[i] < 1.0);
  CHECK(bad == 0);
  free(x);
  args[1] = a_double(1);
  CHECK_OK(run_op("uniform_", TPU_VARIANT_INPLACE, args, 4, outs, 1));
  x = read_f64(&t);
  CHECK(x[0] == 1 && x[N - 1] == 1);
  free(x);
  tpu_storage_release(t.storage);
}

static void test_uniform_errors(void) {
  int64_t s1[1] = {4};
  tpu_view_t f = make_tensor(TPU_DTYPE_F32, 1, s1), h = make_tensor(TPU_DTYPE_F16, 1, s1),
             i = make_tensor(TPU_DTYPE_I64, 1, s1);
  tpu_view_t o[1];
  tpu_arg_t args[4] = {a_tensor(f), a_double(2), a_double(1), a_none()};
  o[0] = f;
  tpu_status_t st = run_op("uniform_", TPU_VARIANT_INPLACE, args, 4, o, 1);
  CHECK(tpu_status_code(st) == TPU_INVALID_ARGUMENT);
  CHECK(st && strstr(tpu_status_message(st), "uniform_ expects to return a [from, to) range, but found from=2 > to=1"));
  tpu_status_free(st);
  args[0] = a_tensor(i); args[1] = a_double(0); args[2] = a_double(1); o[0] = i;
  CHECK_CODE(run_op("uniform_", TPU_VARIANT_INPLACE, args, 4, o, 1), TPU_UNIMPLEMENTED);
  args[0] = a_tensor(h); args[2] = a_double(1e6); o[0] = h;
  st = run_op("uniform_", TPU_VARIANT_INPLACE, args, 4, o, 1);
  CHECK(st && strstr(tpu_status_message(st), "to is out of bounds for c10::Half"));
  tpu_status_free(st);
  args[0] = a_tensor(f); args[1] = a_double(-3e38); args[2] = a_double(3e38); o[0] = f;
  CHECK_CODE(run_op("uniform_", TPU_VARIANT_INPLACE, args, 4, o, 1), TPU_INVALID_ARGUMENT);
  tpu_storage_release(f.storage); tpu_storage_release(h.storage); tpu_storage_release(i.storage);
}

static void test_reproducible_and_stride_free(void) {
  /* same seed -> same values; different seed -> different; a transposed output gets the
   * same values in logical order as a contiguous one */
  int64_t s2[2] = {64, 48};
  tpu_view_t a = make_tensor(TPU_DTYPE_F32, 2, s2), b = make_tensor(TPU_DTYPE_F32, 2, s2);
  int64_t st[2] = {48, 64};
  tpu_view_t base = make_tensor(TPU_DTYPE_F32, 2, st);
  tpu_view_t tr = base; /* transpose of a (48, 64) tensor: shape (64, 48), strides (1, 64) */
  tr.sizes[0] = 64; tr.sizes[1] = 48; tr.strides[0] = 1; tr.strides[1] = 64;
  tpu_arg_t args[4] = {a_tensor(a), a_double(0), a_double(1), a_int(42)};
  tpu_view_t o[1] = {a};
  CHECK_OK(run_op("normal_", TPU_VARIANT_INPLACE, args, 4, o, 1));
  args[0] = a_tensor(b); o[0] = b;
  CHECK_OK(run_op("normal_", TPU_VARIANT_INPLACE, args, 4, o, 1));
  args[0] = a_tensor(tr); o[0] = tr;
  CHECK_OK(run_op("normal_", TPU_VARIANT_INPLACE, args, 4, o, 1));
  double *xa = read_f64(&a), *xb = read_f64(&b), *xt = read_f64(&tr);
  CHECK(memcmp(xa, xb, 64 * 48 * sizeof(double)) == 0);
  CHECK(memcmp(xa, xt, 64 * 48 * sizeof(double)) == 0);
  free(xb);
  args[0] = a_tensor(b); args[3] = a_int(43); o[0] = b;
  CHECK_OK(run_op("normal_", TPU_VARIANT_INPLACE, args, 4, o, 1));
  xb = read_f64(&b);
  int same = 0;
  for (int i = 0; i < 64 * 48; ++i) same += xa[i] == xb[i];
  CHECK(same < 5);
  free(xa); free(xb); free(xt);
  tpu_storage_release(a.storage); tpu_storage_release(b.storage); tpu_storage_release(base.storage);
}

static void test_normal(void) {
  tpu_view_t t = make_tensor(TPU_DTYPE_F64, 1, kN);
  tpu_arg_t args[4] = {a_tensor(t), a_double(3), a_double(2), a_int(7)};
  tpu_view_t o[1] = {t};
  CHECK_OK(run_op("normal_", TPU_VARIANT_INPLACE, args, 4, o, 1));
  double* x = read_f64(&t);
  double mean, var;
  stats(x, N, &mean, &var);
  CHECK_NEAR(mean, 3, 0.05);
  CHECK_NEAR(var, 4, 0.15);
  free(x);
  args[2] = a_double(-1);
  tpu_status_t st = run_op("normal_", TPU_VARIANT_INPLACE, args, 4, o, 1);
  CHECK(tpu_status_code(st) == TPU_INVALID_ARGUMENT);
  CHECK(st && strstr(tpu_status_message(st), "normal expects std >= 0.0, but found std -1"));
  tpu_status_free(st);
  tpu_storage_release(t.storage);

  /* normal.Tensor_Tensor: mean (2, 1) broadcast with std (3): per-column spread */
  int64_t sm[2] = {2, 1}, ss[1] = {3};
  tpu_view_t m = make_tensor(TPU_DTYPE_F32, 2, sm), sd = make_tensor(TPU_DTYPE_F64, 1, ss);
  double hm[2] = {10, -10}, hs[3] = {0, 1, 0};
  fill_f64(m, hm);
  fill_f64(sd, hs);
  tpu_arg_t a2[3] = {a_tensor(m), a_tensor(sd), a_int(3)};
  tpu_view_t o2[1] = {{0}};
  CHECK_OK(run_op("normal.Tensor_Tensor", TPU_VARIANT_FUNCTIONAL, a2, 3, o2, 1));
  CHECK(o2[0].dtype == TPU_DTYPE_F32 && o2[0].ndim == 2 && o2[0].sizes[0] == 2 && o2[0].sizes[1] == 3);
  x = read_f64(&o2[0]);
  CHECK(x[0] == 10 && x[2] == 10 && x[3] == -10 && x[5] == -10 && x[1] != 10);
  free(x);
  tpu_storage_release(o2[0].storage);
  /* negative std in a tensor: found by the kernel, reported at sync */
  hs[1] = -1;
  fill_f64(sd, hs);
  o2[0] = (tpu_view_t){0};
  CHECK_CODE(run_op("normal.Tensor_Tensor", TPU_VARIANT_FUNCTIONAL, a2, 3, o2, 1), TPU_INVALID_ARGUMENT);
  tpu_storage_release(o2[0].storage);
  /* float_Tensor takes std's dtype: an integer std cannot be sampled */
  int64_t s3[1] = {3};
  tpu_view_t is = make_tensor(TPU_DTYPE_I64, 1, s3);
  tpu_arg_t a3[3] = {a_double(0), a_tensor(is), a_none()};
  o2[0] = (tpu_view_t){0};
  CHECK_CODE(run_op("normal.float_Tensor", TPU_VARIANT_FUNCTIONAL, a3, 3, o2, 1), TPU_UNIMPLEMENTED);
  tpu_storage_release(m.storage); tpu_storage_release(sd.storage); tpu_storage_release(is.storage);
}

static void test_bernoulli(void) {
  tpu_dtype_t dts[] = {TPU_DTYPE_F32, TPU_DTYPE_I64, TPU_DTYPE_BOOL, TPU_DTYPE_U8};
  for (size_t d = 0; d < 4; ++d) {
    tpu_view_t t = make_tensor(dts[d], 1, kN);
    tpu_arg_t args[3] = {a_tensor(t), a_double(0.3), a_int(11)};
    tpu_view_t o[1] = {t};
    CHECK_OK(run_op("bernoulli_.float", TPU_VARIANT_INPLACE, args, 3, o, 1));
    double* x = read_f64(&t);
    double mean, var;
    int bad = 0;
    for (int i = 0; i < N; ++i) bad += x[i] != 0 && x[i] != 1;
    stats(x, N, &mean, &var);
    CHECK(bad == 0);
    CHECK_NEAR(mean, 0.3, 0.01);
    free(x);
    tpu_storage_release(t.storage);
  }
  int64_t s[1] = {5};
  tpu_view_t t = make_tensor(TPU_DTYPE_F32, 1, s);
  tpu_arg_t args[3] = {a_tensor(t), a_double(1.5), a_none()};
  tpu_view_t o[1] = {t};
  tpu_status_t st = run_op("bernoulli_.float", TPU_VARIANT_INPLACE, args, 3, o, 1);
  CHECK(st && strstr(tpu_status_message(st), "bernoulli_ expects p to be in [0, 1], but got p=1.5"));
  tpu_status_free(st);
  /* p tensor: 0 and 1 are exact, broadcasting from (1,), shape mismatch, bad values */
  tpu_view_t p = make_tensor(TPU_DTYPE_F64, 1, s);
  double hp[5] = {0, 1, 0, 1, 1};
  fill_f64(p, hp);
  args[1] = a_tensor(p);
  CHECK_OK(run_op("bernoulli_.Tensor", TPU_VARIANT_INPLACE, args, 3, o, 1));
  double* x = read_f64(&t);
  for (int i = 0; i < 5; ++i) CHECK(x[i] == hp[i]);
  free(x);
  int64_t s3[1] = {3};
  tpu_view_t p3 = make_tensor(TPU_DTYPE_F32, 1, s3);
  args[1] = a_tensor(p3);
  st = run_op("bernoulli_.Tensor", TPU_VARIANT_INPLACE, args, 3, o, 1);
  CHECK(tpu_status_code(st) == TPU_INVALID_ARGUMENT);
  CHECK(st && strstr(tpu_status_message(st), "The expanded size of the tensor (5) must match the existing size (3)"));
  tpu_status_free(st);
  hp[2] = 2;
  fill_f64(p, hp);
  args[1] = a_tensor(p);
  CHECK_CODE(run_op("bernoulli_.Tensor", TPU_VARIANT_INPLACE, args, 3, o, 1), TPU_INVALID_ARGUMENT);
  /* functional bernoulli(self): p from self */
  hp[2] = 0;
  fill_f64(p, hp);
  tpu_arg_t a1[2] = {a_tensor(p), a_int(9)};
  tpu_view_t of[1] = {{0}};
  CHECK_OK(run_op("bernoulli", TPU_VARIANT_FUNCTIONAL, a1, 2, of, 1));
  CHECK(of[0].dtype == TPU_DTYPE_F64);
  x = read_f64(&of[0]);
  for (int i = 0; i < 5; ++i) CHECK(x[i] == hp[i]);
  free(x);
  tpu_storage_release(of[0].storage);
  tpu_view_t it = make_tensor(TPU_DTYPE_I64, 1, s);
  a1[0] = a_tensor(it);
  of[0] = (tpu_view_t){0};
  CHECK_CODE(run_op("bernoulli", TPU_VARIANT_FUNCTIONAL, a1, 2, of, 1), TPU_UNIMPLEMENTED);
  tpu_storage_release(t.storage); tpu_storage_release(p.storage); tpu_storage_release(p3.storage);
  tpu_storage_release(it.storage);
}

static void test_random_ranges(void) {
  struct { tpu_dtype_t dt; double lo, hi; } def[] = {
      {TPU_DTYPE_F32, 0, 16777216}, {TPU_DTYPE_F16, 0, 2048}, {TPU_DTYPE_BF16, 0, 256},
      {TPU_DTYPE_I8, 0, 127}, {TPU_DTYPE_U8, 0, 255}, {TPU_DTYPE_BOOL, 0, 1},
      {TPU_DTYPE_I32, 0, 2147483647.0}};
  for (size_t d = 0; d < sizeof def / sizeof *def; ++d) {
    tpu_view_t t = make_tensor(def[d].dt, 1, kN);
    tpu_arg_t args[2] = {a_tensor(t), a_int(99)};
    tpu_view_t o[1] = {t};
    CHECK_OK(run_op("random_", TPU_VARIANT_INPLACE, args, 2, o, 1));
    double* x = read_f64(&t);
    double mn = INFINITY, mx = -INFINITY;
    for (int i = 0; i < N; ++i) { mn = x[i] < mn ? x[i] : mn; mx = x[i] > mx ? x[i] : mx; CHECK(x[i] == floor(x[i])); }
    CHECK(mn >= def[d].lo && mx <= def[d].hi);
    CHECK(mx > def[d].hi * 0.99);
    free(x);
    tpu_storage_release(t.storage);
  }
  /* random_.from with to: every value of [-3, 4) shows up; to = None on int8: [from, 127] */
  tpu_view_t t = make_tensor(TPU_DTYPE_I32, 1, kN);
  tpu_arg_t args[4] = {a_tensor(t), a_int(-3), a_int(4), a_int(1)};
  tpu_view_t o[1] = {t};
  CHECK_OK(run_op("random_.from", TPU_VARIANT_INPLACE, args, 4, o, 1));
  double* x = read_f64(&t);
  int hist[7] = {0};
  for (int i = 0; i < N; ++i) { CHECK(x[i] >= -3 && x[i] < 4); if (x[i] >= -3 && x[i] < 4) hist[(int)x[i] + 3]++; }
  for (int k = 0; k < 7; ++k) CHECK(hist[k] > N / 7 * 0.9 && hist[k] < N / 7 * 1.1);
  free(x);
  tpu_storage_release(t.storage);
  t = make_tensor(TPU_DTYPE_I8, 1, kN);
  args[0] = a_tensor(t); args[1] = a_int(100); args[2] = a_none(); o[0] = t;
  CHECK_OK(run_op("random_.from", TPU_VARIANT_INPLACE, args, 4, o, 1));
  x = read_f64(&t);
  double mn = 1e9, mx = -1e9;
  for (int i = 0; i < N; ++i) { mn = x[i] < mn ? x[i] : mn; mx = x[i] > mx ? x[i] : mx; }
  CHECK(mn == 100 && mx == 127);
  free(x);
  /* random_.to(5) */
  tpu_arg_t a3[3] = {a_tensor(t), a_int(5), a_none()};
  CHECK_OK(run_op("random_.to", TPU_VARIANT_INPLACE, a3, 3, o, 1));
  x = read_f64(&t);
  mn = 1e9; mx = -1e9;
  for (int i = 0; i < N; ++i) { mn = x[i] < mn ? x[i] : mn; mx = x[i] > mx ? x[i] : mx; }
  CHECK(mn == 0 && mx == 4);
  free(x);
  tpu_storage_release(t.storage);
  /* full 64-bit range for int64: both signs appear */
  t = make_tensor(TPU_DTYPE_I64, 1, kN);
  args[0] = a_tensor(t); args[1] = a_int(INT64_MIN); args[2] = a_none(); o[0] = t;
  CHECK_OK(run_op("random_.from", TPU_VARIANT_INPLACE, args, 4, o, 1));
  x = read_f64(&t);
  int neg = 0;
  for (int i = 0; i < N; ++i) neg += x[i] < 0;
  CHECK(neg > N * 0.45 && neg < N * 0.55);
  free(x);
  tpu_storage_release(t.storage);
}

static void test_random_errors(void) {
  int64_t s[1] = {4};
  tpu_view_t u8 = make_tensor(TPU_DTYPE_U8, 1, s), f16 = make_tensor(TPU_DTYPE_F16, 1, s),
             i32 = make_tensor(TPU_DTYPE_I32, 1, s);
  tpu_view_t o[1] = {u8};
  tpu_arg_t args[4] = {a_tensor(u8), a_int(5), a_int(3), a_none()};
  tpu_status_t st = run_op("random_.from", TPU_VARIANT_INPLACE, args, 4, o, 1);
  CHECK(st && strstr(tpu_status_message(st), "random_ expects 'from' to be less than 'to', but got from=5 >= to=3"));
  tpu_status_free(st);
  args[1] = a_int(0); args[2] = a_int(300);
  st = run_op("random_.from", TPU_VARIANT_INPLACE, args, 4, o, 1);
  CHECK(st && strstr(tpu_status_message(st), "to - 1 is out of bounds for unsigned char"));
  tpu_status_free(st);
  args[1] = a_int(-1); args[2] = a_int(5);
  st = run_op("random_.from", TPU_VARIANT_INPLACE, args, 4, o, 1);
  CHECK(st && strstr(tpu_status_message(st), "from is out of bounds for unsigned char"));
  tpu_status_free(st);
  args[0] = a_tensor(f16); args[1] = a_int(2048); args[2] = a_none(); o[0] = f16;
  CHECK_CODE(run_op("random_.from", TPU_VARIANT_INPLACE, args, 4, o, 1), TPU_INVALID_ARGUMENT);
  args[1] = a_int(INT64_MIN);
  CHECK_CODE(run_op("random_.from", TPU_VARIANT_INPLACE, args, 4, o, 1), TPU_UNIMPLEMENTED);
  args[0] = a_tensor(i32); o[0] = i32;
  CHECK_CODE(run_op("random_.from", TPU_VARIANT_INPLACE, args, 4, o, 1), TPU_INVALID_ARGUMENT);
  tpu_arg_t a3[3] = {a_tensor(i32), a_int(0), a_none()};
  CHECK_CODE(run_op("random_.to", TPU_VARIANT_INPLACE, a3, 3, o, 1), TPU_INVALID_ARGUMENT);
  tpu_storage_release(u8.storage); tpu_storage_release(f16.storage); tpu_storage_release(i32.storage);
}

static void test_other_distributions(void) {
  tpu_view_t t = make_tensor(TPU_DTYPE_F64, 1, kN);
  tpu_view_t o[1] = {t};
  double mean, var;
  tpu_arg_t ex[3] = {a_tensor(t), a_double(2), a_int(3)};
  CHECK_OK(run_op("exponential_", TPU_VARIANT_INPLACE, ex, 3, o, 1));
  double* x = read_f64(&t);
  stats(x, N, &mean, &var);
  CHECK_NEAR(mean, 0.5, 0.01);
  CHECK_NEAR(var, 0.25, 0.01);
  for (int i = 0; i < N; ++i) CHECK(x[i] >= 0);
  free(x);
  tpu_arg_t ln[4] = {a_tensor(t), a_double(0), a_double(0.5), a_int(3)};
  CHECK_OK(run_op("log_normal_", TPU_VARIANT_INPLACE, ln, 4, o, 1));
  x = read_f64(&t);
  stats(x, N, &mean, &var);
  CHECK_NEAR(mean, exp(0.125), 0.01);
  free(x);
  tpu_arg_t ge[3] = {a_tensor(t), a_double(0.25), a_int(3)};
  CHECK_OK(run_op("geometric_", TPU_VARIANT_INPLACE, ge, 3, o, 1));
  x = read_f64(&t);
  stats(x, N, &mean, &var);
  CHECK_NEAR(mean, 4, 0.1); /* 1/p */
  CHECK_NEAR(var, 12, 0.6); /* (1-p)/p^2 */
  for (int i = 0; i < N; ++i) CHECK(x[i] >= 1 && x[i] == floor(x[i]));
  free(x);
  tpu_arg_t ca[4] = {a_tensor(t), a_double(1), a_double(2), a_int(3)};
  CHECK_OK(run_op("cauchy_", TPU_VARIANT_INPLACE, ca, 4, o, 1));
  x = read_f64(&t);
  int below = 0, inner = 0;
  for (int i = 0; i < N; ++i) { below += x[i] < 1; inner += x[i] > -1 && x[i] < 3; }
  CHECK(below > N * 0.49 && below < N * 0.51); /* median 1 */
  CHECK(inner > N * 0.49 && inner < N * 0.51); /* quartiles at median +- sigma */
  free(x);
  /* errors */
  ex[1] = a_double(0);
  CHECK_CODE(run_op("exponential_", TPU_VARIANT_INPLACE, ex, 3, o, 1), TPU_INVALID_ARGUMENT);
  ln[2] = a_double(0);
  CHECK_CODE(run_op("log_normal_", TPU_VARIANT_INPLACE, ln, 4, o, 1), TPU_INVALID_ARGUMENT);
  ge[1] = a_double(1);
  CHECK_CODE(run_op("geometric_", TPU_VARIANT_INPLACE, ge, 3, o, 1), TPU_INVALID_ARGUMENT);
  ca[2] = a_double(-1);
  CHECK_CODE(run_op("cauchy_", TPU_VARIANT_INPLACE, ca, 4, o, 1), TPU_INVALID_ARGUMENT);
  tpu_storage_release(t.storage);
  int64_t s[1] = {4};
  tpu_view_t i64 = make_tensor(TPU_DTYPE_I64, 1, s), b = make_tensor(TPU_DTYPE_BOOL, 1, s);
  o[0] = i64;
  ex[0] = a_tensor(i64); ex[1] = a_double(1);
  tpu_status_t st = run_op("exponential_", TPU_VARIANT_INPLACE, ex, 3, o, 1);
  CHECK(st && strstr(tpu_status_message(st), "dtype must be a floating point but you specified Long"));
  tpu_status_free(st);
  ln[0] = a_tensor(i64); ln[2] = a_double(1);
  CHECK_CODE(run_op("log_normal_", TPU_VARIANT_INPLACE, ln, 4, o, 1), TPU_UNIMPLEMENTED);
  ge[0] = a_tensor(i64); ge[1] = a_double(0.5);
  CHECK_OK(run_op("geometric_", TPU_VARIANT_INPLACE, ge, 3, o, 1));
  ge[0] = a_tensor(b); o[0] = b;
  CHECK_CODE(run_op("geometric_", TPU_VARIANT_INPLACE, ge, 3, o, 1), TPU_UNIMPLEMENTED);
  tpu_storage_release(i64.storage); tpu_storage_release(b.storage);
}

static void test_randperm(void) {
  tpu_dtype_t dts[] = {TPU_DTYPE_I64, TPU_DTYPE_I32, TPU_DTYPE_F32, TPU_DTYPE_F16};
  int64_t ns[] = {1000, 1000, 1000, 2049};
  for (size_t d = 0; d < 4; ++d) {
    int64_t s0[1] = {0};
    tpu_view_t out = make_tensor(dts[d], 1, &ns[d]);
    (void)s0;
    tpu_arg_t args[3] = {a_int(ns[d]), a_int(77), a_tensor(out)};
    tpu_view_t o[1] = {out};
    CHECK_OK(run_op("randperm.generator_out", TPU_VARIANT_OUT, args, 3, o, 1));
    double* x = read_f64(&out);
    char* seen = calloc((size_t)ns[d], 1);
    int ok = 1, fixed = 0;
    for (int64_t i = 0; i < ns[d]; ++i) {
      int64_t v = (int64_t)x[i];
      if (v < 0 || v >= ns[d] || seen[v]) ok = 0; else seen[v] = 1;
      fixed += v == i;
    }
    CHECK(ok);
    CHECK(fixed < 10); /* a uniform permutation has ~1 fixed point */
    free(seen); free(x);
    tpu_storage_release(out.storage);
  }
  int64_t s[1] = {5};
  tpu_view_t out = make_tensor(TPU_DTYPE_I64, 1, s), h = make_tensor(TPU_DTYPE_F16, 1, s),
             i8 = make_tensor(TPU_DTYPE_I8, 1, s), bl = make_tensor(TPU_DTYPE_BOOL, 1, s);
  tpu_view_t o[1] = {out};
  tpu_arg_t args[3] = {a_int(-1), a_none(), a_tensor(out)};
  tpu_status_t st = run_op("randperm.generator_out", TPU_VARIANT_OUT, args, 3, o, 1);
  CHECK(st && strstr(tpu_status_message(st), "n must be non-negative, got-1"));
  tpu_status_free(st);
  args[0] = a_int(3000); args[2] = a_tensor(h); o[0] = h;
  st = run_op("randperm.generator_out", TPU_VARIANT_OUT, args, 3, o, 1);
  CHECK(st && strstr(tpu_status_message(st), "n cannot be greater than 2049 for Half type."));
  tpu_status_free(st);
  args[0] = a_int(300); args[2] = a_tensor(i8); o[0] = i8;
  CHECK_CODE(run_op("randperm.generator_out", TPU_VARIANT_OUT, args, 3, o, 1), TPU_INVALID_ARGUMENT);
  args[0] = a_int(5); args[2] = a_tensor(bl); o[0] = bl;
  CHECK_CODE(run_op("randperm.generator_out", TPU_VARIANT_OUT, args, 3, o, 1), TPU_UNIMPLEMENTED);
  tpu_storage_release(out.storage); tpu_storage_release(h.storage);
  tpu_storage_release(i8.storage); tpu_storage_release(bl.storage);
}

static void test_multinomial(void) {
  int64_t sp[2] = {2, 4};
  tpu_view_t p = make_tensor(TPU_DTYPE_F32, 2, sp);
  double hp[8] = {0, 1, 0, 3, 1, 1, 1, 1};
  fill_f64(p, hp);
  /* with replacement: frequencies follow p, zero-probability never drawn */
  tpu_arg_t args[4] = {a_tensor(p), a_int(20000), a_bool(true), a_int(5)};
  tpu_view_t o[1] = {{0}};
  CHECK_OK(run_op("multinomial", TPU_VARIANT_FUNCTIONAL, args, 4, o, 1));
  CHECK(o[0].dtype == TPU_DTYPE_I64 && o[0].ndim == 2 && o[0].sizes[1] == 20000);
  double* x = read_f64(&o[0]);
  int h0[4] = {0}, h1[4] = {0};
  for (int i = 0; i < 20000; ++i) { h0[(int)x[i] & 3]++; h1[(int)x[20000 + i] & 3]++; }
  CHECK(h0[0] == 0 && h0[2] == 0);
  CHECK(h0[3] > 14500 && h0[3] < 15500);
  for (int k = 0; k < 4; ++k) CHECK(h1[k] > 4500 && h1[k] < 5500);
  free(x);
  tpu_storage_release(o[0].storage);
  /* without replacement: distinct indices, nonzero ones first */
  args[1] = a_int(4); args[2] = a_bool(false);
  o[0] = (tpu_view_t){0};
  CHECK_OK(run_op("multinomial", TPU_VARIANT_FUNCTIONAL, args, 4, o, 1));
  x = read_f64(&o[0]);
  CHECK((x[0] == 1 || x[0] == 3) && (x[1] == 1 || x[1] == 3) && x[0] != x[1]);
  CHECK((x[2] == 0 || x[2] == 2) && x[2] + x[3] == 2);
  int seen[4] = {0};
  for (int i = 4; i < 8; ++i) seen[(int)x[i] & 3]++;
  for (int k = 0; k < 4; ++k) CHECK(seen[k] == 1);
  free(x);
  tpu_storage_release(o[0].storage);
  /* errors: build-time and data-dependent */
  args[1] = a_int(5);
  o[0] = (tpu_view_t){0};
  tpu_status_t st = run_op("multinomial", TPU_VARIANT_FUNCTIONAL, args, 4, o, 1);
  CHECK(st && strstr(tpu_status_message(st), "cannot sample n_sample > prob_dist.size(-1) samples without replacement"));
  tpu_status_free(st);
  args[1] = a_int(0);
  CHECK_CODE(run_op("multinomial", TPU_VARIANT_FUNCTIONAL, args, 4, o, 1), TPU_INVALID_ARGUMENT);
  hp[0] = -1;
  fill_f64(p, hp);
  args[1] = a_int(2);
  o[0] = (tpu_view_t){0};
  st = run_op("multinomial", TPU_VARIANT_FUNCTIONAL, args, 4, o, 1);
  CHECK(st && strstr(tpu_status_message(st), "probability tensor contains either `inf`, `nan` or element < 0"));
  tpu_status_free(st);
  tpu_storage_release(o[0].storage);
  args[2] = a_bool(true);
  o[0] = (tpu_view_t){0};
  st = run_op("multinomial", TPU_VARIANT_FUNCTIONAL, args, 4, o, 1);
  CHECK(st && strstr(tpu_status_message(st), "invalid multinomial distribution (encountering probability entry < 0)"));
  tpu_status_free(st);
  tpu_storage_release(o[0].storage);
  tpu_storage_release(p.storage);
}

static void test_dropout(void) {
  tpu_view_t in = make_tensor(TPU_DTYPE_F32, 1, kN);
  double* ones = malloc(N * sizeof(double));
  for (int i = 0; i < N; ++i) ones[i] = 1 + (i % 7);
  fill_f64(in, ones);
  tpu_arg_t args[4] = {a_tensor(in), a_double(0.25), a_bool(true), a_int(17)};
  tpu_view_t o[2] = {{0}, {0}};
  CHECK_OK(run_op("native_dropout", TPU_VARIANT_FUNCTIONAL, args, 4, o, 2));
  CHECK(o[1].dtype == TPU_DTYPE_BOOL && o[0].dtype == TPU_DTYPE_F32);
  double *y = read_f64(&o[0]), *m = read_f64(&o[1]);
  int kept = 0, rel = 1;
  for (int i = 0; i < N; ++i) {
    kept += m[i] != 0;
    double want = m[i] != 0 ? ones[i] / 0.75 : 0;
    if (fabs(y[i] - want) > 1e-5 * want) rel = 0;
  }
  CHECK(rel);
  CHECK(kept > N * 0.74 && kept < N * 0.76);
  /* backward: grad * mask * scale, broadcasting a (1,) grad */
  int64_t s1[1] = {1};
  tpu_view_t g = make_tensor(TPU_DTYPE_F64, 1, s1);
  double hg = 3;
  fill_f64(g, &hg);
  tpu_arg_t bargs[3] = {a_tensor(g), a_tensor(o[1]), a_double(1 / 0.75)};
  tpu_view_t ob[1] = {{0}};
  CHECK_OK(run_op("native_dropout_backward", TPU_VARIANT_FUNCTIONAL, bargs, 3, ob, 1));
  CHECK(ob[0].dtype == TPU_DTYPE_F64 && ob[0].sizes[0] == N);
  double* gb = read_f64(&ob[0]);
  int okb = 1;
  for (int i = 0; i < N; ++i) okb &= fabs(gb[i] - (m[i] != 0 ? 4.0 : 0.0)) < 1e-12;
  CHECK(okb);
  free(gb); free(y); free(m);
  tpu_storage_release(ob[0].storage);
  tpu_storage_release(g.storage);
  tpu_storage_release(o[0].storage); tpu_storage_release(o[1].storage);
  /* eval: copy and all-true mask */
  args[2] = a_bool(false);
  o[0] = o[1] = (tpu_view_t){0};
  CHECK_OK(run_op("native_dropout", TPU_VARIANT_FUNCTIONAL, args, 4, o, 2));
  y = read_f64(&o[0]); m = read_f64(&o[1]);
  int same = 1;
  for (int i = 0; i < N; ++i) same &= y[i] == ones[i] && m[i] == 1;
  CHECK(same);
  free(y); free(m);
  tpu_storage_release(o[0].storage); tpu_storage_release(o[1].storage);
  /* p outside [0, 1] in training */
  args[1] = a_double(1.5); args[2] = a_bool(true);
  o[0] = o[1] = (tpu_view_t){0};
  tpu_status_t st = run_op("native_dropout", TPU_VARIANT_FUNCTIONAL, args, 4, o, 2);
  CHECK(st && strstr(tpu_status_message(st), "bernoulli_ expects p to be in [0, 1], but got p=-0.5"));
  tpu_status_free(st);
  /* p = 1 drops everything (scale 0, not inf) */
  args[1] = a_double(1.0);
  CHECK_OK(run_op("native_dropout", TPU_VARIANT_FUNCTIONAL, args, 4, o, 2));
  y = read_f64(&o[0]);
  int zeros = 1;
  for (int i = 0; i < N; ++i) zeros &= y[i] == 0;
  CHECK(zeros);
  free(y);
  tpu_storage_release(o[0].storage); tpu_storage_release(o[1].storage);
  free(ones);
  tpu_storage_release(in.storage);
}

int main(void) {
  test_philox_known_answers();
  test_uniform();
  test_uniform_errors();
  test_reproducible_and_stride_free();
  test_normal();
  test_bernoulli();
  test_random_ranges();
  test_random_errors();
  test_other_distributions();
  test_randperm();
  test_multinomial();
  test_dropout();
  CHECK_OK(tpu_device_synchronize(0));
  TEST_MAIN_END();
}
