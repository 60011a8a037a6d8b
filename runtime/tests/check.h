/* Minimal test harness for libtpurt's C tests: CHECK macros that report file:line and
 * count failures; main returns nonzero when any check failed. */
#ifndef TPURT_TESTS_CHECK_H_
#define TPURT_TESTS_CHECK_H_
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tpurt/runtime.h"

static int check_failures;
#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);   \
      ++check_failures;                                                          \
    }                                                                            \
  } while (0)
#define CHECK_OK(expr)                                                           \
  do {                                                                           \
    tpu_status_t st_ = (expr);                                                   \
    if (st_) {                                                                   \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr,       \
              tpu_status_message(st_));                                          \
      ++check_failures;                                                          \
      tpu_status_free(st_);                                                      \
    }                                                                            \
  } while (0)
#define CHECK_CODE(expr, code)                                                   \
  do {                                                                           \
    tpu_status_t st_ = (expr);                                                   \
    if (tpu_status_code(st_) != (code)) {                                        \
      fprintf(stderr, "%s:%d: %s: expected code %d, got %d (%s)\n", __FILE__,    \
              __LINE__, #expr, (int)(code), (int)tpu_status_code(st_),           \
              tpu_status_message(st_));                                          \
      ++check_failures;                                                          \
    }                                                                            \
    tpu_status_free(st_);                                                        \
  } while (0)
#define CHECK_NEAR(a, b, tol) CHECK(fabs((double)(a) - (double)(b)) <= (tol))
#define TEST_MAIN_END()                                                          \
  do {                                                                           \
    printf("%s: %s\n", __FILE__, check_failures ? "FAILED" : "ok");              \
    return check_failures ? 1 : 0;                                               \
  } while (0)

/* A contiguous view over a whole storage. */
static inline tpu_view_t check_view(tpu_storage_t* s, tpu_dtype_t dt, int nd, const int64_t* sizes) {
  tpu_view_t v = {0};
  v.storage = s;
  v.dtype = dt;
  v.ndim = nd;
  int64_t st = 1;
  for (int i = nd - 1; i >= 0; --i) { v.sizes[i] = sizes[i]; v.strides[i] = st; st *= sizes[i]; }
  return v;
}

static inline int check_op_index(const char* name) {
  for (int i = 0; i < tpu_aten_op_count(); ++i) {
    const char* n = tpu_aten_op_name(i);
    int eq = 1;
    for (int k = 0; eq; ++k) { if (n[k] != name[k]) eq = 0; else if (!n[k]) break; }
    if (eq) return i;
  }
  return -1;
}
#endif
