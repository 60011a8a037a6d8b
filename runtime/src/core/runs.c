/* Runs of equal slices for unique_consecutive and the sorted groups of _unique2, shared
 * by their builders (which count them to size the outputs) and kernels (which fill them);
 * the stable merge sort that sort/topk use as well. */
#include <math.h>

#include "core/internal.h"

/* Element i of a dense array of dtype t, widened for comparison: floats as double,
 * integers and bool as int64 (is_f says which field is set). */
static void widen(const uint8_t* p, tpu_dtype_t t, double* f, int64_t* i, bool* is_f) {
  *is_f = true;
  switch (t) {
    case TPU_DTYPE_F32: { float v; memcpy(&v, p, 4); *f = v; return; }
    case TPU_DTYPE_F64: { double v; memcpy(&v, p, 8); *f = v; return; }
    case TPU_DTYPE_BF16: { uint16_t v; memcpy(&v, p, 2); *f = tpu__bf16_to_f32(v); return; }
    case TPU_DTYPE_F16: { _Float16 v; memcpy(&v, p, 2); *f = (double)v; return; }
    default: break;
  }
  *is_f = false;
  switch (t) {
    case TPU_DTYPE_BOOL: case TPU_DTYPE_U8: *i = *p; return;
    case TPU_DTYPE_I8: { int8_t v; memcpy(&v, p, 1); *i = v; return; }
    case TPU_DTYPE_I16: { int16_t v; memcpy(&v, p, 2); *i = v; return; }
    case TPU_DTYPE_I32: { int32_t v; memcpy(&v, p, 4); *i = v; return; }
    default: { int64_t v; memcpy(&v, p, 8); *i = v; return; }
  }
}

/* Equal as values: NaN differs from everything, -0.0 equals 0.0 (PyTorch's comparison). */
static bool elem_eq(const uint8_t* a, const uint8_t* b, tpu_dtype_t t) {
  double fa = 0, fb = 0;
  int64_t ia = 0, ib = 0;
  bool fl;
  widen(a, t, &fa, &ia, &fl);
  widen(b, t, &fb, &ib, &fl);
  return fl ? fa == fb : ia == ib;
}

int64_t tpu__runs(const void* data, tpu_dtype_t t, int64_t slices, int64_t len, uint8_t* starts) {
  const uint8_t* p = data;
  const size_t es = tpu_dtype_size(t), row = (size_t)len * es;
  int64_t count = 0;
  for (int64_t s = 0; s < slices; ++s) {
    bool start = s == 0;
    for (int64_t e = 0; !start && e < len; ++e)
      start = !elem_eq(p + s * row + (size_t)e * es, p + (s - 1) * row + (size_t)e * es, t);
    if (starts) starts[s] = start;
    count += start;
  }
  return count;
}

/* NaN orders above every number, as on PyTorch CPU. */
static bool before_f(double a, double b, bool desc) {
  if (desc) return (isnan(a) && !isnan(b)) || a > b;
  return (!isnan(a) && isnan(b)) || a < b;
}
static bool before_i(int64_t a, int64_t b, bool desc) { return desc ? a > b : a < b; }

void tpu__merge_sort(int64_t* perm, int64_t* tmp, int64_t n, const void* keys, bool flt, bool desc) {
  const double* kf = keys;
  const int64_t* ki = keys;
  for (int64_t w = 1; w < n; w *= 2) {
    for (int64_t lo = 0; lo < n; lo += 2 * w) {
      int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
      int64_t i = lo, j = mid, o = lo;
      while (i < mid && j < hi) {
        bool take_right = flt ? before_f(kf[perm[j]], kf[perm[i]], desc) : before_i(ki[perm[j]], ki[perm[i]], desc);
        tmp[o++] = take_right ? perm[j++] : perm[i++];
      }
      while (i < mid) tmp[o++] = perm[i++];
      while (j < hi) tmp[o++] = perm[j++];
    }
    memcpy(perm, tmp, (size_t)n * sizeof(int64_t));
  }
}

int64_t tpu__unique_groups(const void* data, tpu_dtype_t t, int64_t n, int64_t* order, uint8_t* starts) {
  if (n <= 0) return 0;
  int64_t* tmp = tpu__malloc((size_t)n * sizeof(int64_t));
  void* keys = tpu__malloc((size_t)n * 8);
  if (!tmp || !keys) { tpu__free(tmp); tpu__free(keys); return -1; }
  const uint8_t* p = data;
  const size_t es = tpu_dtype_size(t);
  bool flt = false;
  for (int64_t i = 0; i < n; ++i) {
    double f = 0;
    int64_t v = 0;
    widen(p + (size_t)i * es, t, &f, &v, &flt);
    if (flt) ((double*)keys)[i] = f; else ((int64_t*)keys)[i] = v;
    order[i] = i;
  }
  tpu__merge_sort(order, tmp, n, keys, flt, false);
  int64_t groups = 0;
  for (int64_t k = 0; k < n; ++k) {
    bool start = k == 0 || (flt ? !(((double*)keys)[order[k]] == ((double*)keys)[order[k - 1]])
                                : ((int64_t*)keys)[order[k]] != ((int64_t*)keys)[order[k - 1]]);
    if (starts) starts[k] = start;
    groups += start;
  }
  tpu__free(tmp);
  tpu__free(keys);
  return groups;
}
