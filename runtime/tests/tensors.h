/* Tensor helpers shared by the op-level C tests (linalg, lapack): device tensors made from
 * and read back as doubles, released by t_reset; tpu_arg_t constructors; running an op
 * functionally; comparing outputs and errors. Include after check.h. */
#ifndef TPURT_TESTS_TENSORS_H_
#define TPURT_TESTS_TENSORS_H_
#include <string.h>

#include "check.h"

#define MAXT 64

/* Test tensors: storages released at the end of each test via t_reset. */
static tpu_storage_t* owned[MAXT];
static int n_owned;

static inline void t_reset(void) {
  CHECK_OK(tpu_device_synchronize(0));
  for (int i = 0; i < n_owned; ++i) tpu_storage_release(owned[i]);
  n_owned = 0;
}

static inline size_t dsize(tpu_dtype_t d) { return tpu_dtype_size(d); }

static inline tpu_view_t t_empty(tpu_dtype_t dt, int nd, const int64_t* sizes) {
  int64_t n = 1;
  for (int i = 0; i < nd; ++i) n *= sizes[i];
  tpu_storage_t* s = NULL;
  CHECK_OK(tpu_storage_create(0, (uint64_t)(n ? n : 1) * dsize(dt), &s));
  owned[n_owned++] = s;
  return check_view(s, dt, nd, sizes);
}

/* A tensor of dtype dt holding the given doubles (converted on the host side). */
static inline tpu_view_t t_make(tpu_dtype_t dt, int nd, const int64_t* sizes, const double* v) {
  tpu_view_t t = t_empty(dt, nd, sizes);
  int64_t n = tpu_view_numel(&t);
  char* buf = malloc((size_t)(n ? n : 1) * dsize(dt));
  for (int64_t i = 0; i < n; ++i) {
    switch (dt) {
      case TPU_DTYPE_F32: ((float*)buf)[i] = (float)v[i]; break;
      case TPU_DTYPE_F64: ((double*)buf)[i] = v[i]; break;
      case TPU_DTYPE_I64: ((int64_t*)buf)[i] = (int64_t)v[i]; break;
      case TPU_DTYPE_I32: ((int32_t*)buf)[i] = (int32_t)v[i]; break;
      case TPU_DTYPE_F16: ((_Float16*)buf)[i] = (_Float16)v[i]; break;
      case TPU_DTYPE_BF16: { float f = (float)v[i]; uint32_t u; memcpy(&u, &f, 4); ((uint16_t*)buf)[i] = (uint16_t)(u >> 16); break; }
      case TPU_DTYPE_BOOL: case TPU_DTYPE_U8: ((uint8_t*)buf)[i] = (uint8_t)v[i]; break;
      default: break;
    }
  }
  CHECK_OK(tpu_copy_from_host(&t, buf));
  free(buf);
  return t;
}

static inline void t_read(const tpu_view_t* t, double* out) {
  int64_t n = tpu_view_numel(t);
  char* buf = malloc((size_t)(n ? n : 1) * dsize(t->dtype));
  CHECK_OK(tpu_copy_to_host(t, buf));
  for (int64_t i = 0; i < n; ++i) {
    switch (t->dtype) {
      case TPU_DTYPE_F32: out[i] = ((float*)buf)[i]; break;
      case TPU_DTYPE_F64: out[i] = ((double*)buf)[i]; break;
      case TPU_DTYPE_I64: out[i] = (double)((int64_t*)buf)[i]; break;
      case TPU_DTYPE_I32: out[i] = ((int32_t*)buf)[i]; break;
      case TPU_DTYPE_F16: out[i] = (double)((_Float16*)buf)[i]; break;
      case TPU_DTYPE_BF16: { uint32_t u = (uint32_t)((uint16_t*)buf)[i] << 16; float f; memcpy(&f, &u, 4); out[i] = f; break; }
      default: out[i] = ((uint8_t*)buf)[i]; break;
    }
  }
  free(buf);
}

static inline tpu_arg_t a_t(tpu_view_t v) { tpu_arg_t a = {0}; a.kind = TPU_ARG_TENSOR; a.tensor = v; return a; }
static inline tpu_arg_t a_none(void) { tpu_arg_t a = {0}; a.kind = TPU_ARG_NONE; return a; }
static inline tpu_arg_t a_int(int64_t i) { tpu_arg_t a = {0}; a.kind = TPU_ARG_INT; a.v.i = i; return a; }
static inline tpu_arg_t a_bool(bool b) { tpu_arg_t a = {0}; a.kind = TPU_ARG_BOOL; a.v.b = b; return a; }
static inline tpu_arg_t a_sc(double d) {
  tpu_arg_t a = {0}; a.kind = TPU_ARG_SCALAR; a.scalar_kind = TPU_SCALAR_FLOAT; a.v.d = d; return a;
}
static inline tpu_arg_t a_list(const int64_t* v, int n) {
  tpu_arg_t a = {0}; a.kind = TPU_ARG_INTLIST; a.list = v; a.list_len = n; return a;
}

/* Runs op functionally; outputs are fresh contiguous tensors stored in outs. */
static inline tpu_status_t run(const char* name, tpu_arg_t* args, int nargs, tpu_view_t* outs) {
  int idx = check_op_index(name);
  if (idx < 0) { fprintf(stderr, "no op %s\n", name); ++check_failures; return NULL; }
  tpu_node_t* n;
  TPU_RETURN_IF_ERROR(tpu_op_prepare(idx, TPU_VARIANT_FUNCTIONAL, args, nargs, &n));
  for (int i = 0; i < tpu_node_output_count(n); ++i) {
    tpu_dtype_t dt; int32_t nd; int64_t sz[TPU_MAX_DIMS];
    tpu_node_output_meta(n, i, &dt, &nd, sz);
    if (nd < 0) { memset(&outs[i], 0, sizeof outs[i]); outs[i].ndim = -1; continue; } /* absent */
    outs[i] = t_empty(dt, nd, sz);
    tpu_status_t st = tpu_node_bind_output(n, i, &outs[i]);
    if (st) { tpu_node_discard(n); return st; }
  }
  return tpu_node_submit(n);
}

static inline void expect(const tpu_view_t* t, const double* want, double tol) {
  int64_t n = tpu_view_numel(t);
  double* got = malloc(sizeof(double) * (size_t)(n ? n : 1));
  t_read(t, got);
  for (int64_t i = 0; i < n; ++i)
    if (!(fabs(got[i] - want[i]) <= tol || (isnan(got[i]) && isnan(want[i])))) {
      fprintf(stderr, "  element %lld: got %g want %g\n", (long long)i, got[i], want[i]);
      ++check_failures;
      break;
    }
  free(got);
}

static inline void expect_err(tpu_status_t st, tpu_status_code_t code, const char* text) {
  CHECK(tpu_status_code(st) == code);
  if (st && text && !strstr(tpu_status_message(st), text)) {
    fprintf(stderr, "  message '%s' lacks '%s'\n", tpu_status_message(st), text);
    ++check_failures;
  }
  tpu_status_free(st);
}

#endif /* TPURT_TESTS_TENSORS_H_ */
