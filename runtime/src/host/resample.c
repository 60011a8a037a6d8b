/* Resampling kernels: upsampling and 2-d grid sampling, forward and backward.
 *
 * Upsampling is separable: each spatial axis gets a table of source indices and weights
 * per output index (1 tap for nearest, 2 linear, 4 cubic, a variable count for the
 * antialiased filters). The goal is CPU's result bit for bit, so the tables and sums
 * follow ATen's CPU kernels exactly: their precision (float for f32/bf16/f16 and uint8,
 * double for f64, weights rounded to bf16/f16 where ATen stores them in the dtype), their
 * summation order, the kernel ATen picks for a shape (generic or channels-last), and the
 * fused multiply-adds its AVX2/AVX-512 build contracts (see fmadd_f32; where a pattern
 * was not obvious it was found by probing CPU's results, and is marked so). The tests
 * compare with CPU bit for bit where this holds and within tolerance elsewhere.
 *
 * Operands are seen as dense N*C planes (NCHW): an operand that is contiguous in the
 * compute dtype is read or written in place, any other layout (channels-last, bf16) is
 * packed or unpacked once. Forward kernels split the output rows of all planes over the
 * thread pool. Backward kernels accumulate per input plane (f32 for f32/bf16/f16, f64
 * for f64, rounding once on store), visiting output pixels in ATen's order; the pool
 * splits planes, never one plane, so no two threads add into the same element and
 * results do not depend on the thread count. The grid sampler's backward is split the
 * same way (grad_input per plane, grad_grid per grid row); it computes in the tensor's
 * dtype as CPU's does (see DEFINE_GRID). */
#include <math.h>
#include <stdlib.h>

#include "host/host.h"

/* Upsampling modes: must match aten/resample.c. */
enum { UP_NEAREST = 0, UP_NEAREST_EXACT = 1, UP_LINEAR = 2, UP_CUBIC = 3, UP_AA_LINEAR = 4, UP_AA_CUBIC = 5 };
/* Grid sampler modes, as ATen's GridSamplerInterpolation / GridSamplerPadding. */
enum { GS_BILINEAR = 0, GS_NEAREST = 1, GS_BICUBIC = 2 };
enum { GS_ZEROS = 0, GS_BORDER = 1, GS_REFLECTION = 2 };

static size_t cnt1(int64_t n) { return n > 0 ? (size_t)n : 1; }

/* float -> int64 without undefined behaviour: NaN and huge values land far outside every
 * index range (ATen's casts are undefined there; only bounds checks see these values). */
static inline int64_t to_i64(double f) {
  if (f != f) return INT64_MIN / 4;
  if (f >= 4.0e18) return INT64_MAX / 4;
  if (f <= -4.0e18) return INT64_MIN / 4;
  return (int64_t)f;
}

/* ---- dense operands ------------------------------------------------------------------ */

/* A dense row-major view of op in dtype dt: op itself when it already is one, else a
 * packed copy (*owned). NULL on host OOM. */
static void* dense_in(const tpu_operand_t* op, tpu_dtype_t dt, bool* owned) {
  *owned = false;
  if (op->dtype == dt && tpu__operand_is_contiguous(op)) return tpu__operand_ptr(op);
  *owned = true;
  return tpu__pack_alloc(op, dt);
}

/* Where a kernel writes output op densely in dt: op itself, or scratch to unpack. */
static void* dense_out(tpu_operand_t* op, tpu_dtype_t dt, bool* owned) {
  *owned = false;
  if (op->dtype == dt && tpu__operand_is_contiguous(op)) return tpu__operand_ptr(op);
  uint64_t bytes;
  if (!tpu__mul_ok((uint64_t)cnt1(tpu__operand_numel(op)), tpu_dtype_size(dt), &bytes)) return NULL;
  *owned = true;
  return tpu__malloc((size_t)bytes);
}

static int64_t grain_for(int64_t work_per_unit) {
  return TPU_PARALLEL_MIN_WORK / (work_per_unit > 0 ? work_per_unit : 1) + 1;
}

static tpu_status_t run_units(int64_t units, int64_t work_per_unit, tpu_parallel_fn fn, void* ctx) {
  if (units <= 0) return NULL;
  if (units * (work_per_unit > 0 ? work_per_unit : 1) < TPU_PARALLEL_MIN_WORK) return fn(ctx, 0, units, 0);
  return tpu__parallel_for(units, grain_for(work_per_unit), fn, ctx);
}

/* ---- fused multiply-add ---------------------------------------------------------------
 * ATen's CPU kernels are built for AVX2/AVX-512 with floating-point contraction, so a*b+c
 * in their index arithmetic and sums is one fused operation (a single rounding). The same
 * here: for float, the double product of two floats is exact and the double sum rounded to
 * float equals fmaf except in vanishingly rare double-rounding ties; for double the
 * difference of one rounding is far below any f64 tolerance, so it stays unfused. */
static inline float fmadd_f32(float a, float b, float c) { return (float)((double)a * (double)b + (double)c); }
static inline double fmadd_f64(double a, double b, double c) { return a * b + c; }
static inline float fmul_add_f32(float a, float b, float c) { return a * b + c; } /* unfused */

/* Lanes of ATen's Vectorized<float/double> on this machine: its kernels' vector loops
 * decide some summation orders. AVX-512 (the capability ATen picks when the CPU has it,
 * unless ATEN_CPU_CAPABILITY says otherwise) holds 16 floats, AVX2 8. */
static int64_t cpu_vec_lanes(tpu_dtype_t compute) {
  static _Atomic int cached = 0;
  int lanes_f32 = atomic_load(&cached);
  if (!lanes_f32) {
    const char* cap = getenv("ATEN_CPU_CAPABILITY");
    bool avx512 = cap && *cap ? strcmp(cap, "avx512") == 0
                              : __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    lanes_f32 = avx512 ? 16 : 8;
    atomic_store(&cached, lanes_f32);
  }
  return compute == TPU_DTYPE_F64 ? lanes_f32 / 2 : lanes_f32;
}

/* ---- per-axis index and weight tables ------------------------------------------------ */

typedef struct axis_s {
  int64_t in, out;
  int K;           /* taps per output index (the most, for the antialiased filters) */
  int64_t* idx;    /* out*K source indices, in range */
  double* w;       /* out*K weights, exact values of the compute precision */
  float* wf;       /* the same as float (filled by up_finish for the float kernels) */
  int* cnt;        /* out: taps used (K except for the antialiased filters) */
} axis_t;

static void axis_free(axis_t* a) {
  tpu__free(a->idx);
  tpu__free(a->w);
  tpu__free(a->cnt);
  tpu__free(a->wf);
  a->idx = NULL; a->w = NULL; a->cnt = NULL; a->wf = NULL;
}

static bool axis_alloc(axis_t* a, int64_t in, int64_t out, int K) {
  a->in = in; a->out = out; a->K = K;
  a->idx = tpu__calloc(cnt1(out * K), sizeof(int64_t));
  a->w = tpu__calloc(cnt1(out * K), sizeof(double));
  a->cnt = tpu__calloc(cnt1(out), sizeof(int));
  a->wf = tpu__calloc(cnt1(out * K), sizeof(float));
  if (!a->idx || !a->w || !a->cnt || !a->wf) { axis_free(a); return false; }
  return true;
}

/* A spatial axis the op does not have (1-d and 2-d ops run as 3-d): one tap, weight 1. */
static bool axis_unit(axis_t* a) {
  if (!axis_alloc(a, 1, 1, 1)) return false;
  a->w[0] = 1.0;
  a->cnt[0] = 1;
  return true;
}

/* ATen's UpSample.h helpers, instantiated for float (T=float) and double. Casts mirror the
 * C++ expressions (int64 operands convert to T, double literals widen to double). */
#define DEFINE_AXIS_FNS(T, S, FLOOR, CEIL, FABS, MAD)                                         \
  static T S##_scales_value(double s, int64_t in, int64_t out) {                             \
    return s > 0. ? (T)(1.0 / s) : (T)in / (T)out;                                            \
  }                                                                                          \
  static T S##_pixel_scale(int64_t in, int64_t out, bool ac, double s) {                     \
    if (ac) return out > 1 ? (T)(in - 1) / (T)(out - 1) : (T)0;                              \
    return S##_scales_value(s, in, out);                                                     \
  }                                                                                          \
  static T S##_source_index(T scale, int64_t dst, bool ac, bool cubic) {                     \
    if (ac) return scale * (T)dst;                                                           \
    T src = MAD(scale, (T)dst + (T)0.5, (T)-0.5);                                            \
    return (!cubic && src < (T)0) ? (T)0 : src;                                              \
  }                                                                                          \
  /* guard_index_and_lambda: floorf, as ATen writes it, also for double */                   \
  static void S##_guard(T real, int64_t in, int64_t* idx, T* lambda) {                      \
    int64_t i = to_i64(floorf((float)real));                                                 \
    if (i > in - 1) i = in - 1;                                                              \
    *idx = i;                                                                                \
    T l = real - (T)i;                                                                       \
    l = l < (T)0 ? (T)0 : l;                                                                 \
    *lambda = (T)1 < l ? (T)1 : l;                                                           \
  }                                                                                          \
  /* cubic_convolution1/2 as CPU's build contracts them (found by probing its weights) */   \
  static T S##_cc1(T x, T A) { return MAD(A + 2, x, -(A + 3)) * x * x + 1; }                 \
  static T S##_cc2(T x, T A) { return MAD(MAD(A, x, -(5 * A)), x, 8 * A) * x - 4 * A; }       \
  static void S##_cubic_coeffs(T c[4], T t) {                                                \
    T A = (T)-0.75;                                                                          \
    T x1 = t;                                                                                \
    c[0] = S##_cc2((T)(x1 + 1.0), A);                                                        \
    c[1] = S##_cc1(x1, A);                                                                   \
    T x2 = (T)(1.0 - t);                                                                     \
    c[2] = S##_cc1(x2, A);                                                                   \
    c[3] = S##_cc2((T)(x2 + 1.0), A);                                                        \
  }                                                                                          \
  static void S##_axis_linear(axis_t* a, bool ac, double s) {                                \
    T scale = S##_pixel_scale(a->in, a->out, ac, s);                                         \
    for (int64_t o = 0; o < a->out; ++o) {                                                   \
      int64_t i0, i1;                                                                        \
      T l0, l1;                                                                              \
      if (a->in == a->out) {                                                                 \
        i0 = i1 = o; l0 = 1; l1 = 0;                                                         \
      } else {                                                                               \
        S##_guard(S##_source_index(scale, o, ac, false), a->in, &i0, &l1);                   \
        if (i0 < 0) i0 = 0;                                                                  \
        i1 = i0 + (i0 < a->in - 1 ? 1 : 0);                                                  \
        l0 = (T)1 - l1;                                                                      \
      }                                                                                      \
      a->idx[2 * o] = i0; a->idx[2 * o + 1] = i1;                                            \
      a->w[2 * o] = l0; a->w[2 * o + 1] = l1;                                                \
      a->cnt[o] = 2;                                                                         \
    }                                                                                        \
  }                                                                                          \
  static void S##_axis_cubic(axis_t* a, bool ac, double s) {                                 \
    T scale = S##_pixel_scale(a->in, a->out, ac, s);                                         \
    for (int64_t o = 0; o < a->out; ++o) {                                                   \
      int64_t i;                                                                             \
      T t, c[4];                                                                             \
      S##_guard(S##_source_index(scale, o, ac, true), a->in, &i, &t);                        \
      S##_cubic_coeffs(c, t);                                                                \
      for (int j = 0; j < 4; ++j) {                                                          \
        int64_t k = i + j - 1;                                                               \
        a->idx[4 * o + j] = k < 0 ? 0 : k > a->in - 1 ? a->in - 1 : k;                      \
        a->w[4 * o + j] = c[j];                                                              \
      }                                                                                      \
      a->cnt[o] = 4;                                                                         \
    }                                                                                        \
  }                                                                                          \
  /* forward nearest (HelperInterpNearest / HelperInterpNearestExact) */                     \
  static void S##_axis_nearest(axis_t* a, bool exact, double s) {                            \
    T scale = S##_pixel_scale(a->in, a->out, false, s);                                      \
    for (int64_t o = 0; o < a->out; ++o) {                                                   \
      int64_t i;                                                                             \
      if (exact)                                                                             \
        i = to_i64(floorf((float)((double)S##_source_index(scale, o, false, false) + 0.5))); \
      else                                                                                   \
        i = to_i64(floorf((float)S##_source_index(scale, o, true, false)));                  \
      if (i > a->in - 1) i = a->in - 1;                                                      \
      a->idx[o] = i < 0 ? 0 : i;                                                             \
      a->w[o] = 1.0;                                                                         \
      a->cnt[o] = 1;                                                                         \
    }                                                                                        \
  }                                                                                          \
  static T S##_aa_filter(T x, bool cubic) {                                                  \
    x = FABS(x);                                                                             \
    if (!cubic) return x < 1.0 ? (T)(1.0 - x) : (T)0;                                        \
    T A = (T)-0.5; /* contracted fully here, unlike the interpolation weights' helpers */  \
    if (x < 1.0) return MAD(MAD(A + 2, x, -(A + 3)) * x, x, (T)1);                           \
    if (x < 2.0) return MAD(MAD(MAD(A, x, -(5 * A)), x, 8 * A), x, -(4 * A));                \
    return (T)0;                                                                             \
  }                                                                                          \
  /* _compute_indices_min_size_weights_aa */                                                 \
  static bool S##_axis_aa(axis_t* a, int64_t in, int64_t out, bool ac, double s, bool cubic) { \
    int interp = cubic ? 4 : 2;                                                              \
    T scale = S##_pixel_scale(in, out, ac, s);                                               \
    T support = scale >= 1.0 ? (T)((interp * 0.5) * scale) : (T)(interp * 0.5);              \
    int K = (int)CEIL(support) * 2 + 1;                                                      \
    if (!axis_alloc(a, in, out, K)) return false;                                            \
    T invscale = scale >= 1.0 ? (T)(1.0 / scale) : (T)1.0;                                   \
    for (int64_t o = 0; o < out; ++o) {                                                      \
      T center = (T)(scale * (o + 0.5));                                                     \
      int64_t xmin = (int64_t)((double)(center - support) + 0.5);                            \
      if (xmin < 0) xmin = 0;                                                                \
      int64_t xmax = (int64_t)((double)(center + support) + 0.5);                            \
      if (xmax > in) xmax = in;                                                              \
      int64_t xsize = xmax - xmin;                                                           \
      xsize = xsize < 0 ? 0 : xsize > K ? K : xsize;                                         \
      T total = 0;                                                                           \
      double* w = a->w + o * K;                                                              \
      for (int64_t j = 0; j < xsize; ++j) {                                                  \
        T v = S##_aa_filter((T)(((double)((T)(j + xmin) - center) + 0.5) * invscale), cubic); \
        w[j] = v;                                                                            \
        total += v;                                                                          \
      }                                                                                      \
      for (int64_t j = 0; j < K; ++j) {                                                      \
        if (j < xsize && total != 0) w[j] = (T)((T)w[j] / total);                            \
        a->idx[o * K + j] = j < xsize ? xmin + j : (xmin < in ? xmin : in - 1);             \
      }                                                                                      \
      a->cnt[o] = (int)xsize;                                                                \
    }                                                                                        \
    return true;                                                                             \
  }

DEFINE_AXIS_FNS(float, f32, floorf, ceilf, fabsf, fmadd_f32)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function" /* only its cubic table is used */
DEFINE_AXIS_FNS(float, f32u, floorf, ceilf, fabsf, fmul_add_f32)
#pragma GCC diagnostic pop
DEFINE_AXIS_FNS(double, f64, floor, ceil, fabs, fmadd_f64)

/* ATen's nearest_idx / nearest_exact_idx (the backward's, always in float). */
static void axis_nearest_bwd(axis_t* a, bool exact, double s) {
  float scale = f32_scales_value(s, a->in, a->out);
  for (int64_t o = 0; o < a->out; ++o) {
    int64_t i;
    if (!exact && a->out == a->in) i = o;
    else if (!exact && a->out == 2 * a->in) i = o >> 1;
    else if (!exact) i = to_i64(floorf((float)o * scale));
    else i = to_i64(floorf((float)(((double)o + 0.5) * (double)scale)));
    if (i > a->in - 1) i = a->in - 1;
    a->idx[o] = i < 0 ? 0 : i;
    a->w[o] = 1.0;
    a->cnt[o] = 1;
  }
}

/* The three axes (d, h, w) of an UPSAMPLE(_BACKWARD) node; in/out are the full input and
 * output sizes. Returns false on host OOM (axes freed). */
typedef struct up_s {
  axis_t ax[3];
  int64_t P;          /* N*C planes */
  int64_t in[3], out[3];
  int mode;
  bool f64;
} up_t;

static void up_free(up_t* u) {
  for (int k = 0; k < 3; ++k) axis_free(&u->ax[k]);
}

static bool up_tables(up_t* u, const tpu_node_t* n, const int64_t* in_sizes, const int64_t* out_sizes,
                      bool backward, bool f64) {
  memset(u, 0, sizeof *u);
  int sdim = (int)n->ia[1];
  bool ac = n->ia[2] != 0;
  u->mode = (int)n->ia[0];
  u->f64 = f64;
  u->P = in_sizes[0] * in_sizes[1];
  for (int k = 0; k < 3; ++k) {
    int s = k - (3 - sdim); /* spatial index of axis k, < 0 if absent */
    axis_t* a = &u->ax[k];
    if (s < 0) {
      u->in[k] = u->out[k] = 1;
      if (!axis_unit(a)) { up_free(u); return false; }
      continue;
    }
    int64_t in = in_sizes[2 + s], out = out_sizes[2 + s];
    double sc = n->da[s];
    u->in[k] = in;
    u->out[k] = out;
    bool ok = true;
    switch (u->mode) {
      case UP_NEAREST:
      case UP_NEAREST_EXACT:
        ok = axis_alloc(a, in, out, 1);
        if (ok && backward) axis_nearest_bwd(a, u->mode == UP_NEAREST_EXACT, sc);
        else if (ok && f64) f64_axis_nearest(a, u->mode == UP_NEAREST_EXACT, sc);
        else if (ok) f32_axis_nearest(a, u->mode == UP_NEAREST_EXACT, sc);
        break;
      case UP_LINEAR:
        ok = axis_alloc(a, in, out, 2);
        if (ok) { if (f64) f64_axis_linear(a, ac, sc); else f32_axis_linear(a, ac, sc); }
        break;
      case UP_CUBIC:
        ok = axis_alloc(a, in, out, 4);
        /* ATen's bicubic backward lives outside its per-CPU-capability kernels: it is
         * built without contraction, so its weights are too */
        if (ok) {
          if (f64) f64_axis_cubic(a, ac, sc);
          else if (backward) f32u_axis_cubic(a, ac, sc);
          else f32_axis_cubic(a, ac, sc);
        }
        break;
      default: /* antialiased */
        ok = f64 ? f64_axis_aa(a, in, out, ac, sc, u->mode == UP_AA_CUBIC)
                 : f32_axis_aa(a, in, out, ac, sc, u->mode == UP_AA_CUBIC);
        break;
    }
    if (!ok) { up_free(u); return false; }
  }
  return true;
}

/* Float copies of the weights (after any rounding to the dtype) for the float kernels. */
static void up_finish(up_t* u) {
  for (int k = 0; k < 3; ++k)
    for (int64_t j = 0; j < u->ax[k].out * u->ax[k].K; ++j) u->ax[k].wf[j] = (float)u->ax[k].w[j];
}

/* ---- upsampling forward ------------------------------------------------------------- */

typedef struct fwd_s {
  const up_t* u;
  const void* x;
  void* y;
  size_t esz; /* nearest: element size */
  int64_t channels, lanes; /* channels-last linear kernel */
  int sdim;
  /* antialiased passes */
  int64_t in_w, out_w;
  const axis_t* axis;
} fwd_t;

/* Nearest copies elements of any dtype: units are output rows (plane, od, oh). */
static tpu_status_t nearest_rows(void* ctx, int64_t b, int64_t e, int tid) {
  const fwd_t* F = ctx;
  const up_t* u = F->u;
  const axis_t *ad = &u->ax[0], *ah = &u->ax[1], *aw = &u->ax[2];
  int64_t IH = u->in[1], IW = u->in[2], ID = u->in[0], OD = u->out[0], OH = u->out[1], OW = u->out[2];
  size_t esz = F->esz;
  for (int64_t r = b; r < e; ++r) {
    int64_t oh = r % OH, t = r / OH, od = t % OD, p = t / OD;
    const char* src = (const char*)F->x + (size_t)(((p * ID + ad->idx[od]) * IH + ah->idx[oh]) * IW) * esz;
    char* dst = (char*)F->y + (size_t)(r * OW) * esz;
    const int64_t* iw = aw->idx;
    switch (esz) {
      case 1: for (int64_t o = 0; o < OW; ++o) ((uint8_t*)dst)[o] = ((const uint8_t*)src)[iw[o]]; break;
      case 2: for (int64_t o = 0; o < OW; ++o) ((uint16_t*)dst)[o] = ((const uint16_t*)src)[iw[o]]; break;
      case 4: for (int64_t o = 0; o < OW; ++o) ((uint32_t*)dst)[o] = ((const uint32_t*)src)[iw[o]]; break;
      default: for (int64_t o = 0; o < OW; ++o) memcpy(dst + o * esz, src + iw[o] * esz, esz); break;
    }
  }
  return NULL;
}

/* Linear and cubic: ATen's Interpolate nesting, outer axes outermost, each axis summed as
 * t*w0 + t*w1 + ... in the compute type. */
#define DEFINE_INTERP_ROWS(T, S, MAD)                                                         \
  /* one axis of ATen's Interpolate, t0*w0 + t1*w1 + ..., contracted as CPU's build does:   \
   * the first product fused with the second, each later one fused into the sum */          \
  static inline T S##_comb(const T* t, const double* w, int K) {                             \
    if (K == 1) return t[0] * (T)w[0];                                                       \
    T acc = MAD(t[0], (T)w[0], t[1] * (T)w[1]);                                              \
    for (int k = 2; k < K; ++k) acc = MAD(t[k], (T)w[k], acc);                               \
    return acc;                                                                              \
  }                                                                                          \
  static tpu_status_t S##_interp_rows(void* ctx, int64_t b, int64_t e, int tid) {            \
    const fwd_t* F = ctx;                                                                    \
    const up_t* u = F->u;                                                                    \
    const axis_t *ad = &u->ax[0], *ah = &u->ax[1], *aw = &u->ax[2];                          \
    int64_t ID = u->in[0], IH = u->in[1], IW = u->in[2];                                     \
    int64_t OD = u->out[0], OH = u->out[1], OW = u->out[2];                                  \
    const T* x = F->x;                                                                       \
    T* y = F->y;                                                                             \
    int Kd = ad->K, Kh = ah->K, Kw = aw->K;                                                  \
    for (int64_t r = b; r < e; ++r) {                                                        \
      int64_t oh = r % OH, t = r / OH, od = t % OD, p = t / OD;                              \
      const T* xp = x + p * ID * IH * IW;                                                    \
      T* yr = y + r * OW;                                                                    \
      for (int64_t ow = 0; ow < OW; ++ow) {                                                  \
        const int64_t* iw = aw->idx + ow * Kw;                                               \
        const double* ww = aw->w + ow * Kw;                                                  \
        T td[4] = {0};                                                                       \
        for (int kd = 0; kd < Kd; ++kd) {                                                    \
          const T* xd = xp + ad->idx[od * Kd + kd] * IH * IW;                                \
          T th[4] = {0};                                                                     \
          for (int kh = 0; kh < Kh; ++kh) {                                                  \
            const T* xr = xd + ah->idx[oh * Kh + kh] * IW;                                   \
            T tw[4] = {0};                                                                   \
            for (int kw = 0; kw < Kw; ++kw) tw[kw] = xr[iw[kw]];                             \
            th[kh] = S##_comb(tw, ww, Kw);                                                   \
          }                                                                                  \
          td[kd] = S##_comb(th, ah->w + oh * Kh, Kh);                                        \
        }                                                                                    \
        T accd = S##_comb(td, ad->w + od * Kd, Kd);                                          \
        yr[ow] = accd;                                                                       \
      }                                                                                      \
    }                                                                                        \
    return NULL;                                                                             \
  }                                                                                          \
  /* CPU's channels-last linear kernel: per pixel the 2^k corner products with weights     \
   * (d*h)*w, summed left to right in its scalar tail loop (the first product fused with   \
   * the second, the others into the sum) and right to left in its vector loop (channels    \
   * below C - C % lanes), as CPU's build contracts each. Units are output rows. */         \
  static tpu_status_t S##_cl_rows(void* ctx, int64_t b, int64_t e, int tid) {                \
    const fwd_t* F = ctx;                                                                    \
    const up_t* u = F->u;                                                                    \
    const axis_t *ad = &u->ax[0], *ah = &u->ax[1], *aw = &u->ax[2];                          \
    int64_t ID = u->in[0], IH = u->in[1], IW = u->in[2];                                     \
    int64_t OD = u->out[0], OH = u->out[1], OW = u->out[2];                                  \
    int64_t C = F->channels, vec_end = C - C % F->lanes;                                     \
    bool three = F->sdim == 3;                                                               \
    const T* x = F->x;                                                                       \
    T* y = F->y;                                                                             \
    for (int64_t r = b; r < e; ++r) {                                                        \
      int64_t oh = r % OH, t = r / OH, od = t % OD, p = t / OD;                              \
      bool vec = p % C < vec_end;                                                            \
      const T* xp = x + p * ID * IH * IW;                                                    \
      T* yr = y + r * OW;                                                                    \
      T wd[2] = {(T)ad->w[od * 2], (T)ad->w[od * 2 + 1]};                                    \
      T wh[2] = {(T)ah->w[oh * 2], (T)ah->w[oh * 2 + 1]};                                    \
      if (!three) { wd[0] = 1; wd[1] = 0; }                                                  \
      for (int64_t ow = 0; ow < OW; ++ow) {                                                  \
        T ww[2] = {(T)aw->w[ow * 2], (T)aw->w[ow * 2 + 1]};                                  \
        T tv[8], wv[8];                                                                      \
        int n = 0;                                                                           \
        for (int kd = 0; kd < (three ? 2 : 1); ++kd)                                         \
          for (int kh = 0; kh < 2; ++kh)                                                     \
            for (int kw = 0; kw < 2; ++kw) {                                                 \
              int64_t id = three ? ad->idx[od * 2 + kd] : 0;                                 \
              tv[n] = xp[(id * IH + ah->idx[oh * 2 + kh]) * IW + aw->idx[ow * 2 + kw]];      \
              wv[n++] = three ? wd[kd] * wh[kh] * ww[kw] : wh[kh] * ww[kw];                  \
            }                                                                                \
        T acc;                                                                               \
        if (vec) {                                                                           \
          acc = MAD(tv[n - 1], wv[n - 1], tv[n - 2] * wv[n - 2]);                            \
          for (int k = n - 3; k >= 0; --k) acc = MAD(tv[k], wv[k], acc);                     \
        } else {                                                                             \
          acc = MAD(tv[0], wv[0], tv[1] * wv[1]);                                            \
          for (int k = 2; k < n; ++k) acc = MAD(tv[k], wv[k], acc);                          \
        }                                                                                    \
        yr[ow] = acc;                                                                        \
      }                                                                                      \
    }                                                                                        \
    return NULL;                                                                             \
  }                                                                                          \
  /* antialiased horizontal pass: rows of in_w -> rows of out_w. (When downscaling, CPU's  \
   * width pass rounds some outputs one ulp differently: its contraction pattern there     \
   * depends on the tap count and was not pinned down; the height pass matches.) */       \
  static tpu_status_t S##_aa_hrows(void* ctx, int64_t b, int64_t e, int tid) {               \
    const fwd_t* F = ctx;                                                                    \
    const axis_t* a = F->axis;                                                               \
    const T* x = F->x;                                                                       \
    T* y = F->y;                                                                             \
    for (int64_t r = b; r < e; ++r) {                                                        \
      const T* xr = x + r * F->in_w;                                                         \
      T* yr = y + r * F->out_w;                                                              \
      for (int64_t o = 0; o < F->out_w; ++o) {                                               \
        const T* src = xr + a->idx[o * a->K];                                                \
        const double* w = a->w + o * a->K;                                                   \
        int c = a->cnt[o];                                                                   \
        T acc = c ? src[0] * (T)w[0] : (T)0;                                                 \
        for (int j = 1; j < c; ++j) acc = MAD(src[j], (T)w[j], acc);                         \
        yr[o] = acc;                                                                         \
      }                                                                                      \
    }                                                                                        \
    return NULL;                                                                             \
  }                                                                                          \
  /* antialiased vertical pass: units are output rows (plane, oh) of width in_w */           \
  static tpu_status_t S##_aa_vrows(void* ctx, int64_t b, int64_t e, int tid) {               \
    const fwd_t* F = ctx;                                                                    \
    const axis_t* a = F->axis;                                                               \
    const T* x = F->x;                                                                       \
    T* y = F->y;                                                                             \
    int64_t W = F->in_w, IH = a->in, OH = a->out;                                            \
    for (int64_t r = b; r < e; ++r) {                                                        \
      int64_t oh = r % OH, p = r / OH;                                                       \
      const T* src = x + (p * IH + a->idx[oh * a->K]) * W;                                   \
      const double* w = a->w + oh * a->K;                                                    \
      int c = a->cnt[oh];                                                                    \
      T* yr = y + r * W;                                                                     \
      for (int64_t o = 0; o < W; ++o) {                                                      \
        T acc = c ? src[o] * (T)w[0] : (T)0;                                                 \
        for (int j = 1; j < c; ++j) acc = MAD(src[j * W + o], (T)w[j], acc);                 \
        yr[o] = acc;                                                                         \
      }                                                                                      \
    }                                                                                        \
    return NULL;                                                                             \
  }

DEFINE_INTERP_ROWS(float, f32, fmadd_f32)
DEFINE_INTERP_ROWS(double, f64, fmadd_f64)

/* _upsample_{bilinear,bicubic}2d_aa: the width pass, then the height pass (each only if
 * that size changes; a plain copy if neither does), each rounded to the dtype as on CPU. */
static tpu_status_t aa_forward(const up_t* u, const void* x, void* y, tpu_dtype_t cd) {
  size_t csz = tpu_dtype_size(cd);
  int64_t P = u->P, IH = u->in[1], IW = u->in[2], OH = u->out[1], OW = u->out[2];
  bool hpass = IW != OW, vpass = IH != OH;
  if (!hpass && !vpass) {
    memcpy(y, x, (size_t)(P * IH * IW) * csz);
    return NULL;
  }
  fwd_t F = {.u = u};
  void* tmp = NULL;
  tpu_status_t st = NULL;
  const void* src = x;
  if (hpass) {
    void* dst = y;
    if (vpass) {
      tmp = tpu__malloc(cnt1(P * IH * OW) * csz);
      if (!tmp) return TPU_HOST_NOMEM();
      dst = tmp;
    }
    F.x = src; F.y = dst; F.in_w = IW; F.out_w = OW; F.axis = &u->ax[2];
    st = run_units(P * IH, OW * u->ax[2].K, cd == TPU_DTYPE_F64 ? f64_aa_hrows : f32_aa_hrows, &F);
    src = dst;
  }
  if (!st && vpass) {
    F.x = src; F.y = y; F.in_w = OW; F.axis = &u->ax[1];
    st = run_units(P * OH, OW * u->ax[1].K, cd == TPU_DTYPE_F64 ? f64_aa_vrows : f32_aa_vrows, &F);
  }
  tpu__free(tmp);
  return st;
}

/* Float fast paths of the two most common shapes, same arithmetic as f32_interp_rows and
 * f32_cl_rows (checked bit for bit by the tests): 2-d bilinear and bicubic through CPU's
 * generic kernel, 2-d bilinear through its channels-last kernel. Units are output rows.
 * Built twice: with the CPU's fused multiply-add where it has one (same results as the
 * double-based emulation, faster), and portable. */
#define DEFINE_FAST_F32(SUF, ATTR, FMAF)                                                        \
ATTR static tpu_status_t f32_lin2_rows##SUF(void* ctx, int64_t b, int64_t e, int tid) {         \
  const fwd_t* F = ctx;                                                                         \
  const up_t* u = F->u;                                                                         \
  const axis_t *ah = &u->ax[1], *aw = &u->ax[2];                                                \
  int64_t IH = u->in[1], IW = u->in[2], OH = u->out[1], OW = u->out[2];                         \
  const int64_t* iw = aw->idx;                                                                  \
  const float* ww = aw->wf;                                                                     \
  for (int64_t r = b; r < e; ++r) {                                                             \
    int64_t oh = r % OH, p = r / OH;                                                            \
    const float* x0 = (const float*)F->x + (p * IH + ah->idx[2 * oh]) * IW;                     \
    const float* x1 = (const float*)F->x + (p * IH + ah->idx[2 * oh + 1]) * IW;                 \
    float h0 = ah->wf[2 * oh], h1 = ah->wf[2 * oh + 1];                                         \
    float* y = (float*)F->y + r * OW;                                                           \
    for (int64_t o = 0; o < OW; ++o) {                                                          \
      int64_t i0 = iw[2 * o], i1 = iw[2 * o + 1];                                               \
      float w0 = ww[2 * o], w1 = ww[2 * o + 1];                                                 \
      float t0 = FMAF(x0[i0], w0, x0[i1] * w1);                                                 \
      float t1 = FMAF(x1[i0], w0, x1[i1] * w1);                                                 \
      y[o] = FMAF(t0, h0, t1 * h1);                                                             \
    }                                                                                           \
  }                                                                                             \
  return NULL;                                                                                  \
}                                                                                               \
                                                                                                \
ATTR static inline float comb4_f32##SUF(const float* x, const int64_t* i, const float* w) {     \
  float acc = FMAF(x[i[0]], w[0], x[i[1]] * w[1]);                                              \
  acc = FMAF(x[i[2]], w[2], acc);                                                               \
  return FMAF(x[i[3]], w[3], acc);                                                              \
}                                                                                               \
                                                                                                \
ATTR static tpu_status_t f32_cub2_rows##SUF(void* ctx, int64_t b, int64_t e, int tid) {         \
  const fwd_t* F = ctx;                                                                         \
  const up_t* u = F->u;                                                                         \
  const axis_t *ah = &u->ax[1], *aw = &u->ax[2];                                                \
  int64_t IH = u->in[1], IW = u->in[2], OH = u->out[1], OW = u->out[2];                         \
  for (int64_t r = b; r < e; ++r) {                                                             \
    int64_t oh = r % OH, p = r / OH;                                                            \
    const float* xp = (const float*)F->x + p * IH * IW;                                         \
    const float* rows[4];                                                                       \
    for (int k = 0; k < 4; ++k) rows[k] = xp + ah->idx[4 * oh + k] * IW;                        \
    const float* wh = ah->wf + 4 * oh;                                                          \
    float* y = (float*)F->y + r * OW;                                                           \
    for (int64_t o = 0; o < OW; ++o) {                                                          \
      const int64_t* iw = aw->idx + 4 * o;                                                      \
      const float* ww = aw->wf + 4 * o;                                                         \
      float t0 = comb4_f32##SUF(rows[0], iw, ww), t1 = comb4_f32##SUF(rows[1], iw, ww);         \
      float t2 = comb4_f32##SUF(rows[2], iw, ww), t3 = comb4_f32##SUF(rows[3], iw, ww);         \
      float acc = FMAF(t0, wh[0], t1 * wh[1]);                                                  \
      acc = FMAF(t2, wh[2], acc);                                                               \
      y[o] = FMAF(t3, wh[3], acc);                                                              \
    }                                                                                           \
  }                                                                                             \
  return NULL;                                                                                  \
}                                                                                               \
                                                                                                \
ATTR static tpu_status_t f32_cl2_rows##SUF(void* ctx, int64_t b, int64_t e, int tid) {          \
  const fwd_t* F = ctx;                                                                         \
  const up_t* u = F->u;                                                                         \
  const axis_t *ah = &u->ax[1], *aw = &u->ax[2];                                                \
  int64_t IH = u->in[1], IW = u->in[2], OH = u->out[1], OW = u->out[2];                         \
  int64_t C = F->channels, vec_end = C - C % F->lanes;                                          \
  const int64_t* iw = aw->idx;                                                                  \
  const float* ww = aw->wf;                                                                     \
  for (int64_t r = b; r < e; ++r) {                                                             \
    int64_t oh = r % OH, p = r / OH;                                                            \
    bool vec = p % C < vec_end;                                                                 \
    const float* x0 = (const float*)F->x + (p * IH + ah->idx[2 * oh]) * IW;                     \
    const float* x1 = (const float*)F->x + (p * IH + ah->idx[2 * oh + 1]) * IW;                 \
    float h0 = ah->wf[2 * oh], h1 = ah->wf[2 * oh + 1];                                         \
    float* y = (float*)F->y + r * OW;                                                           \
    for (int64_t o = 0; o < OW; ++o) {                                                          \
      int64_t i0 = iw[2 * o], i1 = iw[2 * o + 1];                                               \
      float w0 = ww[2 * o], w1 = ww[2 * o + 1];                                                 \
      float w00 = h0 * w0, w01 = h0 * w1, w10 = h1 * w0, w11 = h1 * w1;                         \
      float acc;                                                                                \
      if (vec) {                                                                                \
        acc = FMAF(x1[i1], w11, x1[i0] * w10);                                                  \
        acc = FMAF(x0[i1], w01, acc);                                                           \
        acc = FMAF(x0[i0], w00, acc);                                                           \
      } else {                                                                                  \
        acc = FMAF(x0[i0], w00, x0[i1] * w01);                                                  \
        acc = FMAF(x1[i0], w10, acc);                                                           \
        acc = FMAF(x1[i1], w11, acc);                                                           \
      }                                                                                         \
      y[o] = acc;                                                                               \
    }                                                                                           \
  }                                                                                             \
  return NULL;                                                                                  \
}                                                                                               \

DEFINE_FAST_F32(_sw, , fmadd_f32)
DEFINE_FAST_F32(_hw, __attribute__((target("fma"))), __builtin_fmaf)

static bool have_fma(void) {
  static _Atomic int cached = -1;
  int v = atomic_load(&cached);
  if (v < 0) atomic_store(&cached, v = __builtin_cpu_supports("fma") ? 1 : 0);
  return v == 1;
}

/* at::Tensor::is_contiguous(ChannelsLast / ChannelsLast3d): strides in (C, W, H, [D,] N)
 * order, size-1 dims ignored. */
static bool is_channels_last(const tpu_operand_t* op) {
  static const int order4[4] = {1, 3, 2, 0}, order5[5] = {1, 4, 3, 2, 0};
  const int* order = op->ndim == 4 ? order4 : op->ndim == 5 ? order5 : NULL;
  if (!order) return false;
  int64_t expected = 1;
  for (int i = 0; i < op->ndim; ++i) {
    int d = order[i];
    if (op->sizes[d] == 1) continue;
    if (op->strides[d] != expected) return false;
    expected *= op->sizes[d];
  }
  return true;
}

/* Whether CPU runs a linear upsample through its channels-last kernel
 * (cpu_upsample_linear_channels_last): bilinear on channels-last input with C > 3 or when
 * out_h + out_w <= 128, trilinear on channels-last-3d input with C > 3. That kernel keeps
 * float weights and sums the 4 (8) corner products per pixel; the generic kernel
 * (upsample_generic_Nd_kernel_impl) nests the axes and stores its weights in the tensor's
 * dtype (rounded for bf16/f16). */
static bool cpu_channels_last_path(const tpu_node_t* n, const tpu_operand_t* X, const tpu_operand_t* Y) {
  int mode = (int)n->ia[0], sdim = (int)n->ia[1];
  if (mode != UP_LINEAR) return false;
  if (sdim == 2) return (is_channels_last(X) && X->sizes[1] > 3) || Y->sizes[2] + Y->sizes[3] <= 128;
  if (sdim == 3) return is_channels_last(X) && X->sizes[1] > 3;
  return false;
}

static bool generic_weights_rounded(const tpu_node_t* n, const tpu_operand_t* X, const tpu_operand_t* Y) {
  if (X->dtype != TPU_DTYPE_BF16 && X->dtype != TPU_DTYPE_F16) return false;
  int mode = (int)n->ia[0];
  return mode == UP_CUBIC || (mode == UP_LINEAR && !cpu_channels_last_path(n, X, Y));
}

/* Weights as the generic kernel stores them: cubic coefficients rounded; linear lambda1
 * rounded and lambda0 = scalar_t(1) - lambda1 in scalar_t arithmetic. */
static void round_weights(up_t* u, tpu_dtype_t dt) {
  for (int k = 0; k < 3; ++k) {
    axis_t* a = &u->ax[k];
    if (a->K == 1) continue;
    for (int64_t o = 0; o < a->out; ++o) {
      double* w = a->w + o * a->K;
      if (u->mode == UP_LINEAR) {
        float l1 = (float)tpu__round_to_dtype((float)w[1], dt);
        w[1] = l1;
        w[0] = (float)tpu__round_to_dtype(1.0f - l1, dt);
      } else {
        for (int j = 0; j < a->K; ++j) w[j] = (float)tpu__round_to_dtype((float)w[j], dt);
      }
    }
  }
}

static tpu_status_t upsample_kernel(tpu_node_t* n) {
  const tpu_operand_t* X = &n->in[0];
  tpu_operand_t* Y = &n->out[0];
  if (tpu__operand_numel(Y) == 0) return NULL;
  int mode = (int)n->ia[0];
  bool nearest = mode == UP_NEAREST || mode == UP_NEAREST_EXACT;
  /* nearest moves elements in the input's own dtype; the rest compute in n->compute */
  tpu_dtype_t cd = nearest ? X->dtype : n->compute;
  up_t u;
  if (!up_tables(&u, n, X->sizes, Y->sizes, false, cd == TPU_DTYPE_F64)) return TPU_HOST_NOMEM();
  if (generic_weights_rounded(n, X, Y)) round_weights(&u, X->dtype);
  up_finish(&u);
  bool xo, yo;
  void* x = dense_in(X, cd, &xo);
  void* y = dense_out(Y, cd, &yo);
  tpu_status_t st = NULL;
  if (!x || !y) { st = TPU_HOST_NOMEM(); goto done; }
  int64_t rows = u.P * u.out[0] * u.out[1];
  fwd_t F = {.u = &u, .x = x, .y = y, .esz = tpu_dtype_size(cd)};
  if (nearest) {
    st = run_units(rows, u.out[2], nearest_rows, &F);
  } else if (cpu_channels_last_path(n, X, Y)) {
    F.channels = X->sizes[1];
    F.lanes = cpu_vec_lanes(cd);
    F.sdim = (int)n->ia[1];
    int64_t taps = (int64_t)u.ax[0].K * u.ax[1].K * u.ax[2].K;
    tpu_parallel_fn fn = cd == TPU_DTYPE_F64 ? f64_cl_rows
                         : F.sdim == 2       ? (have_fma() ? f32_cl2_rows_hw : f32_cl2_rows_sw)
                                             : f32_cl_rows;
    st = run_units(rows, u.out[2] * taps, fn, &F);
  } else if (mode == UP_LINEAR || mode == UP_CUBIC) {
    int64_t taps = (int64_t)u.ax[0].K * u.ax[1].K * u.ax[2].K;
    bool two_d = u.ax[0].K == 1 && u.out[0] == 1;
    tpu_parallel_fn fn = cd == TPU_DTYPE_F64                  ? f64_interp_rows
                         : two_d && mode == UP_LINEAR && u.ax[1].K == 2
                             ? (have_fma() ? f32_lin2_rows_hw : f32_lin2_rows_sw)
                         : two_d && mode == UP_CUBIC ? (have_fma() ? f32_cub2_rows_hw : f32_cub2_rows_sw)
                                                     : f32_interp_rows;
    st = run_units(rows, u.out[2] * taps, fn, &F);
  } else {
    st = aa_forward(&u, x, y, cd);
  }
  if (!st && yo) tpu__unpack(Y, y, cd);
done:
  if (xo) tpu__free(x);
  if (yo) tpu__free(y);
  up_free(&u);
  return st;
}

/* ---- upsampling backward ------------------------------------------------------------ */

typedef struct bwd_s {
  const up_t* u;
  const void* go;
  void* gi;
} bwd_t;

/* Units are planes. Per plane the output pixels are visited in order and each scatters
 * into its taps: ((wd*wh)*ww)*g for nearest, linear and antialiased (h outer, w inner, as
 * ATen's linear and _aa backward kernels), (g*wh)*ww with w outer for cubic (ATen's
 * upsample_bicubic2d_backward). */
#define DEFINE_BWD_PLANES(T, S, MAD)                                                          \
  static tpu_status_t S##_bwd_planes(void* ctx, int64_t b, int64_t e, int tid) {             \
    const bwd_t* B = ctx;                                                                    \
    const up_t* u = B->u;                                                                    \
    const axis_t *ad = &u->ax[0], *ah = &u->ax[1], *aw = &u->ax[2];                          \
    int64_t ID = u->in[0], IH = u->in[1], IW = u->in[2];                                     \
    int64_t OD = u->out[0], OH = u->out[1], OW = u->out[2];                                  \
    int64_t isz = ID * IH * IW, osz = OD * OH * OW;                                          \
    bool cubic = u->mode == UP_CUBIC;                                                        \
    for (int64_t p = b; p < e; ++p) {                                                        \
      T* gi = (T*)B->gi + p * isz;                                                           \
      const T* go = (const T*)B->go + p * osz;                                               \
      memset(gi, 0, sizeof(T) * (size_t)isz);                                                \
      for (int64_t od = 0; od < OD; ++od)                                                    \
        for (int64_t oh = 0; oh < OH; ++oh) {                                                \
          const T* gr = go + (od * OH + oh) * OW;                                            \
          for (int64_t ow = 0; ow < OW; ++ow) {                                              \
            T g = gr[ow];                                                                    \
            const int64_t* iw = aw->idx + ow * aw->K;                                        \
            const double* ww = aw->w + ow * aw->K;                                           \
            int cw = aw->cnt[ow];                                                            \
            for (int kd = 0; kd < ad->cnt[od]; ++kd) {                                       \
              T wd = (T)ad->w[od * ad->K + kd];                                              \
              T* gd = gi + ad->idx[od * ad->K + kd] * IH * IW;                               \
              int ch = ah->cnt[oh];                                                          \
              const int64_t* ih = ah->idx + oh * ah->K;                                      \
              const double* wh = ah->w + oh * ah->K;                                         \
              if (cubic) {                                                                   \
                for (int kw = 0; kw < cw; ++kw)                                              \
                  for (int kh = 0; kh < ch; ++kh)                                            \
                    gd[ih[kh] * IW + iw[kw]] += (g * (T)wh[kh]) * (T)ww[kw];                 \
              } else {                                                                       \
                for (int kh = 0; kh < ch; ++kh) {                                            \
                  T wdh = wd * (T)wh[kh];                                                    \
                  T* grow = gd + ih[kh] * IW;                                                \
                  for (int kw = 0; kw < cw; ++kw)                                            \
                    grow[iw[kw]] = MAD(wdh * (T)ww[kw], g, grow[iw[kw]]);                    \
                }                                                                            \
              }                                                                              \
            }                                                                                \
          }                                                                                  \
        }                                                                                    \
    }                                                                                        \
    return NULL;                                                                             \
  }

DEFINE_BWD_PLANES(float, f32, fmadd_f32)
DEFINE_BWD_PLANES(double, f64, fmadd_f64)

static tpu_status_t upsample_bwd_kernel(tpu_node_t* n) {
  const tpu_operand_t* GO = &n->in[0];
  tpu_operand_t* GI = &n->out[0];
  if (tpu__operand_numel(GI) == 0) return NULL;
  tpu_dtype_t cd = n->compute;
  up_t u;
  if (!up_tables(&u, n, GI->sizes, GO->sizes, true, cd == TPU_DTYPE_F64)) return TPU_HOST_NOMEM();
  bool goo = false, gio;
  void* go = tpu__operand_numel(GO) ? dense_in(GO, cd, &goo) : NULL;
  void* gi = dense_out(GI, cd, &gio);
  tpu_status_t st = NULL;
  if (!gi || (tpu__operand_numel(GO) && !go)) { st = TPU_HOST_NOMEM(); goto done; }
  if (!go) {
    memset(gi, 0, (size_t)tpu__operand_numel(GI) * tpu_dtype_size(cd));
  } else {
    bwd_t B = {.u = &u, .go = go, .gi = gi};
    int64_t taps = (int64_t)u.ax[0].K * u.ax[1].K * u.ax[2].K;
    int64_t per_plane = u.out[0] * u.out[1] * u.out[2] * taps + u.in[0] * u.in[1] * u.in[2];
    st = run_units(u.P, per_plane, cd == TPU_DTYPE_F64 ? f64_bwd_planes : f32_bwd_planes, &B);
  }
  if (!st && gio) tpu__unpack(GI, gi, cd);
done:
  if (goo) tpu__free(go);
  if (gio) tpu__free(gi);
  up_free(&u);
  return st;
}

/* ---- grid sampler 2-d ---------------------------------------------------------------- */

typedef struct gs_s {
  const void *x, *grid, *go;
  void *y, *gi, *gg;
  void* coords;   /* backward: per grid point ix, iy, gix_mult, giy_mult */
  int64_t N, C, H, W, OH, OW;
  int interp, pad;
  bool ac;
  int64_t lanes;  /* backward: points per chunk of ATen's vectorized kernel */
  int64_t* toff;  /* backward: per point ntaps tap offsets, and 8 tap weights in tw */
  void* tw;
  int ntaps;
} gs_t;

/* The arithmetic of ATen's CPU grid sampler (cpu/GridSamplerKernel.cpp, the vectorized
 * kernel CPU runs for every dtype), in scalar_t. T is the type the kernel computes in
 * (float or double) and R(x) rounds a result to scalar_t: identity for f32/f64; for
 * bf16/f16 it rounds after every operation, as Vectorized<BFloat16/Half> arithmetic does
 * on CPU (which computes in the tensor's own dtype: a more precise native result would
 * not compare within the reduced dtype's tolerance). Integers converted to scalar_t
 * round too (S##_I). Out-of-bounds taps read 0 and are summed like the others, as the
 * masked gathers do. */
#define DEFINE_GRID(T, S, R, FLOOR, FABS, TRUNC, NEARBYINT, FMA_, ATTR)                                 \
  ATTR static inline T S##_I(int64_t n) { return R((T)n); }                                       \
  ATTR static inline T S##_min(T a, T b) { return (a != a || b != b) ? a + b : (a < b ? a : b); } \
  /* ComputeLocationBase<scalar_t, align_corners> + the padding mode */                      \
  typedef struct S##_loc_s {                                                                 \
    T max_val, sf, low, ts;                                                                  \
    bool empty, ac;                                                                          \
    int pad;                                                                                 \
  } S##_loc_t;                                                                               \
  ATTR static S##_loc_t S##_loc(int64_t size, int pad, bool ac) {                                 \
    S##_loc_t L;                                                                             \
    L.max_val = S##_I(size - 1);                                                             \
    L.sf = ac ? R(S##_I(size - 1) / 2) : R(S##_I(size) / 2);                                 \
    L.low = ac ? (T)0 : (T)-0.5;                                                             \
    L.ts = ac ? R(S##_I(size - 1) * 2) : R(S##_I(size) * 2);                                 \
    L.empty = ac ? size <= 1 : size <= 0;                                                    \
    L.ac = ac;                                                                               \
    L.pad = pad;                                                                             \
    return L;                                                                                \
  }                                                                                          \
  ATTR static T S##_unnorm(const S##_loc_t* L, T in) {                                            \
    return L->ac ? R(R(in + 1) * L->sf) : FMA_(R(in + 1), L->sf, (T)-0.5);                  \
  }                                                                                          \
  /* clamp_max(max_val, clamp_min(0, in)): NaN clamps to 0 */                                \
  ATTR static T S##_clip(const S##_loc_t* L, T in) {                                              \
    T v = in > (T)0 ? in : (T)0;                                                             \
    return v < L->max_val ? v : L->max_val;                                                  \
  }                                                                                          \
  ATTR static T S##_clip_grad(const S##_loc_t* L, T in, bool* inb) {                              \
    T lo = in != in ? in : (in > (T)0 ? in : (T)0);                                          \
    T res = S##_min(lo, L->max_val);                                                         \
    *inb = (lo != (T)0 || lo != lo) && (res != L->max_val || res != res);                    \
    return res;                                                                              \
  }                                                                                          \
  ATTR static T S##_reflect(const S##_loc_t* L, T in) {                                           \
    if (L->empty) return 0;                                                                  \
    T a = L->ac ? FABS(in) : FABS(R(in - L->low));                                           \
    T flips = TRUNC(R(a / L->ts));                                                           \
    T extra = FMA_(-flips, L->ts, a);                                                        \
    T r = S##_min(extra, R(L->ts - extra));                                                  \
    return L->ac ? r : R(r + L->low);                                                        \
  }                                                                                          \
  ATTR static T S##_reflect_grad(const S##_loc_t* L, T in, T* g) {                                \
    if (L->empty) { *g = 0; return 0; }                                                      \
    T iml = L->ac ? in : R(in - L->low);                                                     \
    bool neg = iml < (T)0;                                                                   \
    T a = FABS(iml);                                                                         \
    T flips = TRUNC(R(a / L->ts));                                                           \
    T extra = FMA_(-flips, L->ts, a);                                                        \
    T rex = R(L->ts - extra);                                                                \
    bool more = extra > rex;                                                                 \
    *g = (more != neg) ? (T)-1 : (T)1;                                                       \
    T r = more ? rex : extra;                                                                \
    return L->ac ? r : R(r + L->low);                                                        \
  }                                                                                          \
  ATTR static T S##_coords(const S##_loc_t* L, T in) {                                            \
    if (L->pad == GS_BORDER) return S##_clip(L, in);                                         \
    if (L->pad == GS_REFLECTION) return S##_clip(L, S##_reflect(L, in));                     \
    return in;                                                                               \
  }                                                                                          \
  ATTR static T S##_apply(const S##_loc_t* L, T in) { return S##_coords(L, S##_unnorm(L, in)); }  \
  ATTR static T S##_apply_grad(const S##_loc_t* L, T in, T* g) {                                 \
    T u = S##_unnorm(L, in);                                                                 \
    bool inb;                                                                                \
    if (L->pad == GS_BORDER) {                                                               \
      T r = S##_clip_grad(L, u, &inb);                                                       \
      *g = inb ? L->sf : (T)0;                                                               \
      return r;                                                                              \
    }                                                                                        \
    if (L->pad == GS_REFLECTION) {                                                           \
      T gr;                                                                                  \
      T r = S##_reflect_grad(L, u, &gr);                                                     \
      T gg = R(gr * L->sf);                                                                  \
      r = S##_clip_grad(L, r, &inb);                                                         \
      *g = inb ? gg : (T)0;                                                                  \
      return r;                                                                              \
    }                                                                                        \
    *g = L->sf;                                                                              \
    return u;                                                                                \
  }                                                                                          \
  /* element offset of tap (x, y) after padding, or -1 outside (get/add_value_bounded) */    \
  ATTR static int64_t S##_tap(const S##_loc_t* LW, const S##_loc_t* LH, T x, T y, int64_t H, int64_t W) { \
    int64_t ix = to_i64(S##_coords(LW, x)), iy = to_i64(S##_coords(LH, y));                  \
    return (ix > -1 && ix < W && iy > -1 && iy < H) ? iy * W + ix : -1;                      \
  }                                                                                          \
  ATTR static void S##_cubic(T c[4], T tx) {                                                      \
    T A = (T)-0.75, x;                                                                       \
    T a5 = R(5 * A), a8 = R(8 * A), a4 = R(4 * A), a2 = R(A + 2), a3 = R(A + 3);             \
    x = R(tx + 1);                                                                           \
    /* the outer taps unfused, the inner ones fused: as CPU's build has it (probed) */     \
    c[0] = R(R(R(R(R(R(A * x) - a5) * x) + a8) * x) - a4);                                   \
    x = tx;                                                                                  \
    c[1] = FMA_(R(FMA_(a2, x, -a3) * x), x, (T)1);                                           \
    x = R(1 - tx);                                                                           \
    c[2] = FMA_(R(FMA_(a2, x, -a3) * x), x, (T)1);                                           \
    x = R(2 - tx);                                                                           \
    c[3] = R(R(R(R(R(R(A * x) - a5) * x) + a8) * x) - a4);                                   \
  }                                                                                          \
  ATTR static void S##_cubic_grad(T c[4], T tx) {                                                 \
    T A = (T)-0.75, x;                                                                       \
    T a2 = R(A + 2), a3 = R(A + 3);                                                          \
    x = R(-1 - tx);                                                                          \
    c[0] = R(R(R(R(R(-3 * A) * x) - R(10 * A)) * x) - R(8 * A));                             \
    x = R(0 - tx);                                                                           \
    c[1] = R(R(R(R(-3 * a2) * x) - R(2 * a3)) * x);                                          \
    x = R(1 - tx);                                                                           \
    c[2] = R(R(R(R(3 * a2) * x) - R(2 * a3)) * x);                                           \
    x = R(2 - tx);                                                                           \
    c[3] = R(R(R(R(R(3 * A) * x) - R(10 * A)) * x) + R(8 * A));                              \
  }                                                                                          \
  /* a0*b0 + a1*b1 + a2*b2 + a3*b3, left to right, each later product fused into the sum  \
   * (as CPU's build contracts its vector expression) */                                    \
  ATTR static inline T S##_dot4(const T a[4], const T b[4]) {                                     \
    return FMA_(a[3], b[3], FMA_(a[2], b[2], FMA_(a[1], b[1], R(a[0] * b[0]))));             \
  }                                                                                          \
  /* bicubic's four taps along x: only the first two products fused (probed) */            \
  ATTR static inline T S##_row4(const T c[4], const T v[4]) {                                     \
    return R(R(FMA_(c[0], v[0], R(c[1] * v[1])) + R(c[2] * v[2])) + R(c[3] * v[3]));         \
  }                                                                                          \
  /* compute_interp_params: corner offsets (-1 outside) and the weights nw, ne, sw, se */    \
  typedef struct S##_bl_s { int64_t off[4]; T n, s, w, e, wt[4]; } S##_bl_t;                 \
  ATTR static void S##_bilinear(T x, T y, int64_t H, int64_t W, S##_bl_t* B) {                   \
    T xw = FLOOR(x), yn = FLOOR(y);                                                          \
    B->w = R(x - xw); B->e = R(1 - B->w);                                                    \
    B->n = R(y - yn); B->s = R(1 - B->n);                                                    \
    B->wt[0] = R(B->s * B->e); B->wt[1] = R(B->s * B->w);                                    \
    B->wt[2] = R(B->n * B->e); B->wt[3] = R(B->n * B->w);                                    \
    int64_t x0 = to_i64(xw), y0 = to_i64(yn);                                                \
    for (int k = 0; k < 4; ++k) {                                                            \
      int64_t xx = x0 + (k & 1), yy = y0 + (k >> 1);                                         \
      B->off[k] = (xx > -1 && xx < W && yy > -1 && yy < H) ? yy * W + xx : -1;               \
    }                                                                                        \
  }                                                                                          \
  /* forward: units are output rows (n, oh); every channel of each point */                  \
  ATTR static tpu_status_t S##_gs_rows(void* ctx, int64_t b, int64_t e, int tid) {                \
    const gs_t* G = ctx;                                                                     \
    int64_t C = G->C, H = G->H, W = G->W, OH = G->OH, OW = G->OW, HW = H * W;                \
    S##_loc_t LW = S##_loc(W, G->pad, G->ac), LH = S##_loc(H, G->pad, G->ac);                \
    const T* grid = G->grid;                                                                 \
    for (int64_t r = b; r < e; ++r) {                                                        \
      int64_t n = r / OH, oh = r % OH;                                                       \
      const T* xn = (const T*)G->x + n * C * HW;                                             \
      T* yn = (T*)G->y + n * C * OH * OW + oh * OW;                                          \
      for (int64_t ow = 0; ow < OW; ++ow) {                                                  \
        const T* gp = grid + ((n * OH + oh) * OW + ow) * 2;                                  \
        T* yo = yn + ow;                                                                     \
        if (G->interp == GS_BICUBIC) {                                                       \
          T x = S##_unnorm(&LW, gp[0]), y = S##_unnorm(&LH, gp[1]);                          \
          T ix = FLOOR(x), iy = FLOOR(y), cx[4], cy[4];                                      \
          S##_cubic(cx, R(x - ix));                                                          \
          S##_cubic(cy, R(y - iy));                                                          \
          int64_t off[4][4];                                                                 \
          for (int i = 0; i < 4; ++i)                                                        \
            for (int k = 0; k < 4; ++k)                                                      \
              off[i][k] = S##_tap(&LW, &LH, R(ix + (T)(k - 1)), R(iy + (T)(i - 1)), H, W);   \
          for (int64_t c = 0; c < C; ++c) {                                                  \
            const T* xc = xn + c * HW;                                                       \
            T rows[4];                                                                       \
            for (int i = 0; i < 4; ++i) {                                                    \
              T v[4];                                                                        \
              for (int k = 0; k < 4; ++k) v[k] = off[i][k] >= 0 ? xc[off[i][k]] : (T)0;      \
              rows[i] = S##_row4(cx, v);                                                     \
            }                                                                                \
            yo[c * OH * OW] = S##_dot4(cy, rows);                                            \
          }                                                                                  \
          continue;                                                                          \
        }                                                                                    \
        T x = S##_apply(&LW, gp[0]), y = S##_apply(&LH, gp[1]);                              \
        if (G->interp == GS_NEAREST) {                                                       \
          int64_t xi = to_i64(NEARBYINT(x)), yi = to_i64(NEARBYINT(y));                      \
          bool in = xi > -1 && xi < W && yi > -1 && yi < H;                                  \
          int64_t o = in ? yi * W + xi : 0;                                                  \
          for (int64_t c = 0; c < C; ++c) yo[c * OH * OW] = in ? xn[c * HW + o] : (T)0;      \
          continue;                                                                          \
        }                                                                                    \
        S##_bl_t B;                                                                          \
        S##_bilinear(x, y, H, W, &B);                                                        \
        for (int64_t c = 0; c < C; ++c) {                                                    \
          const T* xc = xn + c * HW;                                                         \
          T v[4];                                                                            \
          for (int k = 0; k < 4; ++k) v[k] = B.off[k] >= 0 ? xc[B.off[k]] : (T)0;            \
          yo[c * OH * OW] = S##_dot4(v, B.wt);                                               \
        }                                                                                    \
      }                                                                                      \
    }                                                                                        \
    return NULL;                                                                             \
  }                                                                                          \
  /* backward, step 1: per grid point the source coordinates and their multipliers, and    \
   * the taps grad_input scatters to: G->ntaps element offsets (-1 outside) and weights    \
   * (bilinear: the 4 corner weights; bicubic: cx[4], cy[4]). */                            \
  ATTR static tpu_status_t S##_gs_coords(void* ctx, int64_t b, int64_t e, int tid) {              \
    const gs_t* G = ctx;                                                                     \
    S##_loc_t LW = S##_loc(G->W, G->pad, G->ac), LH = S##_loc(G->H, G->pad, G->ac);          \
    const T* grid = G->grid;                                                                 \
    T* cc = G->coords;                                                                       \
    int64_t H = G->H, W = G->W;                                                              \
    for (int64_t i = b; i < e; ++i) {                                                        \
      T gx = grid[2 * i], gy = grid[2 * i + 1], mx = 0, my = 0, x, y;                        \
      int64_t* off = G->toff + i * G->ntaps;                                                 \
      T* tw = (T*)G->tw + i * 8;                                                             \
      if (G->interp == GS_BICUBIC) {                                                         \
        x = S##_unnorm(&LW, gx); y = S##_unnorm(&LH, gy); mx = LW.sf; my = LH.sf;            \
        T ix = FLOOR(x), iy = FLOOR(y);                                                      \
        S##_cubic(tw, R(x - ix));                                                            \
        S##_cubic(tw + 4, R(y - iy));                                                        \
        for (int k = 0; k < 16; ++k)                                                         \
          off[k] = S##_tap(&LW, &LH, R(ix + (T)(k / 4 - 1)), R(iy + (T)(k % 4 - 1)), H, W);  \
      } else if (G->interp == GS_NEAREST) {                                                  \
        x = S##_apply(&LW, gx); y = S##_apply(&LH, gy);                                      \
        int64_t xi = to_i64(NEARBYINT(x)), yi = to_i64(NEARBYINT(y));                        \
        off[0] = xi > -1 && xi < W && yi > -1 && yi < H ? yi * W + xi : -1;                  \
      } else {                                                                               \
        x = S##_apply_grad(&LW, gx, &mx); y = S##_apply_grad(&LH, gy, &my);                  \
        S##_bl_t B;                                                                          \
        S##_bilinear(x, y, H, W, &B);                                                        \
        for (int k = 0; k < 4; ++k) { off[k] = B.off[k]; tw[k] = B.wt[k]; }                  \
      }                                                                                      \
      cc[4 * i] = x; cc[4 * i + 1] = y; cc[4 * i + 2] = mx; cc[4 * i + 3] = my;              \
    }                                                                                        \
    return NULL;                                                                             \
  }                                                                                          \
  /* backward, step 2: grad_input, units are planes (n, c). ATen's vectorized kernel       \
   * visits the points in chunks of V lanes, each tap for all lanes of a chunk before the  \
   * next tap: the same order here (it decides the rounding of colliding adds, which       \
   * matters most for bf16/f16 accumulators). */                                            \
  ATTR static tpu_status_t S##_gs_gi_planes(void* ctx, int64_t b, int64_t e, int tid) {           \
    const gs_t* G = ctx;                                                                     \
    int64_t C = G->C, HW = G->H * G->W, P = G->OH * G->OW, V = G->lanes;                     \
    int nt = G->ntaps;                                                                       \
    for (int64_t pl = b; pl < e; ++pl) {                                                     \
      int64_t n = pl / C;                                                                    \
      T* gi = (T*)G->gi + pl * HW;                                                           \
      const T* go = (const T*)G->go + pl * P;                                                \
      const int64_t* offn = G->toff + n * P * nt;                                            \
      const T* twn = (const T*)G->tw + n * P * 8;                                            \
      memset(gi, 0, sizeof(T) * (size_t)HW);                                                 \
      for (int64_t q0 = 0; q0 < P; q0 += V) {                                                \
        int64_t q1 = q0 + V < P ? q0 + V : P;                                                \
        for (int k = 0; k < nt; ++k)                                                         \
          for (int64_t q = q0; q < q1; ++q) {                                                \
            int64_t o = offn[q * nt + k];                                                    \
            if (o < 0) continue;                                                             \
            T g = go[q];                                                                     \
            const T* w = twn + q * 8;                                                        \
            T delta = nt == 4 ? R(g * w[k]) : nt == 1 ? g : R(R(g * w[k / 4]) * w[4 + k % 4]); \
            gi[o] = R(gi[o] + delta);                                                        \
          }                                                                                  \
      }                                                                                      \
    }                                                                                        \
    return NULL;                                                                             \
  }                                                                                          \
  /* backward, step 3: grad_grid, units are grid rows (n, oh), channels summed in order */   \
  ATTR static tpu_status_t S##_gs_gg_rows(void* ctx, int64_t b, int64_t e, int tid) {             \
    const gs_t* G = ctx;                                                                     \
    int64_t C = G->C, H = G->H, W = G->W, HW = H * W, OH = G->OH, OW = G->OW, P = OH * OW;   \
    S##_loc_t LW = S##_loc(W, G->pad, G->ac), LH = S##_loc(H, G->pad, G->ac);                \
    const T* cc = G->coords;                                                                 \
    T* gg = G->gg;                                                                           \
    for (int64_t r = b; r < e; ++r) {                                                        \
      int64_t n = r / OH;                                                                    \
      const T* xn = (const T*)G->x + n * C * HW;                                             \
      const T* gon = (const T*)G->go + n * C * P;                                            \
      for (int64_t q = (r % OH) * OW; q < (r % OH + 1) * OW; ++q) {                          \
        const T* cq = cc + (n * P + q) * 4;                                                  \
        T x = cq[0], y = cq[1], gx = 0, gy = 0;                                              \
        T* out = gg + (n * P + q) * 2;                                                       \
        if (G->interp == GS_NEAREST) { out[0] = 0; out[1] = 0; continue; }                   \
        if (G->interp == GS_BILINEAR) {                                                      \
          S##_bl_t B;                                                                        \
          S##_bilinear(x, y, H, W, &B);                                                      \
          for (int64_t c = 0; c < C; ++c) {                                                  \
            const T* xc = xn + c * HW;                                                       \
            T g = gon[c * P + q], v[4];                                                      \
            for (int k = 0; k < 4; ++k) v[k] = B.off[k] >= 0 ? xc[B.off[k]] : (T)0;          \
            gx = FMA_(FMA_(R(v[3] - v[2]), B.n, R(R(v[1] - v[0]) * B.s)), g, gx);            \
            gy = FMA_(FMA_(R(v[3] - v[1]), B.w, R(R(v[2] - v[0]) * B.e)), g, gy);            \
          }                                                                                  \
        } else {                                                                             \
          T ix = FLOOR(x), iy = FLOOR(y), cx[4], cy[4], dx[4], dy[4];                        \
          S##_cubic(cx, R(x - ix));                                                          \
          S##_cubic(cy, R(y - iy));                                                          \
          S##_cubic_grad(dx, R(x - ix));                                                     \
          S##_cubic_grad(dy, R(y - iy));                                                     \
          int64_t off[4][4];                                                                 \
          for (int i = 0; i < 4; ++i)                                                        \
            for (int j = 0; j < 4; ++j)                                                      \
              off[i][j] = S##_tap(&LW, &LH, R(ix + (T)(i - 1)), R(iy + (T)(j - 1)), H, W);   \
          for (int64_t c = 0; c < C; ++c) {                                                  \
            const T* xc = xn + c * HW;                                                       \
            T g = gon[c * P + q];                                                            \
            for (int i = 0; i < 4; ++i)                                                      \
              for (int j = 0; j < 4; ++j) {                                                  \
                T vg = R((off[i][j] >= 0 ? xc[off[i][j]] : (T)0) * g);                       \
                gx = FMA_(-R(vg * dx[i]), cy[j], gx);                                        \
                gy = FMA_(-R(vg * dy[j]), cx[i], gy);                                        \
              }                                                                              \
          }                                                                                  \
        }                                                                                    \
        out[0] = R(gx * cq[2]);                                                              \
        out[1] = R(gy * cq[3]);                                                              \
      }                                                                                      \
    }                                                                                        \
    return NULL;                                                                             \
  }

#define R_ID(x) (x)
static inline float r_bf16(float x) { return tpu__bf16_to_f32(tpu__f32_to_bf16(x)); }
static inline float r_f16(float x) { return (float)(_Float16)x; }
/* bf16/f16: CPU's reduced-precision vectors round the product and the sum separately */
#define FMA_BF(a, b, c) r_bf16(r_bf16((a) * (b)) + (c))
#define FMA_HF(a, b, c) r_f16(r_f16((a) * (b)) + (c))
DEFINE_GRID(float, f32, R_ID, floorf, fabsf, truncf, nearbyintf, fmadd_f32, )
DEFINE_GRID(float, f32hw, R_ID, floorf, fabsf, truncf, nearbyintf, __builtin_fmaf, __attribute__((target("fma"))))
DEFINE_GRID(double, f64, R_ID, floor, fabs, trunc, nearbyint, fmadd_f64, )
DEFINE_GRID(float, bf16, r_bf16, floorf, fabsf, truncf, nearbyintf, FMA_BF, )
DEFINE_GRID(float, f16, r_f16, floorf, fabsf, truncf, nearbyintf, FMA_HF, )
#undef R_ID

/* The instantiation for a dtype: bf16/f16 round like CPU, in float scratch. */
typedef struct gs_fns_s { tpu_parallel_fn rows, coords, gi_planes, gg_rows; } gs_fns_t;
static gs_fns_t gs_fns(tpu_dtype_t dt) {
#define GS_FNS(S) (gs_fns_t){S##_gs_rows, S##_gs_coords, S##_gs_gi_planes, S##_gs_gg_rows}
  switch (dt) {
    case TPU_DTYPE_F64: return GS_FNS(f64);
    case TPU_DTYPE_BF16: return GS_FNS(bf16);
    case TPU_DTYPE_F16: return GS_FNS(f16);
    default: return have_fma() ? GS_FNS(f32hw) : GS_FNS(f32);
  }
#undef GS_FNS
}

static void gs_init(gs_t* G, const tpu_node_t* n, const tpu_operand_t* X, const tpu_operand_t* Gr) {
  memset(G, 0, sizeof *G);
  G->N = X->sizes[0]; G->C = X->sizes[1]; G->H = X->sizes[2]; G->W = X->sizes[3];
  G->OH = Gr->sizes[1]; G->OW = Gr->sizes[2];
  G->interp = (int)n->ia[0];
  G->pad = (int)n->ia[1];
  G->ac = n->ia[2] != 0;
}

static tpu_status_t grid_sampler_kernel(tpu_node_t* n) {
  const tpu_operand_t *X = &n->in[0], *Gr = &n->in[1];
  tpu_operand_t* Y = &n->out[0];
  if (tpu__operand_numel(Y) == 0) return NULL;
  tpu_dtype_t cd = n->compute;
  gs_t G;
  gs_init(&G, n, X, Gr);
  bool xo, go_, yo;
  void* x = dense_in(X, cd, &xo);
  void* grid = dense_in(Gr, cd, &go_);
  void* y = dense_out(Y, cd, &yo);
  tpu_status_t st = NULL;
  if (!x || !grid || !y) { st = TPU_HOST_NOMEM(); goto done; }
  G.x = x; G.grid = grid; G.y = y;
  int64_t taps = G.interp == GS_BICUBIC ? 16 : G.interp == GS_NEAREST ? 1 : 4;
  st = run_units(G.N * G.OH, G.OW * G.C * taps, gs_fns(X->dtype).rows, &G);
  if (!st && yo) tpu__unpack(Y, y, cd);
done:
  if (xo) tpu__free(x);
  if (go_) tpu__free(grid);
  if (yo) tpu__free(y);
  return st;
}

static tpu_status_t grid_sampler_bwd_kernel(tpu_node_t* n) {
  const tpu_operand_t *GO = &n->in[0], *X = &n->in[1], *Gr = &n->in[2];
  tpu_operand_t *GI = &n->out[0], *GG = &n->out[1];
  bool want_gi = n->ia[3] != 0 && !tpu__output_absent(GI);
  tpu_dtype_t cd = n->compute;
  size_t csz = tpu_dtype_size(cd);
  gs_t G;
  gs_init(&G, n, X, Gr);
  int64_t npts = G.N * G.OH * G.OW;
  bool xo = false, gro = false, goo = false, gio = false, ggo = false;
  void *x = NULL, *grid = NULL, *go = NULL, *gi = NULL, *gg = NULL, *coords = NULL, *tw = NULL;
  int64_t* toff = NULL;
  tpu_status_t st = NULL;
  bool empty = npts == 0 || G.C == 0;
  if (want_gi && tpu__operand_numel(GI)) {
    gi = dense_out(GI, cd, &gio);
    if (!gi) { st = TPU_HOST_NOMEM(); goto done; }
    if (empty) memset(gi, 0, (size_t)tpu__operand_numel(GI) * csz);
  }
  if (npts) {
    gg = dense_out(GG, cd, &ggo);
    if (!gg) { st = TPU_HOST_NOMEM(); goto done; }
    if (empty) memset(gg, 0, (size_t)npts * 2 * csz);
  }
  if (!empty) {
    x = dense_in(X, cd, &xo);
    grid = dense_in(Gr, cd, &gro);
    go = dense_in(GO, cd, &goo);
    coords = tpu__malloc((size_t)npts * 4 * csz);
    G.ntaps = G.interp == GS_BICUBIC ? 16 : G.interp == GS_NEAREST ? 1 : 4;
    toff = tpu__malloc((size_t)npts * (size_t)G.ntaps * sizeof(int64_t));
    tw = tpu__malloc((size_t)npts * 8 * csz);
    if (!x || !grid || !go || !coords || !toff || !tw) { st = TPU_HOST_NOMEM(); goto done; }
    G.x = x; G.grid = grid; G.go = go; G.gi = gi; G.gg = gg; G.coords = coords;
    G.toff = toff; G.tw = tw;
    gs_fns_t fns = gs_fns(X->dtype);
    /* ATen's grid sampler kernel is an AVX2 one (256-bit vectors of the tensor's dtype)
     * also on AVX-512 machines: that many points per chunk (probed) */
    G.lanes = 32 / (int64_t)tpu_dtype_size(X->dtype);
    st = run_units(npts, 16, fns.coords, &G);
    int64_t taps = G.interp == GS_BICUBIC ? 16 : G.interp == GS_NEAREST ? 1 : 4;
    if (!st && gi) st = run_units(G.N * G.C, G.OH * G.OW * taps + G.H * G.W, fns.gi_planes, &G);
    if (!st) st = run_units(G.N * G.OH, G.OW * G.C * taps, fns.gg_rows, &G);
  }
  if (!st && gi && gio) tpu__unpack(GI, gi, cd);
  if (!st && gg && ggo) tpu__unpack(GG, gg, cd);
done:
  if (xo) tpu__free(x);
  if (gro) tpu__free(grid);
  if (goo) tpu__free(go);
  if (gio) tpu__free(gi);
  if (ggo) tpu__free(gg);
  tpu__free(coords);
  tpu__free(toff);
  tpu__free(tw);
  return st;
}

void tpu__host_register_resample(tpu_host_kernel_fn* table) {
  table[TPU_KIND_UPSAMPLE] = upsample_kernel;
  table[TPU_KIND_UPSAMPLE_BACKWARD] = upsample_bwd_kernel;
  table[TPU_KIND_GRID_SAMPLER_2D] = grid_sampler_kernel;
  table[TPU_KIND_GRID_SAMPLER_2D_BACKWARD] = grid_sampler_bwd_kernel;
}
