/* nn family: layer norm, embedding, embedding_bag, nll loss, fused attention and pointwise losses,
 * built through tpu_op_prepare as the adapter does, checked against values computed here
 * (directly, or by finite differences of the forward op for backward kernels). */
#include <string.h>

#include "check.h"
#include "host/host.h" /* element load/store helpers */

#define MAXT 16
static tpu_storage_t* live[256];
static int n_live;

static tpu_view_t make_t(tpu_dtype_t dt, int nd, const int64_t* sizes, const double* vals) {
  int64_t n = 1;
  for (int i = 0; i < nd; ++i) n *= sizes[i];
  tpu_storage_t* s = NULL;
  tpu_status_t st = tpu_storage_create(0, (uint64_t)(n ? n : 1) * tpu_dtype_size(dt), &s);
  tpu_view_t v = check_view(s, dt, nd, sizes);
  if (st) { /* host OOM tests: the caller sees a view without storage */
    tpu_status_free(st);
    v.storage = NULL;
    return v;
  }
  live[n_live++] = s;
  if (vals && n) {
    char* host = malloc((size_t)n * tpu_dtype_size(dt));
    for (int64_t i = 0; i < n; ++i) tpu__store_f64(host + i * (int64_t)tpu_dtype_size(dt), dt, vals[i]);
    CHECK_OK(tpu_copy_from_host(&v, host));
    free(host);
  }
  return v;
}

static void read_t(const tpu_view_t* v, double* out) {
  int64_t n = tpu_view_numel(v);
  char* host = malloc((size_t)(n ? n : 1) * tpu_dtype_size(v->dtype));
  CHECK_OK(tpu_copy_to_host(v, host));
  for (int64_t i = 0; i < n; ++i) out[i] = tpu__load_f64(host + i * (int64_t)tpu_dtype_size(v->dtype), v->dtype);
  free(host);
}

static void release_all(void) {
  for (int i = 0; i < n_live; ++i) tpu_storage_release(live[i]);
  n_live = 0;
}

static tpu_arg_t A_T(tpu_view_t v) { tpu_arg_t a = {0}; a.kind = TPU_ARG_TENSOR; a.tensor = v; return a; }
static tpu_arg_t A_I(int64_t i) { tpu_arg_t a = {0}; a.kind = TPU_ARG_INT; a.v.i = i; return a; }
static tpu_arg_t A_D(double d) { tpu_arg_t a = {0}; a.kind = TPU_ARG_DOUBLE; a.v.d = d; return a; }
static tpu_arg_t A_B(bool b) { tpu_arg_t a = {0}; a.kind = TPU_ARG_BOOL; a.v.b = b; return a; }
static tpu_arg_t A_N(void) { tpu_arg_t a = {0}; return a; }
static tpu_arg_t A_L(const int64_t* l, int n) {
  tpu_arg_t a = {0}; a.kind = TPU_ARG_INTLIST; a.list = l; a.list_len = n; return a;
}

/* Prepares, binds fresh outputs, submits. Returns the status of prepare or submit. */
static tpu_status_t run_op(const char* name, tpu_arg_t* args, int nargs, tpu_view_t* outs, int* n_outs) {
  int idx = check_op_index(name);
  if (idx < 0) return tpu_status_make(TPU_INTERNAL, "no op %s", name);
  tpu_node_t* n;
  TPU_RETURN_IF_ERROR(tpu_op_prepare(idx, TPU_VARIANT_FUNCTIONAL, args, nargs, &n));
  int no = tpu_node_output_count(n);
  for (int i = 0; i < no; ++i) {
    tpu_dtype_t dt; int32_t nd; int64_t sz[TPU_MAX_DIMS];
    tpu_node_output_meta(n, i, &dt, &nd, sz);
    memset(&outs[i], 0, sizeof outs[i]);
    outs[i].ndim = nd;
    if (nd < 0) continue; /* absent output */
    outs[i] = make_t(dt, nd, sz, NULL);
    tpu_status_t st = outs[i].storage ? tpu_node_bind_output(n, i, &outs[i])
                                      : tpu_status_make(TPU_OUT_OF_MEMORY, "output storage");
    if (st) { tpu_node_discard(n); return st; }
  }
  if (n_outs) *n_outs = no;
  return tpu_node_submit(n);
}

/* ---- layer norm ---- */

static void ref_layer_norm(const double* x, int m, int k, const double* w, const double* b, double eps,
                           double* y) {
  for (int r = 0; r < m; ++r) {
    double mu = 0, var = 0;
    for (int j = 0; j < k; ++j) mu += x[r * k + j];
    mu /= k;
    for (int j = 0; j < k; ++j) var += (x[r * k + j] - mu) * (x[r * k + j] - mu);
    var /= k;
    for (int j = 0; j < k; ++j) y[r * k + j] = (x[r * k + j] - mu) / sqrt(var + eps) * w[j] + b[j];
  }
}

static void test_layer_norm(void) {
  double x[8] = {1, 2, 3, 4, -1, 0.5, 2, 7}, w[4] = {1, 2, -1, 0.5}, bb[4] = {0, 1, 2, 3};
  int64_t xs[2] = {2, 4}, ws[1] = {4}, ns[1] = {4};
  tpu_view_t vx = make_t(TPU_DTYPE_F64, 2, xs, x), vw = make_t(TPU_DTYPE_F64, 1, ws, w),
             vb = make_t(TPU_DTYPE_F64, 1, ws, bb);
  tpu_arg_t args[5] = {A_T(vx), A_L(ns, 1), A_T(vw), A_T(vb), A_D(1e-5)};
  tpu_view_t o[4];
  int no = 0;
  CHECK_OK(run_op("native_layer_norm", args, 5, o, &no));
  CHECK(no == 3 && o[1].ndim == 2 && o[1].sizes[0] == 2 && o[1].sizes[1] == 1);
  double y[8], ref[8], mu[2], rs[2];
  read_t(&o[0], y);
  read_t(&o[1], mu);
  read_t(&o[2], rs);
  ref_layer_norm(x, 2, 4, w, bb, 1e-5, ref);
  for (int i = 0; i < 8; ++i) CHECK_NEAR(y[i], ref[i], 1e-12);
  CHECK_NEAR(mu[0], 2.5, 1e-12);
  CHECK_NEAR(rs[0], 1 / sqrt(1.25 + 1e-5), 1e-12);

  /* backward against central differences of sum(dy * y) */
  double dy[8] = {0.3, -1, 2, 0.5, 1, 1, -2, 0.25};
  tpu_view_t vdy = make_t(TPU_DTYPE_F64, 2, xs, dy);
  int64_t mask[3] = {1, 1, 1};
  tpu_arg_t bargs[8] = {A_T(vdy), A_T(vx), A_L(ns, 1), A_T(o[1]), A_T(o[2]), A_T(vw), A_T(vb), A_L(mask, 3)};
  tpu_view_t g[4];
  CHECK_OK(run_op("native_layer_norm_backward", bargs, 8, g, &no));
  double dx[8], dw[4], db[4];
  read_t(&g[0], dx);
  read_t(&g[1], dw);
  read_t(&g[2], db);
  for (int i = 0; i < 8; ++i) {
    double xp[8], xm[8], yp[8], ym[8], fp = 0, fm = 0;
    memcpy(xp, x, sizeof x); memcpy(xm, x, sizeof x);
    xp[i] += 1e-6; xm[i] -= 1e-6;
    ref_layer_norm(xp, 2, 4, w, bb, 1e-5, yp);
    ref_layer_norm(xm, 2, 4, w, bb, 1e-5, ym);
    for (int j = 0; j < 8; ++j) { fp += dy[j] * yp[j]; fm += dy[j] * ym[j]; }
    CHECK_NEAR(dx[i], (fp - fm) / 2e-6, 1e-6);
  }
  for (int j = 0; j < 4; ++j) {
    double e = 0, s = 0;
    for (int r = 0; r < 2; ++r) { e += dy[r * 4 + j] * (ref[r * 4 + j] - bb[j]) / w[j]; s += dy[r * 4 + j]; }
    CHECK_NEAR(dw[j], e, 1e-9);
    CHECK_NEAR(db[j], s, 1e-12);
  }
  /* a transposed input and output take the whole-tensor pack path */
  double xt[8];
  for (int r = 0; r < 2; ++r)
    for (int j = 0; j < 4; ++j) xt[j * 2 + r] = x[r * 4 + j];
  int64_t xts[2] = {4, 2};
  tpu_view_t vxt = make_t(TPU_DTYPE_F64, 2, xts, xt);
  vxt.sizes[0] = 2; vxt.sizes[1] = 4; vxt.strides[0] = 1; vxt.strides[1] = 2;
  args[0] = A_T(vxt);
  {
    int idx = check_op_index("native_layer_norm");
    tpu_node_t* nt;
    CHECK_OK(tpu_op_prepare(idx, TPU_VARIANT_FUNCTIONAL, args, 5, &nt));
    tpu_view_t yt = make_t(TPU_DTYPE_F64, 2, xts, NULL), st1 = make_t(TPU_DTYPE_F64, 2, (int64_t[2]){2, 1}, NULL),
               st2 = make_t(TPU_DTYPE_F64, 2, (int64_t[2]){2, 1}, NULL);
    tpu_view_t ytv = yt;
    ytv.sizes[0] = 2; ytv.sizes[1] = 4; ytv.strides[0] = 1; ytv.strides[1] = 2;
    CHECK_OK(tpu_node_bind_output(nt, 0, &ytv));
    CHECK_OK(tpu_node_bind_output(nt, 1, &st1));
    CHECK_OK(tpu_node_bind_output(nt, 2, &st2));
    CHECK_OK(tpu_node_submit(nt));
    double yy[8];
    read_t(&ytv, yy);
    for (int i = 0; i < 8; ++i) CHECK_NEAR(yy[i], ref[i], 1e-12);
  }
  args[0] = A_T(vx);

  /* masked-off outputs are absent */
  int64_t mask2[3] = {1, 0, 0};
  bargs[7] = A_L(mask2, 3);
  CHECK_OK(run_op("native_layer_norm_backward", bargs, 8, g, &no));
  CHECK(g[0].ndim == 2 && g[1].ndim < 0 && g[2].ndim < 0);
  double dx2[8];
  read_t(&g[0], dx2);
  CHECK(memcmp(dx, dx2, sizeof dx) == 0);

  /* bf16 input with f32 params: mixed, f32 statistics */
  tpu_view_t vxb = make_t(TPU_DTYPE_BF16, 2, xs, x), vwf = make_t(TPU_DTYPE_F32, 1, ws, w);
  tpu_arg_t margs[5] = {A_T(vxb), A_L(ns, 1), A_T(vwf), A_N(), A_D(1e-5)};
  CHECK_OK(run_op("native_layer_norm", margs, 5, o, &no));
  CHECK(o[0].dtype == TPU_DTYPE_BF16 && o[1].dtype == TPU_DTYPE_F32);
  read_t(&o[0], y);
  double refnb[8], zero[4] = {0};
  ref_layer_norm(x, 2, 4, w, zero, 1e-5, refnb);
  for (int i = 0; i < 8; ++i) CHECK_NEAR(y[i], refnb[i], 0.02 * (1 + fabs(refnb[i])));

  /* errors: shape mismatch, parameter dtype, integer input */
  int64_t ns3[1] = {3};
  tpu_node_t* n;
  int li = check_op_index("native_layer_norm");
  tpu_arg_t e1[5] = {A_T(vx), A_L(ns3, 1), A_N(), A_N(), A_D(1e-5)};
  CHECK_CODE(tpu_op_prepare(li, TPU_VARIANT_FUNCTIONAL, e1, 5, &n), TPU_INVALID_ARGUMENT);
  tpu_arg_t e2[5] = {A_T(vx), A_L(ns, 1), A_T(vwf), A_N(), A_D(1e-5)};
  CHECK_CODE(tpu_op_prepare(li, TPU_VARIANT_FUNCTIONAL, e2, 5, &n), TPU_INVALID_ARGUMENT);
  tpu_view_t vxi = make_t(TPU_DTYPE_I64, 2, xs, x);
  tpu_arg_t e3[5] = {A_T(vxi), A_L(ns, 1), A_N(), A_N(), A_D(1e-5)};
  CHECK_CODE(tpu_op_prepare(li, TPU_VARIANT_FUNCTIONAL, e3, 5, &n), TPU_UNIMPLEMENTED);
  tpu_arg_t e4[5] = {A_T(vx), A_L(ns, 0), A_N(), A_N(), A_D(1e-5)};
  CHECK_CODE(tpu_op_prepare(li, TPU_VARIANT_FUNCTIONAL, e4, 5, &n), TPU_INVALID_ARGUMENT);
  release_all();
}

/* ---- embedding ---- */

static void test_embedding(void) {
  double w[8] = {0, 1, 10, 11, 20, 21, 30, 31};
  int64_t ws[2] = {4, 2}, is[2] = {1, 3};
  double idx[3] = {3, 0, 3};
  tpu_view_t vw = make_t(TPU_DTYPE_F32, 2, ws, w), vi = make_t(TPU_DTYPE_I32, 2, is, idx);
  /* a transposed weight exercises the strided row gather */
  tpu_view_t vt = vw;
  vt.sizes[0] = 2; vt.sizes[1] = 4; vt.strides[0] = 1; vt.strides[1] = 2;
  tpu_arg_t args[5] = {A_T(vw), A_T(vi), A_I(-1), A_B(false), A_B(false)};
  tpu_view_t o[4];
  int no;
  CHECK_OK(run_op("embedding", args, 5, o, &no));
  CHECK(o[0].ndim == 3 && o[0].sizes[2] == 2);
  double r[8];
  read_t(&o[0], r);
  CHECK(r[0] == 30 && r[1] == 31 && r[2] == 0 && r[3] == 1 && r[4] == 30);
  double i2[2] = {1, 0};
  int64_t is2[1] = {2};
  tpu_view_t vi2 = make_t(TPU_DTYPE_I64, 1, is2, i2);
  args[0] = A_T(vt); args[1] = A_T(vi2);
  CHECK_OK(run_op("embedding", args, 5, o, &no));
  read_t(&o[0], r);
  CHECK(r[0] == 1 && r[1] == 11 && r[4] == 0 && r[7] == 30);

  /* out-of-range index: IndexError at the next sync */
  double bad[3] = {0, 4, 1};
  tpu_view_t vbad = make_t(TPU_DTYPE_I64, 2, is, bad);
  args[0] = A_T(vw); args[1] = A_T(vbad);
  CHECK_OK(run_op("embedding", args, 5, o, &no));
  CHECK_CODE(tpu_device_synchronize(0), TPU_INDEX_ERROR);
  double neg[3] = {0, -1, 1};
  tpu_view_t vneg = make_t(TPU_DTYPE_I64, 2, is, neg);
  args[1] = A_T(vneg);
  CHECK_OK(run_op("embedding", args, 5, o, &no));
  CHECK_CODE(tpu_device_synchronize(0), TPU_INDEX_ERROR);
  /* float indices and 1-D weight are rejected at prepare */
  tpu_view_t vfi = make_t(TPU_DTYPE_F32, 2, is, idx);
  args[1] = A_T(vfi);
  tpu_node_t* n;
  CHECK_CODE(tpu_op_prepare(check_op_index("embedding"), TPU_VARIANT_FUNCTIONAL, args, 5, &n), TPU_INVALID_ARGUMENT);

  /* dense backward: padding row gets nothing, scale_grad_by_freq divides by counts */
  double g[6] = {1, 2, 3, 4, 5, 6};
  int64_t gs[3] = {1, 3, 2};
  tpu_view_t vg = make_t(TPU_DTYPE_F32, 3, gs, g);
  tpu_arg_t bargs[5] = {A_T(vg), A_T(vi), A_I(4), A_I(0), A_B(true)};
  CHECK_OK(run_op("embedding_dense_backward", bargs, 5, o, &no));
  CHECK(o[0].sizes[0] == 4 && o[0].sizes[1] == 2);
  double gw[8];
  read_t(&o[0], gw);
  CHECK(gw[0] == 0 && gw[1] == 0 && gw[2] == 0 && gw[6] == 3 && gw[7] == 4);
  bargs[3] = A_I(-1); bargs[4] = A_B(false);
  CHECK_OK(run_op("embedding_dense_backward", bargs, 5, o, &no));
  read_t(&o[0], gw);
  CHECK(gw[0] == 3 && gw[1] == 4 && gw[6] == 6 && gw[7] == 8);
  bargs[2] = A_I(3);  /* index 3 is now out of range */
  CHECK_OK(run_op("embedding_dense_backward", bargs, 5, o, &no));
  CHECK_CODE(tpu_device_synchronize(0), TPU_INDEX_ERROR);
  int64_t gs2[2] = {2, 2};
  tpu_view_t vg2 = make_t(TPU_DTYPE_F32, 2, gs2, g);
  bargs[0] = A_T(vg2); bargs[2] = A_I(4);
  CHECK_CODE(tpu_op_prepare(check_op_index("embedding_dense_backward"), TPU_VARIANT_FUNCTIONAL, bargs, 5, &n),
             TPU_INVALID_ARGUMENT);
  release_all();
}

/* ---- embedding_bag ---- */

static void expect_status(tpu_status_t st, tpu_status_code_t code, const char* text) {
  CHECK(tpu_status_code(st) == code);
  if (st && !strstr(tpu_status_message(st), text)) {
    fprintf(stderr, "  message '%s' lacks '%s'\n", tpu_status_message(st), text);
    ++check_failures;
  }
  tpu_status_free(st);
}

static void test_embedding_bag(void) {
  /* rows r = (r, 10r); bags [1, 2, 2] [] [3, 0, 2 (padding)] */
  double w[8] = {0, 0, 1, 10, 2, 20, 3, 30};
  int64_t ws[2] = {4, 2}, is[1] = {6}, os[1] = {3};
  double idx[6] = {1, 2, 2, 3, 0, 2}, off[3] = {0, 3, 3};
  tpu_view_t vw = make_t(TPU_DTYPE_F64, 2, ws, w), vi = make_t(TPU_DTYPE_I64, 1, is, idx);
  tpu_view_t vo = make_t(TPU_DTYPE_I64, 1, os, off);
  tpu_arg_t args[9] = {A_T(vw), A_T(vi), A_T(vo), A_B(false), A_I(1), A_B(false), A_N(), A_B(false), A_I(2)};
  tpu_view_t o[4];
  int no;
  double r[16];
  /* mean with padding_idx 2: bag 0 = row 1 alone, bag 2 = rows 3, 0 */
  CHECK_OK(run_op("_embedding_bag", args, 9, o, &no));
  CHECK(no == 4 && o[0].sizes[0] == 3 && o[1].sizes[0] == 6);
  read_t(&o[0], r);
  CHECK(r[0] == 1 && r[1] == 10 && r[2] == 0 && r[3] == 0 && r[4] == 1.5 && r[5] == 15);
  read_t(&o[1], r); /* offset2bag */
  CHECK(r[0] == 0 && r[2] == 0 && r[3] == 2 && r[5] == 2);
  read_t(&o[2], r); /* bag_size counts non-padding indices */
  CHECK(r[0] == 1 && r[1] == 0 && r[2] == 2);
  /* max: the first non-padding value, then strictly greater ones; max_indices are rows */
  args[4] = A_I(2);
  CHECK_OK(run_op("_embedding_bag", args, 9, o, &no));
  CHECK(o[3].ndim == 2 && o[3].sizes[1] == 2);
  read_t(&o[0], r);
  CHECK(r[0] == 1 && r[2] == 0 && r[4] == 3 && r[5] == 30);
  read_t(&o[3], r);
  CHECK(r[0] == 1 && r[1] == 1 && r[2] == 0 && r[4] == 3 && r[5] == 3);
  /* max backward: each bag's grad goes to its max rows; empty bags give nothing */
  double g[6] = {1, 2, 3, 4, 5, 6};
  int64_t gs[2] = {3, 2};
  tpu_view_t vg = make_t(TPU_DTYPE_F64, 2, gs, g);
  tpu_arg_t bargs[12] = {A_T(vg), A_T(vi), A_T(vo), A_T(o[1]), A_T(o[2]), A_T(o[3]), A_I(4), A_B(false), A_I(2),
                         A_B(false), A_N(), A_I(2)};
  tpu_view_t gw[1];
  CHECK_OK(run_op("_embedding_bag_backward", bargs, 12, gw, &no));
  read_t(&gw[0], r);
  CHECK(r[0] == 0 && r[2] == 1 && r[3] == 2 && r[4] == 0 && r[6] == 5 && r[7] == 6);
  /* sum without padding (CPU's fast path: empty offset2bag); the backward rebuilds it from
   * offsets; per_sample_weights scale each row */
  double pw[6] = {1, 2, 3, 4, 5, 6};
  tpu_view_t vp = make_t(TPU_DTYPE_F64, 1, is, pw);
  args[4] = A_I(0); args[6] = A_T(vp); args[8] = A_I(-1);
  tpu_view_t f[4];
  CHECK_OK(run_op("_embedding_bag", args, 9, f, &no));
  CHECK(f[1].sizes[0] == 6); /* f64 weights: CPU fills offset2bag */
  read_t(&f[0], r);
  CHECK(r[0] == 1 * 1 + 2 * 2 + 3 * 2 && r[4] == 4 * 3 + 0 + 6 * 2);
  int64_t z[1] = {0};
  tpu_view_t empty = make_t(TPU_DTYPE_I64, 1, z, NULL);
  tpu_arg_t pargs[7] = {A_T(vg), A_T(vw), A_T(vi), A_T(vo), A_T(empty), A_I(0), A_I(-1)};
  CHECK_OK(run_op("_embedding_bag_per_sample_weights_backward", pargs, 7, gw, &no));
  read_t(&gw[0], r); /* grad row of the index's bag . weight row */
  CHECK(r[0] == 1 * 1 + 2 * 10 && r[1] == 1 * 2 + 2 * 20 && r[3] == 5 * 3 + 6 * 30 && r[4] == 0);
  bargs[3] = A_T(empty); bargs[8] = A_I(0); bargs[10] = A_T(vp); bargs[11] = A_I(-1);
  CHECK_OK(run_op("_embedding_bag_backward", bargs, 12, gw, &no));
  read_t(&gw[0], r); /* row 2 from bag 0 twice (weights 2, 3) and bag 2 once (weight 6) */
  CHECK(r[2] == 1 && r[3] == 2 && r[4] == 2 * 1 + 3 * 1 + 6 * 5 && r[5] == 2 * 2 + 3 * 2 + 6 * 6);
  /* offsets checks (RuntimeError at the next sync), index range, then still usable */
  args[6] = A_N();
  double bad_off[3][3] = {{1, 3, 3}, {0, 3, 7}, {0, 4, 3}};
  const char* want[3] = {"offsets[0] has to be 0", "offsets[-1] can not be greater than input's length 6",
                         "offsets must be non-decreasing"};
  for (int k = 0; k < 3; ++k) {
    args[2] = A_T(make_t(TPU_DTYPE_I64, 1, os, bad_off[k]));
    CHECK_OK(run_op("_embedding_bag", args, 9, o, &no));
    expect_status(tpu_device_synchronize(0), TPU_INVALID_ARGUMENT, want[k]);
  }
  double bad_idx[6] = {1, 2, 4, 3, 0, 2};
  args[1] = A_T(make_t(TPU_DTYPE_I64, 1, is, bad_idx)); args[2] = A_T(vo);
  CHECK_OK(run_op("_embedding_bag", args, 9, o, &no));
  expect_status(tpu_device_synchronize(0), TPU_INVALID_ARGUMENT, "not in the valid range [0, 4)");
  args[1] = A_T(vi);
  CHECK_OK(run_op("_embedding_bag", args, 9, o, &no));
  CHECK_OK(tpu_device_synchronize(0));
  /* shape checks at prepare */
  tpu_node_t* n;
  args[4] = A_I(1); args[6] = A_T(vp);
  CHECK_CODE(tpu_op_prepare(check_op_index("_embedding_bag"), TPU_VARIANT_FUNCTIONAL, args, 9, &n),
             TPU_INVALID_ARGUMENT); /* per_sample_weights with mean */
  args[4] = A_I(0); args[6] = A_N(); args[0] = A_T(vi);
  CHECK_CODE(tpu_op_prepare(check_op_index("_embedding_bag"), TPU_VARIANT_FUNCTIONAL, args, 9, &n),
             TPU_INVALID_ARGUMENT); /* 1-D weight */
  release_all();
}

/* ---- nll loss ---- */

static void test_nll(void) {
  double x[6] = {-1, -2, -3, -0.5, -1.5, -2.5}, w[3] = {1, 2, 3}, t[2] = {2, 0};
  int64_t xs[2] = {2, 3}, ws[1] = {3}, ts[1] = {2};
  tpu_view_t vx = make_t(TPU_DTYPE_F32, 2, xs, x), vw = make_t(TPU_DTYPE_F32, 1, ws, w),
             vt = make_t(TPU_DTYPE_I64, 1, ts, t);
  tpu_arg_t args[5] = {A_T(vx), A_T(vt), A_T(vw), A_I(1), A_I(-100)};
  tpu_view_t o[4];
  int no;
  double r[6];
  CHECK_OK(run_op("nll_loss_forward", args, 5, o, &no));
  CHECK(no == 2 && o[0].ndim == 0);
  read_t(&o[0], r);
  CHECK_NEAR(r[0], (9 + 0.5) / 4, 1e-6);
  read_t(&o[1], r);
  CHECK_NEAR(r[0], 4, 0);
  tpu_view_t tw = o[1];
  args[3] = A_I(0);
  CHECK_OK(run_op("nll_loss_forward", args, 5, o, &no));
  CHECK(o[0].ndim == 1 && o[0].sizes[0] == 2);
  read_t(&o[0], r);
  CHECK_NEAR(r[0], 9, 1e-6);
  CHECK_NEAR(r[1], 0.5, 1e-6);
  /* ignore_index drops the sample from both sums */
  args[3] = A_I(1); args[4] = A_I(0);
  CHECK_OK(run_op("nll_loss_forward", args, 5, o, &no));
  read_t(&o[0], r);
  CHECK_NEAR(r[0], 3, 1e-6);

  /* backward (mean): -w[t] / total_weight at the target column */
  double go[1] = {2};
  tpu_view_t vgo = make_t(TPU_DTYPE_F32, 0, NULL, go);
  tpu_arg_t bargs[7] = {A_T(vgo), A_T(vx), A_T(vt), A_T(vw), A_I(1), A_I(-100), A_T(tw)};
  CHECK_OK(run_op("nll_loss_backward", bargs, 7, o, &no));
  read_t(&o[0], r);
  CHECK_NEAR(r[2], -3 * 2 / 4.0, 1e-6);
  CHECK_NEAR(r[3], -1 * 2 / 4.0, 1e-6);
  CHECK(r[0] == 0 && r[1] == 0 && r[4] == 0 && r[5] == 0);

  /* out-of-bounds target: IndexError at sync; float target: RuntimeError at prepare */
  double tb[2] = {3, 0};
  tpu_view_t vtb = make_t(TPU_DTYPE_I64, 1, ts, tb);
  args[1] = A_T(vtb); args[4] = A_I(-100);
  CHECK_OK(run_op("nll_loss_forward", args, 5, o, &no));
  CHECK_CODE(tpu_device_synchronize(0), TPU_INDEX_ERROR);
  tpu_view_t vtf = make_t(TPU_DTYPE_F32, 1, ts, t);
  args[1] = A_T(vtf);
  tpu_node_t* n;
  int fi = check_op_index("nll_loss_forward");
  CHECK_CODE(tpu_op_prepare(fi, TPU_VARIANT_FUNCTIONAL, args, 5, &n), TPU_INVALID_ARGUMENT);
  int64_t ws4[1] = {4};
  tpu_view_t vw4 = make_t(TPU_DTYPE_F32, 1, ws4, x);
  args[1] = A_T(vt); args[2] = A_T(vw4);
  CHECK_CODE(tpu_op_prepare(fi, TPU_VARIANT_FUNCTIONAL, args, 5, &n), TPU_INVALID_ARGUMENT);

  /* 2-D: input (1, 3, 1, 2), target (1, 1, 2) */
  double x4[6] = {-1, -2, -3, -4, -5, -6}, t4[2] = {2, 0};
  int64_t x4s[4] = {1, 3, 1, 2}, t4s[3] = {1, 1, 2};
  tpu_view_t vx4 = make_t(TPU_DTYPE_F64, 4, x4s, x4), vt4 = make_t(TPU_DTYPE_I64, 3, t4s, t4);
  tpu_arg_t a2[5] = {A_T(vx4), A_T(vt4), A_N(), A_I(0), A_I(-100)};
  CHECK_OK(run_op("nll_loss2d_forward", a2, 5, o, &no));
  CHECK(o[0].ndim == 3);
  read_t(&o[0], r);
  CHECK(r[0] == 5 && r[1] == 2);
  a2[3] = A_I(2);
  CHECK_OK(run_op("nll_loss2d_forward", a2, 5, o, &no));
  read_t(&o[0], r);
  CHECK(r[0] == 7);
  tpu_view_t tw2 = o[1];
  double go2[1] = {1};
  tpu_view_t vgo2 = make_t(TPU_DTYPE_F64, 0, NULL, go2);
  tpu_arg_t b2[7] = {A_T(vgo2), A_T(vx4), A_T(vt4), A_N(), A_I(2), A_I(-100), A_T(tw2)};
  CHECK_OK(run_op("nll_loss2d_backward", b2, 7, o, &no));
  read_t(&o[0], r);
  CHECK(r[4] == -1 && r[1] == -1 && r[0] == 0 && r[5] == 0);
  a2[1] = A_T(vt);
  CHECK_CODE(tpu_op_prepare(check_op_index("nll_loss2d_forward"), TPU_VARIANT_FUNCTIONAL, a2, 5, &n),
             TPU_INVALID_ARGUMENT);
  release_all();
}

/* ---- fused attention ---- */

/* out[b,h,i,:] = softmax(scale q k^T + bias, causal) v with k/v head h / (H / Hk). */
static void ref_sdpa(const double* q, const double* k, const double* v, const double* bias, bool causal,
                     int B, int H, int Hk, int L, int S, int E, int Ev, double scale, double* out) {
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      int hk = h / (H / Hk);
      for (int i = 0; i < L; ++i) {
        double s[16], mx = -INFINITY, sum = 0;
        for (int j = 0; j < S; ++j) {
          double d = 0;
          for (int e = 0; e < E; ++e)
            d += q[((b * H + h) * L + i) * E + e] * k[((b * Hk + hk) * S + j) * E + e];
          s[j] = d * scale + (bias ? bias[i * S + j] : 0);
          if (causal && j > i) s[j] = -INFINITY;
          if (s[j] > mx) mx = s[j];
        }
        for (int j = 0; j < S; ++j) { s[j] = exp(s[j] - mx); sum += s[j]; }
        for (int e = 0; e < Ev; ++e) {
          double acc = 0;
          for (int j = 0; j < S; ++j) acc += s[j] / sum * v[((b * Hk + hk) * S + j) * Ev + e];
          out[((b * H + h) * L + i) * Ev + e] = acc;
        }
      }
    }
}

static void test_sdpa(void) {
  enum { B = 1, H = 2, HK = 1, L = 3, S = 4, E = 2, EV = 3 };
  double q[B * H * L * E], k[B * HK * S * E], v[B * HK * S * EV], bias[L * S];
  for (int i = 0; i < B * H * L * E; ++i) q[i] = sin(i + 1.0);
  for (int i = 0; i < B * HK * S * E; ++i) k[i] = cos(2.0 * i);
  for (int i = 0; i < B * HK * S * EV; ++i) v[i] = 0.1 * i - 0.5;
  for (int i = 0; i < L * S; ++i) bias[i] = 0.05 * i;
  int64_t qs[4] = {B, H, L, E}, ks[4] = {B, HK, S, E}, vs[4] = {B, HK, S, EV}, bs[2] = {L, S};
  tpu_view_t vq = make_t(TPU_DTYPE_F64, 4, qs, q), vk = make_t(TPU_DTYPE_F64, 4, ks, k),
             vv = make_t(TPU_DTYPE_F64, 4, vs, v), vb = make_t(TPU_DTYPE_F64, 2, bs, bias);
  tpu_arg_t args[8] = {A_T(vq), A_T(vk), A_T(vv), A_T(vb), A_D(0), A_B(true), A_B(false), A_N()};
  tpu_view_t o[4];
  int no;
  CHECK_OK(run_op("_scaled_dot_product_fused_attention_overrideable", args, 8, o, &no));
  CHECK(no == 2 && o[0].sizes[3] == EV && o[1].ndim == 3 && o[1].dtype == TPU_DTYPE_F64);
  double out[B * H * L * EV], ref[B * H * L * EV];
  read_t(&o[0], out);
  double scale = 1 / sqrt((double)E);
  ref_sdpa(q, k, v, bias, true, B, H, HK, L, S, E, EV, scale, ref);
  for (int i = 0; i < B * H * L * EV; ++i) CHECK_NEAR(out[i], ref[i], 1e-12);
  /* row 0 attends only to key 0: logsumexp = its score */
  double lse[B * H * L];
  read_t(&o[1], lse);
  CHECK_NEAR(lse[0], (q[0] * k[0] + q[1] * k[1]) * scale + bias[0], 1e-12);

  /* backward against central differences of sum(go * out) */
  double go[B * H * L * EV];
  for (int i = 0; i < B * H * L * EV; ++i) go[i] = cos(0.7 * i);
  tpu_view_t vgo = make_t(TPU_DTYPE_F64, 4, qs, NULL);
  vgo = make_t(TPU_DTYPE_F64, 4, (int64_t[4]){B, H, L, EV}, go);
  int64_t mask[4] = {1, 1, 1, 1};
  tpu_arg_t bargs[17] = {A_T(vgo), A_T(vq), A_T(vk), A_T(vv), A_T(vb), A_L(mask, 4), A_T(o[0]), A_T(o[1]),
                         A_N(), A_N(), A_I(L), A_I(S), A_D(0), A_B(true), A_N(), A_N(), A_N()};
  tpu_view_t g[4];
  CHECK_OK(run_op("_scaled_dot_product_fused_attention_overrideable_backward", bargs, 17, g, &no));
  CHECK(no == 4 && g[1].sizes[1] == HK && g[3].ndim == 2);
  double* bufs[4] = {q, k, v, bias};
  int lens[4] = {B * H * L * E, B * HK * S * E, B * HK * S * EV, L * S};
  for (int which = 0; which < 4; ++which) {
    double grad[64];
    read_t(&g[which], grad);
    for (int i = 0; i < lens[which]; ++i) {
      double save = bufs[which][i], fp = 0, fm = 0, tmp[B * H * L * EV];
      bufs[which][i] = save + 1e-6;
      ref_sdpa(q, k, v, bias, true, B, H, HK, L, S, E, EV, scale, tmp);
      for (int j = 0; j < B * H * L * EV; ++j) fp += go[j] * tmp[j];
      bufs[which][i] = save - 1e-6;
      ref_sdpa(q, k, v, bias, true, B, H, HK, L, S, E, EV, scale, tmp);
      for (int j = 0; j < B * H * L * EV; ++j) fm += go[j] * tmp[j];
      bufs[which][i] = save;
      CHECK_NEAR(grad[i], (fp - fm) / 2e-6, 1e-6);
    }
  }

  /* f32 with a bool mask that hides every key from row 1: that row is zero */
  tpu_view_t fq = make_t(TPU_DTYPE_F32, 4, qs, q), fk = make_t(TPU_DTYPE_F32, 4, ks, k),
             fv = make_t(TPU_DTYPE_F32, 4, vs, v);
  double m[L * S];
  for (int i = 0; i < L * S; ++i) m[i] = i / S != 1;
  tpu_view_t vm = make_t(TPU_DTYPE_BOOL, 2, bs, m);
  tpu_arg_t fargs[8] = {A_T(fq), A_T(fk), A_T(fv), A_T(vm), A_D(0), A_B(false), A_B(false), A_D(0.5)};
  CHECK_OK(run_op("_scaled_dot_product_fused_attention_overrideable", fargs, 8, o, &no));
  read_t(&o[0], out);
  ref_sdpa(q, k, v, NULL, false, B, H, HK, L, S, E, EV, 0.5, ref);
  CHECK(out[EV] == 0 && out[EV + 2] == 0);
  CHECK_NEAR(out[0], ref[0], 1e-5);
  CHECK_NEAR(out[2 * EV + 1], ref[2 * EV + 1], 1e-5);

  /* errors: dropout (NotImplementedError), dtype mismatch, non-dividing heads */
  tpu_node_t* n;
  int si = check_op_index("_scaled_dot_product_fused_attention_overrideable");
  fargs[4] = A_D(0.1);
  CHECK_CODE(tpu_op_prepare(si, TPU_VARIANT_FUNCTIONAL, fargs, 8, &n), TPU_UNIMPLEMENTED);
  fargs[4] = A_D(0);
  fargs[1] = A_T(vk);
  CHECK_CODE(tpu_op_prepare(si, TPU_VARIANT_FUNCTIONAL, fargs, 8, &n), TPU_INVALID_ARGUMENT);
  int64_t k3[4] = {B, 3, S, E};
  tpu_view_t vk3 = make_t(TPU_DTYPE_F32, 4, k3, NULL);
  fargs[1] = A_T(vk3);
  CHECK_CODE(tpu_op_prepare(si, TPU_VARIANT_FUNCTIONAL, fargs, 8, &n), TPU_INVALID_ARGUMENT);
  release_all();
}

/* ---- pointwise losses ---- */

static void test_point_losses(void) {
  double x[3] = {0.25, 0.5, 0.9}, y[3] = {0, 1, 3};
  int64_t s[1] = {3};
  tpu_view_t vx = make_t(TPU_DTYPE_F32, 1, s, x), vy = make_t(TPU_DTYPE_F32, 1, s, y);
  tpu_view_t o[4];
  int no;
  double r[3];
  tpu_arg_t a[4] = {A_T(vx), A_T(vy), A_I(1)};
  CHECK_OK(run_op("mse_loss", a, 3, o, &no));
  read_t(&o[0], r);
  CHECK_NEAR(r[0], (0.0625 + 0.25 + 2.1 * 2.1) / 3, 1e-6);
  double one[1] = {1};
  tpu_view_t vg = make_t(TPU_DTYPE_F32, 0, NULL, one);
  tpu_arg_t b[5] = {A_T(vg), A_T(vx), A_T(vy), A_I(2)};
  CHECK_OK(run_op("mse_loss_backward", b, 4, o, &no));
  read_t(&o[0], r);
  CHECK_NEAR(r[2], 2 * (0.9 - 3), 1e-6);
  /* smooth_l1 with beta 1: quadratic below 1, linear above */
  tpu_arg_t c[4] = {A_T(vx), A_T(vy), A_I(0), A_D(1.0)};
  CHECK_OK(run_op("smooth_l1_loss", c, 4, o, &no));
  read_t(&o[0], r);
  CHECK_NEAR(r[0], 0.5 * 0.0625, 1e-6);
  CHECK_NEAR(r[2], 2.1 - 0.5, 1e-6);
  c[3] = A_D(-1);
  tpu_node_t* n;
  CHECK_CODE(tpu_op_prepare(check_op_index("smooth_l1_loss"), TPU_VARIANT_FUNCTIONAL, c, 4, &n), TPU_INVALID_ARGUMENT);
  /* bce: log clamps at -100; inputs outside [0, 1] fail at run time */
  double bx[2] = {0, 1}, by[2] = {1, 0};
  int64_t s2[1] = {2};
  tpu_view_t vbx = make_t(TPU_DTYPE_F32, 1, s2, bx), vby = make_t(TPU_DTYPE_F32, 1, s2, by);
  tpu_arg_t d[4] = {A_T(vbx), A_T(vby), A_N(), A_I(0)};
  CHECK_OK(run_op("binary_cross_entropy", d, 4, o, &no));
  read_t(&o[0], r);
  CHECK(r[0] == 100 && r[1] == 100);
  d[0] = A_T(vy); d[1] = A_T(vx);
  CHECK_OK(run_op("binary_cross_entropy", d, 4, o, &no));
  CHECK_CODE(tpu_device_synchronize(0), TPU_INVALID_ARGUMENT);
  /* integer inputs: NotImplementedError like ATen's dispatch */
  tpu_view_t vi = make_t(TPU_DTYPE_I64, 1, s, y);
  tpu_arg_t e[3] = {A_T(vi), A_T(vi), A_I(1)};
  CHECK_CODE(tpu_op_prepare(check_op_index("mse_loss"), TPU_VARIANT_FUNCTIONAL, e, 3, &n), TPU_UNIMPLEMENTED);
  release_all();
}

/* Host allocation failures anywhere inside prepare or a kernel end as a status, never a
 * crash or leak (the sanitizer build checks the latter). */
static void test_host_oom(void) {
  double q[24];
  for (int i = 0; i < 24; ++i) q[i] = 0.1 * i;
  int64_t qs[4] = {1, 2, 3, 4}, ns[1] = {4};
  for (int fail = 0; fail < 40; ++fail) {
    tpu_view_t vq = make_t(TPU_DTYPE_F32, 4, qs, q);
    if (!vq.storage) continue;
    tpu_view_t o[4];
    int no;
    tpu_arg_t a[8] = {A_T(vq), A_T(vq), A_T(vq), A_T(vq), A_D(0), A_B(true), A_B(false), A_N()};
    tpu_arg_t l[5] = {A_T(vq), A_L(ns, 1), A_N(), A_N(), A_D(1e-5)};
    tpu__alloc_fail_after(fail);
    tpu_status_free(run_op("_scaled_dot_product_fused_attention_overrideable", a, 8, o, &no));
    tpu_status_free(run_op("native_layer_norm", l, 5, o, &no));
    tpu_status_free(tpu_device_synchronize(0));
    tpu__alloc_fail_after(-1);
    tpu_status_free(tpu_device_synchronize(0));
    release_all();
  }
}

/* ---- the transformer fast path's kernels ---- */

static void test_masked_softmax(void) {
  /* [B=2, heads=1, L=2, L=2] with a [B, L] key padding mask (type 1): batch 1 masks
   * every key, so its rows are NaN throughout (CPU's result); batch 0 masks key 1. */
  double xv[8] = {1, 5, 2, -1, 0, 0, 3, 3};
  tpu_view_t x = make_t(TPU_DTYPE_F32, 4, (int64_t[]){2, 1, 2, 2}, xv);
  tpu_view_t m = make_t(TPU_DTYPE_BOOL, 2, (int64_t[]){2, 2}, (double[]){0, 1, 1, 1});
  tpu_arg_t a[4] = {A_T(x), A_T(m), A_I(3), A_I(1)};
  tpu_view_t o[1];
  CHECK_OK(run_op("_masked_softmax", a, 4, o, NULL));
  double r[8];
  read_t(&o[0], r);
  CHECK(r[0] == 1 && r[1] == 0 && r[2] == 1 && r[3] == 0);
  for (int i = 4; i < 8; ++i) CHECK(isnan(r[i]));
  /* type 2 over dim 0 of a [2, 2]: column 0 unmasked, column 1 half masked */
  tpu_view_t x2 = make_t(TPU_DTYPE_F64, 2, (int64_t[]){2, 2}, (double[]){0, 7, log(3.0), 1});
  tpu_view_t m2 = make_t(TPU_DTYPE_BOOL, 2, (int64_t[]){2, 2}, (double[]){0, 0, 0, 1});
  tpu_arg_t b[4] = {A_T(x2), A_T(m2), A_I(0), A_N()};
  CHECK_OK(run_op("_masked_softmax", b, 4, o, NULL));
  read_t(&o[0], r);
  CHECK_NEAR(r[0], 0.25, 1e-15);
  CHECK_NEAR(r[2], 0.75, 1e-15);
  CHECK(r[1] == 1 && r[3] == 0);
  /* errors in CPU's order and classes */
  tpu_arg_t c[4] = {A_T(x), A_T(x), A_I(3), A_I(1)};
  CHECK_CODE(run_op("_masked_softmax", c, 4, o, NULL), TPU_INVALID_ARGUMENT); /* mask not bool */
  tpu_arg_t d[4] = {A_T(x), A_T(m), A_I(3), A_N()};
  CHECK_CODE(run_op("_masked_softmax", d, 4, o, NULL), TPU_INVALID_ARGUMENT); /* type needed */
  tpu_arg_t e[4] = {A_T(x), A_T(m), A_I(4), A_I(1)};
  CHECK_CODE(run_op("_masked_softmax", e, 4, o, NULL), TPU_INDEX_ERROR);
  CHECK_OK(tpu_device_synchronize(0));
  release_all();
}

static void test_transform_qkv(void) {
  /* B = T = 1, D = 4, two heads of 2: q = (x + b) / sqrt(2), k and v = x + b */
  double xv[12], bv[12];
  for (int i = 0; i < 12; ++i) { xv[i] = i; bv[i] = 0.5; }
  tpu_view_t x = make_t(TPU_DTYPE_F64, 3, (int64_t[]){1, 1, 12}, xv);
  tpu_view_t b = make_t(TPU_DTYPE_F64, 1, (int64_t[]){12}, bv);
  tpu_arg_t a[3] = {A_T(x), A_T(b), A_I(2)};
  tpu_view_t o[3];
  int no = 0;
  CHECK_OK(run_op("_transform_bias_rescale_qkv", a, 3, o, &no));
  CHECK(no == 3 && o[0].ndim == 4 && o[0].sizes[1] == 2 && o[0].sizes[3] == 2);
  double r[4];
  for (int s = 0; s < 3; ++s) {
    read_t(&o[s], r);
    for (int i = 0; i < 4; ++i) CHECK_NEAR(r[i], (4 * s + i + 0.5) / (s == 0 ? sqrt(2.0) : 1.0), 1e-15);
  }
  tpu_arg_t c[3] = {A_T(x), A_T(b), A_I(3)}; /* 4 % 3 */
  CHECK_CODE(run_op("_transform_bias_rescale_qkv", c, 3, o, &no), TPU_INVALID_ARGUMENT);
  CHECK_OK(tpu_device_synchronize(0));
  release_all();
}

static void test_addmm_activation(void) {
  /* [1, 2] @ [2, 2] + [2]: one negative result, which relu zeroes; the activation is a
   * second node the submit queues after the product. */
  tpu_view_t c = make_t(TPU_DTYPE_F32, 1, (int64_t[]){2}, (double[]){1, -10});
  tpu_view_t x = make_t(TPU_DTYPE_F32, 2, (int64_t[]){1, 2}, (double[]){1, 2});
  tpu_view_t y = make_t(TPU_DTYPE_F32, 2, (int64_t[]){2, 2}, (double[]){1, 1, 1, 1});
  for (int g = 0; g < 2; ++g) {
    tpu_arg_t a[6] = {A_T(c), A_T(x), A_T(y), A_N(), A_N(), A_B(g)};
    tpu_view_t o[1];
    CHECK_OK(run_op("_addmm_activation", a, 6, o, NULL));
    double r[2];
    read_t(&o[0], r);
    CHECK(g ? fabs(r[0] - 4) < 1e-3 && r[0] < 4 : r[0] == 4);
    CHECK(g ? fabs(r[1]) < 1e-4 && r[1] < 0 : r[1] == 0); /* gelu(-7) is a tiny negative */
  }
  /* an integer product with gelu: the follow-up's UNIMPLEMENTED fails the whole call */
  tpu_view_t ci = make_t(TPU_DTYPE_I64, 1, (int64_t[]){2}, (double[]){1, 2});
  tpu_view_t xi = make_t(TPU_DTYPE_I64, 2, (int64_t[]){1, 2}, (double[]){1, 2});
  tpu_view_t yi = make_t(TPU_DTYPE_I64, 2, (int64_t[]){2, 2}, (double[]){1, 1, 1, 1});
  tpu_arg_t a[6] = {A_T(ci), A_T(xi), A_T(yi), A_N(), A_N(), A_B(true)};
  tpu_view_t o[1];
  CHECK_CODE(run_op("_addmm_activation", a, 6, o, NULL), TPU_UNIMPLEMENTED);
  CHECK_OK(tpu_device_synchronize(0));
  release_all();
}

int main(void) {
  test_layer_norm();
  test_embedding();
  test_embedding_bag();
  test_nll();
  test_sdpa();
  test_point_losses();
  test_host_oom();
  test_masked_softmax();
  test_transform_qkv();
  test_addmm_activation();
  CHECK_OK(tpu_device_synchronize(0));
  TEST_MAIN_END();
}
