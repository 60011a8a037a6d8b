/* Debug mode's checks and records: NaN/Inf in floating outputs (raise or warn, naming
 * the op and call site), the per-op trace, and the warnings the adapter turns into
 * Python warnings. Runs on the queue thread right after each debug node. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>

#include "core/internal.h"

#define TRACE_CAP 100000
#define WARN_CAP 256

static _Atomic int nan_policy = 2; /* 0 off, 1 warn, 2 raise */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static tpu_trace_record_t* trace;
static int trace_n;
static char warnings[WARN_CAP][512];
static int warn_head, warn_n;

void tpu_set_nan_check(int policy) { atomic_store(&nan_policy, policy < 0 ? 0 : policy > 2 ? 2 : policy); }

static void shape_str(char* buf, size_t cap, size_t* o, const tpu_operand_t* op) {
  if (*o >= cap) return;
  if (op->is_scalar) { *o += (size_t)snprintf(buf + *o, cap - *o, "scalar"); return; }
  if (!op->value && op->ndim >= 0) { *o += (size_t)snprintf(buf + *o, cap - *o, "None"); return; }
  char s[160];
  tpu__fmt_shape(s, sizeof s, op->ndim < 0 ? 0 : op->ndim, op->sizes);
  *o += (size_t)snprintf(buf + *o, cap - *o, "%s%s", tpu_dtype_name(op->dtype), s);
}

/* Counts NaN and Inf among a floating operand's elements. */
static void count_nonfinite(const tpu_operand_t* op, int64_t* nan_out, int64_t* inf_out) {
  int64_t numel = tpu__operand_numel(op), nan_n = 0, inf_n = 0;
  int64_t idx[TPU_MAX_DIMS] = {0};
  size_t isz = tpu_dtype_size(op->dtype);
  const char* base = (const char*)op->value->data;
  for (int64_t k = 0; k < numel; ++k) {
    int64_t off = op->offset;
    for (int d = 0; d < op->ndim; ++d) off += idx[d] * op->strides[d];
    double v, v2 = 0;
    const char* p = base + off * (int64_t)isz;
    switch (op->dtype) {
      case TPU_DTYPE_C64: v = ((const float*)p)[0]; v2 = ((const float*)p)[1]; break;
      case TPU_DTYPE_C128: v = ((const double*)p)[0]; v2 = ((const double*)p)[1]; break;
      case TPU_DTYPE_F32: v = *(const float*)p; break;
      case TPU_DTYPE_F64: v = *(const double*)p; break;
      case TPU_DTYPE_F16: v = (double)*(const _Float16*)p; break;
      default: { uint32_t u = (uint32_t)(*(const uint16_t*)p) << 16; float f; memcpy(&f, &u, 4); v = f; }
    }
    nan_n += isnan(v) || isnan(v2);
    inf_n += isinf(v) || isinf(v2); /* glibc's isinf is -1 for -inf */
    for (int d = op->ndim - 1; d >= 0; --d) {
      if (++idx[d] < op->sizes[d]) break;
      idx[d] = 0;
    }
  }
  *nan_out = nan_n;
  *inf_out = inf_n;
}

/* Whether a contiguous floating operand holds a NaN or Inf: a value whose exponent bits
 * are all ones. One branch-free pass over the bits that the compiler vectorizes; the
 * per-element walk above (index arithmetic and a conversion per element) took longer
 * than the GEMM it checked. Complex values are checked as pairs of their parts. */
#define ANY_EXP_ONES(UT, MASK)                                         \
  do {                                                                 \
    const UT* u = (const UT*)p;                                        \
    int any = 0;                                                       \
    for (int64_t k = 0; k < n; ++k) any |= (u[k] & (MASK)) == (MASK);  \
    return any != 0;                                                   \
  } while (0)

static bool dense_has_nonfinite(const tpu_operand_t* op) {
  int64_t n = tpu__operand_numel(op);
  const char* p = (const char*)op->value->data + op->offset * (int64_t)tpu_dtype_size(op->dtype);
  switch (op->dtype) {
    case TPU_DTYPE_C64: n *= 2; /* fall through */
    case TPU_DTYPE_F32: ANY_EXP_ONES(uint32_t, 0x7f800000u);
    case TPU_DTYPE_C128: n *= 2; /* fall through */
    case TPU_DTYPE_F64: ANY_EXP_ONES(uint64_t, 0x7ff0000000000000ull);
    case TPU_DTYPE_F16: ANY_EXP_ONES(uint16_t, 0x7c00u);
    default: ANY_EXP_ONES(uint16_t, 0x7f80u); /* bfloat16 */
  }
}
#undef ANY_EXP_ONES

void tpu__debug_after_run(tpu_node_t* n, double us, tpu_status_t* st) {
  tpu_trace_record_t r = {0};
  snprintf(r.op, sizeof r.op, "%s", tpu__node_describe(n));
  size_t o = 0;
  for (int i = 0; i < n->n_in; ++i) {
    if (i && o < sizeof r.shapes) o += (size_t)snprintf(r.shapes + o, sizeof r.shapes - o, ", ");
    shape_str(r.shapes, sizeof r.shapes, &o, &n->in[i]);
  }
  if (o < sizeof r.shapes) o += (size_t)snprintf(r.shapes + o, sizeof r.shapes - o, " -> ");
  for (int i = 0; i < n->n_out; ++i) {
    if (i && o < sizeof r.shapes) o += (size_t)snprintf(r.shapes + o, sizeof r.shapes - o, ", ");
    shape_str(r.shapes, sizeof r.shapes, &o, &n->out[i]);
  }
  snprintf(r.site, sizeof r.site, "%s", n->site ? n->site : "");
  r.us = us;
  tpu_driver_t* drv = tpu__driver();
  r.fusable = drv->vt->can_fuse && drv->vt->can_fuse(drv, n);
  pthread_mutex_lock(&mu);
  if (!trace) trace = tpu__calloc(TRACE_CAP, sizeof(*trace));
  if (trace && trace_n < TRACE_CAP) trace[trace_n++] = r;
  pthread_mutex_unlock(&mu);

  int policy = atomic_load(&nan_policy);
  if (*st || policy == 0) return;
  for (int i = 0; i < n->n_out; ++i) {
    const tpu_operand_t* op = &n->out[i];
    if (tpu__output_absent(op) || !n->out_bound[i] ||
        !(tpu_dtype_is_floating(op->dtype) || tpu_dtype_is_complex(op->dtype))) continue;
    if (tpu__operand_is_contiguous(op) && !dense_has_nonfinite(op)) continue;
    int64_t nan_n, inf_n;
    count_nonfinite(op, &nan_n, &inf_n);
    if (!nan_n && !inf_n) continue;
    char msg[512];
    snprintf(msg, sizeof msg, "%s produced %lld NaN and %lld Inf values in output %d (%s)",
             tpu__node_describe(n), (long long)nan_n, (long long)inf_n, i, r.shapes);
    if (policy == 2) {
      *st = tpu_status_make(TPU_INVALID_ARGUMENT, "debug mode NaN/Inf check: %s", msg);
      return;
    }
    pthread_mutex_lock(&mu);
    if (warn_n < WARN_CAP) {
      snprintf(warnings[(warn_head + warn_n) % WARN_CAP], sizeof warnings[0], "%.300s%s%.200s", msg,
               n->site ? " at " : "", n->site ? n->site : "");
      warn_n++;
    }
    pthread_mutex_unlock(&mu);
  }
}

bool tpu_take_warning(char* buf, size_t cap) {
  pthread_mutex_lock(&mu);
  bool ok = warn_n > 0;
  if (ok) {
    snprintf(buf, cap, "%s", warnings[warn_head]);
    warn_head = (warn_head + 1) % WARN_CAP;
    warn_n--;
  }
  pthread_mutex_unlock(&mu);
  return ok;
}

void tpu_trace_fallback(const char* op, double us) {
  tpu_trace_record_t r = {0};
  snprintf(r.op, sizeof r.op, "%s", op);
  snprintf(r.shapes, sizeof r.shapes, "(CPU fallback)");
  const char* site = tpu__current_site();
  snprintf(r.site, sizeof r.site, "%s", site ? site : "");
  r.us = us;
  r.fallback = true;
  pthread_mutex_lock(&mu);
  if (!trace) trace = tpu__calloc(TRACE_CAP, sizeof(*trace));
  if (trace && trace_n < TRACE_CAP) trace[trace_n++] = r;
  pthread_mutex_unlock(&mu);
}

int tpu_trace_count(void) {
  pthread_mutex_lock(&mu);
  int n = trace_n;
  pthread_mutex_unlock(&mu);
  return n;
}

bool tpu_trace_get(int i, tpu_trace_record_t* out) {
  pthread_mutex_lock(&mu);
  bool ok = trace && i >= 0 && i < trace_n;
  if (ok) *out = trace[i];
  pthread_mutex_unlock(&mu);
  return ok;
}

void tpu_trace_clear(void) {
  pthread_mutex_lock(&mu);
  trace_n = 0;
  pthread_mutex_unlock(&mu);
}
