/* Host driver internals shared by the kernel families: the elementwise tile engine,
 * pack/unpack between strided operands and dense compute buffers, and conversions.
 *
 * Compute dtypes: float32 (for f32/bf16/f16), float64, int64 (integers and bool). Every
 * kernel works on dense buffers of one compute dtype; loads and stores convert. */
#ifndef TPURT_HOST_HOST_H_
#define TPURT_HOST_HOST_H_

#include <pthread.h>

#include "core/internal.h"

typedef tpu_status_t (*tpu_host_kernel_fn)(tpu_node_t* node);

/* Each family registers its kernels into the table indexed by tpu_kind_t. */
#define TPU_HOST_FAMILIES(X) X(elementwise) X(reduce) X(linalg) X(nn) X(index) X(random) X(norm)
#define TPU__DECL_REG(f) void tpu__host_register_##f(tpu_host_kernel_fn* table);
TPU_HOST_FAMILIES(TPU__DECL_REG)
#undef TPU__DECL_REG

/* Tile engine: output 0 and all inputs are broadcast to output 0's shape; fn sees
 * contiguous tiles in `compute` dtype (scalars arrive as constant tiles). The output
 * tile is converted to output 0's dtype on store. n_in <= 8. */
typedef void (*tpu_tile_fn)(int64_t n, void* out, const void* const* in, const tpu_node_t* node);
tpu_status_t tpu__tile_run(tpu_node_t* node, tpu_dtype_t compute, tpu_tile_fn fn);
/* Same with explicit input operand list and output operand (for multi-output kernels). */
tpu_status_t tpu__tile_run_ops(const tpu_node_t* node, tpu_operand_t* out,
                               const tpu_operand_t* const* ins, int n_in,
                               tpu_dtype_t compute, tpu_tile_fn fn);

/* Dense conversions between a strided run and a contiguous buffer. */
void tpu__convert_run(void* dst, tpu_dtype_t dst_dtype, int64_t dst_stride,
                      const void* src, tpu_dtype_t src_dtype, int64_t src_stride, int64_t n);

/* Pack: copies operand op (strided, any dtype) into dense row-major `dst` of dtype,
 * with dimensions permuted by perm (perm may be NULL = identity). A scalar operand fills
 * numel(shape) copies — pass its broadcast shape via op->sizes. */
void tpu__pack(const tpu_operand_t* op, const int* perm, tpu_dtype_t dtype, void* dst);
/* Allocates and packs; returns NULL on host OOM. Caller frees with tpu__free. */
void* tpu__pack_alloc(const tpu_operand_t* op, tpu_dtype_t dtype);
/* Unpack: writes dense row-major src (dtype) into operand op (strided, any dtype). */
void tpu__unpack(tpu_operand_t* op, const void* src, tpu_dtype_t dtype);

/* Element load/store by dtype (slow path, one element). */
double tpu__load_f64(const void* p, tpu_dtype_t dtype);
int64_t tpu__load_i64(const void* p, tpu_dtype_t dtype);
void tpu__store_f64(void* p, tpu_dtype_t dtype, double v);
void tpu__store_i64(void* p, tpu_dtype_t dtype, int64_t v);

/* bf16 / f16 bit conversions (round to nearest even). */
static inline float tpu__bf16_to_f32(uint16_t h) {
  union { uint32_t u; float f; } x; x.u = (uint32_t)h << 16; return x.f;
}
static inline uint16_t tpu__f32_to_bf16(float f) {
  union { uint32_t u; float f; } x; x.f = f;
  if ((x.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x.u >> 16) | 0x40);
  uint32_t lsb = (x.u >> 16) & 1u;
  return (uint16_t)((x.u + 0x7fffu + lsb) >> 16);
}

#define TPU_HOST_NOMEM() tpu_status_make(TPU_OUT_OF_MEMORY, "host out of memory in kernel scratch")

#endif /* TPURT_HOST_HOST_H_ */
