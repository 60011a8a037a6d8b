/* Host kernels of torchvision's detection ops (aten/vision.c has the node layouts).
 * RoIAlign reproduces torchvision's CPU arithmetic in the tensor's dtype T: the box
 * corners, bin sizes and sample coordinates are rounded to T at each step in the same
 * order, each sample's four taps are summed left to right, the samples of a bin in
 * (iy, ix) order, then divided by the count. The backward scatters into each channel
 * plane in torchvision's order (rois, then bins, then samples), so splitting the work by
 * channel gives the serial loop's sums exactly. */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "host/host.h"

static int64_t grain_for(int64_t work_per_unit) {
  return TPU_PARALLEL_MIN_WORK / (work_per_unit > 0 ? work_per_unit : 1) + 1;
}

static tpu_status_t run_units(int64_t units, int64_t work_per_unit, tpu_parallel_fn fn, void* ctx) {
  if (units <= 0) return NULL;
  if (units * (work_per_unit > 0 ? work_per_unit : 1) < TPU_PARALLEL_MIN_WORK) return fn(ctx, 0, units, 0);
  return tpu__parallel_for(units, grain_for(work_per_unit), fn, ctx);
}

/* A dense row-major copy of op in its own dtype, or op itself when already dense. */
static void* dense_in(const tpu_operand_t* op, bool* owned) {
  *owned = false;
  if (tpu__operand_is_contiguous(op)) return tpu__operand_ptr(op);
  *owned = true;
  return tpu__pack_alloc(op, op->dtype);
}

static void* dense_out(tpu_operand_t* op, bool* owned) {
  *owned = false;
  if (tpu__operand_is_contiguous(op)) return tpu__operand_ptr(op);
  *owned = true;
  int64_t n = tpu__operand_numel(op);
  return tpu__malloc((size_t)(n > 0 ? n : 1) * tpu_dtype_size(op->dtype));
}

/* ---- nms ------------------------------------------------------------------------------ */

static tpu_status_t nms_kernel(tpu_node_t* n) {
  const tpu_operand_t *D = &n->in[0], *S = &n->in[1];
  int64_t nb = D->sizes[0], count = n->ia[0];
  if (nb == 0) return NULL;
  bool dow, sow;
  void* d = dense_in(D, &dow);
  void* s = dense_in(S, &sow);
  int64_t* keep = tpu__malloc((size_t)nb * sizeof(int64_t));
  tpu_status_t st = NULL;
  if (!d || !s || !keep) { st = TPU_HOST_NOMEM(); goto done; }
  int64_t kept = tpu__nms_keep(d, s, D->dtype, nb, n->da[0], keep);
  if (kept < 0) st = TPU_HOST_NOMEM();
  else if (kept != count)
    st = tpu_status_make(TPU_INVALID_ARGUMENT, "%s: the boxes changed between building and running the op",
                         tpu__node_describe(n));
  else if (count > 0) tpu__unpack(&n->out[0], keep, TPU_DTYPE_I64);
done:
  if (dow) tpu__free(d);
  if (sow) tpu__free(s);
  tpu__free(keep);
  return st;
}

/* ---- roi_align ------------------------------------------------------------------------ */

typedef struct roi_s {
  const void* x;    /* forward: input (N, C, H, W); backward: grad (K, C, PH, PW) */
  const void* rois; /* K x 5 */
  void* y;          /* forward: (K, C, PH, PW); backward: grad_input (N, C, H, W) */
  int64_t N, C, H, W, K, PH, PW;
  int64_t sr;
  bool aligned;
  double scale;
  tpu_status_t bad; /* set (by thread 0's range or any) when a batch index is out of range */
} roi_t;

/* One roi's geometry in T, as torchvision computes it. Returns false when its batch
 * index is outside [0, N). */
#define DEFINE_ROI(T, S, CEIL)                                                                 \
  typedef struct S##_geom_s { T sh, sw, bh, bw, count; int64_t gh, gw, b; } S##_geom_t;          \
  typedef struct S##_tap_s { int32_t p[4]; T w[4]; } S##_tap_t;                                   \
  static int64_t S##_grid(T extent, int64_t pooled, int64_t sr) {                               \
    if (sr > 0) return sr;                                                                      \
    T g = CEIL(extent / (T)pooled);                                                             \
    if (!(g > 0)) return 0;                                                                     \
    return g > (T)INT_MAX ? INT_MAX : (int64_t)g;                                               \
  }                                                                                             \
  static bool S##_geom(const roi_t* R, const T* r, S##_geom_t* G) {                             \
    T scale = (T)R->scale, off = R->aligned ? (T)0.5 : (T)0;                                    \
    T b = r[0];                                                                                 \
    if (!(b > (T)-1 && b < (T)R->N)) return false; /* truncated toward zero, as (int) */       \
    G->b = (int64_t)b;                                                                          \
    T sw = (T)((T)(r[1] * scale) - off), sh = (T)((T)(r[2] * scale) - off);                     \
    T ew = (T)((T)(r[3] * scale) - off), eh = (T)((T)(r[4] * scale) - off);                     \
    T rw = (T)(ew - sw), rh = (T)(eh - sh);                                                     \
    if (!R->aligned) { rw = rw < (T)1 ? (T)1 : rw; rh = rh < (T)1 ? (T)1 : rh; }                \
    G->sh = sh; G->sw = sw;                                                                     \
    G->bh = (T)(rh / (T)R->PH); G->bw = (T)(rw / (T)R->PW);                                      \
    G->gh = S##_grid(rh, R->PH, R->sr); G->gw = S##_grid(rw, R->PW, R->sr);                     \
    int64_t cnt = G->gh * G->gw;                                                                \
    G->count = (T)(cnt > 1 ? cnt : 1);                                                          \
    return true;                                                                                \
  }                                                                                             \
  /* A sample point's taps (flat offsets in an H x W plane) and weights; false when the      \
   * point lies outside [-1, H] x [-1, W] (or is NaN): then the taps are pixel 0 with weight  \
   * 0, as torchvision's forward reads them (0 * inf there gives NaN, as on CPU). */          \
  static bool S##_taps(const roi_t* R, T y, T x, int32_t* pos, T* w) {                          \
    int64_t H = R->H, W = R->W;                                                                 \
    if (!(y >= -1.0 && y <= (T)H && x >= -1.0 && x <= (T)W)) {                                  \
      for (int q = 0; q < 4; ++q) { pos[q] = 0; w[q] = 0; }                                     \
      return false;                                                                             \
    }                                                                                           \
    if (y <= 0) y = 0;                                                                          \
    if (x <= 0) x = 0;                                                                          \
    int64_t yl = (int64_t)y, xl = (int64_t)x, yh, xh;                                           \
    if (yl >= H - 1) { yh = yl = H - 1; y = (T)yl; } else yh = yl + 1;                          \
    if (xl >= W - 1) { xh = xl = W - 1; x = (T)xl; } else xh = xl + 1;                          \
    T ly = (T)(y - (T)yl), lx = (T)(x - (T)xl);                                                 \
    T hy = (T)(1. - ly), hx = (T)(1. - lx);                                                     \
    w[0] = (T)(hy * hx); w[1] = (T)(hy * lx); w[2] = (T)(ly * hx); w[3] = (T)(ly * lx);         \
    pos[0] = (int32_t)(yl * W + xl); pos[1] = (int32_t)(yl * W + xh);                          \
    pos[2] = (int32_t)(yh * W + xl); pos[3] = (int32_t)(yh * W + xh);                          \
    return true;                                                                                \
  }                                                                                             \
  static T S##_y(const S##_geom_t* G, int64_t p, int64_t i) {                                   \
    return (T)((T)(G->sh + (T)((T)p * G->bh)) +                                                 \
               (T)((T)((T)((T)i + (T)0.5) * G->bh) / (T)G->gh));                                \
  }                                                                                             \
  static T S##_x(const S##_geom_t* G, int64_t p, int64_t i) {                                   \
    return (T)((T)(G->sw + (T)((T)p * G->bw)) +                                                 \
               (T)((T)((T)((T)i + (T)0.5) * G->bw) / (T)G->gw));                                \
  }                                                                                             \
  /* forward: rois [begin, end), all channels */                                              \
  static tpu_status_t S##_roi_fwd(void* ctx, int64_t begin, int64_t end, int tid) {             \
    roi_t* R = ctx;                                                                             \
    const T* x = R->x;                                                                          \
    T* y = R->y;                                                                                \
    int64_t HW = R->H * R->W, bins = R->PH * R->PW;                                             \
    for (int64_t k = begin; k < end; ++k) {                                                     \
      S##_geom_t G;                                                                             \
      if (!S##_geom(R, (const T*)R->rois + 5 * k, &G))                                          \
        return tpu_status_make(TPU_INDEX_ERROR, "roi_align: roi %lld has batch index %g outside [0, %lld)", \
                               (long long)k, (double)((const T*)R->rois)[5 * k], (long long)R->N);  \
      int64_t ns = G.gh * G.gw;                                                                 \
      S##_tap_t* tp = tpu__malloc((size_t)(bins * ns > 0 ? bins * ns : 1) * sizeof(S##_tap_t));  \
      if (!tp) return TPU_HOST_NOMEM();                                                         \
      int64_t s = 0;                                                                            \
      for (int64_t ph = 0; ph < R->PH; ++ph)                                                    \
        for (int64_t pw = 0; pw < R->PW; ++pw)                                                  \
          for (int64_t iy = 0; iy < G.gh; ++iy) {                                               \
            T yy = S##_y(&G, ph, iy);                                                           \
            for (int64_t ix = 0; ix < G.gw; ++ix, ++s)                                          \
              (void)S##_taps(R, yy, S##_x(&G, pw, ix), tp[s].p, tp[s].w);                       \
          }                                                                                     \
      for (int64_t c = 0; c < R->C; ++c) {                                                      \
        const T* plane = x + (G.b * R->C + c) * HW;                                             \
        T* out = y + (k * R->C + c) * bins;                                                     \
        int64_t t = 0;                                                                          \
        for (int64_t bi = 0; bi < bins; ++bi) {                                                 \
          T acc = 0;                                                                            \
          for (int64_t j = 0; j < ns; ++j, ++t) {                                               \
            const int32_t* p = tp[t].p;                                                         \
            const T* q = tp[t].w;                                                               \
            T v = (T)((T)((T)((T)(q[0] * plane[p[0]]) + (T)(q[1] * plane[p[1]])) +              \
                          (T)(q[2] * plane[p[2]])) + (T)(q[3] * plane[p[3]]));                   \
            acc = (T)(acc + v);                                                                 \
          }                                                                                     \
          out[bi] = (T)(acc / G.count);                                                         \
        }                                                                                       \
      }                                                                                         \
      tpu__free(tp);                                                                            \
    }                                                                                           \
    return NULL;                                                                                \
  }                                                                                             \
  /* backward: channels [begin, end), every roi, in torchvision's order per plane */           \
  static tpu_status_t S##_roi_bwd(void* ctx, int64_t begin, int64_t end, int tid) {             \
    roi_t* R = ctx;                                                                             \
    const T* g = R->x;                                                                          \
    T* gi = R->y;                                                                               \
    int64_t HW = R->H * R->W, bins = R->PH * R->PW;                                             \
    for (int64_t c = begin; c < end; ++c) {                                                     \
      for (int64_t k = 0; k < R->K; ++k) {                                                      \
        S##_geom_t G;                                                                           \
        if (!S##_geom(R, (const T*)R->rois + 5 * k, &G))                                        \
          return tpu_status_make(TPU_INDEX_ERROR, "_roi_align_backward: roi %lld has batch index %g outside " \
                                 "[0, %lld)", (long long)k, (double)((const T*)R->rois)[5 * k], (long long)R->N); \
        T cnt = (T)(G.gh * G.gw);                                                               \
        T* plane = gi + (G.b * R->C + c) * HW;                                                  \
        const T* go = g + (k * R->C + c) * bins;                                                \
        for (int64_t ph = 0; ph < R->PH; ++ph)                                                  \
          for (int64_t pw = 0; pw < R->PW; ++pw) {                                              \
            T gb = go[ph * R->PW + pw];                                                         \
            for (int64_t iy = 0; iy < G.gh; ++iy) {                                             \
              T yy = S##_y(&G, ph, iy);                                                         \
              for (int64_t ix = 0; ix < G.gw; ++ix) {                                           \
                int32_t p[4];                                                                   \
                T w[4];                                                                         \
                if (!S##_taps(R, yy, S##_x(&G, pw, ix), p, w)) continue;                        \
                for (int q = 0; q < 4; ++q) plane[p[q]] = (T)(plane[p[q]] + (T)((T)(gb * w[q]) / cnt)); \
              }                                                                                 \
            }                                                                                   \
          }                                                                                     \
      }                                                                                         \
    }                                                                                           \
    return NULL;                                                                                \
  }

DEFINE_ROI(float, f32, ceilf)
DEFINE_ROI(double, f64, ceil)
#undef DEFINE_ROI

static void roi_init(roi_t* R, const tpu_node_t* n, const tpu_operand_t* rois) {
  memset(R, 0, sizeof *R);
  R->K = rois->sizes[0];
  R->PH = n->ia[0];
  R->PW = n->ia[1];
  R->sr = n->ia[2];
  R->aligned = n->ia[3] != 0;
  R->scale = n->da[0];
}

static tpu_status_t roi_align_kernel(tpu_node_t* n) {
  const tpu_operand_t *X = &n->in[0], *RO = &n->in[1];
  tpu_operand_t* Y = &n->out[0];
  if (tpu__operand_numel(Y) == 0) return NULL;
  roi_t R;
  roi_init(&R, n, RO);
  R.N = X->sizes[0]; R.C = X->sizes[1]; R.H = X->sizes[2]; R.W = X->sizes[3];
  bool xo, ro, yo;
  void* x = dense_in(X, &xo);
  void* rois = dense_in(RO, &ro);
  void* y = dense_out(Y, &yo);
  tpu_status_t st = NULL;
  if (!x || !rois || !y) { st = TPU_HOST_NOMEM(); goto done; }
  R.x = x; R.rois = rois; R.y = y;
  int64_t work = R.C * R.PH * R.PW * 4 * (R.sr > 0 ? R.sr * R.sr : 4);
  st = run_units(R.K, work, X->dtype == TPU_DTYPE_F64 ? f64_roi_fwd : f32_roi_fwd, &R);
  if (!st && yo) tpu__unpack(Y, y, Y->dtype);
done:
  if (xo) tpu__free(x);
  if (ro) tpu__free(rois);
  if (yo) tpu__free(y);
  return st;
}

static tpu_status_t roi_align_bwd_kernel(tpu_node_t* n) {
  const tpu_operand_t *GO = &n->in[0], *RO = &n->in[1];
  tpu_operand_t* GI = &n->out[0];
  int64_t total = tpu__operand_numel(GI);
  if (total == 0) return NULL;
  roi_t R;
  roi_init(&R, n, RO);
  R.N = GI->sizes[0]; R.C = GI->sizes[1]; R.H = GI->sizes[2]; R.W = GI->sizes[3];
  bool go_, ro, gio;
  void* go = dense_in(GO, &go_);
  void* rois = dense_in(RO, &ro);
  void* gi = dense_out(GI, &gio);
  tpu_status_t st = NULL;
  if (!go || !rois || !gi) { st = TPU_HOST_NOMEM(); goto done; }
  memset(gi, 0, (size_t)total * tpu_dtype_size(GI->dtype));
  R.x = go; R.rois = rois; R.y = gi;
  if (tpu__operand_numel(GO) > 0) {
    int64_t work = R.K * R.PH * R.PW * 4 * (R.sr > 0 ? R.sr * R.sr : 4);
    st = run_units(R.C, work, GI->dtype == TPU_DTYPE_F64 ? f64_roi_bwd : f32_roi_bwd, &R);
  }
  if (!st && gio) tpu__unpack(GI, gi, GI->dtype);
done:
  if (go_) tpu__free(go);
  if (ro) tpu__free(rois);
  if (gio) tpu__free(gi);
  return st;
}

void tpu__host_register_vision(tpu_host_kernel_fn* table) {
  table[TPU_KIND_NMS] = nms_kernel;
  table[TPU_KIND_ROI_ALIGN] = roi_align_kernel;
  table[TPU_KIND_ROI_ALIGN_BACKWARD] = roi_align_bwd_kernel;
}
