/* libtpurt base: status values, dtypes, limits. Part of the public C contract.
 *
 * Every function that can fail returns a tpu_status_t: NULL means OK; otherwise the
 * caller owns the status and must pass it to tpu_status_free (or return it upward,
 * adding context with tpu_status_annotate). Nothing in libtpurt aborts on bad input. */
#ifndef TPURT_BASE_H_
#define TPURT_BASE_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TPU_MAX_DIMS 12

typedef enum tpu_status_code_e {
  TPU_OK = 0,
  TPU_INVALID_ARGUMENT = 1, /* bad shapes, values: Python RuntimeError */
  TPU_TYPE_ERROR = 2,       /* wrong dtype/kind of argument: Python TypeError */
  TPU_INDEX_ERROR = 3,      /* index out of range: Python IndexError */
  TPU_VALUE_ERROR = 4,      /* Python ValueError */
  TPU_OUT_OF_MEMORY = 5,    /* torch.OutOfMemoryError */
  TPU_UNIMPLEMENTED = 6,    /* NotImplementedError */
  TPU_INTERNAL = 7,         /* a broken invariant inside libtpurt */
  TPU_UNAVAILABLE = 8,      /* device or driver missing */
} tpu_status_code_t;

typedef struct tpu_status_s* tpu_status_t;

/* Creates a status with a printf-style message. Never returns NULL for code != TPU_OK
 * (on host OOM it returns a static status that tpu_status_free ignores). */
tpu_status_t tpu_status_make(tpu_status_code_t code, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prefixes context ("while ...: ") to the message; returns the same status. */
tpu_status_t tpu_status_annotate(tpu_status_t status, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));
tpu_status_code_t tpu_status_code(tpu_status_t status);
/* Borrowed; valid until the status is freed. "" for OK. */
const char* tpu_status_message(tpu_status_t status);
/* Accepts NULL. */
void tpu_status_free(tpu_status_t status);
/* A deep copy (for sticky errors handed to several readers). */
tpu_status_t tpu_status_clone(tpu_status_t status);

#define TPU_RETURN_IF_ERROR(expr)         \
  do {                                    \
    tpu_status_t tpu__st_ = (expr);       \
    if (tpu__st_) return tpu__st_;        \
  } while (0)

/* Values equal c10::ScalarType's so the adapter converts with a cast (it static-asserts). */
typedef enum tpu_dtype_e {
  TPU_DTYPE_U8 = 0,
  TPU_DTYPE_I8 = 1,
  TPU_DTYPE_I16 = 2,
  TPU_DTYPE_I32 = 3,
  TPU_DTYPE_I64 = 4,
  TPU_DTYPE_F16 = 5,
  TPU_DTYPE_F32 = 6,
  TPU_DTYPE_F64 = 7,
  TPU_DTYPE_C64 = 9,   /* complex64: interleaved (re, im) float32 pairs */
  TPU_DTYPE_C128 = 10, /* complex128: interleaved (re, im) float64 pairs */
  TPU_DTYPE_BOOL = 11,
  TPU_DTYPE_BF16 = 15,
  /* Storage-only dtypes: tensors of these live on the device and copy to and from the
   * host and within the device in their own dtype; no kernel computes with them (ops on
   * them take the CPU fallback, conversions go through the host). */
  TPU_DTYPE_C32 = 8, /* complex32 (ComplexHalf) */
  TPU_DTYPE_F8_E5M2 = 23,
  TPU_DTYPE_F8_E4M3FN = 24,
  TPU_DTYPE_F8_E5M2FNUZ = 25,
  TPU_DTYPE_F8_E4M3FNUZ = 26,
  TPU_DTYPE_U16 = 27,
  TPU_DTYPE_U32 = 28,
  TPU_DTYPE_U64 = 29,
  TPU_DTYPE_F8_E8M0FNU = 44,
  TPU_DTYPE_F4_E2M1FN_X2 = 45,
  TPU_DTYPE_BC32 = 46, /* complex with bfloat16 parts */
  TPU_DTYPE_INVALID = -1,
} tpu_dtype_t;

size_t tpu_dtype_size(tpu_dtype_t dtype);       /* 0 for a dtype the device cannot hold */
const char* tpu_dtype_name(tpu_dtype_t dtype);  /* "float32", ... */
bool tpu_dtype_is_supported(tpu_dtype_t dtype); /* kernels compute with it */
bool tpu_dtype_is_storage_only(tpu_dtype_t dtype);
bool tpu_dtype_is_floating(tpu_dtype_t dtype);
bool tpu_dtype_is_integral(tpu_dtype_t dtype, bool include_bool);
bool tpu_dtype_is_complex(tpu_dtype_t dtype);

#ifdef __cplusplus
}
#endif
#endif /* TPURT_BASE_H_ */
