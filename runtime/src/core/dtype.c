#include "core/internal.h"

static size_t storage_only_size(tpu_dtype_t d) {
  switch (d) {
    case TPU_DTYPE_F8_E5M2: case TPU_DTYPE_F8_E4M3FN: case TPU_DTYPE_F8_E5M2FNUZ:
    case TPU_DTYPE_F8_E4M3FNUZ: case TPU_DTYPE_F8_E8M0FNU: case TPU_DTYPE_F4_E2M1FN_X2: return 1;
    case TPU_DTYPE_U16: return 2;
    case TPU_DTYPE_C32: case TPU_DTYPE_BC32: case TPU_DTYPE_U32: return 4;
    case TPU_DTYPE_U64: return 8;
    default: return 0;
  }
}
bool tpu_dtype_is_storage_only(tpu_dtype_t d) { return storage_only_size(d) != 0; }

size_t tpu_dtype_size(tpu_dtype_t d) {
  switch (d) {
    case TPU_DTYPE_U8: case TPU_DTYPE_I8: case TPU_DTYPE_BOOL: return 1;
    case TPU_DTYPE_I16: case TPU_DTYPE_F16: case TPU_DTYPE_BF16: return 2;
    case TPU_DTYPE_I32: case TPU_DTYPE_F32: return 4;
    case TPU_DTYPE_I64: case TPU_DTYPE_F64: case TPU_DTYPE_C64: return 8;
    case TPU_DTYPE_C128: return 16;
    default: return storage_only_size(d);
  }
}

const char* tpu_dtype_name(tpu_dtype_t d) {
  switch (d) {
    case TPU_DTYPE_U8: return "uint8";
    case TPU_DTYPE_I8: return "int8";
    case TPU_DTYPE_I16: return "int16";
    case TPU_DTYPE_I32: return "int32";
    case TPU_DTYPE_I64: return "int64";
    case TPU_DTYPE_F16: return "float16";
    case TPU_DTYPE_F32: return "float32";
    case TPU_DTYPE_F64: return "float64";
    case TPU_DTYPE_BOOL: return "bool";
    case TPU_DTYPE_BF16: return "bfloat16";
    case TPU_DTYPE_C64: return "complex64";
    case TPU_DTYPE_C128: return "complex128";
    case TPU_DTYPE_C32: return "complex32";
    case TPU_DTYPE_BC32: return "bcomplex32";
    case TPU_DTYPE_F8_E5M2: return "float8_e5m2";
    case TPU_DTYPE_F8_E4M3FN: return "float8_e4m3fn";
    case TPU_DTYPE_F8_E5M2FNUZ: return "float8_e5m2fnuz";
    case TPU_DTYPE_F8_E4M3FNUZ: return "float8_e4m3fnuz";
    case TPU_DTYPE_F8_E8M0FNU: return "float8_e8m0fnu";
    case TPU_DTYPE_F4_E2M1FN_X2: return "float4_e2m1fn_x2";
    case TPU_DTYPE_U16: return "uint16";
    case TPU_DTYPE_U32: return "uint32";
    case TPU_DTYPE_U64: return "uint64";
    default: return "unsupported dtype";
  }
}

/* one switch: every builder asks this of every tensor argument */
bool tpu_dtype_is_supported(tpu_dtype_t d) {
  switch (d) {
    case TPU_DTYPE_U8: case TPU_DTYPE_I8: case TPU_DTYPE_I16: case TPU_DTYPE_I32: case TPU_DTYPE_I64:
    case TPU_DTYPE_F16: case TPU_DTYPE_F32: case TPU_DTYPE_F64: case TPU_DTYPE_C64: case TPU_DTYPE_C128:
    case TPU_DTYPE_BOOL: case TPU_DTYPE_BF16: return true;
    default: return false;
  }
}
bool tpu_dtype_is_floating(tpu_dtype_t d) {
  return d == TPU_DTYPE_F16 || d == TPU_DTYPE_F32 || d == TPU_DTYPE_F64 || d == TPU_DTYPE_BF16;
}
bool tpu_dtype_is_complex(tpu_dtype_t d) { return d == TPU_DTYPE_C64 || d == TPU_DTYPE_C128; }
tpu_dtype_t tpu__complex_of(tpu_dtype_t d) {
  if (tpu_dtype_is_complex(d)) return d;
  return d == TPU_DTYPE_F64 ? TPU_DTYPE_C128 : TPU_DTYPE_C64;
}
tpu_dtype_t tpu__real_of(tpu_dtype_t d) {
  return d == TPU_DTYPE_C128 ? TPU_DTYPE_F64 : d == TPU_DTYPE_C64 ? TPU_DTYPE_F32 : d;
}
bool tpu_dtype_is_integral(tpu_dtype_t d, bool include_bool) {
  switch (d) {
    case TPU_DTYPE_U8: case TPU_DTYPE_I8: case TPU_DTYPE_I16: case TPU_DTYPE_I32:
    case TPU_DTYPE_I64: return true;
    case TPU_DTYPE_BOOL: return include_bool;
    default: return false;
  }
}

/* Rank within the integer lattice (bool lowest); u8 handled separately. */
static int int_rank(tpu_dtype_t d) {
  switch (d) {
    case TPU_DTYPE_BOOL: return 0;
    case TPU_DTYPE_I8: return 1;
    case TPU_DTYPE_I16: return 2;
    case TPU_DTYPE_I32: return 3;
    case TPU_DTYPE_I64: return 4;
    default: return -1;
  }
}

tpu_dtype_t tpu__promote(tpu_dtype_t a, tpu_dtype_t b) {
  if (a == TPU_DTYPE_INVALID) return b;
  if (b == TPU_DTYPE_INVALID) return a;
  if (a == b) return a;
  /* complex with anything: the complex type whose parts are the promotion of the real
   * parts (complex64 with float64 is complex128, as c10's table has it) */
  if (tpu_dtype_is_complex(a) || tpu_dtype_is_complex(b))
    return tpu__complex_of(tpu__promote(tpu__real_of(a), tpu__real_of(b)));
  bool fa = tpu_dtype_is_floating(a), fb = tpu_dtype_is_floating(b);
  if (fa && fb) {
    if (a == TPU_DTYPE_F64 || b == TPU_DTYPE_F64) return TPU_DTYPE_F64;
    return TPU_DTYPE_F32; /* f32 with anything, and f16 with bf16 */
  }
  if (fa) return a;
  if (fb) return b;
  if (a == TPU_DTYPE_BOOL) return b;
  if (b == TPU_DTYPE_BOOL) return a;
  if (a == TPU_DTYPE_U8 || b == TPU_DTYPE_U8) {
    tpu_dtype_t o = a == TPU_DTYPE_U8 ? b : a;
    return o == TPU_DTYPE_I8 ? TPU_DTYPE_I16 : o;
  }
  return int_rank(a) > int_rank(b) ? a : b;
}

bool tpu__can_cast(tpu_dtype_t from, tpu_dtype_t to) {
  if (tpu_dtype_is_complex(from) && !tpu_dtype_is_complex(to)) return false;
  if (tpu_dtype_is_floating(from) && tpu_dtype_is_integral(to, false)) return false;
  if (from != TPU_DTYPE_BOOL && to == TPU_DTYPE_BOOL) return false;
  return true;
}

tpu_dtype_t tpu__compute_dtype(tpu_dtype_t r) {
  if (tpu_dtype_is_complex(r)) return r;
  if (r == TPU_DTYPE_F64) return TPU_DTYPE_F64;
  if (tpu_dtype_is_floating(r)) return TPU_DTYPE_F32;
  return TPU_DTYPE_I64;
}

tpu_dtype_t tpu__default_float(void) { return TPU_DTYPE_F32; }

const char* tpu__dtype_c10_name(tpu_dtype_t d) {
  switch (d) {
    case TPU_DTYPE_U8: return "Byte";
    case TPU_DTYPE_I8: return "Char";
    case TPU_DTYPE_I16: return "Short";
    case TPU_DTYPE_I32: return "Int";
    case TPU_DTYPE_I64: return "Long";
    case TPU_DTYPE_F16: return "Half";
    case TPU_DTYPE_F32: return "Float";
    case TPU_DTYPE_F64: return "Double";
    case TPU_DTYPE_BOOL: return "Bool";
    case TPU_DTYPE_BF16: return "BFloat16";
    case TPU_DTYPE_C64: return "ComplexFloat";
    case TPU_DTYPE_C128: return "ComplexDouble";
    case TPU_DTYPE_C32: return "ComplexHalf";
    case TPU_DTYPE_BC32: return "BComplex32";
    case TPU_DTYPE_F8_E5M2: return "Float8_e5m2";
    case TPU_DTYPE_F8_E4M3FN: return "Float8_e4m3fn";
    case TPU_DTYPE_F8_E5M2FNUZ: return "Float8_e5m2fnuz";
    case TPU_DTYPE_F8_E4M3FNUZ: return "Float8_e4m3fnuz";
    case TPU_DTYPE_F8_E8M0FNU: return "Float8_e8m0fnu";
    case TPU_DTYPE_F4_E2M1FN_X2: return "Float4_e2m1fn_x2";
    case TPU_DTYPE_U16: return "UInt16";
    case TPU_DTYPE_U32: return "UInt32";
    case TPU_DTYPE_U64: return "UInt64";
    default: return "Undefined";
  }
}

double tpu__round_to_dtype(double v, tpu_dtype_t t) {
  switch (t) {
    case TPU_DTYPE_F32: return (float)v;
    case TPU_DTYPE_F16: return (double)(_Float16)v;
    case TPU_DTYPE_BF16: return tpu__bf16_to_f32(tpu__f32_to_bf16((float)v));
    default: return v;
  }
}
