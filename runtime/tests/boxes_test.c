/* Greedy non-maximum suppression (core/boxes.c): visit order by score (stable ties, NaN
 * first), suppression by IoU strictly above the threshold, degenerate boxes, float64, a
 * count-only call, and host OOM reported as -1. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "core/internal.h"

static void test_basic_f32(void) {
  /* 0 and 1 overlap with IoU 81/119 = 0.68; 2 is apart; 3 is inside 2 (IoU 0.25) */
  const float boxes[] = {0, 0, 10, 10, 1, 1, 11, 11, 20, 20, 30, 30, 20, 20, 25, 25};
  const float scores[] = {0.9f, 0.95f, 0.5f, 0.6f};
  int64_t keep[4];
  CHECK(tpu__nms_keep(boxes, scores, TPU_DTYPE_F32, 4, 0.5, keep) == 3);
  CHECK(keep[0] == 1 && keep[1] == 3 && keep[2] == 2);
  /* threshold 0.2: box 2 suppressed by box 3 */
  CHECK(tpu__nms_keep(boxes, scores, TPU_DTYPE_F32, 4, 0.2, keep) == 2);
  CHECK(keep[0] == 1 && keep[1] == 3);
  /* threshold exactly at the IoU keeps (strictly greater suppresses) */
  const float sq[] = {0, 0, 2, 2, 0, 0, 2, 1};
  const float sc[] = {1, 1};
  CHECK(tpu__nms_keep(sq, sc, TPU_DTYPE_F32, 2, 0.5, keep) == 2);
  CHECK(tpu__nms_keep(sq, sc, TPU_DTYPE_F32, 2, 0.49, keep) == 1);
  CHECK(tpu__nms_keep(sq, sc, TPU_DTYPE_F32, 2, 0.49, NULL) == 1);
}

static void test_order_ties_nan(void) {
  const float boxes[] = {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7};
  const float scores[] = {0.5f, NAN, 0.5f, NAN};
  int64_t keep[4];
  CHECK(tpu__nms_keep(boxes, scores, TPU_DTYPE_F32, 4, 0.5, keep) == 4);
  CHECK(keep[0] == 1 && keep[1] == 3 && keep[2] == 0 && keep[3] == 2);
}

static void test_degenerate_f64(void) {
  /* zero-area and inverted boxes: IoU 0/0 is NaN, never above the threshold */
  const double boxes[] = {1, 1, 1, 1, 1, 1, 1, 1, 5, 5, 2, 2, 5, 5, 2, 2};
  const double scores[] = {0.1, 0.2, 0.3, 0.4};
  int64_t keep[4];
  CHECK(tpu__nms_keep(boxes, scores, TPU_DTYPE_F64, 4, 0.0, keep) == 4);
  CHECK(keep[0] == 3 && keep[1] == 2 && keep[2] == 1 && keep[3] == 0);
  CHECK(tpu__nms_keep(boxes, scores, TPU_DTYPE_F64, 0, 0.5, keep) == 0);
}

static void test_oom(void) {
  const float boxes[] = {0, 0, 1, 1};
  const float scores[] = {1};
  int64_t keep[1];
  for (int n = 0; n < 5; ++n) { /* each of its five scratch allocations failing */
    tpu__alloc_fail_after(n);
    CHECK(tpu__nms_keep(boxes, scores, TPU_DTYPE_F32, 1, 0.5, keep) == -1);
  }
  tpu__alloc_fail_after(-1);
  CHECK(tpu__nms_keep(boxes, scores, TPU_DTYPE_F32, 1, 0.5, keep) == 1);
}

int main(void) {
  test_basic_f32();
  test_order_ties_nan();
  test_degenerate_f64();
  test_oom();
  if (check_failures) fprintf(stderr, "boxes_test: %d failure(s)\n", check_failures);
  else printf("boxes_test: ok\n");
  return check_failures != 0;
}
