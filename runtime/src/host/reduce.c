/* Host kernels of the reduce family (node layout: aten/reduce.c).
 *
 * Every kernel packs its input as rows: the kept dims (in order) outer, the reduced
 * dims (or the scan/softmax dim) inner, so each output element reduces one dense row.
 * Floating inputs are packed as float64 whatever their dtype: accumulating f32 in double
 * is what PyTorch's CPU does for cumulative ops and is at least as exact as its cascade
 * sums elsewhere. Integers and bool are packed as int64 and wrap like CPU's. */
#include <math.h>

#include "host/host.h"

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

static tpu_dtype_t buf_dtype(const tpu_node_t* n) {
  return tpu_dtype_is_floating(n->compute) ? TPU_DTYPE_F64 : TPU_DTYPE_I64;
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

/* Two-level blocked summation: error grows with n/256 + 256, not n. */
static double block_sum(const double* x, int64_t n, int mode, double a) {
  double tot = 0;
  for (int64_t b0 = 0; b0 < n; b0 += 256) {
    int64_t e = b0 + 256 < n ? b0 + 256 : n;
    double s0 = 0, s1 = 0;
    int64_t i = b0;
    for (; i + 1 < e; i += 2) { s0 += term(x[i], mode, a); s1 += term(x[i + 1], mode, a); }
    if (i < e) s0 += term(x[i], mode, a);
    tot += s0 + s1;
  }
  return tot;
}

static double f_max(const double* x, int64_t n) {
  double m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (isnan(x[i])) return x[i];
    if (x[i] > m) m = x[i];
  }
  return m;
}

static double f_min(const double* x, int64_t n) {
  double m = INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (isnan(x[i])) return x[i];
    if (x[i] < m) m = x[i];
  }
  return m;
}

/* First index of the extreme value; a NaN wins and its first index is taken. */
static int64_t f_arg(const double* x, int64_t n, bool want_max) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (isnan(x[best])) break;
    if (isnan(x[i]) || (want_max ? x[i] > x[best] : x[i] < x[best])) best = i;
  }
  return best;
}

static int64_t i_arg(const int64_t* x, int64_t n, bool want_max) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (want_max ? x[i] > x[best] : x[i] < x[best]) best = i;
  return best;
}

static double f_lse(const double* x, int64_t n) {
  double m = f_max(x, n);
  if (isnan(m)) return m;
  if (isinf(m)) m = 0; /* all -inf gives -inf; any +inf gives +inf */
  return log(block_sum(x, n, S_EXPDEV, m)) + m;
}

static double f_norm(const double* x, int64_t n, double p) {
  if (p == 0) {
    double c = 0;
    for (int64_t i = 0; i < n; ++i) c += x[i] != 0;
    return c;
  }
  if (isinf(p)) {
    double m = p > 0 ? 0 : INFINITY;
    for (int64_t i = 0; i < n; ++i) {
      double v = fabs(x[i]);
      if (isnan(v)) return v;
      if (p > 0 ? v > m : v < m) m = v;
    }
    return m;
  }
  if (p == 1) return block_sum(x, n, S_ABS, 0);
  if (p == 2) return sqrt(block_sum(x, n, S_SQ, 0));
  return pow(block_sum(x, n, S_POW, p), 1.0 / p);
}

static tpu_status_t reduce_kernel(tpu_node_t* node) {
  tpu_dtype_t dt = buf_dtype(node);
  bool fl = dt == TPU_DTYPE_F64;
  rows_t r;
  TPU_RETURN_IF_ERROR(pack_rows(&node->in[0], (uint32_t)node->ia[0], dt, (tpu_dtype_t)node->ia[2], &r));
  int64_t outer = r.outer, inner = r.inner;
  void* o0 = alloc8(outer);
  void* o1 = node->n_out > 1 ? alloc8(outer) : NULL;
  if (!o0 || (node->n_out > 1 && !o1)) {
    tpu__free(o0); tpu__free(o1); rows_free(&r);
    return TPU_HOST_NOMEM();
  }
  double* fo = o0;
  double* fo1 = o1;
  int64_t* io = o0;
  int64_t* io1 = o1;
  tpu_dtype_t dt1 = dt; /* dtype of o1 */
  tpu_kind_t k = node->kind;
  for (int64_t j = 0; j < outer; ++j) {
    const double* fx = (const double*)r.data + j * inner;
    const int64_t* ix = (const int64_t*)r.data + j * inner;
    switch (k) {
      case TPU_KIND_RED_SUM:
      case TPU_KIND_RED_NANSUM:
      case TPU_KIND_RED_COUNT_NONZERO:
        if (fl) fo[j] = block_sum(fx, inner, k == TPU_KIND_RED_NANSUM ? S_NONAN : S_PLAIN, 0);
        else {
          uint64_t s = 0;
          for (int64_t i = 0; i < inner; ++i) s += (uint64_t)ix[i];
          io[j] = (int64_t)s;
        }
        break;
      case TPU_KIND_RED_MEAN:
        fo[j] = block_sum(fx, inner, S_PLAIN, 0) / (double)inner;
        break;
      case TPU_KIND_RED_PROD:
        if (fl) { double p = 1; for (int64_t i = 0; i < inner; ++i) p *= fx[i]; fo[j] = p; }
        else { uint64_t p = 1; for (int64_t i = 0; i < inner; ++i) p *= (uint64_t)ix[i]; io[j] = (int64_t)p; }
        break;
      case TPU_KIND_RED_AMAX:
      case TPU_KIND_RED_AMIN:
      case TPU_KIND_RED_AMINMAX: {
        bool mx = k == TPU_KIND_RED_AMAX;
        if (fl) {
          if (k == TPU_KIND_RED_AMINMAX) { fo[j] = f_min(fx, inner); fo1[j] = f_max(fx, inner); }
          else fo[j] = mx ? f_max(fx, inner) : f_min(fx, inner);
        } else if (inner > 0) {
          if (k == TPU_KIND_RED_AMINMAX) { io[j] = ix[i_arg(ix, inner, false)]; io1[j] = ix[i_arg(ix, inner, true)]; }
          else io[j] = ix[i_arg(ix, inner, mx)];
        }
        break;
      }
      case TPU_KIND_RED_MAX_DIM:
      case TPU_KIND_RED_MIN_DIM: {
        bool mx = k == TPU_KIND_RED_MAX_DIM;
        int64_t a = inner > 0 ? (fl ? f_arg(fx, inner, mx) : i_arg(ix, inner, mx)) : 0;
        if (fl) fo[j] = inner > 0 ? fx[a] : NAN; else io[j] = inner > 0 ? ix[a] : 0;
        io1[j] = a;
        dt1 = TPU_DTYPE_I64;
        break;
      }
      case TPU_KIND_RED_ARGMAX:
      case TPU_KIND_RED_ARGMIN: {
        bool mx = k == TPU_KIND_RED_ARGMAX;
        io[j] = inner > 0 ? (fl ? f_arg(fx, inner, mx) : i_arg(ix, inner, mx)) : 0;
        break;
      }
      case TPU_KIND_RED_VAR: {
        double mean = block_sum(fx, inner, S_PLAIN, 0) / (double)inner;
        double ss = block_sum(fx, inner, S_SQDEV, mean);
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
  bool is_idx = k == TPU_KIND_RED_ARGMAX || k == TPU_KIND_RED_ARGMIN;
  /* any/all/count_nonzero pack int64 from floats too; their buffers are int64 */
  bool int_out = is_idx || k == TPU_KIND_RED_ANY || k == TPU_KIND_RED_ALL || k == TPU_KIND_RED_COUNT_NONZERO;
  tpu__unpack(&node->out[0], o0, int_out ? TPU_DTYPE_I64 : dt);
  if (node->n_out > 1) tpu__unpack(&node->out[1], o1, dt1);
  tpu__free(o0);
  tpu__free(o1);
  rows_free(&r);
  return NULL;
}

/* ---- scans and softmax along one dim ------------------------------------------------------ */

static inline double log_add_exp(double a, double b) {
  double lo = isnan(b) ? b : (a < b ? a : b);
  double hi = isnan(b) ? b : (a < b ? b : a);
  if (lo != hi || isfinite(lo)) return hi + log1p(exp(lo - hi));
  return a; /* both infinite with the same sign */
}

static void scan_row(tpu_kind_t k, bool fl, const void* xin, void* yout, int64_t* idx, int64_t n) {
  const double* fx = xin;
  const int64_t* ix = xin;
  double* fy = yout;
  int64_t* iy = yout;
  switch (k) {
    case TPU_KIND_RED_CUMSUM:
      if (fl) { double s = 0; for (int64_t i = 0; i < n; ++i) fy[i] = s += fx[i]; }
      else { uint64_t s = 0; for (int64_t i = 0; i < n; ++i) iy[i] = (int64_t)(s += (uint64_t)ix[i]); }
      break;
    case TPU_KIND_RED_CUMPROD:
      if (fl) { double s = 1; for (int64_t i = 0; i < n; ++i) fy[i] = s *= fx[i]; }
      else { uint64_t s = 1; for (int64_t i = 0; i < n; ++i) iy[i] = (int64_t)(s *= (uint64_t)ix[i]); }
      break;
    case TPU_KIND_RED_LOGCUMSUMEXP: {
      double s = -INFINITY;
      for (int64_t i = 0; i < n; ++i) fy[i] = s = log_add_exp(s, fx[i]);
      break;
    }
    case TPU_KIND_RED_CUMMAX:
    case TPU_KIND_RED_CUMMIN: {
      /* ties move the index forward; once NaN, every later NaN takes over */
      bool mx = k == TPU_KIND_RED_CUMMAX;
      int64_t b = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (fl) {
          double v = fx[i], c = fx[b];
          if (isnan(v) || (!isnan(c) && (mx ? v >= c : v <= c))) b = i;
          fy[i] = fx[b];
        } else {
          if (mx ? ix[i] >= ix[b] : ix[i] <= ix[b]) b = i;
          iy[i] = ix[b];
        }
        idx[i] = b;
      }
      break;
    }
    case TPU_KIND_RED_SOFTMAX:
    case TPU_KIND_RED_LOG_SOFTMAX: {
      double m = -INFINITY;
      for (int64_t i = 0; i < n; ++i) m = fx[i] > m || isnan(fx[i]) ? fx[i] : m;
      if (k == TPU_KIND_RED_SOFTMAX) {
        for (int64_t i = 0; i < n; ++i) fy[i] = exp(fx[i] - m);
        double inv = 1.0 / block_sum(fy, n, S_PLAIN, 0);
        for (int64_t i = 0; i < n; ++i) fy[i] *= inv;
      } else {
        double ls = log(block_sum(fx, n, S_EXPDEV, m));
        for (int64_t i = 0; i < n; ++i) fy[i] = fx[i] - m - ls;
      }
      break;
    }
    default:
      break;
  }
}

static tpu_status_t scan_kernel(tpu_node_t* node) {
  tpu_dtype_t dt = buf_dtype(node);
  bool fl = dt == TPU_DTYPE_F64;
  uint32_t mask = node->in[0].ndim ? 1u << node->ia[0] : 0;
  rows_t r;
  TPU_RETURN_IF_ERROR(pack_rows(&node->in[0], mask, dt, (tpu_dtype_t)node->ia[2], &r));
  int64_t total = r.outer * r.inner;
  bool two = node->n_out > 1;
  void* y = alloc8(total);
  int64_t* idx = two ? alloc8(total) : NULL;
  if (!y || (two && !idx)) { tpu__free(y); tpu__free(idx); rows_free(&r); return TPU_HOST_NOMEM(); }
  for (int64_t j = 0; j < r.outer; ++j)
    scan_row(node->kind, fl, (const char*)r.data + j * r.inner * 8, (char*)y + j * r.inner * 8,
             idx ? idx + j * r.inner : NULL, r.inner);
  unpack_perm(&node->out[0], r.perm, y, dt);
  if (two) unpack_perm(&node->out[1], r.perm, idx, TPU_DTYPE_I64);
  tpu__free(y);
  tpu__free(idx);
  rows_free(&r);
  return NULL;
}

/* grad_input of softmax: y * (g - sum(g * y)); of log_softmax: g - exp(y) * sum(g). */
static tpu_status_t softmax_bwd_kernel(tpu_node_t* node) {
  uint32_t mask = node->in[0].ndim ? 1u << node->ia[0] : 0;
  rows_t rg, ry;
  TPU_RETURN_IF_ERROR(pack_rows(&node->in[0], mask, TPU_DTYPE_F64, TPU_DTYPE_INVALID, &rg));
  tpu_status_t st = pack_rows(&node->in[1], mask, TPU_DTYPE_F64, TPU_DTYPE_INVALID, &ry);
  if (st) { rows_free(&rg); return st; }
  int64_t n = rg.inner;
  double* gi = alloc8(rg.outer * n);
  if (!gi) { rows_free(&rg); rows_free(&ry); return TPU_HOST_NOMEM(); }
  bool lsm = node->kind == TPU_KIND_RED_LOG_SOFTMAX_BWD;
  for (int64_t j = 0; j < rg.outer; ++j) {
    const double* g = (const double*)rg.data + j * n;
    const double* y = (const double*)ry.data + j * n;
    double* o = gi + j * n;
    double s = 0;
    if (lsm) {
      s = block_sum(g, n, S_PLAIN, 0);
      for (int64_t i = 0; i < n; ++i) o[i] = g[i] - exp(y[i]) * s;
    } else {
      for (int64_t i = 0; i < n; ++i) s += g[i] * y[i];
      for (int64_t i = 0; i < n; ++i) o[i] = y[i] * (g[i] - s);
    }
  }
  unpack_perm(&node->out[0], rg.perm, gi, TPU_DTYPE_F64);
  tpu__free(gi);
  rows_free(&rg);
  rows_free(&ry);
  return NULL;
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
}
