/* Host kernels of the reduce family (node layout: aten/reduce.c).
 *
 * Every kernel sees its input as rows: the kept dims (in order) outer, the reduced dims
 * (or the scan/softmax dim) inner, so each output element reduces one dense row. A
 * contiguous input in the row dtype is read in place, others are packed. Rows are f32
 * when the compute dtype is f32 (f32/bf16/f16 values are exact in it) and f64 for f64;
 * either way every accumulation runs in double registers: accumulating f32 in double is
 * what PyTorch's CPU does for cumulative ops and is at least as exact as its cascade sums
 * elsewhere. Integers and bool are packed as int64 and wrap like CPU's.
 *
 * Threads: rows are split across the pool; a single long row is summed in fixed
 * SUPER-element blocks whose partials are added in block order, so results never depend
 * on the thread count. */
#include <math.h>

#include "host/host.h"
#include "host/vmath.h"

typedef struct rows_s {
  void* data;
  bool owned;
  int64_t outer, inner;
  int perm[TPU_MAX_DIMS];
} rows_t;

static void rows_free(rows_t* r) {
  if (r->owned) tpu__free(r->data);
  r->data = NULL;
}

/* via: a dtype the values are first cast to (PyTorch's self.to(dtype)), or INVALID. */
static tpu_status_t pack_rows(const tpu_operand_t* op, uint32_t mask, tpu_dtype_t dt,
                              tpu_dtype_t via, rows_t* r) {
  int nd = op->ndim, k = 0;
  r->outer = r->inner = 1;
  r->owned = false;
  for (int d = 0; d < nd; ++d)
    if (!(mask & (1u << d))) { r->perm[k++] = d; r->outer *= op->sizes[d]; }
  for (int d = 0; d < nd; ++d)
    if (mask & (1u << d)) { r->perm[k++] = d; r->inner *= op->sizes[d]; }
  bool identity = true;
  for (int d = 0; d < nd; ++d) identity &= r->perm[d] == d;
  if (via == dt || via == op->dtype) via = TPU_DTYPE_INVALID;
  if (via == TPU_DTYPE_INVALID && op->dtype == dt && identity && !op->is_scalar &&
      tpu__operand_is_contiguous(op)) {
    r->data = tpu__operand_ptr(op);
    return NULL;
  }
  uint64_t numel = (uint64_t)(r->outer * r->inner), nbytes;
  if (!tpu__mul_ok(numel ? numel : 1, 8, &nbytes)) return TPU_HOST_NOMEM();
  r->data = tpu__malloc(nbytes);
  if (!r->data) return TPU_HOST_NOMEM();
  r->owned = true;
  if (via != TPU_DTYPE_INVALID) {
    void* tmp = tpu__malloc((numel ? numel : 1) * tpu_dtype_size(via));
    if (!tmp) { rows_free(r); return TPU_HOST_NOMEM(); }
    tpu__pack(op, r->perm, via, tmp);
    tpu__convert_run(r->data, dt, 1, tmp, via, 1, (int64_t)numel);
    tpu__free(tmp);
  } else {
    tpu__pack(op, r->perm, dt, r->data);
  }
  return NULL;
}

/* Writes dense rows (in the packing's permuted order) back into a same-shaped output. */
static void unpack_perm(tpu_operand_t* out, const int* perm, const void* src, tpu_dtype_t dt) {
  tpu_operand_t po = *out;
  for (int d = 0; d < out->ndim; ++d) {
    po.sizes[d] = out->sizes[perm[d]];
    po.strides[d] = out->strides[perm[d]];
  }
  tpu__unpack(&po, src, dt);
}

static void* alloc8(int64_t n) { return tpu__malloc((size_t)(n > 0 ? n : 1) * 8); }

/* Row dtype: f32 rows for f32 compute (loads widen to double), else f64 / i64. */
static tpu_dtype_t buf_dtype(const tpu_node_t* n) {
  if (n->compute == TPU_DTYPE_F32) return TPU_DTYPE_F32;
  return tpu_dtype_is_floating(n->compute) ? TPU_DTYPE_F64 : TPU_DTYPE_I64;
}

/* Rows per parallel chunk so that a chunk holds at least TPU_PARALLEL_MIN_WORK elements. */
static int64_t row_grain(int64_t inner) {
  return TPU_PARALLEL_MIN_WORK / (inner > 0 ? inner : 1) + 1;
}

/* ---- row reductions ------------------------------------------------------------------- */

enum { S_PLAIN, S_SQDEV, S_ABS, S_SQ, S_POW, S_EXPDEV, S_NONAN };

static inline double term(double v, int mode, double a) {
  switch (mode) {
    case S_SQDEV: return (v - a) * (v - a);
    case S_ABS: return fabs(v);
    case S_SQ: return v * v;
    case S_POW: return pow(fabs(v), a);
    case S_EXPDEV: return exp(v - a);
    case S_NONAN: return isnan(v) ? 0.0 : v;
    default: return v;
  }
}

/* Summation in blocks: 256-element pair sums added per block (error grows with n/256 +
 * 256, not n), blocks grouped in SUPER-element groups whose sums are added in order. A
 * long row's groups are summed in parallel with the same grouping. */
#define SUPER 16384

/* Plain, squared, |x|, squared-deviation and NaN-skipping sums run 8 lanes wide (GCC
 * vectors: the compiler left the two-accumulator loop scalar, a chain of dependent adds
 * that capped a sum at ~2 cycles per element); each block's lanes are combined in a fixed
 * order, so the result does not depend on the instruction set. */
/* (v8d, ld8_f32/f64 and v8_total: host/vmath.h) */
static inline bool lane_mode(int mode) {
  return mode == S_PLAIN || mode == S_SQ || mode == S_SQDEV || mode == S_ABS || mode == S_NONAN;
}
TPU_VINLINE v4d term4(v4d v, int mode, double a) {
  switch (mode) {
    case S_SQDEV: return (v - a) * (v - a);
    case S_ABS: return (v4d)((v4l)v & ((v4l){0} + INT64_MAX));
    case S_SQ: return v * v;
    case S_NONAN: return (v4d)((v4l)v & (v == v));
    default: return v;
  }
}
TPU_VINLINE v8d term8(v8d v, int mode, double a) { return (v8d){term4(v.lo, mode, a), term4(v.hi, mode, a)}; }

/* Scalar loads of a row element as double (bf16: the high half of an f32, exact). */
static inline double ld1_f32(const float* p) { return *p; }
static inline double ld1_f64(const double* p) { return *p; }
static inline double ld1_bf16(const uint16_t* p) { return tpu__bf16_to_f32(*p); }

/* nx runs (x + q stride, q < nx <= 4; n elements each) in lane mode `mode`, added to
 * tot[q], in blocks of 256: 8 lanes per run, combined in a fixed order, then the tail.
 * The runs advance together, 8 elements at a time, so nx read streams are in flight
 * (taking them a block at a time ran ~40% slower). Called with constant nx and mode, so
 * the compiler unrolls the runs and folds term8's switch out of the loop. bf16 runs are
 * widened in registers: the same doubles as the float32 copy's, so the same sums. */
#define LANE_FNS(T, SFX)                                                                    \
  TPU_VINLINE void lane_sum_##SFX(const T* x, int64_t stride, int nx, int64_t n, int mode, double a, \
                                  double* tot) {                                           \
    for (int64_t b0 = 0; b0 < n; b0 += 256) {                                              \
      int64_t e = b0 + 256 < n ? b0 + 256 : n, i = b0;                                     \
      v8d acc[4] = {V8D_ZERO, V8D_ZERO, V8D_ZERO, V8D_ZERO};                               \
      for (; i + 8 <= e; i += 8)                                                           \
        for (int q = 0; q < nx; ++q)                                                       \
          acc[q] = v8_add(acc[q], term8(ld8_##SFX(x + q * stride + i), mode, a));          \
      for (int q = 0; q < nx; ++q) {                                                       \
        double s1 = 0;                                                                     \
        for (int64_t j = i; j < e; ++j) s1 += term(ld1_##SFX(x + q * stride + j), mode, a); \
        tot[q] += v8_total(acc[q]) + s1;                                                   \
      }                                                                                    \
    }                                                                                      \
  }                                                                                        \
  TPU_VINLINE void lane_sums_##SFX(const T* x, int64_t stride, int nx, int64_t n, int mode, double a, \
                                   double* tot) {                                          \
    switch (mode) {                                                                        \
      case S_SQ: lane_sum_##SFX(x, stride, nx, n, S_SQ, a, tot); break;                    \
      case S_ABS: lane_sum_##SFX(x, stride, nx, n, S_ABS, a, tot); break;                  \
      case S_SQDEV: lane_sum_##SFX(x, stride, nx, n, S_SQDEV, a, tot); break;              \
      case S_NONAN: lane_sum_##SFX(x, stride, nx, n, S_NONAN, a, tot); break;              \
      default: lane_sum_##SFX(x, stride, nx, n, S_PLAIN, a, tot);                          \
    }                                                                                      \
  }                                                                                        \
  /* block_sum of four runs (lane modes only): each run gets exactly block_sum's          \
   * operations, so the results are bit-identical to four calls, but four read streams    \
   * are in flight instead of one. One stream per core left a sum of 16M floats on 2 AVX2 \
   * cores at ~15 GB/s, four reach ~19. */                                                 \
  TPU_ISA_CLONES static void block_sum4_##SFX(const T* x, int64_t stride, int64_t n, int mode, \
                                             double a, double* out) {                     \
    for (int q = 0; q < 4; ++q) out[q] = 0;                                                \
    lane_sums_##SFX(x, stride, 4, n, mode, a, out);                                        \
  }
LANE_FNS(float, f32)
LANE_FNS(double, f64)
LANE_FNS(uint16_t, bf16)
#undef LANE_FNS

/* f32 rows take exponentials in float (expf is several times faster than exp and as
 * accurate as the f32 result needs); the sums stay double. */
#define ROW_FNS(T, SFX, EXPT)                                                               \
  TPU_ISA_CLONES static double block_sum_##SFX(const T* x, int64_t n, int mode, double a) { \
    double tot = 0;                                                                        \
    if (lane_mode(mode)) {                                                                 \
      lane_sums_##SFX(x, 0, 1, n, mode, a, &tot);                                          \
      return tot;                                                                          \
    }                                                                                      \
    for (int64_t b0 = 0; b0 < n; b0 += 256) {                                              \
      int64_t e = b0 + 256 < n ? b0 + 256 : n, i = b0;                                     \
      double s0 = 0, s1 = 0;                                                               \
      if (mode == S_EXPDEV)                                                                \
        for (; i + 1 < e; i += 2) { s0 += EXPT(x[i] - (T)a); s1 += EXPT(x[i + 1] - (T)a); } \
      else                                                                                 \
        for (; i + 1 < e; i += 2) { s0 += term(x[i], mode, a); s1 += term(x[i + 1], mode, a); } \
      for (; i < e; ++i) s1 += term(x[i], mode, a);                                        \
      tot += s0 + s1;                                                                      \
    }                                                                                      \
    return tot;                                                                            \
  }                                                                                        \
  /* First index of the extreme value; a NaN wins and its first index is taken. */         \
  static int64_t f_arg_##SFX(const T* x, int64_t n, bool want_max) {                       \
    int64_t best = 0;                                                                      \
    for (int64_t i = 1; i < n; ++i) {                                                      \
      if (isnan(x[best])) break;                                                           \
      if (isnan(x[i]) || (want_max ? x[i] > x[best] : x[i] < x[best])) best = i;           \
    }                                                                                      \
    return best;                                                                           \
  }

ROW_FNS(float, f32, expf)
ROW_FNS(double, f64, exp)

/* A row of floats in the row dtype: f32 (fs) or f64 (fd); or a dense bf16 row (bs), only
 * for the sum family (fr_sum, fr_blocks, fr_blocks4 read it; fr_at and the extremes do
 * not: other kinds widen bf16 rows into f32 first). */
typedef struct frow_s {
  const float* fs;
  const double* fd;
  const uint16_t* bs;
} frow_t;

static frow_t frow(const void* base, bool f32, int64_t at) {
  frow_t r = {NULL, NULL, NULL};
  if (f32) r.fs = (const float*)base + at; else r.fd = (const double*)base + at;
  return r;
}
static frow_t fr_skip(frow_t r, int64_t s) {
  if (r.fs) r.fs += s; else if (r.fd) r.fd += s; else r.bs += s;
  return r;
}
static double fr_at(frow_t r, int64_t i) { return r.fs ? (double)r.fs[i] : r.fd[i]; }
TPU_ISA_CLONES static double lane_block_bf16(const uint16_t* x, int64_t n, int mode, double a) {
  double tot = 0;
  lane_sums_bf16(x, 0, 1, n, mode, a, &tot);
  return tot;
}
/* A bf16 run is summed in registers in the lane modes; for exp/pow terms (one group, at
 * most SUPER elements) it is widened into a 64 KiB stack buffer that stays in L2. Either
 * way the operations are the float32 copy's, so the result is too, and no float copy of
 * the whole tensor is written (and page-faulted). */
static double fr_blocks(frow_t r, int64_t n, int mode, double a) {
  if (r.bs && lane_mode(mode)) return lane_block_bf16(r.bs, n, mode, a);
  if (r.bs) {
    float buf[SUPER];
    tpu__convert_run(buf, TPU_DTYPE_F32, 1, r.bs, TPU_DTYPE_BF16, 1, n);
    return block_sum_f32(buf, n, mode, a);
  }
  return r.fs ? block_sum_f32(r.fs, n, mode, a) : block_sum_f64(r.fd, n, mode, a);
}
/* (lane modes only) */
static void fr_blocks4(frow_t r, int64_t stride, int64_t n, int mode, double a, double* out) {
  if (r.fs) block_sum4_f32(r.fs, stride, n, mode, a, out);
  else if (r.fd) block_sum4_f64(r.fd, stride, n, mode, a, out);
  else block_sum4_bf16(r.bs, stride, n, mode, a, out);
}

typedef struct lsum_s {
  frow_t x;
  int64_t n;
  int mode;
  double a;
  double* part;
} lsum_t;

static tpu_status_t lsum_chunk(void* arg, int64_t b, int64_t e, int tid) {
  lsum_t* L = arg;
  if (lane_mode(L->mode)) /* four whole groups at a time */
    for (; b + 4 <= e && (b + 4) * SUPER <= L->n; b += 4)
      fr_blocks4(fr_skip(L->x, b * SUPER), SUPER, SUPER, L->mode, L->a, L->part + b);
  for (int64_t g = b; g < e; ++g) {
    int64_t s = g * SUPER, len = L->n - s < SUPER ? L->n - s : SUPER;
    L->part[g] = fr_blocks(fr_skip(L->x, s), len, L->mode, L->a);
  }
  return NULL;
}

static double fr_sum(frow_t x, int64_t n, int mode, double a) {
  int64_t groups = (n + SUPER - 1) / SUPER;
  if (groups <= 1) return fr_blocks(x, n, mode, a);
  double stack[64];
  double* part = groups <= 64 ? stack : tpu__malloc(sizeof(double) * (size_t)groups);
  lsum_t L = {x, n, mode, a, part};
  tpu_status_t st = NULL;
  if (!part) lsum_chunk(&L, 0, 0, 0); /* no scratch: fall back to the serial loop below */
  else st = tpu__parallel_for(groups, 2, lsum_chunk, &L);
  double tot = 0;
  if (part && !st) {
    for (int64_t g = 0; g < groups; ++g) tot += part[g];
  } else {
    tpu_status_free(st);
    for (int64_t g = 0; g < groups; ++g) {
      int64_t s = g * SUPER, len = n - s < SUPER ? n - s : SUPER;
      tot += fr_blocks(fr_skip(x, s), len, mode, a);
    }
  }
  if (part != stack) tpu__free(part);
  return tot;
}

/* The largest (smallest) element of a row, NaN if any: two 32-byte vectors of L running
 * extremes (GCC vectors of a size every x86-64 clone keeps in registers, host/vmath.h,
 * with NaN lanes tracked in a mask: the element-wise ternary form stayed scalar), then
 * their extreme; max and min are exact, so the order does not matter. (amax/amin rows
 * used a scalar loop that converted every element to double: ~1 ns per element.) */
#define ROW_EXT(T, SFX, VT, IT, L, NAME, GT, START)                                         \
  TPU_ISA_CLONES static double row_##NAME##_##SFX(const T* x, int64_t n) {                 \
    VT acc0, acc1;                                                                          \
    IT nan = {0};                                                                           \
    for (int l = 0; l < L; ++l) acc0[l] = acc1[l] = (T)(START);                             \
    int64_t i = 0;                                                                          \
    for (; i + 2 * L <= n; i += 2 * L) {                                                    \
      VT v, u;                                                                              \
      memcpy(&v, x + i, sizeof v);                                                          \
      memcpy(&u, x + i + L, sizeof u);                                                      \
      IT gt = v GT acc0, gu = u GT acc1;                                                    \
      acc0 = (VT)(((IT)v & gt) | ((IT)acc0 & ~gt));                                         \
      acc1 = (VT)(((IT)u & gu) | ((IT)acc1 & ~gu));                                         \
      nan |= (v != v) | (u != u);                                                           \
    }                                                                                       \
    T m = (T)(START);                                                                       \
    bool any_nan = false;                                                                   \
    for (int l = 0; l < L; ++l) {                                                           \
      m = acc0[l] GT m ? acc0[l] : m;                                                       \
      m = acc1[l] GT m ? acc1[l] : m;                                                       \
      any_nan |= nan[l] != 0;                                                               \
    }                                                                                       \
    for (; i < n; ++i) { any_nan |= x[i] != x[i]; m = x[i] GT m ? x[i] : m; }               \
    return any_nan ? (double)NAN : (double)m;                                               \
  }
ROW_EXT(float, f32, v8f, v8i, 8, max, >, -INFINITY)
ROW_EXT(double, f64, v4d, v4l, 4, max, >, -INFINITY)
ROW_EXT(float, f32, v8f, v8i, 8, min, <, INFINITY)
ROW_EXT(double, f64, v4d, v4l, 4, min, <, INFINITY)
#undef ROW_EXT

static double fr_max(frow_t r, int64_t n) { return r.fs ? row_max_f32(r.fs, n) : row_max_f64(r.fd, n); }
static double fr_min(frow_t r, int64_t n) { return r.fs ? row_min_f32(r.fs, n) : row_min_f64(r.fd, n); }
static int64_t fr_arg(frow_t r, int64_t n, bool mx) { return r.fs ? f_arg_f32(r.fs, n, mx) : f_arg_f64(r.fd, n, mx); }

static int64_t i_arg(const int64_t* x, int64_t n, bool want_max) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (want_max ? x[i] > x[best] : x[i] < x[best]) best = i;
  return best;
}

static double f_lse(frow_t x, int64_t n) {
  double m = fr_max(x, n);
  if (isnan(m)) return m;
  if (isinf(m)) m = 0; /* all -inf gives -inf; any +inf gives +inf */
  return log(fr_sum(x, n, S_EXPDEV, m)) + m;
}

static double f_norm(frow_t x, int64_t n, double p) {
  if (p == 0) {
    double c = 0;
    for (int64_t i = 0; i < n; ++i) c += fr_at(x, i) != 0;
    return c;
  }
  if (isinf(p)) {
    double m = p > 0 ? 0 : INFINITY;
    for (int64_t i = 0; i < n; ++i) {
      double v = fabs(fr_at(x, i));
      if (isnan(v)) return v;
      if (p > 0 ? v > m : v < m) m = v;
    }
    return m;
  }
  if (p == 1) return fr_sum(x, n, S_ABS, 0);
  if (p == 2) return sqrt(fr_sum(x, n, S_SQ, 0));
  return pow(fr_sum(x, n, S_POW, p), 1.0 / p);
}

typedef struct red_s {
  tpu_node_t* node;
  const void* data;
  const uint16_t* bf16; /* instead of data: dense bf16 rows, read in place (sums) or widened */
  bool fl, f32, widen;
  int64_t inner;
  double *fo, *fo1;
  int64_t *io, *io1;
} red_t;

/* Float rows j .. j + n - 1: in place; bf16 ones as they are (the sum family, whose sums
 * widen in registers) or widened into fbuf (the other kinds, rows of at most SUPER). */
static frow_t rows_at(const red_t* R, float* fbuf, int64_t j, int64_t n) {
  if (!R->bf16) return frow(R->data, R->f32, j * R->inner);
  if (!R->widen) return (frow_t){NULL, NULL, R->bf16 + j * R->inner};
  tpu__convert_run(fbuf, TPU_DTYPE_F32, 1, R->bf16 + j * R->inner, TPU_DTYPE_BF16, 1, n * R->inner);
  return frow(fbuf, true, 0);
}

static tpu_status_t reduce_rows(void* arg, int64_t jb, int64_t je, int tid) {
  red_t* R = arg;
  tpu_node_t* node = R->node;
  bool fl = R->fl;
  int64_t inner = R->inner;
  double *fo = R->fo, *fo1 = R->fo1;
  int64_t *io = R->io, *io1 = R->io1;
  tpu_kind_t k = node->kind;
  /* widened bf16 rows: four (or one) at a time into a float buffer, then the float32 code */
  float* fbuf = R->widen ? tpu__malloc(sizeof(float) * (size_t)(4 * (inner ? inner : 1))) : NULL;
  if (R->widen && !fbuf) return TPU_HOST_NOMEM();
  /* Sums of short rows four at a time (fr_sum of one group, four read streams). */
  bool sum = k == TPU_KIND_RED_SUM || k == TPU_KIND_RED_NANSUM || k == TPU_KIND_RED_MEAN;
  int sum_mode = k == TPU_KIND_RED_NANSUM ? S_NONAN : S_PLAIN;
  if (fl && sum && inner <= SUPER)
    for (; jb + 4 <= je; jb += 4) {
      double s[4];
      fr_blocks4(rows_at(R, fbuf, jb, 4), inner, inner, sum_mode, 0, s);
      for (int q = 0; q < 4; ++q) fo[jb + q] = k == TPU_KIND_RED_MEAN ? s[q] / (double)inner : s[q];
    }
  for (int64_t j = jb; j < je; ++j) {
    frow_t fx = fl ? rows_at(R, fbuf, j, 1) : frow(NULL, false, 0);
    const int64_t* ix = fl ? NULL : (const int64_t*)R->data + j * inner;
    switch (k) {
      case TPU_KIND_RED_SUM:
      case TPU_KIND_RED_NANSUM:
      case TPU_KIND_RED_COUNT_NONZERO:
        if (fl) fo[j] = fr_sum(fx, inner, sum_mode, 0);
        else {
          uint64_t s = 0;
          for (int64_t i = 0; i < inner; ++i) s += (uint64_t)ix[i];
          io[j] = (int64_t)s;
        }
        break;
      case TPU_KIND_RED_MEAN:
        fo[j] = fr_sum(fx, inner, S_PLAIN, 0) / (double)inner;
        break;
      case TPU_KIND_RED_PROD:
        if (fl) { double p = 1; for (int64_t i = 0; i < inner; ++i) p *= fr_at(fx, i); fo[j] = p; }
        else { uint64_t p = 1; for (int64_t i = 0; i < inner; ++i) p *= (uint64_t)ix[i]; io[j] = (int64_t)p; }
        break;
      case TPU_KIND_RED_AMAX:
      case TPU_KIND_RED_AMIN:
      case TPU_KIND_RED_AMINMAX: {
        bool mx = k == TPU_KIND_RED_AMAX;
        if (fl) {
          if (k == TPU_KIND_RED_AMINMAX) { fo[j] = fr_min(fx, inner); fo1[j] = fr_max(fx, inner); }
          else fo[j] = mx ? fr_max(fx, inner) : fr_min(fx, inner);
        } else if (inner > 0) {
          if (k == TPU_KIND_RED_AMINMAX) { io[j] = ix[i_arg(ix, inner, false)]; io1[j] = ix[i_arg(ix, inner, true)]; }
          else io[j] = ix[i_arg(ix, inner, mx)];
        }
        break;
      }
      case TPU_KIND_RED_MAX_DIM:
      case TPU_KIND_RED_MIN_DIM: {
        bool mx = k == TPU_KIND_RED_MAX_DIM;
        int64_t a = inner > 0 ? (fl ? fr_arg(fx, inner, mx) : i_arg(ix, inner, mx)) : 0;
        if (fl) fo[j] = inner > 0 ? fr_at(fx, a) : NAN; else io[j] = inner > 0 ? ix[a] : 0;
        io1[j] = a;
        break;
      }
      case TPU_KIND_RED_ARGMAX:
      case TPU_KIND_RED_ARGMIN: {
        bool mx = k == TPU_KIND_RED_ARGMAX;
        io[j] = inner > 0 ? (fl ? fr_arg(fx, inner, mx) : i_arg(ix, inner, mx)) : 0;
        break;
      }
      case TPU_KIND_RED_VAR: {
        double mean = fr_sum(fx, inner, S_PLAIN, 0) / (double)inner;
        double ss = fr_sum(fx, inner, S_SQDEV, mean);
        double div = (double)inner - node->da[0];
        double v = ss / (div > 0 ? div : 0.0);
        fo[j] = node->ia[1] ? sqrt(v) : v;
        if (fo1) fo1[j] = mean;
        break;
      }
      case TPU_KIND_RED_ANY: {
        int64_t v = 0;
        for (int64_t i = 0; i < inner && !v; ++i) v = ix[i] != 0;
        io[j] = v;
        break;
      }
      case TPU_KIND_RED_ALL: {
        int64_t v = 1;
        for (int64_t i = 0; i < inner && v; ++i) v = ix[i] != 0;
        io[j] = v;
        break;
      }
      case TPU_KIND_RED_LOGSUMEXP:
        fo[j] = f_lse(fx, inner);
        break;
      case TPU_KIND_RED_NORM:
        fo[j] = f_norm(fx, inner, node->da[0]);
        break;
      default:
        break;
    }
  }
  tpu__free(fbuf);
  return NULL;
}

/* Sum/mean over leading dims of a dense f32, f64 or bf16 input (a bias gradient:
 * [tokens, features] -> [features]): rows stay where they are and are added into a column
 * accumulator, instead of being transposed into reduction rows first (for bf16, a
 * strided gather through the generic conversion: 5.5x PyTorch CPU's time). Each column
 * is summed in index order in double, whatever the thread count (threads split the
 * columns). */
typedef struct colsum_s {
  const void* x;
  int64_t nred, cols;
  double* acc;
} colsum_t;

/* Tiles of 8 rows; in a tile, blocks of 16 columns keep their sums in registers over the
 * tile's rows (then one load and store of acc per block and tile, not per element), the
 * remaining columns row by row. Each column still adds its rows in order, so the result
 * is the same as acc[j] += x[j] row after row. Short tiles keep the reads sequential:
 * each row of a tile is read 64 bytes at a time, one block after another (64-row tiles
 * ran a [4096, 1024] sum 1.7x slower than the row-by-row loop; 8-row tiles 3.3x faster). */
#define COLSUM_TILE_ROWS 8
#define COLSUM_FN(T, SFX)                                                                   \
  TPU_ISA_CLONES static tpu_status_t colsum_chunk_##SFX(void* arg, int64_t cb, int64_t ce, int tid) { \
    colsum_t* C = arg;                                                                     \
    const T* x = C->x;                                                                     \
    double* acc = C->acc;                                                                  \
    for (int64_t j = cb; j < ce; ++j) acc[j] = 0;                                          \
    for (int64_t r0 = 0; r0 < C->nred; r0 += COLSUM_TILE_ROWS) {                           \
      int64_t r1 = r0 + COLSUM_TILE_ROWS < C->nred ? r0 + COLSUM_TILE_ROWS : C->nred, j = cb; \
      for (; j + 16 <= ce; j += 16) {                                                      \
        v8d a0 = ld8_f64(acc + j), a1 = ld8_f64(acc + j + 8);                              \
        for (int64_t r = r0; r < r1; ++r) {                                                \
          a0 = v8_add(a0, ld8_##SFX(x + r * C->cols + j));                                 \
          a1 = v8_add(a1, ld8_##SFX(x + r * C->cols + j + 8));                             \
        }                                                                                  \
        st8_f64(acc + j, a0);                                                              \
        st8_f64(acc + j + 8, a1);                                                          \
      }                                                                                    \
      for (int64_t r = r0; r < r1 && j < ce; ++r)                                          \
        for (int64_t q = j; q < ce; ++q) acc[q] += ld1_##SFX(x + r * C->cols + q);         \
    }                                                                                      \
    return NULL;                                                                           \
  }
COLSUM_FN(float, f32)
COLSUM_FN(double, f64)
COLSUM_FN(uint16_t, bf16)
#undef COLSUM_FN

static bool leading_dims_reduced(const tpu_operand_t* op, uint32_t mask, int64_t* nred, int64_t* cols) {
  int d = 0;
  *nred = *cols = 1;
  while (d < op->ndim && (mask & (1u << d))) *nred *= op->sizes[d++];
  if (d == 0 || d == op->ndim) return false;
  for (int e = d; e < op->ndim; ++e) {
    if (mask & (1u << e)) return false;
    *cols *= op->sizes[e];
  }
  return true;
}

/* The dims in mask are the trailing ones (rows in place, in order). */
static bool trailing_dims_reduced(const tpu_operand_t* op, uint32_t mask) {
  int d = 0;
  while (d < op->ndim && !(mask & (1u << d))) ++d;
  for (; d < op->ndim; ++d)
    if (!(mask & (1u << d))) return false;
  return true;
}

static tpu_status_t column_sum_kernel(tpu_node_t* node, tpu_dtype_t dt, int64_t nred, int64_t cols) {
  double* acc = alloc8(cols);
  if (!acc) return TPU_HOST_NOMEM();
  colsum_t C = {tpu__operand_ptr(&node->in[0]), nred, cols, acc};
  tpu_dtype_t in = node->in[0].dtype;
  tpu_status_t (*chunk)(void*, int64_t, int64_t, int) =
      in == TPU_DTYPE_BF16 ? colsum_chunk_bf16 : in == TPU_DTYPE_F32 ? colsum_chunk_f32 : colsum_chunk_f64;
  bool par = nred * cols >= TPU_PARALLEL_MIN_WORK && cols >= 64;
  tpu_status_t st = par ? tpu__parallel_for(cols, 64, chunk, &C) : chunk(&C, 0, cols, 0);
  if (!st && node->kind == TPU_KIND_RED_MEAN)
    for (int64_t j = 0; j < cols; ++j) acc[j] /= (double)nred;
  if (!st) tpu__unpack(&node->out[0], acc, TPU_DTYPE_F64);
  tpu__free(acc);
  return st;
}

/* Reductions that only read their rows through fr_sum (any bf16 row length). */
static bool sum_family(const tpu_node_t* node) {
  tpu_kind_t k = node->kind;
  double p = node->da[0];
  return k == TPU_KIND_RED_SUM || k == TPU_KIND_RED_NANSUM || k == TPU_KIND_RED_MEAN || k == TPU_KIND_RED_VAR ||
         (k == TPU_KIND_RED_NORM && p != 0 && !isinf(p));
}

static tpu_status_t reduce_kernel(tpu_node_t* node) {
  tpu_dtype_t dt = buf_dtype(node);
  bool fl = dt != TPU_DTYPE_I64;
  const tpu_operand_t* in = &node->in[0];
  int64_t nred, cols;
  if ((node->kind == TPU_KIND_RED_SUM || node->kind == TPU_KIND_RED_MEAN) && fl &&
      (in->dtype == dt || (in->dtype == TPU_DTYPE_BF16 && dt == TPU_DTYPE_F32)) &&
      (tpu_dtype_t)node->ia[2] == TPU_DTYPE_INVALID && !in->is_scalar &&
      tpu__operand_is_contiguous(in) && leading_dims_reduced(in, (uint32_t)node->ia[0], &nred, &cols))
    return column_sum_kernel(node, dt, nred, cols);
  /* dense bf16 rows (the trailing dims reduced) are read in place: the sum family's (sum,
   * mean, var, p-norms) as they are, any length; the other kinds' rows of at most SUPER
   * elements widened four rows or one at a time. No packed copy of the whole tensor. (A
   * long row of the other kinds still needs its whole float copy: the packed path.) */
  rows_t r = {0};
  bool sums = sum_family(node);
  bool b16 = fl && dt == TPU_DTYPE_F32 && in->dtype == TPU_DTYPE_BF16 && !in->is_scalar &&
             (tpu_dtype_t)node->ia[2] == TPU_DTYPE_INVALID && tpu__operand_is_contiguous(in) &&
             trailing_dims_reduced(in, (uint32_t)node->ia[0]);
  if (b16) {
    r.outer = 1;
    for (int d = 0; d < in->ndim && !((uint32_t)node->ia[0] & (1u << d)); ++d) r.outer *= in->sizes[d];
    r.inner = r.outer ? tpu__operand_numel(in) / r.outer : 0;
    b16 = r.inner <= SUPER || sums;
  }
  if (!b16) {
    TPU_RETURN_IF_ERROR(pack_rows(&node->in[0], (uint32_t)node->ia[0], dt, (tpu_dtype_t)node->ia[2], &r));
  }
  int64_t outer = r.outer, inner = r.inner;
  void* o0 = alloc8(outer);
  void* o1 = node->n_out > 1 ? alloc8(outer) : NULL;
  if (!o0 || (node->n_out > 1 && !o1)) {
    tpu__free(o0); tpu__free(o1); rows_free(&r);
    return TPU_HOST_NOMEM();
  }
  tpu_kind_t k = node->kind;
  red_t R = {node, r.data, b16 ? (const uint16_t*)tpu__operand_ptr(in) : NULL, fl, dt == TPU_DTYPE_F32,
             b16 && !sums, inner, o0, o1, o0, o1};
  tpu_status_t st = outer > 1 && outer * inner >= TPU_PARALLEL_MIN_WORK
                        ? tpu__parallel_for(outer, row_grain(inner), reduce_rows, &R)
                        : reduce_rows(&R, 0, outer, 0);
  /* floating results are in double buffers whatever the row dtype */
  tpu_dtype_t vdt = fl ? TPU_DTYPE_F64 : TPU_DTYPE_I64;
  tpu_dtype_t dt1 = k == TPU_KIND_RED_MAX_DIM || k == TPU_KIND_RED_MIN_DIM ? TPU_DTYPE_I64 : vdt;
  bool is_idx = k == TPU_KIND_RED_ARGMAX || k == TPU_KIND_RED_ARGMIN;
  /* any/all/count_nonzero pack int64 from floats too; their buffers are int64 */
  bool int_out = is_idx || k == TPU_KIND_RED_ANY || k == TPU_KIND_RED_ALL || k == TPU_KIND_RED_COUNT_NONZERO;
  if (!st) {
    tpu__unpack(&node->out[0], o0, int_out ? TPU_DTYPE_I64 : vdt);
    if (node->n_out > 1) tpu__unpack(&node->out[1], o1, dt1);
  }
  tpu__free(o0);
  tpu__free(o1);
  rows_free(&r);
  return st;
}

/* ---- scans and softmax along one dim ------------------------------------------------------ */

static inline double log_add_exp(double a, double b) {
  double lo = isnan(b) ? b : (a < b ? a : b);
  double hi = isnan(b) ? b : (a < b ? b : a);
  if (lo != hi || isfinite(lo)) return hi + log1p(exp(lo - hi));
  return a; /* both infinite with the same sign */
}

/* Float rows are read and written in the row dtype (T = float or double); the running
 * values are double. */

/* Softmax and log_softmax of one row: the max (exact, any order), then e^(x - max) summed
 * in double, then one scaling pass. Float rows, which are what the bandwidth benchmark
 * and models use, take three passes over the row (16 KB at 4096 elements, so the second
 * and third hit L1/L2): the exponentials are stored and summed in the same loop (16 at a
 * time; before, a separate pass re-read them), and the output is scaled in float by the
 * rounded 1/sum (PyTorch's CPU kernel does the same; before, each element went through
 * double and back). The sum: 16 float lanes add 8 exponentials each, then each 128-block
 * is widened and added in double (widening every exponential cost as much as the exp:
 * GCC splits the conversions into 128-bit pieces). log_softmax writes (x - max) - log(sum)
 * in float. With a finite max, x - max is never NaN and the exp needs one clamp.
 * While a row's exponentials are taken, the next row (where the caller passes it) is
 * prefetched into the cache, so the max pass over it does not wait on memory (+8%).
 *
 * Measured with the bench's "softmax (rows of 4096)" op (16M floats), one pool thread,
 * best of alternating runs against the previous build on a shared 2-core machine
 * (GB/s of ideal traffic; copy 19-23 GB/s in the same runs): softmax 7.7 -> 14.7,
 * log_softmax 7.1 -> 13.7, softmax backward 9.7 -> 16.8 (its sum(g * y) was a chain of
 * dependent double adds, ~4 cycles an element). CPU time per element (one thread, robust
 * to the machine's other load): softmax 1.03 -> 0.54 ns, log_softmax 1.11 -> 0.58,
 * softmax backward 1.21 -> 0.70, copy 0.33-0.42. Tried without gain: prefetching the next
 * output row for writing during the exp pass (-2%), and storing no exponentials in
 * log_softmax (the output lines were then fetched in the last pass: 13.0 -> 10.8). */
/* e^(x - m) with m the finite row max: x - m is in [-inf, 0], never NaN, so one clamp
 * covers every special case (23% faster than tpu__vexpf's). */
TPU_VINLINE float exp_le0(float d) { return tpu__vexpf_core(d < -120.0f ? -120.0f : d, 0.0f); }
#define EXP_DEV(d, finite) ((finite) ? exp_le0(d) : tpu__vexpf(d))

/* e^(x - m) of 16 elements, stored into y when given, and their sum as a float vector. */
TPU_VINLINE v16f exp16_f32(const float* x, float m, float* y, bool finite) {
  float e[16];
  for (int l = 0; l < 16; ++l) e[l] = EXP_DEV(x[l] - m, finite);
  if (y) memcpy(y, e, sizeof e);
  return ld16_f32(e);
}

TPU_VINLINE double exp_sum_f32(const float* x, float m, float* y, int64_t n, const float* next, bool finite) {
  v8d a = V8D_ZERO;
  int64_t i = 0;
  for (; i + 128 <= n; i += 128) {
    v16f acc = V16F_ZERO; /* each lane adds 8 terms in float, then the block goes to double */
    for (int c = 0; c < 128; c += 16) {
      acc = v16_add(acc, exp16_f32(x + i + c, m, y ? y + i + c : NULL, finite));
      if (next) __builtin_prefetch(next + i + c);
    }
    a = v8_add(a, v16_widen_sum(acc));
  }
  for (; i + 16 <= n; i += 16) {
    a = v8_add(a, v16_widen_sum(exp16_f32(x + i, m, y ? y + i : NULL, finite)));
    if (next) __builtin_prefetch(next + i);
  }
  double s = v8_total(a);
  for (; i < n; ++i) {
    float e = EXP_DEV(x[i] - m, finite);
    if (y) y[i] = e;
    s += e;
  }
  return s;
}

TPU_ISA_CLONES static void softmax_row_f32(bool log_sm, const float* x, float* y, int64_t n, const float* next) {
  float m = (float)row_max_f32(x, n);
  /* a NaN or infinite max (NaN results, as e^(inf - inf) gives) takes the general exp */
  bool finite = __builtin_isfinite(m);
  if (!log_sm) {
    double s = finite ? exp_sum_f32(x, m, y, n, next, true) : exp_sum_f32(x, m, y, n, next, false);
    float inv = (float)(1.0 / s);
    for (int64_t i = 0; i < n; ++i) y[i] *= inv;
  } else {
    /* (x - m) - log(sum): both terms <= 0, so no cancellation; <= 1.5 ulp. The
     * exponentials are stored too, only so that y's cache lines are fetched for writing
     * while the exponentials are computed rather than in the last, load-free pass. */
    double s = finite ? exp_sum_f32(x, m, y, n, next, true) : exp_sum_f32(x, m, y, n, next, false);
    float ls = (float)log(s);
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) - ls;
  }
}

static inline void softmax_row_f64(bool log_sm, const double* x, double* y, int64_t n, const double* next) {
  double m = row_max_f64(x, n);
  for (int64_t i = 0; i < n; ++i) y[i] = exp(x[i] - m);
  double s = block_sum_f64(y, n, S_PLAIN, 0);
  if (!log_sm) {
    double inv = 1.0 / s;
    for (int64_t i = 0; i < n; ++i) y[i] *= inv;
  } else {
    double ls = log(s);
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] - m - ls;
  }
}

#define SCAN_ROW(T, SFX, EXPT)                                                              \
  TPU_ISA_CLONES static void scan_row_##SFX(tpu_kind_t k, const T* fx, T* fy, int64_t* idx, int64_t n, \
                                            const T* next) {                                \
    switch (k) {                                                                            \
      case TPU_KIND_RED_CUMSUM: { double s = 0; for (int64_t i = 0; i < n; ++i) fy[i] = (T)(s += fx[i]); break; } \
      case TPU_KIND_RED_CUMPROD: { double s = 1; for (int64_t i = 0; i < n; ++i) fy[i] = (T)(s *= fx[i]); break; } \
      case TPU_KIND_RED_LOGCUMSUMEXP: {                                                     \
        double s = -INFINITY;                                                               \
        for (int64_t i = 0; i < n; ++i) fy[i] = (T)(s = log_add_exp(s, fx[i]));             \
        break;                                                                              \
      }                                                                                     \
      case TPU_KIND_RED_CUMMAX:                                                             \
      case TPU_KIND_RED_CUMMIN: {                                                           \
        /* ties move the index forward; once NaN, every later NaN takes over */             \
        bool mx = k == TPU_KIND_RED_CUMMAX;                                                 \
        int64_t b = 0;                                                                      \
        T best = n ? fx[0] : 0;                                                             \
        for (int64_t i = 0; i < n; ++i) {                                                   \
          T v = fx[i];                                                                      \
          if (isnan(v) || (!isnan(best) && (mx ? v >= best : v <= best))) { b = i; best = v; } \
          fy[i] = best;                                                                     \
          idx[i] = b;                                                                       \
        }                                                                                   \
        break;                                                                              \
      }                                                                                     \
      case TPU_KIND_RED_SOFTMAX:                                                            \
      case TPU_KIND_RED_LOG_SOFTMAX:                                                        \
        softmax_row_##SFX(k == TPU_KIND_RED_LOG_SOFTMAX, fx, fy, n, next);                  \
        break;                                                                              \
      default:                                                                              \
        break;                                                                              \
    }                                                                                       \
  }

SCAN_ROW(float, f32, tpu__vexpf)
SCAN_ROW(double, f64, exp)

static void scan_row_i64(tpu_kind_t k, const int64_t* ix, int64_t* iy, int64_t* idx, int64_t n) {
  switch (k) {
    case TPU_KIND_RED_CUMSUM: { uint64_t s = 0; for (int64_t i = 0; i < n; ++i) iy[i] = (int64_t)(s += (uint64_t)ix[i]); break; }
    case TPU_KIND_RED_CUMPROD: { uint64_t s = 1; for (int64_t i = 0; i < n; ++i) iy[i] = (int64_t)(s *= (uint64_t)ix[i]); break; }
    case TPU_KIND_RED_CUMMAX:
    case TPU_KIND_RED_CUMMIN: {
      bool mx = k == TPU_KIND_RED_CUMMAX;
      int64_t b = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (mx ? ix[i] >= ix[b] : ix[i] <= ix[b]) b = i;
        iy[i] = ix[b];
        idx[i] = b;
      }
      break;
    }
    default:
      break;
  }
}

typedef struct scan_s {
  tpu_kind_t kind;
  tpu_dtype_t dt;
  const char* x;
  char* y;
  int64_t* idx;
  int64_t inner;
  bool bf16; /* x and y dense bf16 rows, each widened to a float row buffer and back */
} scan_t;

static tpu_status_t scan_rows_bf16(const scan_t* S, int64_t jb, int64_t je) {
  float* buf = tpu__malloc(sizeof(float) * (size_t)(2 * S->inner));
  if (!buf) return TPU_HOST_NOMEM();
  for (int64_t j = jb; j < je; ++j) {
    tpu__convert_run(buf, TPU_DTYPE_F32, 1, (const uint16_t*)S->x + j * S->inner, TPU_DTYPE_BF16, 1, S->inner);
    scan_row_f32(S->kind, buf, buf + S->inner, NULL, S->inner, NULL);
    tpu__convert_run((uint16_t*)S->y + j * S->inner, TPU_DTYPE_BF16, 1, buf + S->inner, TPU_DTYPE_F32, 1, S->inner);
  }
  tpu__free(buf);
  return NULL;
}

static tpu_status_t scan_rows(void* arg, int64_t jb, int64_t je, int tid) {
  scan_t* S = arg;
  if (S->bf16) return scan_rows_bf16(S, jb, je);
  size_t es = tpu_dtype_size(S->dt);
  for (int64_t j = jb; j < je; ++j) {
    const char* x = S->x + (size_t)(j * S->inner) * es;
    char* y = S->y + (size_t)(j * S->inner) * es;
    int64_t* idx = S->idx ? S->idx + j * S->inner : NULL;
    const char* next = j + 1 < je ? x + (size_t)S->inner * es : NULL; /* prefetched by softmax */
    if (S->dt == TPU_DTYPE_F32) scan_row_f32(S->kind, (const float*)x, (float*)y, idx, S->inner, (const float*)next);
    else if (S->dt == TPU_DTYPE_F64) scan_row_f64(S->kind, (const double*)x, (double*)y, idx, S->inner, (const double*)next);
    else scan_row_i64(S->kind, (const int64_t*)x, (int64_t*)y, idx, S->inner);
  }
  return NULL;
}

/* Softmax / log_softmax over the last dim of a float32 input into a dense float32
 * output, as the end of a fused group: the kernel's own row function. */
bool tpu__softmax_row_end_ok(const tpu_node_t* n) {
  const tpu_operand_t* x = &n->in[0];
  return (n->kind == TPU_KIND_RED_SOFTMAX || n->kind == TPU_KIND_RED_LOG_SOFTMAX) && x->ndim >= 1 &&
         n->ia[0] == x->ndim - 1 && x->dtype == TPU_DTYPE_F32 && n->compute == TPU_DTYPE_F32 &&
         n->out[0].dtype == TPU_DTYPE_F32 && tpu__operand_is_contiguous(&n->out[0]);
}

static void softmax_row_end(const tpu_row_end_t* e, const float* x, int64_t r, double* scratch) {
  (void)scratch;
  float* y = (float*)tpu__operand_ptr(&e->node->out[0]) + r * e->k;
  scan_row_f32(e->node->kind, x, y, NULL, e->k, NULL);
}

tpu_status_t tpu__softmax_row_end_open(const tpu_node_t* n, tpu_row_end_t* e) {
  *e = (tpu_row_end_t){n, n->in[0].sizes[n->in[0].ndim - 1], NULL, softmax_row_end};
  return NULL;
}

static bool identity_perm(const int* perm, int nd) {
  for (int d = 0; d < nd; ++d)
    if (perm[d] != d) return false;
  return true;
}

/* The output written in place: dense, in the row dtype, in row order, and not sharing
 * memory with the input (rows are read whole before being written, but only an exact
 * alias would be safe). */
static bool direct_out(const tpu_operand_t* out, const tpu_operand_t* in, tpu_dtype_t dt, const int* perm) {
  return out->dtype == dt && tpu__operand_is_contiguous(out) && identity_perm(perm, out->ndim) &&
         (in->is_scalar || !in->value || out->value != in->value);
}

static tpu_status_t scan_kernel(tpu_node_t* node) {
  tpu_dtype_t dt = buf_dtype(node);
  uint32_t mask = node->in[0].ndim ? 1u << node->ia[0] : 0;
  const tpu_operand_t *in = &node->in[0], *out = &node->out[0];
  /* softmax / log_softmax / cumsum ... of dense bf16 rows along the last dim into a dense
   * bf16 output: row by row through float buffers, no whole-tensor copies (the packed
   * copy and the double output of a [256, 4096] softmax took 3x PyTorch CPU's time,
   * most of it in page faults on the fresh scratch) */
  if (dt == TPU_DTYPE_F32 && node->n_out == 1 && in->dtype == TPU_DTYPE_BF16 && out->dtype == TPU_DTYPE_BF16 &&
      !in->is_scalar && in->ndim >= 1 && node->ia[0] == in->ndim - 1 &&
      (tpu_dtype_t)node->ia[2] == TPU_DTYPE_INVALID && tpu__operand_is_contiguous(in) &&
      tpu__operand_is_contiguous(out) && out->value != in->value) {
    int64_t inner = in->sizes[in->ndim - 1], total = tpu__operand_numel(in), outer = inner ? total / inner : 0;
    scan_t S = {node->kind, dt, tpu__operand_ptr(in), tpu__operand_ptr(out), NULL, inner, true};
    if (total == 0) return NULL;
    return outer > 1 && total >= TPU_PARALLEL_MIN_WORK ? tpu__parallel_for(outer, row_grain(inner), scan_rows, &S)
                                                       : scan_rows(&S, 0, outer, 0);
  }
  rows_t r;
  TPU_RETURN_IF_ERROR(pack_rows(&node->in[0], mask, dt, (tpu_dtype_t)node->ia[2], &r));
  int64_t total = r.outer * r.inner;
  bool two = node->n_out > 1;
  bool direct = direct_out(&node->out[0], &node->in[0], dt, r.perm);
  void* y = direct ? tpu__operand_ptr(&node->out[0]) : alloc8(total);
  int64_t* idx = two ? alloc8(total) : NULL;
  if (!y || (two && !idx)) {
    if (!direct) tpu__free(y);
    tpu__free(idx); rows_free(&r); return TPU_HOST_NOMEM();
  }
  scan_t S = {node->kind, dt, r.data, y, idx, r.inner, false};
  tpu_status_t st = r.outer > 1 && total >= TPU_PARALLEL_MIN_WORK
                        ? tpu__parallel_for(r.outer, row_grain(r.inner), scan_rows, &S)
                        : scan_rows(&S, 0, r.outer, 0);
  if (!st && !direct) unpack_perm(&node->out[0], r.perm, y, dt);
  if (!st && two) unpack_perm(&node->out[1], r.perm, idx, TPU_DTYPE_I64);
  if (!direct) tpu__free(y);
  tpu__free(idx);
  rows_free(&r);
  return st;
}

/* grad_input of softmax: y * (g - sum(g * y)); of log_softmax: g - exp(y) * sum(g). */
#define SOFTMAX_BWD_ROWS(T, SFX, EXPT)                                                            \
  TPU_ISA_CLONES static void softmax_bwd_row_##SFX(bool lsm, const T* g, const T* y, T* o, int64_t n) {     \
    double s = 0;                                                                           \
    if (lsm) {                                                                              \
      s = block_sum_##SFX(g, n, S_PLAIN, 0);                                                \
      for (int64_t i = 0; i < n; ++i) o[i] = (T)(g[i] - EXPT(y[i]) * s);             \
    } else {                                                                                \
      /* sum(g * y) in double lanes (the products of floats are exact); it was one chain \
       * of dependent adds, ~4 cycles an element */                                        \
      v8d a0 = V8D_ZERO, a1 = V8D_ZERO;                                                     \
      int64_t i = 0;                                                                        \
      for (; i + 16 <= n; i += 16) {                                                        \
        a0 = v8_add(a0, v8_mul(ld8_##SFX(g + i), ld8_##SFX(y + i)));                        \
        a1 = v8_add(a1, v8_mul(ld8_##SFX(g + i + 8), ld8_##SFX(y + i + 8)));                \
      }                                                                                     \
      s = v8_total(v8_add(a0, a1));                                                         \
      for (; i < n; ++i) s += (double)g[i] * y[i];                                          \
      for (int64_t i = 0; i < n; ++i) o[i] = (T)(y[i] * (g[i] - s));                        \
    }                                                                                       \
  }
SOFTMAX_BWD_ROWS(float, f32, tpu__vexpf)
SOFTMAX_BWD_ROWS(double, f64, exp)

typedef struct smb_s {
  bool lsm, f32;
  const void *g, *y;
  void* o;
  int64_t n;
} smb_t;

static tpu_status_t softmax_bwd_rows(void* arg, int64_t jb, int64_t je, int tid) {
  smb_t* S = arg;
  for (int64_t j = jb; j < je; ++j) {
    int64_t at = j * S->n;
    if (S->f32) softmax_bwd_row_f32(S->lsm, (const float*)S->g + at, (const float*)S->y + at, (float*)S->o + at, S->n);
    else softmax_bwd_row_f64(S->lsm, (const double*)S->g + at, (const double*)S->y + at, (double*)S->o + at, S->n);
  }
  return NULL;
}

static tpu_status_t softmax_bwd_kernel(tpu_node_t* node) {
  uint32_t mask = node->in[0].ndim ? 1u << node->ia[0] : 0;
  tpu_dtype_t dt = node->compute == TPU_DTYPE_F32 ? TPU_DTYPE_F32 : TPU_DTYPE_F64;
  rows_t rg, ry;
  TPU_RETURN_IF_ERROR(pack_rows(&node->in[0], mask, dt, TPU_DTYPE_INVALID, &rg));
  tpu_status_t st = pack_rows(&node->in[1], mask, dt, TPU_DTYPE_INVALID, &ry);
  if (st) { rows_free(&rg); return st; }
  int64_t n = rg.inner;
  bool direct = direct_out(&node->out[0], &node->in[0], dt, rg.perm) &&
                direct_out(&node->out[0], &node->in[1], dt, rg.perm);
  void* gi = direct ? tpu__operand_ptr(&node->out[0]) : alloc8(rg.outer * n);
  if (!gi) { rows_free(&rg); rows_free(&ry); return TPU_HOST_NOMEM(); }
  smb_t S = {node->kind == TPU_KIND_RED_LOG_SOFTMAX_BWD, dt == TPU_DTYPE_F32, rg.data, ry.data, gi, n};
  st = rg.outer > 1 && rg.outer * n >= TPU_PARALLEL_MIN_WORK
           ? tpu__parallel_for(rg.outer, row_grain(n), softmax_bwd_rows, &S)
           : softmax_bwd_rows(&S, 0, rg.outer, 0);
  if (!st && !direct) unpack_perm(&node->out[0], rg.perm, gi, dt);
  if (!direct) tpu__free(gi);
  rows_free(&rg);
  rows_free(&ry);
  return st;
}

/* ---- histc --------------------------------------------------------------------------------------
 * HISTC: in[0] self; ia[0] bins; ia[1] 1 when the range comes from the data (min == max);
 * da[0..1] the range of a floating input, ia[2..3] that of an integer input (already
 * narrowed to its dtype, CUDA's rule). */

/* Rounds v to floating dtype t the way c10's arithmetic on t stores each result. */
/* The bin of e in [lo, hi] exactly as CPU's linear histogram computes it:
 * (e - lo) * bins / (hi - lo) in the input dtype's arithmetic, truncated. */
static int64_t float_bin(double e, double lo, double hi, int64_t bins, tpu_dtype_t t) {
  if (t == TPU_DTYPE_F64) return (int64_t)((e - lo) * (double)bins / (hi - lo));
  float d = (float)tpu__round_to_dtype((float)e - (float)lo, t);
  float p = (float)tpu__round_to_dtype(d * (float)tpu__round_to_dtype((float)bins, t), t);
  return (int64_t)(float)tpu__round_to_dtype(p / (float)tpu__round_to_dtype((float)hi - (float)lo, t), t);
}

/* v stored into integer dtype t and read back (the high bits dropped). */
static int64_t narrow(int64_t v, tpu_dtype_t t) {
  int64_t r;
  tpu__store_i64(&r, t, v);
  return tpu__load_i64(&r, t);
}

static tpu_status_t histc_kernel(tpu_node_t* n) {
  const tpu_operand_t* x = &n->in[0];
  tpu_dtype_t t = x->dtype;
  int64_t bins = n->ia[0], numel = tpu__operand_numel(x);
  bool flt = tpu_dtype_is_floating(t);
  void* v = alloc8(numel);
  double* cnt = tpu__calloc((size_t)bins, sizeof(double));
  tpu_status_t st = NULL;
  if (!v || !cnt) { st = TPU_HOST_NOMEM(); goto done; }
  tpu__pack(x, NULL, flt ? TPU_DTYPE_F64 : TPU_DTYPE_I64, v);
  const char* name = tpu__node_describe(n);
  if (flt) {
    const double* e = v;
    double lo = n->da[0], hi = n->da[1];
    if (n->ia[1]) { /* aminmax of the data, NaN propagating, then CPU's range checks */
      lo = hi = e[0];
      for (int64_t i = 1; i < numel; ++i) {
        if (isnan(e[i]) || e[i] < lo) lo = isnan(lo) ? lo : e[i];
        if (isnan(e[i]) || e[i] > hi) hi = isnan(hi) ? hi : e[i];
      }
      if (lo == hi) { lo -= 1; hi += 1; }
      if (!isfinite(lo) || !isfinite(hi)) {
        st = tpu_status_make(TPU_INVALID_ARGUMENT, "%s: torch.histc: range of [%g, %g] is not finite", name, lo, hi);
        goto done;
      }
    }
    /* The edges are linspace(lo, hi, bins + 1) in dtype t: its ends are lo and hi rounded
     * to t, unless the step overflows (step * 0 is then NaN and nothing is counted). */
    if (t != TPU_DTYPE_F64) { lo = (float)tpu__round_to_dtype((float)lo, t); hi = (float)tpu__round_to_dtype((float)hi, t); }
    double step = t == TPU_DTYPE_F64 ? (hi - lo) / (double)bins
                                     : (float)tpu__round_to_dtype((float)tpu__round_to_dtype((float)hi - (float)lo, t) / (float)tpu__round_to_dtype((float)bins, t), t);
    if (isfinite(step))
      for (int64_t i = 0; i < numel; ++i) {
        if (!(e[i] >= lo && e[i] <= hi)) continue; /* outside, or NaN */
        int64_t pos = float_bin(e[i], lo, hi, bins, t);
        if (pos == bins) pos -= 1;
        if (pos < 0 || pos >= bins) continue; /* only reachable when lo == hi after rounding */
        /* CPU counts in the input dtype: f16/bf16 counts stop growing where +1 rounds away */
        cnt[pos] = t == TPU_DTYPE_F64 ? cnt[pos] + 1 : (float)tpu__round_to_dtype((float)cnt[pos] + 1.0f, t);
      }
    tpu__unpack(&n->out[0], cnt, TPU_DTYPE_F64);
  } else {
    const int64_t* e = v;
    int64_t lo = n->ia[2], hi = n->ia[3];
    if (n->ia[1]) {
      lo = hi = e[0];
      for (int64_t i = 1; i < numel; ++i) {
        if (e[i] < lo) lo = e[i];
        if (e[i] > hi) hi = e[i];
      }
      if (lo == hi) { lo = narrow(lo - 1, t); hi = narrow(hi + 1, t); } /* CUDA's input_t arithmetic */
      if (!(lo < hi)) {
        st = tpu_status_make(TPU_INVALID_ARGUMENT, "%s: max must be larger than min", name);
        goto done;
      }
    }
    int64_t* c = (int64_t*)cnt;
    for (int64_t i = 0; i < numel; ++i) {
      if (e[i] < lo || e[i] > hi) continue;
      /* CUDA's getBin: (int)((v - min) * nbins / (max - min)) in int64 */
      int64_t num = (int64_t)(((uint64_t)e[i] - (uint64_t)lo) * (uint64_t)bins);
      int64_t pos = (int)(num / (int64_t)((uint64_t)hi - (uint64_t)lo));
      if (pos == bins) pos -= 1;
      if (pos < 0 || pos >= bins) continue;
      ++c[pos];
    }
    tpu__unpack(&n->out[0], c, TPU_DTYPE_I64); /* the store wraps, as CUDA's atomic adds do */
  }
done:
  tpu__free(v);
  tpu__free(cnt);
  return st;
}

void tpu__host_register_reduce(tpu_host_kernel_fn* table) {
  static const tpu_kind_t reductions[] = {
      TPU_KIND_RED_SUM, TPU_KIND_RED_NANSUM, TPU_KIND_RED_PROD, TPU_KIND_RED_MEAN,
      TPU_KIND_RED_AMAX, TPU_KIND_RED_AMIN, TPU_KIND_RED_AMINMAX, TPU_KIND_RED_MAX_DIM,
      TPU_KIND_RED_MIN_DIM, TPU_KIND_RED_ARGMAX, TPU_KIND_RED_ARGMIN, TPU_KIND_RED_VAR,
      TPU_KIND_RED_ANY, TPU_KIND_RED_ALL, TPU_KIND_RED_LOGSUMEXP, TPU_KIND_RED_NORM,
      TPU_KIND_RED_COUNT_NONZERO};
  static const tpu_kind_t scans[] = {
      TPU_KIND_RED_CUMSUM, TPU_KIND_RED_CUMPROD, TPU_KIND_RED_LOGCUMSUMEXP, TPU_KIND_RED_CUMMAX,
      TPU_KIND_RED_CUMMIN, TPU_KIND_RED_SOFTMAX, TPU_KIND_RED_LOG_SOFTMAX};
  for (size_t i = 0; i < sizeof reductions / sizeof *reductions; ++i) table[reductions[i]] = reduce_kernel;
  for (size_t i = 0; i < sizeof scans / sizeof *scans; ++i) table[scans[i]] = scan_kernel;
  table[TPU_KIND_RED_SOFTMAX_BWD] = softmax_bwd_kernel;
  table[TPU_KIND_RED_LOG_SOFTMAX_BWD] = softmax_bwd_kernel;
  table[TPU_KIND_HISTC] = histc_kernel;
}
