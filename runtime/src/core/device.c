/* Device enumeration and host<->device copies. The active driver is host (built in);
 * the pjrt driver slots in behind the same vtable. */
#include <stdlib.h>

#include "core/internal.h"

tpu_driver_t* tpu__driver(void) { return tpu__host_driver(); }
const char* tpu_driver_name(void) { return tpu__driver()->vt->name; }
int tpu_device_count(void) { return tpu__driver()->vt->device_count(tpu__driver()); }

const char* tpu_device_name(int device) {
  (void)device;
  return "TPU (host driver, CPU emulation)";
}

tpu_status_t tpu_device_props(int device, tpu_device_props_t* out) {
  if (device < 0 || device >= tpu_device_count())
    return tpu_status_make(TPU_INVALID_ARGUMENT, "invalid device index %d (device count %d)",
                           device, tpu_device_count());
  TPU_RETURN_IF_ERROR(tpu__driver()->vt->props(tpu__driver(), device, out));
  out->total_memory = tpu__pool_hbm(device); /* (a process limit does not change it) */
  return NULL;
}

static bool view_in_bounds(const tpu_view_t* v) {
  if (!v->storage) return false;
  int64_t lo = v->offset, hi = v->offset;
  for (int i = 0; i < v->ndim; ++i) {
    if (v->sizes[i] == 0) return true;
    int64_t ext = (v->sizes[i] - 1) * v->strides[i];
    if (ext < 0) lo += ext; else hi += ext;
  }
  return lo >= 0 && (uint64_t)(hi + 1) * tpu_dtype_size(v->dtype) <= v->storage->nbytes;
}

tpu_status_t tpu_copy_from_host(const tpu_view_t* dst, const void* src) {
  if (!view_in_bounds(dst))
    return tpu_status_make(TPU_INVALID_ARGUMENT, "copy to tpu: destination view out of bounds");
  int64_t numel = tpu_view_numel(dst);
  if (numel == 0) return NULL;
  uint64_t nbytes = (uint64_t)numel * tpu_dtype_size(dst->dtype);
  /* Stage into a fresh value (the caller's buffer may change once we return), then
   * queue a strided copy into dst, ordered after earlier writers of dst. */
  tpu_value_t* staged;
  int device = dst->storage->device;
  TPU_RETURN_IF_ERROR(tpu__value_create(device, nbytes, &staged));
  tpu_status_t st = tpu__value_materialize(staged); /* holds data now, in every mode */
  if (!st) st = tpu__driver()->vt->write(tpu__driver(), staged, 0, src, nbytes);
  if (st) { tpu__value_release(staged); return st; }
  tpu_node_t* n = tpu__node_create();
  if (!n) { tpu__value_release(staged); return tpu_status_make(TPU_OUT_OF_MEMORY, "host OOM"); }
  n->kind = TPU_KIND_COPY;
  tpu_view_t sv = *dst;
  int64_t s = 1;
  for (int i = dst->ndim - 1; i >= 0; --i) { sv.strides[i] = s; s *= dst->sizes[i]; }
  sv.offset = 0;
  tpu_storage_t tmp = {.device = device, .nbytes = nbytes, .value = staged};
  sv.storage = &tmp;
  st = tpu__node_add_input(n, &sv);
  tpu__value_release(staged); /* the node holds it now */
  if (!st) {
    tpu__node_add_output(n, dst->dtype, dst->ndim, dst->sizes);
    n->variant = TPU_VARIANT_OUT;
    st = tpu_node_bind_output(n, 0, dst);
  }
  if (st) { tpu__node_free(n); return st; }
  return tpu__queue_submit(device, n);
}

tpu_status_t tpu_copy_to_host(const tpu_view_t* src, void* dst) {
  if (!view_in_bounds(src))
    return tpu_status_make(TPU_INVALID_ARGUMENT, "copy from tpu: source view out of bounds");
  int device = src->storage->device;
  TPU_RETURN_IF_ERROR(tpu__flush_for_sync(device, "host read (.item(), .cpu(), print, ...)"));
  TPU_RETURN_IF_ERROR(tpu_device_synchronize(device));
  TPU_RETURN_IF_ERROR(tpu__value_materialize(src->storage->value));
  int64_t numel = tpu_view_numel(src);
  if (numel == 0) return NULL;
  size_t isz = tpu_dtype_size(src->dtype);
  /* Host driver memory is host-addressable: gather directly. A driver with separate
   * memory would read the covering byte range first. */
  int64_t idx[TPU_MAX_DIMS] = {0};
  const char* base = (const char*)src->storage->value->data;
  char* out = dst;
  for (int64_t k = 0; k < numel; ++k) {
    int64_t off = src->offset;
    for (int i = 0; i < src->ndim; ++i) off += idx[i] * src->strides[i];
    memcpy(out + k * (int64_t)isz, base + off * (int64_t)isz, isz);
    for (int i = src->ndim - 1; i >= 0; --i) {
      if (++idx[i] < src->sizes[i]) break;
      idx[i] = 0;
    }
  }
  return NULL;
}

tpu_status_t tpu_copy(const tpu_view_t* dst, const tpu_view_t* src) {
  return tpu_copy_math(dst, src, false, false);
}

tpu_status_t tpu_copy_math(const tpu_view_t* dst, const tpu_view_t* src, bool conj, bool negate) {
  if (!view_in_bounds(dst) || !view_in_bounds(src))
    return tpu_status_make(TPU_INVALID_ARGUMENT, "copy_: view out of bounds");
  if (dst->storage->device != src->storage->device)
    return tpu_status_make(TPU_INVALID_ARGUMENT, "copy_: tpu:%d -> tpu:%d needs a host hop",
                           src->storage->device, dst->storage->device);
  for (int i = 0; i < src->ndim; ++i) {
    int d = dst->ndim - src->ndim + i;
    if (d < 0 ? src->sizes[i] != 1 : (src->sizes[i] != 1 && src->sizes[i] != dst->sizes[d]))
      return tpu_status_make(TPU_INVALID_ARGUMENT, "copy_: source shape is not broadcastable "
                             "to the destination shape");
  }
  /* storage-only dtypes: the device copies their bytes; a conversion, conjugation or
   * negation, or a copy within one buffer, is left to the caller (through the host) */
  if ((tpu_dtype_is_storage_only(src->dtype) || tpu_dtype_is_storage_only(dst->dtype)) &&
      (src->dtype != dst->dtype || conj || negate || src->storage == dst->storage))
    return tpu_status_make(TPU_UNIMPLEMENTED, "copy_: %s -> %s%s on tpu goes through the host",
                           tpu_dtype_name(src->dtype), tpu_dtype_name(dst->dtype),
                           conj ? " (conjugated)" : negate ? " (negated)" : "");
  if (tpu_view_numel(dst) == 0) return NULL;
  tpu_node_t* n = tpu__node_create();
  if (!n) return tpu_status_make(TPU_OUT_OF_MEMORY, "host OOM");
  n->kind = TPU_KIND_COPY;
  n->variant = TPU_VARIANT_OUT;
  n->ia[0] = conj && tpu_dtype_is_complex(src->dtype);
  n->ia[1] = negate;
  tpu_status_t st = tpu__node_add_input(n, src);
  if (!st) {
    tpu__node_add_output(n, dst->dtype, dst->ndim, dst->sizes);
    st = tpu_node_bind_output(n, 0, dst);
  }
  if (st) { tpu__node_free(n); return st; }
  return tpu__queue_submit(dst->storage->device, n);
}
