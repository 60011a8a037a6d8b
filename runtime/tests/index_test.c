/* Index and shape family: builders through tpu_op_prepare, kernels through the host
 * driver, checked against hand-computed results; error classes as PyTorch CPU raises. */
#include <string.h>

#include "check.h"

#define F32 TPU_DTYPE_F32
#define F64 TPU_DTYPE_F64
#define I64 TPU_DTYPE_I64
#define I32 TPU_DTYPE_I32
#define BOOL TPU_DTYPE_BOOL
#define BF16 TPU_DTYPE_BF16

/* Storages made by the helpers, released at the end of each test. */
static tpu_storage_t* owned[256];
static int n_owned;
static void release_all(void) {
  while (n_owned) tpu_storage_release(owned[--n_owned]);
}

static tpu_view_t mk(tpu_dtype_t dt, int nd, const int64_t* sizes, const void* data) {
  int64_t n = 1;
  for (int i = 0; i < nd; ++i) n *= sizes[i];
  tpu_storage_t* s = NULL;
  CHECK_OK(tpu_storage_create(0, (uint64_t)(n ? n : 1) * tpu_dtype_size(dt), &s));
  owned[n_owned++] = s;
  tpu_view_t v = check_view(s, dt, nd, sizes);
  if (data && n) CHECK_OK(tpu_copy_from_host(&v, data));
  return v;
}
#define SZ(...) ((const int64_t[]){__VA_ARGS__})

static tpu_arg_t T(tpu_view_t v) { tpu_arg_t a = {0}; a.kind = TPU_ARG_TENSOR; a.tensor = v; return a; }
static tpu_arg_t I(int64_t i) { tpu_arg_t a = {0}; a.kind = TPU_ARG_INT; a.v.i = i; return a; }
static tpu_arg_t B(bool b) { tpu_arg_t a = {0}; a.kind = TPU_ARG_BOOL; a.v.b = b; return a; }
static tpu_arg_t S(const char* s) { tpu_arg_t a = {0}; a.kind = TPU_ARG_STRING; a.s = s; return a; }
static tpu_arg_t N(void) { tpu_arg_t a = {0}; return a; }
static tpu_arg_t SF(double d) {
  tpu_arg_t a = {0}; a.kind = TPU_ARG_SCALAR; a.scalar_kind = TPU_SCALAR_FLOAT; a.v.d = d; return a;
}
static tpu_arg_t SI(int64_t i) {
  tpu_arg_t a = {0}; a.kind = TPU_ARG_SCALAR; a.scalar_kind = TPU_SCALAR_INT; a.v.i = i; return a;
}
static tpu_arg_t L(const int64_t* v, int n) { tpu_arg_t a = {0}; a.kind = TPU_ARG_INTLIST; a.list = v; a.list_len = n; return a; }
static tpu_arg_t TL(const tpu_view_t* v, int n) {
  tpu_arg_t a = {0}; a.kind = TPU_ARG_TENSORLIST; a.tensors = v; a.list_len = n; return a;
}

/* Prepares, binds (new tensors; self for in-place), submits and synchronizes.
 * outs receives the bound outputs. Returns the first error (prepare or async). */
static tpu_status_t run(const char* name, tpu_variant_t var, const tpu_arg_t* args, int nargs, tpu_view_t* outs) {
  int idx = check_op_index(name);
  if (idx < 0) return tpu_status_make(TPU_INTERNAL, "no op %s", name);
  tpu_node_t* n;
  TPU_RETURN_IF_ERROR(tpu_op_prepare(idx, var, args, nargs, &n));
  for (int i = 0; i < tpu_node_output_count(n); ++i) {
    tpu_dtype_t dt; int32_t nd; int64_t s[TPU_MAX_DIMS];
    tpu_node_output_meta(n, i, &dt, &nd, s);
    if (var == TPU_VARIANT_INPLACE && i == 0) outs[0] = args[0].tensor;
    else if (var == TPU_VARIANT_OUT) outs[i] = args[nargs - tpu_node_output_count(n) + i].tensor;
    else outs[i] = mk(dt, nd, s, NULL);
    tpu_status_t st = tpu_node_bind_output(n, i, &outs[i]);
    if (st) { tpu_node_discard(n); return st; }
  }
  TPU_RETURN_IF_ERROR(tpu_node_submit(n));
  return tpu_device_synchronize(0);
}

static void read_f32(tpu_view_t v, float* out) { CHECK_OK(tpu_copy_to_host(&v, out)); }
static void read_i64(tpu_view_t v, int64_t* out) { CHECK_OK(tpu_copy_to_host(&v, out)); }

static bool eq_f(const float* a, const float* b, int n) {
  for (int i = 0; i < n; ++i)
    if (!(a[i] == b[i] || (isnan(a[i]) && isnan(b[i])))) {
      fprintf(stderr, "  mismatch at %d: %g vs %g\n", i, a[i], b[i]);
      return false;
    }
  return true;
}
static bool eq_i(const int64_t* a, const int64_t* b, int n) {
  for (int i = 0; i < n; ++i)
    if (a[i] != b[i]) { fprintf(stderr, "  mismatch at %d: %lld vs %lld\n", i, (long long)a[i], (long long)b[i]); return false; }
  return true;
}

static const float X6[6] = {0, 1, 2, 3, 4, 5}; /* a 2x3 */

static void test_gather(void) {
  tpu_view_t x = mk(F32, 2, SZ(2, 3), X6);
  int64_t ih[4] = {2, 0, 1, 1};
  tpu_view_t ix = mk(I64, 2, SZ(2, 2), ih);
  tpu_arg_t a[4] = {T(x), I(1), T(ix), B(false)};
  tpu_view_t o[2];
  CHECK_OK(run("gather", TPU_VARIANT_FUNCTIONAL, a, 4, o));
  float r[4];
  read_f32(o[0], r);
  CHECK(eq_f(r, (float[]){2, 0, 4, 4}, 4));
  /* int32 index, dim -2 */
  int32_t ih32[3] = {1, 0, 1};
  tpu_view_t ix32 = mk(I32, 2, SZ(1, 3), ih32);
  tpu_arg_t a2[4] = {T(x), I(-2), T(ix32), B(false)};
  CHECK_OK(run("gather", TPU_VARIANT_FUNCTIONAL, a2, 4, o));
  read_f32(o[0], r);
  CHECK(eq_f(r, (float[]){3, 1, 5}, 3));
  /* out of bounds at run time: RuntimeError class, op named */
  int64_t bad[1] = {5};
  tpu_view_t ib = mk(I64, 2, SZ(1, 1), bad);
  tpu_arg_t a3[4] = {T(x), I(1), T(ib), B(false)};
  tpu_status_t st = run("gather", TPU_VARIANT_FUNCTIONAL, a3, 4, o);
  CHECK(tpu_status_code(st) == TPU_INVALID_ARGUMENT);
  CHECK(st && strstr(tpu_status_message(st), "index 5 is out of bounds for dimension 1 with size 3"));
  tpu_status_free(st);
  /* builder errors */
  tpu_view_t i1 = mk(I64, 1, SZ(1), bad);
  tpu_arg_t a4[4] = {T(x), I(1), T(i1), B(false)};
  CHECK_CODE(run("gather", TPU_VARIANT_FUNCTIONAL, a4, 4, o), TPU_INVALID_ARGUMENT);
  tpu_view_t fi = mk(F32, 2, SZ(1, 1), X6);
  tpu_arg_t a5[4] = {T(x), I(1), T(fi), B(false)};
  CHECK_CODE(run("gather", TPU_VARIANT_FUNCTIONAL, a5, 4, o), TPU_INVALID_ARGUMENT);
  tpu_arg_t a6[4] = {T(x), I(2), T(ix), B(false)};
  CHECK_CODE(run("gather", TPU_VARIANT_FUNCTIONAL, a6, 4, o), TPU_INDEX_ERROR);
  release_all();
}

static void test_scatter(void) {
  tpu_view_t x = mk(F32, 2, SZ(2, 3), X6);
  int64_t ih[2] = {2, 2};
  tpu_view_t ix = mk(I64, 2, SZ(1, 2), ih);
  float sh[2] = {10, 20};
  tpu_view_t src = mk(F32, 2, SZ(1, 2), sh);
  tpu_view_t o[2];
  float r[6];
  /* scatter_add with a duplicate index accumulates */
  tpu_arg_t a[4] = {T(x), I(1), T(ix), T(src)};
  CHECK_OK(run("scatter_add", TPU_VARIANT_FUNCTIONAL, a, 4, o));
  read_f32(o[0], r);
  CHECK(eq_f(r, (float[]){0, 1, 32, 3, 4, 5}, 6));
  /* scatter_.value in place */
  int64_t ih2[2] = {0, 1};
  tpu_view_t ix2 = mk(I64, 2, SZ(2, 1), ih2);
  tpu_arg_t b[4] = {T(x), I(1), T(ix2), SF(-1)};
  CHECK_OK(run("scatter_.value", TPU_VARIANT_INPLACE, b, 4, o));
  read_f32(x, r);
  CHECK(eq_f(r, (float[]){-1, 1, 2, 3, -1, 5}, 6));
  /* scatter.reduce multiply */
  tpu_arg_t c[5] = {T(x), I(1), T(ix), T(src), S("multiply")};
  CHECK_OK(run("scatter.reduce", TPU_VARIANT_FUNCTIONAL, c, 5, o));
  read_f32(o[0], r);
  CHECK(eq_f(r, (float[]){-1, 1, 400, 3, -1, 5}, 6));
  tpu_arg_t c2[5] = {T(x), I(1), T(ix), T(src), S("max")};
  CHECK_CODE(run("scatter.reduce", TPU_VARIANT_FUNCTIONAL, c2, 5, o), TPU_INVALID_ARGUMENT);
  /* dtype mismatch */
  tpu_view_t s64 = mk(F64, 2, SZ(1, 2), (double[]){1, 2});
  tpu_arg_t d[4] = {T(x), I(1), T(ix), T(s64)};
  CHECK_CODE(run("scatter.src", TPU_VARIANT_FUNCTIONAL, d, 4, o), TPU_INVALID_ARGUMENT);
  /* scatter_reduce.two mean, integers floor-divide, include_self false */
  int64_t xi[2] = {-5, 5}, si[2] = {-2, -3}, ii[2] = {0, 0};
  tpu_view_t vx = mk(I64, 1, SZ(2), xi), vs = mk(I64, 1, SZ(2), si), vi = mk(I64, 1, SZ(2), ii);
  tpu_arg_t e[6] = {T(vx), I(0), T(vi), T(vs), S("mean"), B(false)};
  CHECK_OK(run("scatter_reduce.two", TPU_VARIANT_FUNCTIONAL, e, 6, o));
  int64_t ri[2];
  read_i64(o[0], ri);
  CHECK(eq_i(ri, (int64_t[]){-3, 5}, 2));
  tpu_arg_t e2[6] = {T(vx), I(0), T(vi), T(vs), S("mean"), B(true)};
  CHECK_OK(run("scatter_reduce.two", TPU_VARIANT_FUNCTIONAL, e2, 6, o));
  read_i64(o[0], ri);
  CHECK(eq_i(ri, (int64_t[]){-4, 5}, 2)); /* floor(-10/3) */
  /* amax propagates NaN; amin without self */
  float fx[3] = {1, 1, 1}, fs[3] = {NAN, 7, -7};
  int64_t fi[3] = {0, 1, 1};
  tpu_view_t ffx = mk(F32, 1, SZ(3), fx), ffs = mk(F32, 1, SZ(3), fs), ffi = mk(I64, 1, SZ(3), fi);
  tpu_arg_t g[6] = {T(ffx), I(0), T(ffi), T(ffs), S("amax"), B(true)};
  CHECK_OK(run("scatter_reduce.two", TPU_VARIANT_FUNCTIONAL, g, 6, o));
  read_f32(o[0], r);
  CHECK(eq_f(r, (float[]){NAN, 7, 1}, 3));
  tpu_arg_t g2[6] = {T(ffx), I(0), T(ffi), T(ffs), S("amin"), B(false)};
  CHECK_OK(run("scatter_reduce.two", TPU_VARIANT_FUNCTIONAL, g2, 6, o));
  read_f32(o[0], r);
  CHECK(eq_f(r, (float[]){NAN, -7, 1}, 3));
  /* bf16 sums round after every update like CPU: 256 + 1 + 1 stays 256 in bf16 */
  uint16_t bx[1] = {0x4380}; /* 256 */
  uint16_t bs[2] = {0x3f80, 0x3f80}; /* 1, 1 */
  int64_t bi[2] = {0, 0};
  tpu_view_t vbx = mk(BF16, 1, SZ(1), bx), vbs = mk(BF16, 1, SZ(2), bs), vbi = mk(I64, 1, SZ(2), bi);
  tpu_arg_t h[4] = {T(vbx), I(0), T(vbi), T(vbs)};
  CHECK_OK(run("scatter_add", TPU_VARIANT_FUNCTIONAL, h, 4, o));
  uint16_t br[1];
  CHECK_OK(tpu_copy_to_host(&o[0], br));
  CHECK(br[0] == 0x4380);
  /* out of bounds at run time */
  int64_t bad[2] = {0, 3};
  tpu_view_t vbad = mk(I64, 1, SZ(2), bad);
  tpu_arg_t k[4] = {T(ffx), I(0), T(vbad), T(ffs)};
  CHECK_CODE(run("scatter.src", TPU_VARIANT_FUNCTIONAL, k, 4, o), TPU_INVALID_ARGUMENT);
  release_all();
}

static void test_index_select_add_copy(void) {
  tpu_view_t x = mk(F32, 2, SZ(2, 3), X6);
  int64_t ih[3] = {2, 0, 2};
  tpu_view_t ix = mk(I64, 1, SZ(3), ih);
  tpu_view_t o[2];
  float r[9];
  tpu_arg_t a[3] = {T(x), I(1), T(ix)};
  CHECK_OK(run("index_select", TPU_VARIANT_FUNCTIONAL, a, 3, o));
  CHECK(o[0].sizes[0] == 2 && o[0].sizes[1] == 3);
  read_f32(o[0], r);
  CHECK(eq_f(r, (float[]){2, 0, 2, 5, 3, 5}, 6));
  int64_t bad[1] = {-1};
  tpu_view_t vb = mk(I64, 1, SZ(1), bad);
  tpu_arg_t a2[3] = {T(x), I(0), T(vb)};
  CHECK_CODE(run("index_select", TPU_VARIANT_FUNCTIONAL, a2, 3, o), TPU_INDEX_ERROR);
  tpu_view_t i2 = mk(I64, 2, SZ(1, 1), bad);
  tpu_arg_t a3[3] = {T(x), I(0), T(i2)};
  CHECK_CODE(run("index_select", TPU_VARIANT_FUNCTIONAL, a3, 3, o), TPU_INDEX_ERROR);
  /* index_add_ with alpha, duplicate rows accumulate */
  int64_t rows[2] = {1, 1};
  tpu_view_t vr = mk(I64, 1, SZ(2), rows);
  float ones[6] = {1, 1, 1, 1, 1, 1};
  tpu_view_t src = mk(F32, 2, SZ(2, 3), ones);
  tpu_arg_t b[5] = {T(x), I(0), T(vr), T(src), SI(2)};
  CHECK_OK(run("index_add_", TPU_VARIANT_INPLACE, b, 5, o));
  read_f32(x, r);
  CHECK(eq_f(r, (float[]){0, 1, 2, 7, 8, 9}, 6));
  /* index_copy with a bad count: IndexError; int32 index: RuntimeError */
  tpu_view_t src1 = mk(F32, 2, SZ(1, 3), ones);
  tpu_arg_t c[4] = {T(x), I(0), T(vr), T(src1)};
  CHECK_CODE(run("index_copy", TPU_VARIANT_FUNCTIONAL, c, 4, o), TPU_INDEX_ERROR);
  int32_t r32[1] = {0};
  tpu_view_t v32 = mk(I32, 1, SZ(1), r32);
  tpu_arg_t c2[4] = {T(x), I(0), T(v32), T(src1)};
  CHECK_CODE(run("index_copy", TPU_VARIANT_FUNCTIONAL, c2, 4, o), TPU_INVALID_ARGUMENT);
  int64_t r0[1] = {0};
  tpu_view_t vr0 = mk(I64, 1, SZ(1), r0);
  tpu_arg_t c3[4] = {T(x), I(0), T(vr0), T(src1)};
  CHECK_OK(run("index_copy", TPU_VARIANT_FUNCTIONAL, c3, 4, o));
  read_f32(o[0], r);
  CHECK(eq_f(r, (float[]){1, 1, 1, 7, 8, 9}, 6));
  release_all();
}

static void test_advanced_index(void) {
  /* x: 2x3x4 = arange */
  float xh[24];
  for (int i = 0; i < 24; ++i) xh[i] = (float)i;
  tpu_view_t x = mk(F32, 3, SZ(2, 3, 4), xh);
  tpu_view_t o[2];
  float r[24];
  /* x[[1,0], :, [3,0]]: separated indices -> broadcast dims first: shape [2, 3] */
  int64_t i0[2] = {1, 0}, i2[2] = {3, 0};
  tpu_view_t v0 = mk(I64, 1, SZ(2), i0), v2 = mk(I64, 1, SZ(2), i2);
  tpu_view_t list[3] = {v0, {0}, v2};
  tpu_arg_t a[2] = {T(x), TL(list, 3)};
  CHECK_OK(run("index.Tensor", TPU_VARIANT_FUNCTIONAL, a, 2, o));
  CHECK(o[0].ndim == 2 && o[0].sizes[0] == 2 && o[0].sizes[1] == 3);
  read_f32(o[0], r);
  CHECK(eq_f(r, (float[]){15, 19, 23, 0, 4, 8}, 6));
  /* x[:, [[2],[0]], [1,-1]]: adjacent, broadcast [2,2] -> shape [2, 2, 2] */
  int64_t j1[2] = {2, 0}, j2[2] = {1, -1};
  tpu_view_t w1 = mk(I64, 2, SZ(2, 1), j1), w2 = mk(I64, 1, SZ(2), j2);
  tpu_view_t list2[3] = {{0}, w1, w2};
  tpu_arg_t b[2] = {T(x), TL(list2, 3)};
  CHECK_OK(run("index.Tensor", TPU_VARIANT_FUNCTIONAL, b, 2, o));
  CHECK(o[0].ndim == 3 && o[0].sizes[0] == 2 && o[0].sizes[1] == 2 && o[0].sizes[2] == 2);
  read_f32(o[0], r);
  CHECK(eq_f(r, (float[]){9, 11, 1, 3, 21, 23, 13, 15}, 8));
  /* boolean mask over the first two dims: shape [count, 4] */
  bool mh[6] = {true, false, false, false, true, true};
  tpu_view_t m = mk(BOOL, 2, SZ(2, 3), mh);
  tpu_view_t list3[1] = {m};
  tpu_arg_t c[2] = {T(x), TL(list3, 1)};
  CHECK_OK(run("index.Tensor", TPU_VARIANT_FUNCTIONAL, c, 2, o));
  CHECK(o[0].ndim == 2 && o[0].sizes[0] == 3 && o[0].sizes[1] == 4);
  read_f32(o[0], r);
  CHECK(eq_f(r, (float[]){0, 1, 2, 3, 16, 17, 18, 19, 20, 21, 22, 23}, 12));
  /* errors: out of range (IndexError at run time), too many, float index, mask shape */
  int64_t bad[1] = {-3};
  tpu_view_t vb = mk(I64, 1, SZ(1), bad);
  tpu_view_t list4[1] = {vb};
  tpu_arg_t d[2] = {T(x), TL(list4, 1)};
  tpu_status_t st = run("index.Tensor", TPU_VARIANT_FUNCTIONAL, d, 2, o);
  CHECK(tpu_status_code(st) == TPU_INDEX_ERROR);
  CHECK(st && strstr(tpu_status_message(st), "index -3 is out of bounds for dimension 0 with size 2"));
  tpu_status_free(st);
  tpu_view_t list5[4] = {v0, v0, v0, v0};
  tpu_arg_t e[2] = {T(x), TL(list5, 4)};
  CHECK_CODE(run("index.Tensor", TPU_VARIANT_FUNCTIONAL, e, 2, o), TPU_INDEX_ERROR);
  tpu_view_t fl = mk(F32, 1, SZ(1), xh);
  tpu_view_t list6[1] = {fl};
  tpu_arg_t f[2] = {T(x), TL(list6, 1)};
  CHECK_CODE(run("index.Tensor", TPU_VARIANT_FUNCTIONAL, f, 2, o), TPU_INDEX_ERROR);
  tpu_view_t m3 = mk(BOOL, 1, SZ(3), mh);
  tpu_view_t list7[1] = {m3};
  tpu_arg_t g[2] = {T(x), TL(list7, 1)};
  CHECK_CODE(run("index.Tensor", TPU_VARIANT_FUNCTIONAL, g, 2, o), TPU_INDEX_ERROR);
  int64_t three[3] = {0, 1, 2};
  tpu_view_t v3 = mk(I64, 1, SZ(3), three);
  tpu_view_t list8[2] = {v0, v3};
  tpu_arg_t h[2] = {T(x), TL(list8, 2)};
  CHECK_CODE(run("index.Tensor", TPU_VARIANT_FUNCTIONAL, h, 2, o), TPU_INDEX_ERROR);
  release_all();
}

static void test_index_put(void) {
  tpu_view_t x = mk(F32, 2, SZ(2, 3), X6);
  tpu_view_t o[2];
  float r[6];
  int64_t i0[3] = {1, 1, 0}, i1[3] = {2, 2, 0};
  tpu_view_t v0 = mk(I64, 1, SZ(3), i0), v1 = mk(I64, 1, SZ(3), i1);
  float vh[1] = {10};
  tpu_view_t val = mk(F32, 0, NULL, vh);
  tpu_view_t list[2] = {v0, v1};
  tpu_arg_t a[5] = {T(x), TL(list, 2), T(val), B(true), B(false)};
  CHECK_OK(run("_index_put_impl_", TPU_VARIANT_INPLACE, a, 5, o));
  read_f32(x, r);
  CHECK(eq_f(r, (float[]){10, 1, 2, 3, 4, 25}, 6));
  /* mask rows, values broadcast over the row */
  bool mh[2] = {false, true};
  tpu_view_t m = mk(BOOL, 1, SZ(2), mh);
  float vr[3] = {7, 8, 9};
  tpu_view_t row = mk(F32, 1, SZ(3), vr);
  tpu_view_t list2[1] = {m};
  tpu_arg_t b[5] = {T(x), TL(list2, 1), T(row), B(false), B(false)};
  CHECK_OK(run("_index_put_impl_", TPU_VARIANT_INPLACE, b, 5, o));
  read_f32(x, r);
  CHECK(eq_f(r, (float[]){10, 1, 2, 7, 8, 9}, 6));
  /* shape mismatch and dtype mismatch are RuntimeErrors */
  float two[2] = {1, 2};
  tpu_view_t vtwo = mk(F32, 1, SZ(2), two);
  tpu_arg_t c[5] = {T(x), TL(list2, 1), T(vtwo), B(false), B(false)};
  CHECK_CODE(run("_index_put_impl_", TPU_VARIANT_INPLACE, c, 5, o), TPU_INVALID_ARGUMENT);
  tpu_view_t d64 = mk(F64, 0, NULL, (double[]){1});
  tpu_arg_t d[5] = {T(x), TL(list2, 1), T(d64), B(false), B(false)};
  CHECK_CODE(run("_index_put_impl_", TPU_VARIANT_INPLACE, d, 5, o), TPU_INVALID_ARGUMENT);
  int64_t bad[1] = {2};
  tpu_view_t vb = mk(I64, 1, SZ(1), bad);
  tpu_view_t list3[1] = {vb};
  tpu_arg_t e[5] = {T(x), TL(list3, 1), T(val), B(false), B(false)};
  CHECK_CODE(run("_index_put_impl_", TPU_VARIANT_INPLACE, e, 5, o), TPU_INDEX_ERROR);
  release_all();
}

static void test_masked_nonzero(void) {
  tpu_view_t x = mk(F32, 2, SZ(2, 3), X6);
  tpu_view_t o[2];
  float r[6];
  bool mh[3] = {true, false, true};
  tpu_view_t m = mk(BOOL, 1, SZ(3), mh);
  tpu_arg_t a[2] = {T(x), T(m)};
  CHECK_OK(run("masked_select", TPU_VARIANT_FUNCTIONAL, a, 2, o));
  CHECK(o[0].ndim == 1 && o[0].sizes[0] == 4);
  read_f32(o[0], r);
  CHECK(eq_f(r, (float[]){0, 2, 3, 5}, 4));
  tpu_view_t mf = mk(F32, 1, SZ(3), X6);
  tpu_arg_t a2[2] = {T(x), T(mf)};
  CHECK_CODE(run("masked_select", TPU_VARIANT_FUNCTIONAL, a2, 2, o), TPU_INVALID_ARGUMENT);
  /* nonzero: -0.0 is zero, NaN is nonzero */
  float nh[4] = {0, -0.0f, NAN, 3};
  tpu_view_t nz = mk(F32, 2, SZ(2, 2), nh);
  tpu_arg_t b[1] = {T(nz)};
  CHECK_OK(run("nonzero", TPU_VARIANT_FUNCTIONAL, b, 1, o));
  CHECK(o[0].sizes[0] == 2 && o[0].sizes[1] == 2);
  int64_t ri[4];
  read_i64(o[0], ri);
  CHECK(eq_i(ri, (int64_t[]){1, 0, 1, 1}, 4));
  /* masked_scatter_ fills set positions in order; too short a source fails at run time */
  float src[4] = {10, 20, 30, 40};
  tpu_view_t vs = mk(F32, 1, SZ(4), src);
  tpu_arg_t c[3] = {T(x), T(m), T(vs)};
  CHECK_OK(run("masked_scatter_", TPU_VARIANT_INPLACE, c, 3, o));
  read_f32(x, r);
  CHECK(eq_f(r, (float[]){10, 1, 20, 30, 4, 40}, 6));
  tpu_view_t vs2 = mk(F32, 1, SZ(3), src);
  tpu_arg_t c2[3] = {T(x), T(m), T(vs2)};
  CHECK_CODE(run("masked_scatter_", TPU_VARIANT_INPLACE, c2, 3, o), TPU_INVALID_ARGUMENT);
  release_all();
}

static void test_cat_flip_roll(void) {
  tpu_view_t x = mk(F32, 2, SZ(2, 3), X6);
  tpu_view_t o[2];
  double r[12];
  float rf[12];
  /* promotion to float64, legacy empty [0] tensor skipped */
  tpu_view_t y = mk(F64, 2, SZ(2, 1), (double[]){-1, -2});
  tpu_view_t e = mk(F32, 1, SZ(0), NULL);
  tpu_view_t list[3] = {x, e, y};
  tpu_arg_t a[2] = {TL(list, 3), I(1)};
  CHECK_OK(run("cat", TPU_VARIANT_FUNCTIONAL, a, 2, o));
  CHECK(o[0].dtype == F64 && o[0].sizes[0] == 2 && o[0].sizes[1] == 4);
  CHECK_OK(tpu_copy_to_host(&o[0], r));
  CHECK(r[0] == 0 && r[3] == -1 && r[4] == 3 && r[7] == -2);
  tpu_view_t bad = mk(F32, 2, SZ(3, 1), NULL);
  tpu_view_t list2[2] = {x, bad};
  tpu_arg_t b[2] = {TL(list2, 2), I(1)};
  CHECK_CODE(run("cat", TPU_VARIANT_FUNCTIONAL, b, 2, o), TPU_INVALID_ARGUMENT);
  tpu_arg_t b2[2] = {TL(list2, 0), I(0)};
  CHECK_CODE(run("cat", TPU_VARIANT_FUNCTIONAL, b2, 2, o), TPU_VALUE_ERROR);
  /* flip of a transposed view */
  tpu_view_t xt = x;
  xt.sizes[0] = 3; xt.sizes[1] = 2; xt.strides[0] = 1; xt.strides[1] = 3;
  int64_t d0[1] = {0};
  tpu_arg_t c[2] = {T(xt), L(d0, 1)};
  CHECK_OK(run("flip", TPU_VARIANT_FUNCTIONAL, c, 2, o));
  read_f32(o[0], rf);
  CHECK(eq_f(rf, (float[]){2, 5, 1, 4, 0, 3}, 6));
  int64_t dd[2] = {0, -2};
  tpu_arg_t c2[2] = {T(x), L(dd, 2)};
  CHECK_CODE(run("flip", TPU_VARIANT_FUNCTIONAL, c2, 2, o), TPU_INVALID_ARGUMENT);
  /* roll flattened, and per dim */
  int64_t s1[1] = {1}, s2[2] = {1, -1}, dims[2] = {0, 1};
  tpu_arg_t f[3] = {T(x), L(s1, 1), L(NULL, 0)};
  CHECK_OK(run("roll", TPU_VARIANT_FUNCTIONAL, f, 3, o));
  read_f32(o[0], rf);
  CHECK(eq_f(rf, (float[]){5, 0, 1, 2, 3, 4}, 6));
  tpu_arg_t g[3] = {T(x), L(s2, 2), L(dims, 2)};
  CHECK_OK(run("roll", TPU_VARIANT_FUNCTIONAL, g, 3, o));
  read_f32(o[0], rf);
  CHECK(eq_f(rf, (float[]){4, 5, 3, 1, 2, 0}, 6));
  tpu_arg_t g2[3] = {T(x), L(s2, 2), L(dims, 1)};
  CHECK_CODE(run("roll", TPU_VARIANT_FUNCTIONAL, g2, 3, o), TPU_INVALID_ARGUMENT);
  release_all();
}

static void test_repeat_pad_tri(void) {
  tpu_view_t x = mk(F32, 2, SZ(2, 3), X6);
  tpu_view_t o[2];
  float r[24];
  int64_t reps[3] = {2, 1, 2};
  tpu_arg_t a[2] = {T(x), L(reps, 3)};
  CHECK_OK(run("repeat", TPU_VARIANT_FUNCTIONAL, a, 2, o));
  CHECK(o[0].ndim == 3 && o[0].sizes[0] == 2 && o[0].sizes[1] == 2 && o[0].sizes[2] == 6);
  read_f32(o[0], r);
  CHECK(eq_f(r, (float[]){0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5}, 12));
  CHECK(eq_f(r + 12, (float[]){0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5}, 12));
  tpu_arg_t a2[2] = {T(x), L(reps, 1)};
  CHECK_CODE(run("repeat", TPU_VARIANT_FUNCTIONAL, a2, 2, o), TPU_INVALID_ARGUMENT);
  /* pad last dim (1, -1) and first dim (0, 1) with 9 */
  int64_t pad[4] = {1, -1, 0, 1};
  tpu_arg_t b[3] = {T(x), L(pad, 4), SF(9)};
  CHECK_OK(run("constant_pad_nd", TPU_VARIANT_FUNCTIONAL, b, 3, o));
  CHECK(o[0].sizes[0] == 3 && o[0].sizes[1] == 3);
  read_f32(o[0], r);
  CHECK(eq_f(r, (float[]){9, 0, 1, 9, 3, 4, 9, 9, 9}, 9));
  tpu_arg_t b2[3] = {T(x), L(pad, 3), SF(9)};
  CHECK_CODE(run("constant_pad_nd", TPU_VARIANT_FUNCTIONAL, b2, 3, o), TPU_INVALID_ARGUMENT);
  int64_t pad2[2] = {-4, 0};
  tpu_arg_t b3[3] = {T(x), L(pad2, 2), SF(9)};
  CHECK_CODE(run("constant_pad_nd", TPU_VARIANT_FUNCTIONAL, b3, 3, o), TPU_INVALID_ARGUMENT);
  /* tril(-0 diag) / triu_(1) */
  tpu_arg_t c[2] = {T(x), I(0)};
  CHECK_OK(run("tril", TPU_VARIANT_FUNCTIONAL, c, 2, o));
  read_f32(o[0], r);
  CHECK(eq_f(r, (float[]){0, 0, 0, 3, 4, 0}, 6));
  tpu_arg_t c2[2] = {T(x), I(1)};
  CHECK_OK(run("triu_", TPU_VARIANT_INPLACE, c2, 2, o));
  read_f32(x, r);
  CHECK(eq_f(r, (float[]){0, 1, 2, 0, 0, 5}, 6));
  tpu_view_t v1 = mk(F32, 1, SZ(3), X6);
  tpu_arg_t c3[2] = {T(v1), I(0)};
  CHECK_CODE(run("tril", TPU_VARIANT_FUNCTIONAL, c3, 2, o), TPU_INVALID_ARGUMENT);
  release_all();
}

static void test_sort_topk(void) {
  float h[6] = {3, NAN, -1, 3, 0, -0.0f};
  tpu_view_t x = mk(F32, 1, SZ(6), h);
  tpu_view_t o[2];
  float r[6];
  int64_t ri[6];
  tpu_arg_t a[4] = {T(x), B(true), I(0), B(false)};
  CHECK_OK(run("sort.stable", TPU_VARIANT_FUNCTIONAL, a, 4, o));
  read_f32(o[0], r);
  read_i64(o[1], ri);
  CHECK(eq_f(r, (float[]){-1, 0, -0.0f, 3, 3, NAN}, 6));
  CHECK(eq_i(ri, (int64_t[]){2, 4, 5, 0, 3, 1}, 6));
  tpu_arg_t b[4] = {T(x), N(), I(-1), B(true)};
  CHECK_OK(run("sort.stable", TPU_VARIANT_FUNCTIONAL, b, 4, o));
  read_i64(o[1], ri);
  CHECK(eq_i(ri, (int64_t[]){1, 0, 3, 4, 5, 2}, 6));
  /* topk along dim 0 of a 2x3 (column-wise) */
  tpu_view_t m = mk(F32, 2, SZ(2, 3), (float[]){1, 5, 2, 4, 0, 3});
  tpu_arg_t c[5] = {T(m), I(1), I(0), B(true), B(true)};
  CHECK_OK(run("topk", TPU_VARIANT_FUNCTIONAL, c, 5, o));
  CHECK(o[0].sizes[0] == 1 && o[0].sizes[1] == 3);
  read_f32(o[0], r);
  read_i64(o[1], ri);
  CHECK(eq_f(r, (float[]){4, 5, 3}, 3));
  CHECK(eq_i(ri, (int64_t[]){1, 0, 1}, 3));
  tpu_arg_t c2[5] = {T(m), I(2), I(1), B(false), B(true)};
  CHECK_OK(run("topk", TPU_VARIANT_FUNCTIONAL, c2, 5, o));
  read_f32(o[0], r);
  CHECK(eq_f(r, (float[]){1, 2, 0, 3}, 4));
  tpu_arg_t c3[5] = {T(m), I(4), I(1), B(true), B(true)};
  CHECK_CODE(run("topk", TPU_VARIANT_FUNCTIONAL, c3, 5, o), TPU_INVALID_ARGUMENT);
  release_all();
}

static void test_factories(void) {
  tpu_view_t o[2];
  /* arange(1, 2.5, 0.5) into a float32 out */
  tpu_view_t out = mk(F32, 1, SZ(3), NULL);
  tpu_arg_t a[4] = {SI(1), SF(2.5), SF(0.5), T(out)};
  CHECK_OK(run("arange.start_out", TPU_VARIANT_OUT, a, 4, o));
  float r[6];
  read_f32(out, r);
  CHECK(eq_f(r, (float[]){1, 1.5f, 2}, 3));
  /* int64: size by integer arithmetic */
  tpu_view_t oi = mk(I64, 1, SZ(4), NULL);
  tpu_arg_t b[4] = {SI(10), SI(0), SI(-3), T(oi)};
  CHECK_OK(run("arange.start_out", TPU_VARIANT_OUT, b, 4, o));
  int64_t ri[6];
  read_i64(oi, ri);
  CHECK(eq_i(ri, (int64_t[]){10, 7, 4, 1}, 4));
  tpu_arg_t c[4] = {SI(0), SI(5), SI(-1), T(oi)};
  CHECK_CODE(run("arange.start_out", TPU_VARIANT_OUT, c, 4, o), TPU_INVALID_ARGUMENT);
  tpu_arg_t c2[4] = {SI(0), SI(5), SI(0), T(oi)};
  CHECK_CODE(run("arange.start_out", TPU_VARIANT_OUT, c2, 4, o), TPU_INVALID_ARGUMENT);
  /* eye.m_out 2x3 */
  tpu_view_t e = mk(F32, 2, SZ(2, 3), NULL);
  tpu_arg_t d[3] = {I(2), I(3), T(e)};
  CHECK_OK(run("eye.m_out", TPU_VARIANT_OUT, d, 3, o));
  read_f32(e, r);
  CHECK(eq_f(r, (float[]){1, 0, 0, 0, 1, 0}, 6));
  tpu_arg_t d2[2] = {I(-1), T(e)};
  CHECK_CODE(run("eye.out", TPU_VARIANT_OUT, d2, 2, o), TPU_INVALID_ARGUMENT);
  release_all();
}

static void test_unique_consecutive(void) {
  /* flattened: NaN never equals NaN, -0.0 equals 0.0 */
  float xh[6] = {-0.0f, 0.0f, NAN, NAN, 1, 1};
  tpu_view_t x = mk(F32, 1, SZ(6), xh);
  tpu_arg_t a[4] = {T(x), B(true), B(true), N()};
  tpu_view_t o[3];
  CHECK_OK(run("unique_consecutive", TPU_VARIANT_FUNCTIONAL, a, 4, o));
  CHECK(o[0].sizes[0] == 4 && o[2].sizes[0] == 4);
  float v[4];
  int64_t inv[6], cnt[4];
  read_f32(o[0], v);
  read_i64(o[1], inv);
  read_i64(o[2], cnt);
  CHECK(v[0] == 0 && signbit(v[0]) && isnan(v[1]) && isnan(v[2]) && v[3] == 1);
  CHECK(eq_i(inv, (int64_t[]){0, 0, 1, 2, 3, 3}, 6));
  CHECK(eq_i(cnt, (int64_t[]){2, 1, 1, 2}, 4));
  /* along dim 1 of a 2x3 with columns 0 and 1 equal: inverse and counts always given */
  int64_t mh[6] = {1, 1, 2, 3, 3, 3};
  tpu_view_t m = mk(I64, 2, SZ(2, 3), mh);
  tpu_arg_t b[4] = {T(m), B(false), B(false), I(1)};
  CHECK_OK(run("unique_consecutive", TPU_VARIANT_FUNCTIONAL, b, 4, o));
  CHECK(o[0].ndim == 2 && o[0].sizes[0] == 2 && o[0].sizes[1] == 2 && o[1].sizes[0] == 3);
  int64_t vals[4];
  read_i64(o[0], vals);
  read_i64(o[1], inv);
  read_i64(o[2], cnt);
  CHECK(eq_i(vals, (int64_t[]){1, 2, 3, 3}, 4));
  CHECK(eq_i(inv, (int64_t[]){0, 0, 1}, 3));
  CHECK(eq_i(cnt, (int64_t[]){2, 1}, 2));
  tpu_arg_t c[4] = {T(m), B(false), B(false), I(2)};
  CHECK_CODE(run("unique_consecutive", TPU_VARIANT_FUNCTIONAL, c, 4, o), TPU_INDEX_ERROR);
  release_all();
}

static void test_unique(void) {
  /* ascending, NaN last and each its own value (in input order), -0.0 == 0.0 (the first kept) */
  float xh[8] = {3, NAN, 1, 3, NAN, -0.0f, 0.0f, 2};
  tpu_view_t x = mk(F32, 1, SZ(8), xh);
  tpu_arg_t a[4] = {T(x), B(true), B(true), B(true)};
  tpu_view_t o[3];
  CHECK_OK(run("_unique2", TPU_VARIANT_FUNCTIONAL, a, 4, o));
  CHECK(o[0].sizes[0] == 6 && o[1].sizes[0] == 8 && o[2].sizes[0] == 6);
  float v[6];
  int64_t inv[8], cnt[6];
  read_f32(o[0], v);
  read_i64(o[1], inv);
  read_i64(o[2], cnt);
  CHECK(v[0] == 0 && signbit(v[0]) && v[1] == 1 && v[2] == 2 && v[3] == 3 && isnan(v[4]) && isnan(v[5]));
  CHECK(eq_i(inv, (int64_t[]){3, 4, 1, 3, 5, 0, 0, 2}, 8));
  CHECK(eq_i(cnt, (int64_t[]){2, 1, 1, 2, 1, 1}, 6));
  /* integers; outputs not asked for are empty */
  int64_t ih[5] = {5, -2, 5, 7, -2};
  tpu_view_t xi = mk(I64, 1, SZ(5), ih);
  tpu_arg_t b[4] = {T(xi), B(false), B(false), B(false)};
  CHECK_OK(run("_unique2", TPU_VARIANT_FUNCTIONAL, b, 4, o));
  int64_t vals[3];
  read_i64(o[0], vals);
  CHECK(o[0].sizes[0] == 3 && eq_i(vals, (int64_t[]){-2, 5, 7}, 3));
  CHECK(o[1].sizes[0] == 0 && o[2].sizes[0] == 0);
  release_all();
}

static void test_assert_async(void) {
  /* a zero is the running op's error: reported by the next synchronize, with the message */
  float z = 0, one = -1;
  tpu_view_t vz = mk(F32, 0, NULL, &z), vo = mk(F32, 0, NULL, &one);
  tpu_arg_t a[2] = {T(vo), S("never")};
  CHECK_OK(run("_assert_async.msg", TPU_VARIANT_FUNCTIONAL, a, 2, NULL));
  tpu_arg_t b[2] = {T(vz), S("boom")};
  tpu_status_t st = run("_assert_async.msg", TPU_VARIANT_FUNCTIONAL, b, 2, NULL);
  CHECK(tpu_status_code(st) == TPU_INVALID_ARGUMENT);
  CHECK(st && strstr(tpu_status_message(st), "boom") && strstr(tpu_status_message(st), "_assert_async"));
  tpu_status_free(st);
  tpu_arg_t c[1] = {T(vz)};
  st = run("_assert_async", TPU_VARIANT_FUNCTIONAL, c, 1, NULL);
  CHECK(st && strstr(tpu_status_message(st), "Expected Tensor with single nonzero value, but got zero"));
  tpu_status_free(st);
  /* more than one element: refused at the call */
  tpu_view_t two = mk(F32, 1, SZ(2), X6);
  tpu_arg_t d[1] = {T(two)};
  CHECK_CODE(run("_assert_async", TPU_VARIANT_FUNCTIONAL, d, 1, NULL), TPU_INVALID_ARGUMENT);
  CHECK_OK(tpu_device_synchronize(0));
  release_all();
}

int main(void) {
  test_gather();
  test_scatter();
  test_index_select_add_copy();
  test_advanced_index();
  test_index_put();
  test_masked_nonzero();
  test_cat_flip_roll();
  test_repeat_pad_tri();
  test_sort_topk();
  test_factories();
  test_unique_consecutive();
  test_unique();
  test_assert_async();
  TEST_MAIN_END();
}
