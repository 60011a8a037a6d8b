/* torchvision's detection ops (registered by the adapter under the torchvision
 * namespace): nms, roi_align and its backward. Builders check arguments as torchvision's
 * CPU kernels do (same messages); float32 and float64 run natively, other dtypes go to
 * the CPU fallback (UNIMPLEMENTED), where torchvision reports what it supports.
 *
 * NMS: in dets (n x 4), scores (n); da[0] iou_threshold; ia[0] kept count (the builder
 *   reads the inputs: a host-read cut point, as nonzero). Output int64 [kept].
 * ROI_ALIGN: in input (N, C, H, W), rois (K x 5: batch index, x1, y1, x2, y2); da[0]
 *   spatial_scale; ia[0..3] pooled_height, pooled_width, sampling_ratio, aligned.
 *   Output (K, C, pooled_height, pooled_width).
 * ROI_ALIGN_BACKWARD: in grad (K, C, ph, pw), rois; da[0], ia[0..3] as forward. Output
 *   grad_input (batch_size, channels, height, width). */
#include <stdio.h>

#include "aten/aten.h"

static bool vision_dtype(tpu_dtype_t t) { return t == TPU_DTYPE_F32 || t == TPU_DTYPE_F64; }

/* nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor */
static tpu_status_t build_nms(tpu_build_t* b) {
  const tpu_view_t *dets, *scores;
  double thr;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &dets));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &scores));
  TPU_RETURN_IF_ERROR(tpu__arg_double(b, 2, &thr));
  if (dets->ndim != 2) return tpu__err(b, TPU_INVALID_ARGUMENT, "boxes should be a 2d tensor, got %dD", dets->ndim);
  if (dets->sizes[1] != 4)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "boxes should have 4 elements in dimension 1, got %lld",
                    (long long)dets->sizes[1]);
  if (scores->ndim != 1)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "scores should be a 1d tensor, got %dD", scores->ndim);
  if (dets->sizes[0] != scores->sizes[0])
    return tpu__err(b, TPU_INVALID_ARGUMENT, "boxes and scores should have same number of elements in dimension 0, "
                    "got %lld and %lld", (long long)dets->sizes[0], (long long)scores->sizes[0]);
  if (!vision_dtype(dets->dtype)) return tpu__err_not_implemented_for(b, "nms_kernel", dets->dtype);
  if (dets->dtype != scores->dtype)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "dets should have the same type as scores");
  int64_t n = dets->sizes[0], kept = 0;
  if (n > 0) {
    size_t es = tpu_dtype_size(dets->dtype);
    uint64_t bytes;
    if (!tpu__mul_ok((uint64_t)n, 5 * es, &bytes)) return tpu__err(b, TPU_INVALID_ARGUMENT, "too many boxes");
    uint8_t* buf = tpu__malloc((size_t)bytes);
    if (!buf) return tpu_status_make(TPU_OUT_OF_MEMORY, "host out of memory");
    tpu_status_t st = tpu_copy_to_host(dets, buf);
    if (!st) st = tpu_copy_to_host(scores, buf + (size_t)n * 4 * es);
    if (st) { tpu__free(buf); return tpu_status_annotate(st, "%s: reading the boxes", b->name); }
    kept = tpu__nms_keep(buf, buf + (size_t)n * 4 * es, dets->dtype, n, thr, NULL);
    tpu__free(buf);
    if (kept < 0) return tpu_status_make(TPU_OUT_OF_MEMORY, "host out of memory");
  }
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, dets));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, scores));
  b->node->kind = TPU_KIND_NMS;
  b->node->compute = dets->dtype;
  b->node->da[0] = thr;
  b->node->ia[0] = kept;
  tpu__node_add_output(b->node, TPU_DTYPE_I64, 1, &kept);
  return NULL;
}

/* The rois argument and the pooling attributes shared by forward and backward. */
static tpu_status_t roi_common(tpu_build_t* b, const tpu_view_t* x, const char* xname, const tpu_view_t* rois,
                               int sr_arg, int al_arg) {
  double scale;
  int64_t ph, pw, sr;
  bool aligned;
  TPU_RETURN_IF_ERROR(tpu__arg_double(b, 2, &scale));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 3, &ph));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 4, &pw));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, sr_arg, &sr));
  TPU_RETURN_IF_ERROR(tpu__arg_bool(b, al_arg, &aligned));
  if (rois->ndim != 2 || rois->sizes[1] != 5)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "rois must have shape as Tensor[K, 5]");
  if (x->ndim != 4) return tpu__err(b, TPU_INVALID_ARGUMENT, "%s should be a 4d tensor, got %dD", xname, x->ndim);
  if (ph < 0 || pw < 0 || ph > INT32_MAX || pw > INT32_MAX)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "invalid output size %lld x %lld", (long long)ph, (long long)pw);
  if (!vision_dtype(x->dtype)) return tpu__err_not_implemented_for(b, "roi_align", x->dtype);
  if (x->dtype != rois->dtype)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s should have the same type as rois", xname);
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, rois));
  n->compute = x->dtype;
  n->da[0] = scale;
  n->ia[0] = ph;
  n->ia[1] = pw;
  n->ia[2] = sr;
  n->ia[3] = aligned;
  return NULL;
}

/* The kernels index a feature plane with 32-bit offsets, as torchvision's do. */
static tpu_status_t plane_ok(tpu_build_t* b, int64_t h, int64_t w) {
  if (h > 0 && w > INT32_MAX / h)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "feature planes of %lld x %lld elements are too large (at most 2^31 - 1)",
                    (long long)h, (long long)w);
  return NULL;
}

/* roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height,
 *           SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor */
static tpu_status_t build_roi_align(tpu_build_t* b) {
  const tpu_view_t *x, *rois;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &rois));
  TPU_RETURN_IF_ERROR(roi_common(b, x, "input", rois, 5, 6));
  TPU_RETURN_IF_ERROR(plane_ok(b, x->sizes[2], x->sizes[3]));
  b->node->kind = TPU_KIND_ROI_ALIGN;
  int64_t shape[4] = {rois->sizes[0], x->sizes[1], b->node->ia[0], b->node->ia[1]};
  tpu__node_add_output(b->node, x->dtype, 4, shape);
  return NULL;
}

/* _roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height,
 *   SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width,
 *   int sampling_ratio, bool aligned) -> Tensor */
static tpu_status_t build_roi_align_backward(tpu_build_t* b) {
  const tpu_view_t *g, *rois;
  int64_t shape[4];
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &g));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &rois));
  for (int i = 0; i < 4; ++i) {
    TPU_RETURN_IF_ERROR(tpu__arg_int(b, 5 + i, &shape[i]));
    if (shape[i] < 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "negative dimension %lld", (long long)shape[i]);
  }
  TPU_RETURN_IF_ERROR(roi_common(b, g, "grad", rois, 9, 10));
  if (g->sizes[0] != rois->sizes[0] || g->sizes[1] != shape[1] || g->sizes[2] != b->node->ia[0] ||
      g->sizes[3] != b->node->ia[1]) {
    char s[256];
    tpu__fmt_shape(s, sizeof s, g->ndim, g->sizes);
    return tpu__err(b, TPU_INVALID_ARGUMENT, "grad of shape %s does not match %lld rois, %lld channels and a "
                    "%lld x %lld output", s, (long long)rois->sizes[0], (long long)shape[1],
                    (long long)b->node->ia[0], (long long)b->node->ia[1]);
  }
  TPU_RETURN_IF_ERROR(plane_ok(b, shape[2], shape[3]));
  b->node->kind = TPU_KIND_ROI_ALIGN_BACKWARD;
  tpu__node_add_output(b->node, g->dtype, 4, shape);
  return NULL;
}

const tpu_aten_entry_t tpu__aten_vision[] = {
    {"torchvision::nms", build_nms, NULL},
    {"torchvision::roi_align", build_roi_align, NULL},
    {"torchvision::_roi_align_backward", build_roi_align_backward, NULL},
    {NULL, NULL, NULL},
};
