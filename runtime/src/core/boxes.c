/* Box algorithms shared by the ATen front end and the drivers: greedy non-maximum
 * suppression (torchvision::nms). The builder needs the number of kept boxes to declare
 * the output (a host-read cut point, like nonzero); the kernel runs it again to write
 * the indices. */
#include <math.h>
#include <string.h>

#include "core/internal.h"

/* true when score a sorts before score b in a descending sort: NaN is the largest value,
 * as in torch.sort. Equal keys keep index order (the merge below is stable). */
static bool desc_before(double a, double b) {
  if (isnan(a)) return !isnan(b);
  return !isnan(b) && a > b;
}

static void merge_sort(int64_t* idx, int64_t* tmp, int64_t n, const double* key) {
  if (n < 2) return;
  int64_t h = n / 2;
  merge_sort(idx, tmp, h, key);
  merge_sort(idx + h, tmp, n - h, key);
  int64_t i = 0, j = h, k = 0;
  while (i < h && j < n) tmp[k++] = desc_before(key[idx[j]], key[idx[i]]) ? idx[j++] : idx[i++];
  while (i < h) tmp[k++] = idx[i++];
  while (j < n) tmp[k++] = idx[j++];
  memcpy(idx, tmp, (size_t)n * sizeof *idx);
}

/* std::max / std::min as torchvision's kernel uses them (first argument on ties and on
 * NaN comparisons) */
#define NMS_MAX(a, b) ((a) < (b) ? (b) : (a))
#define NMS_MIN(a, b) ((b) < (a) ? (b) : (a))

/* The suppression loop in the boxes' dtype T: areas, intersections and the IoU ratio are
 * rounded to T at each step, the ratio compared with the threshold in double. */
#define DEFINE_NMS(T, S)                                                                   \
  static int64_t nms_##S(const T* d, int64_t n, const int64_t* order, double thr,          \
                         uint8_t* supp, T* area, int64_t* keep) {                          \
    for (int64_t i = 0; i < n; ++i) area[i] = (T)((T)(d[4 * i + 2] - d[4 * i]) *           \
                                                  (T)(d[4 * i + 3] - d[4 * i + 1]));       \
    int64_t kept = 0;                                                                      \
    for (int64_t a = 0; a < n; ++a) {                                                      \
      int64_t i = order[a];                                                                \
      if (supp[i]) continue;                                                               \
      if (keep) keep[kept] = i;                                                            \
      ++kept;                                                                              \
      const T *bi = d + 4 * i;                                                             \
      for (int64_t c = a + 1; c < n; ++c) {                                                \
        int64_t j = order[c];                                                              \
        if (supp[j]) continue;                                                             \
        const T* bj = d + 4 * j;                                                           \
        T xx1 = NMS_MAX(bi[0], bj[0]), yy1 = NMS_MAX(bi[1], bj[1]);                        \
        T xx2 = NMS_MIN(bi[2], bj[2]), yy2 = NMS_MIN(bi[3], bj[3]);                        \
        T dw = (T)(xx2 - xx1), dh = (T)(yy2 - yy1);                                        \
        T w = NMS_MAX((T)0, dw), h = NMS_MAX((T)0, dh);                                    \
        T inter = (T)(w * h);                                                              \
        T ovr = (T)(inter / (T)((T)(area[i] + area[j]) - inter));                          \
        if ((double)ovr > thr) supp[j] = 1;                                                \
      }                                                                                    \
    }                                                                                      \
    return kept;                                                                           \
  }

DEFINE_NMS(float, f32)
DEFINE_NMS(double, f64)
#undef DEFINE_NMS

int64_t tpu__nms_keep(const void* boxes, const void* scores, tpu_dtype_t dtype, int64_t n, double thr,
                      int64_t* keep) {
  if (n <= 0) return 0;
  bool f64 = dtype == TPU_DTYPE_F64;
  double* key = tpu__malloc((size_t)n * sizeof(double));
  int64_t* order = tpu__malloc((size_t)n * sizeof(int64_t));
  int64_t* tmp = tpu__malloc((size_t)n * sizeof(int64_t));
  uint8_t* supp = tpu__calloc((size_t)n, 1);
  void* area = tpu__malloc((size_t)n * (f64 ? sizeof(double) : sizeof(float)));
  int64_t kept = -1;
  if (key && order && tmp && supp && area) {
    for (int64_t i = 0; i < n; ++i) {
      key[i] = f64 ? ((const double*)scores)[i] : (double)((const float*)scores)[i];
      order[i] = i;
    }
    merge_sort(order, tmp, n, key);
    kept = f64 ? nms_f64(boxes, n, order, thr, supp, area, keep) : nms_f32(boxes, n, order, thr, supp, area, keep);
  }
  tpu__free(key);
  tpu__free(order);
  tpu__free(tmp);
  tpu__free(supp);
  tpu__free(area);
  return kept;
}
