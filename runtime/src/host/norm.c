/* Batch normalization kernels. Statistics accumulate in double per channel; the input
 * is packed once to a dense f64 buffer laid out as [N, C, inner]. */
#include <math.h>

#include "host/host.h"

typedef struct { int64_t n, c, inner; } bn_shape_t;

static bn_shape_t shape_of(const tpu_operand_t* x) {
  bn_shape_t s = {x->sizes[0], x->sizes[1], 1};
  for (int d = 2; d < x->ndim; ++d) s.inner *= x->sizes[d];
  return s;
}

static bool present(const tpu_operand_t* op) { return op->value != NULL; }

/* Packs an optional per-channel vector to double; fills `dflt` when absent. */
static double* channel_vec(const tpu_operand_t* op, int64_t c, double dflt) {
  double* v = tpu__malloc(sizeof(double) * (size_t)(c ? c : 1));
  if (!v) return NULL;
  if (present(op) && tpu__operand_numel(op) == c) tpu__pack(op, NULL, TPU_DTYPE_F64, v);
  else for (int64_t i = 0; i < c; ++i) v[i] = dflt;
  return v;
}

/* Per-channel mean and sum of squared deviations of dense [N, C, inner] data. */
static void channel_moments(const double* xd, bn_shape_t s, int64_t ch, double* mu, double* ssd) {
  double sum = 0, sq = 0;
  for (int64_t b = 0; b < s.n; ++b) {
    const double* p = xd + (b * s.c + ch) * s.inner;
    for (int64_t i = 0; i < s.inner; ++i) sum += p[i];
  }
  double m = sum / (double)(s.n * s.inner);
  for (int64_t b = 0; b < s.n; ++b) {
    const double* p = xd + (b * s.c + ch) * s.inner;
    for (int64_t i = 0; i < s.inner; ++i) sq += (p[i] - m) * (p[i] - m);
  }
  *mu = m;
  *ssd = sq;
}

static tpu_status_t bn_forward(tpu_node_t* n) {
  const tpu_operand_t* x = &n->in[0];
  bn_shape_t s = shape_of(x);
  bool training = n->ia[0];
  double momentum = n->da[0], eps = n->da[1];
  int64_t count = s.n * s.inner;
  size_t cb = sizeof(double) * (size_t)(s.c ? s.c : 1);
  double* xd = tpu__pack_alloc(x, TPU_DTYPE_F64);
  double* w = channel_vec(&n->in[1], s.c, 1.0);
  double* bias = channel_vec(&n->in[2], s.c, 0.0);
  double* rmean = channel_vec(&n->in[3], s.c, 0.0);
  double* rvar = channel_vec(&n->in[4], s.c, 1.0);
  double* mean = tpu__malloc(cb);
  double* invstd = tpu__malloc(cb);
  tpu_status_t st = NULL;
  if (!xd || !w || !bias || !rmean || !rvar || !mean || !invstd) { st = TPU_HOST_NOMEM(); goto done; }
  for (int64_t ch = 0; ch < s.c; ++ch) {
    if (training) {
      double ssd;
      channel_moments(xd, s, ch, &mean[ch], &ssd);
      invstd[ch] = 1.0 / sqrt(ssd / (double)count + eps);
      /* running statistics take the unbiased variance */
      rmean[ch] = (1 - momentum) * rmean[ch] + momentum * mean[ch];
      rvar[ch] = (1 - momentum) * rvar[ch] + momentum * ssd / (double)(count > 1 ? count - 1 : 1);
    } else {
      mean[ch] = rmean[ch];
      invstd[ch] = 1.0 / sqrt(rvar[ch] + eps);
    }
  }
  for (int64_t b = 0; b < s.n; ++b)
    for (int64_t ch = 0; ch < s.c; ++ch) {
      double* p = xd + (b * s.c + ch) * s.inner;
      double scale = invstd[ch] * w[ch], shift = bias[ch] - mean[ch] * scale;
      for (int64_t i = 0; i < s.inner; ++i) p[i] = p[i] * scale + shift;
    }
  tpu__unpack(&n->out[0], xd, TPU_DTYPE_F64);
  if (training) {
    tpu__unpack(&n->out[1], mean, TPU_DTYPE_F64);
    tpu__unpack(&n->out[2], invstd, TPU_DTYPE_F64);
    /* ATen's batch norm updates the running statistics in place. */
    if (present(&n->in[3])) tpu__unpack(&n->in[3], rmean, TPU_DTYPE_F64);
    if (present(&n->in[4])) tpu__unpack(&n->in[4], rvar, TPU_DTYPE_F64);
  }
done:
  tpu__free(xd); tpu__free(w); tpu__free(bias); tpu__free(rmean); tpu__free(rvar);
  tpu__free(mean); tpu__free(invstd);
  return st;
}

/* Inputs: grad, input, weight?, running_mean?, running_var?, save_mean?, save_invstd?. */
static tpu_status_t bn_backward(tpu_node_t* n) {
  const tpu_operand_t* x = &n->in[1];
  bn_shape_t s = shape_of(x);
  bool train = n->ia[0];
  double eps = n->da[1];
  int64_t count = s.n * s.inner;
  double* g = tpu__pack_alloc(&n->in[0], TPU_DTYPE_F64);
  double* xd = tpu__pack_alloc(x, TPU_DTYPE_F64);
  double* w = channel_vec(&n->in[2], s.c, 1.0);
  double* mean = channel_vec(train ? &n->in[5] : &n->in[3], s.c, 0.0);
  double* inv = channel_vec(train ? &n->in[6] : &n->in[4], s.c, 1.0);
  double* gw = tpu__calloc((size_t)(s.c ? s.c : 1), sizeof(double));
  double* gb = tpu__calloc((size_t)(s.c ? s.c : 1), sizeof(double));
  tpu_status_t st = NULL;
  if (!g || !xd || !w || !mean || !inv || !gw || !gb) { st = TPU_HOST_NOMEM(); goto done; }
  if (!train)
    for (int64_t ch = 0; ch < s.c; ++ch) inv[ch] = 1.0 / sqrt(inv[ch] + eps); /* inv held var */
  for (int64_t ch = 0; ch < s.c; ++ch)
    for (int64_t b = 0; b < s.n; ++b) {
      const double* gp = g + (b * s.c + ch) * s.inner;
      const double* xp = xd + (b * s.c + ch) * s.inner;
      for (int64_t i = 0; i < s.inner; ++i) {
        gb[ch] += gp[i];
        gw[ch] += gp[i] * (xp[i] - mean[ch]) * inv[ch];
      }
    }
  if (!tpu__output_absent(&n->out[0])) {
    for (int64_t b = 0; b < s.n; ++b)
      for (int64_t ch = 0; ch < s.c; ++ch) {
        const double* gp = g + (b * s.c + ch) * s.inner;
        double* xp = xd + (b * s.c + ch) * s.inner; /* overwritten with grad_input */
        double k = inv[ch] * w[ch];
        if (train) {
          double mg = gb[ch] / (double)count, mgx = gw[ch] / (double)count;
          for (int64_t i = 0; i < s.inner; ++i) {
            double xhat = (xp[i] - mean[ch]) * inv[ch];
            xp[i] = k * (gp[i] - mg - xhat * mgx);
          }
        } else {
          for (int64_t i = 0; i < s.inner; ++i) xp[i] = k * gp[i];
        }
      }
    tpu__unpack(&n->out[0], xd, TPU_DTYPE_F64);
  }
  if (!tpu__output_absent(&n->out[1])) tpu__unpack(&n->out[1], gw, TPU_DTYPE_F64);
  if (!tpu__output_absent(&n->out[2])) tpu__unpack(&n->out[2], gb, TPU_DTYPE_F64);
done:
  tpu__free(g); tpu__free(xd); tpu__free(w); tpu__free(mean); tpu__free(inv);
  tpu__free(gw); tpu__free(gb);
  return st;
}

void tpu__host_register_norm(tpu_host_kernel_fn* table) {
  table[TPU_KIND_BATCH_NORM] = bn_forward;
  table[TPU_KIND_BATCH_NORM_BACKWARD] = bn_backward;
}
