/* Runs of equal slices for unique_consecutive, shared by its builder (which counts them
 * to size the outputs) and its kernel (which fills them). */
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
