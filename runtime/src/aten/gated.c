/* ATen gated activations and recurrent cells: glu, prelu, the fused LSTM and GRU cells,
 * forward and backward.
 *
 * glu and prelu check their arguments as ATen's CPU kernels do. The fused cells have no
 * CPU kernel in PyTorch (on CPU, LSTM and GRU take a composite path); PyTorch's RNN
 * code calls them for every non-CPU device, so their rules and, above all, their
 * workspace layouts are those of the CUDA kernels (aten/src/ATen/native/cuda/RNN.cu):
 * the backward ops read exactly what the forward ops wrote.
 *
 *   LSTM workspace [B, 4H]: the activated gates i, f, g, o (PyTorch's gate order).
 *   GRU  workspace [B, 5H]: r, z, n, hx and the hidden part of n (hn + b_hn).
 *
 * One difference from CUDA: the cell operands may mix floating dtypes. Autocast turns
 * the gate GEMMs into bf16 while the cell state and biases stay float32; CUDA's autocast
 * casts the cell's inputs to one dtype first, and without such a policy for tpu the
 * cells would otherwise fail. Each output takes the dtype of the operand it replaces
 * (hy and cy that of cx or hx, the workspace that of the gates), and the arithmetic runs
 * in float32, or float64 when an operand is float64. */
#include <stdio.h>

#include "aten/aten.h"

/* ia[] slot with the result dtype of glu / prelu / glu_jvp: a wider out= tensor receives
 * the value rounded to the result dtype, as ATen computes in the common dtype. */
#define GATED_IA_RESULT 1

/* TensorIterator's check that every operand has the first one's dtype. */
static tpu_status_t same_dtype(tpu_build_t* b, tpu_dtype_t want, const tpu_view_t* v) {
  if (v->dtype == want) return NULL;
  return tpu__err(b, TPU_INVALID_ARGUMENT, "Found dtype %s but expected %s", tpu__dtype_c10_name(v->dtype),
                  tpu__dtype_c10_name(want));
}

/* Broadcasts vsizes into shape (nd dims) and requires the result to be shape itself: the
 * output of these kernels has a fixed shape, as TensorIterator's preallocated output. */
static tpu_status_t broadcasts_to(tpu_build_t* b, int nv, const int64_t* vsizes, int nd, const int64_t* shape) {
  int64_t r[TPU_MAX_DIMS];
  int rn;
  TPU_RETURN_IF_ERROR(tpu__broadcast(b, shape, nd, vsizes, nv, r, &rn));
  bool same = rn == nd;
  for (int i = 0; same && i < nd; ++i) same = r[i] == shape[i];
  if (!same) {
    char s1[256], s2[256];
    tpu__fmt_shape(s1, sizeof s1, nd, shape);
    tpu__fmt_shape(s2, sizeof s2, rn, r);
    return tpu__err(b, TPU_INVALID_ARGUMENT, "output with shape %s doesn't match the broadcast shape %s", s1, s2);
  }
  return NULL;
}

/* ---- glu -------------------------------------------------------------------------- */

/* The halved dimension of x; fills half[] with x's shape halved along it. */
static tpu_status_t glu_dim(tpu_build_t* b, const tpu_view_t* x, int64_t dim, int* out_dim, int64_t* half) {
  if (x->ndim == 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "glu does not support 0-dimensional tensors");
  int d;
  TPU_RETURN_IF_ERROR(tpu__wrap_dim(b, dim, x->ndim, &d));
  if (x->sizes[d] % 2 != 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Halving dimension must be even, but dimension %d is size %lld", d,
                    (long long)x->sizes[d]);
  memcpy(half, x->sizes, sizeof(int64_t) * (size_t)x->ndim);
  half[d] /= 2;
  *out_dim = d;
  return NULL;
}

/* glu(self, dim=-1) -> first_half * sigmoid(second_half) */
static tpu_status_t build_glu(tpu_build_t* b) {
  const tpu_view_t* x;
  int64_t dim, half[TPU_MAX_DIMS];
  int d;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  TPU_RETURN_IF_ERROR(tpu__arg_int_opt(b, 1, -1, &dim));
  TPU_RETURN_IF_ERROR(glu_dim(b, x, dim, &d, half));
  if (!tpu_dtype_is_floating(x->dtype)) return tpu__err_not_implemented_for(b, "glu_cpu", x->dtype);
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  n->kind = TPU_KIND_GLU;
  n->compute = tpu__compute_dtype(x->dtype);
  n->ia[0] = d;
  n->ia[GATED_IA_RESULT] = x->dtype;
  tpu__node_add_output(n, x->dtype, x->ndim, half);
  return NULL;
}

/* glu_backward(grad_output, self, dim) -> grad_input (self's shape); grad_output
 * broadcasts to the halved shape. */
static tpu_status_t build_glu_backward(tpu_build_t* b) {
  const tpu_view_t *g, *x;
  int64_t dim, half[TPU_MAX_DIMS];
  int d;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &g));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &x));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 2, &dim));
  TPU_RETURN_IF_ERROR(glu_dim(b, x, dim, &d, half));
  TPU_RETURN_IF_ERROR(same_dtype(b, x->dtype, g));
  TPU_RETURN_IF_ERROR(broadcasts_to(b, g->ndim, g->sizes, x->ndim, half));
  if (!tpu_dtype_is_floating(x->dtype)) return tpu__err_not_implemented_for(b, "glu_backward_cpu", x->dtype);
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, g));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  n->kind = TPU_KIND_GLU_BACKWARD;
  n->compute = tpu__compute_dtype(x->dtype);
  n->ia[0] = d;
  n->ia[GATED_IA_RESULT] = x->dtype;
  tpu__node_add_output(n, x->dtype, x->ndim, x->sizes);
  return NULL;
}

/* glu_jvp(glu, x, dx, dim) -> da * sigmoid(b) + glu * (1 - sigmoid(b)) * db, the
 * forward-mode derivative (glu = glu(x); a, b and da, db the halves of x and dx). CPU's
 * kernel lacks float16/bfloat16; CUDA's has them, and so does this one. */
static tpu_status_t build_glu_jvp(tpu_build_t* b) {
  const tpu_view_t *y, *x, *dx;
  int64_t dim, half[TPU_MAX_DIMS];
  int d;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &y));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &x));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 2, &dx));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 3, &dim));
  TPU_RETURN_IF_ERROR(glu_dim(b, x, dim, &d, half));
  bool same = dx->ndim == x->ndim;
  for (int i = 0; same && i < x->ndim; ++i) same = dx->sizes[i] == x->sizes[i];
  if (!same) {
    char s1[256], s2[256];
    tpu__fmt_shape(s1, sizeof s1, x->ndim, x->sizes);
    tpu__fmt_shape(s2, sizeof s2, dx->ndim, dx->sizes);
    return tpu__err(b, TPU_INVALID_ARGUMENT, "x and dx must have the same shape, got %s and %s", s1, s2);
  }
  TPU_RETURN_IF_ERROR(same_dtype(b, y->dtype, x));
  TPU_RETURN_IF_ERROR(same_dtype(b, y->dtype, dx));
  /* the output is glu's shape; the halves broadcast into it */
  TPU_RETURN_IF_ERROR(broadcasts_to(b, x->ndim, half, y->ndim, y->sizes));
  if (!tpu_dtype_is_floating(y->dtype)) return tpu__err_not_implemented_for(b, "glu_jvp_cpu", y->dtype);
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, y));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, dx));
  n->kind = TPU_KIND_GLU_JVP;
  n->compute = tpu__compute_dtype(y->dtype);
  n->ia[0] = d;
  n->ia[GATED_IA_RESULT] = y->dtype;
  tpu__node_add_output(n, y->dtype, y->ndim, y->sizes);
  return NULL;
}

/* ---- prelu ------------------------------------------------------------------------ */

/* _prelu_kernel(self, weight) -> self > 0 ? self : weight * self. `prelu` (composite)
 * reshapes the weight to broadcast over dim 1 before calling this; the kernel itself
 * broadcasts weight and self like any binary op. */
static tpu_status_t build_prelu(tpu_build_t* b) {
  const tpu_view_t *x, *w;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &w));
  int64_t shape[TPU_MAX_DIMS];
  int nd;
  TPU_RETURN_IF_ERROR(tpu__broadcast(b, x->sizes, x->ndim, w->sizes, w->ndim, shape, &nd));
  TPU_RETURN_IF_ERROR(same_dtype(b, x->dtype, w));
  if (!tpu_dtype_is_floating(x->dtype)) return tpu__err_not_implemented_for(b, "prelu_cpu", x->dtype);
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, w));
  n->kind = TPU_KIND_PRELU;
  n->compute = tpu__compute_dtype(x->dtype);
  n->ia[GATED_IA_RESULT] = x->dtype;
  tpu__node_add_output(n, x->dtype, nd, shape);
  return NULL;
}

/* _prelu_kernel_backward(grad_output, self, weight) -> (grad_self, grad_weight), both of
 * the broadcast shape of the three: autograd sums grad_weight down to weight's shape. */
static tpu_status_t build_prelu_backward(tpu_build_t* b) {
  const tpu_view_t *g, *x, *w;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &g));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &x));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 2, &w));
  int64_t s1[TPU_MAX_DIMS], shape[TPU_MAX_DIMS];
  int n1, nd;
  TPU_RETURN_IF_ERROR(tpu__broadcast(b, x->sizes, x->ndim, w->sizes, w->ndim, s1, &n1));
  TPU_RETURN_IF_ERROR(tpu__broadcast(b, s1, n1, g->sizes, g->ndim, shape, &nd));
  TPU_RETURN_IF_ERROR(same_dtype(b, x->dtype, w));
  TPU_RETURN_IF_ERROR(same_dtype(b, x->dtype, g));
  if (!tpu_dtype_is_floating(x->dtype)) return tpu__err_not_implemented_for(b, "prelu_backward_cpu", x->dtype);
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, w));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, g));
  n->kind = TPU_KIND_PRELU_BACKWARD;
  n->compute = tpu__compute_dtype(x->dtype);
  n->ia[GATED_IA_RESULT] = x->dtype;
  tpu__node_add_output(n, x->dtype, nd, shape);
  tpu__node_add_output(n, w->dtype, nd, shape);
  return NULL;
}

/* ---- fused LSTM / GRU cells ------------------------------------------------------- */

/* c10's TensorArg checks, with their messages. pos is the 1-based argument number. */
static tpu_status_t check_dim(tpu_build_t* b, const char* c, const tpu_view_t* v, int pos, const char* name, int want) {
  if (v->ndim == want) return NULL;
  return tpu__err(b, TPU_INVALID_ARGUMENT,
                  "Expected %d-dimensional tensor, but got %d-dimensional tensor for argument #%d '%s' "
                  "(while checking arguments for %s)", want, v->ndim, pos, name, c);
}

static tpu_status_t check_numel(tpu_build_t* b, const char* c, const tpu_view_t* v, int pos, const char* name,
                                int64_t want) {
  if (tpu_view_numel(v) == want) return NULL;
  return tpu__err(b, TPU_INVALID_ARGUMENT,
                  "Expected tensor for argument #%d '%s' to have %lld elements; but it actually has %lld "
                  "elements (while checking arguments for %s)", pos, name, (long long)want,
                  (long long)tpu_view_numel(v), c);
}

static tpu_status_t check_size(tpu_build_t* b, const char* c, const tpu_view_t* v, int pos, const char* name,
                               int nd, const int64_t* want) {
  bool same = v->ndim == nd;
  for (int i = 0; same && i < nd; ++i) same = v->sizes[i] == want[i];
  if (same) return NULL;
  char s1[256], s2[256];
  tpu__fmt_shape(s1, sizeof s1, nd, want);
  tpu__fmt_shape(s2, sizeof s2, v->ndim, v->sizes);
  return tpu__err(b, TPU_INVALID_ARGUMENT,
                  "Expected tensor of size %s, but got tensor of size %s for argument #%d '%s' (while "
                  "checking arguments for %s)", s1, s2, pos, name, c);
}

/* Every operand floating; returns the arithmetic dtype (f64 if any operand is f64). */
static tpu_status_t cell_compute(tpu_build_t* b, const char* kernel, const tpu_view_t* const* v, int k,
                                 tpu_dtype_t* out) {
  bool f64 = false;
  for (int i = 0; i < k; ++i) {
    if (!v[i]) continue;
    if (!tpu_dtype_is_floating(v[i]->dtype)) return tpu__err_not_implemented_for(b, kernel, v[i]->dtype);
    f64 |= v[i]->dtype == TPU_DTYPE_F64;
  }
  *out = f64 ? TPU_DTYPE_F64 : TPU_DTYPE_F32;
  return NULL;
}

/* The shape rules of both cells' forward (CUDA's checkSizes): input_gates is 2-D
 * [B, factor * H], hidden_gates the same size, the biases 1-D of factor * H elements
 * (both or neither), the previous state 2-D [B, H]. Returns B and H. */
static tpu_status_t cell_check(tpu_build_t* b, const char* c, int factor, const tpu_view_t* ig,
                               const tpu_view_t* hg, const tpu_view_t* prev, const tpu_view_t* bi,
                               const tpu_view_t* bh, int64_t* out_b, int64_t* out_h) {
  TPU_RETURN_IF_ERROR(check_dim(b, c, ig, 1, "input_gates", 2));
  TPU_RETURN_IF_ERROR(check_size(b, c, hg, 2, "hidden_gates", ig->ndim, ig->sizes));
  int64_t gates = ig->sizes[1];
  if (gates % factor != 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "input_gates' size 1 (%lld) must be a multiple of %d (while checking "
                    "arguments for %s)", (long long)gates, factor, c);
  if (!bi != !bh)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "input_bias and hidden_bias must both be given or both be None "
                    "(while checking arguments for %s)", c);
  if (bi) {
    TPU_RETURN_IF_ERROR(check_dim(b, c, bi, 4, "input_bias", 1));
    TPU_RETURN_IF_ERROR(check_numel(b, c, bi, 4, "input_bias", gates));
    TPU_RETURN_IF_ERROR(check_size(b, c, bh, 5, "hidden_bias", bi->ndim, bi->sizes));
  }
  TPU_RETURN_IF_ERROR(check_numel(b, c, prev, 3, "prev_hidden", tpu_view_numel(ig) / factor));
  TPU_RETURN_IF_ERROR(check_dim(b, c, prev, 3, "prev_hidden", 2));
  int64_t want[2] = {ig->sizes[0], gates / factor};
  TPU_RETURN_IF_ERROR(check_size(b, c, prev, 3, "prev_hidden", 2, want));
  *out_b = want[0];
  *out_h = want[1];
  return NULL;
}

/* The forward cells share their arguments (input_gates, hidden_gates, previous state,
 * input_bias?, hidden_bias?) and checks; they differ in gate count and outputs:
 * LSTM -> (hy, cy, workspace [B, 4H]), GRU -> (hy, workspace [B, 5H]). */
typedef struct cell_def_s {
  int factor;          /* gates per hidden unit */
  const char* name;    /* the ATen op, for messages */
  const char* kernel;  /* CUDA's kernel name, for dtype messages */
  tpu_kind_t kind;
} cell_def_t;
static const cell_def_t k_lstm = {4, "_thnn_fused_lstm_cell", "_thnn_fused_lstm_cell_cuda", TPU_KIND_LSTM_CELL};
static const cell_def_t k_gru = {3, "_thnn_fused_gru_cell", "_thnn_fused_gru_cell_cuda", TPU_KIND_GRU_CELL};

static tpu_status_t build_cell(tpu_build_t* b) {
  const cell_def_t* d = b->data;
  const tpu_view_t *ig, *hg, *prev, *bi, *bh;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &ig));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &hg));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 2, &prev));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor_opt(b, 3, &bi));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor_opt(b, 4, &bh));
  int64_t B = 0, H = 0;
  TPU_RETURN_IF_ERROR(cell_check(b, d->name, d->factor, ig, hg, prev, bi, bh, &B, &H));
  const tpu_view_t* all[5] = {ig, hg, prev, bi, bh};
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(cell_compute(b, d->kernel, all, 5, &n->compute));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, ig));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, hg));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, prev));
  TPU_RETURN_IF_ERROR(tpu__node_add_opt(b, bi));
  TPU_RETURN_IF_ERROR(tpu__node_add_opt(b, bh));
  n->kind = d->kind;
  n->ia[0] = B;
  n->ia[1] = H;
  tpu__node_add_output(n, prev->dtype, 2, prev->sizes);
  if (d->kind == TPU_KIND_LSTM_CELL) {
    tpu__node_add_output(n, prev->dtype, 2, prev->sizes);
    tpu__node_add_output(n, ig->dtype, 2, ig->sizes);
  } else {
    int64_t wsz[2] = {B, 5 * H};
    tpu__node_add_output(n, prev->dtype, 2, wsz);
  }
  return NULL;
}

/* _thnn_fused_lstm_cell_backward_impl(grad_hy?, grad_cy?, cx, cy, workspace, has_bias)
 * -> (grad_gates, grad_cx, grad_bias). With neither gradient every output is undefined;
 * grad_bias (the batch sum of grad_gates) only with has_bias. */
static tpu_status_t build_lstm_cell_backward(tpu_build_t* b) {
  static const char* c = "fused_lstm_cell_backward";
  const tpu_view_t *ghy, *gcy, *cx, *cy, *ws;
  bool has_bias;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor_opt(b, 0, &ghy));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor_opt(b, 1, &gcy));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 2, &cx));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 3, &cy));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 4, &ws));
  TPU_RETURN_IF_ERROR(tpu__arg_bool(b, 5, &has_bias));
  tpu_node_t* n = b->node;
  n->kind = TPU_KIND_LSTM_CELL_BACKWARD;
  if (!ghy && !gcy) {
    n->compute = TPU_DTYPE_F32;
    for (int i = 0; i < 3; ++i) tpu__node_add_output(n, ws->dtype, -1, NULL);
    return NULL;
  }
  const tpu_view_t* dg = ghy ? ghy : gcy;
  TPU_RETURN_IF_ERROR(check_dim(b, c, dg, ghy ? 1 : 2, ghy ? "grad_hy" : "grad_cy", 2));
  if (ghy) TPU_RETURN_IF_ERROR(check_size(b, c, ghy, 1, "grad_hy", 2, dg->sizes));
  if (gcy) TPU_RETURN_IF_ERROR(check_size(b, c, gcy, 2, "grad_cy", 2, dg->sizes));
  TPU_RETURN_IF_ERROR(check_size(b, c, cx, 3, "cx", 2, dg->sizes));
  TPU_RETURN_IF_ERROR(check_size(b, c, cy, 4, "cy", 2, dg->sizes));
  TPU_RETURN_IF_ERROR(check_dim(b, c, ws, 5, "workspace", 2));
  int64_t B = dg->sizes[0], H = dg->sizes[1];
  int64_t wsz[2] = {B, 4 * H};
  TPU_RETURN_IF_ERROR(check_size(b, c, ws, 5, "workspace", 2, wsz));
  const tpu_view_t* all[5] = {ghy, gcy, cx, cy, ws};
  TPU_RETURN_IF_ERROR(cell_compute(b, "_thnn_fused_lstm_cell_cuda_backward", all, 5, &n->compute));
  TPU_RETURN_IF_ERROR(tpu__node_add_opt(b, ghy));
  TPU_RETURN_IF_ERROR(tpu__node_add_opt(b, gcy));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, cx));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, cy));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, ws));
  n->ia[0] = B;
  n->ia[1] = H;
  tpu__node_add_output(n, ws->dtype, 2, wsz);
  tpu__node_add_output(n, cx->dtype, 2, cx->sizes);
  int64_t g = 4 * H;
  tpu__node_add_output(n, ws->dtype, has_bias ? 1 : -1, &g);
  return NULL;
}

/* _thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias)
 * -> (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias);
 * the bias gradients (batch sums of the gate gradients) only with has_bias. */
static tpu_status_t build_gru_cell_backward(tpu_build_t* b) {
  static const char* c = "fused_gru_cell_backward";
  const tpu_view_t *ghy, *ws;
  bool has_bias;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &ghy));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &ws));
  TPU_RETURN_IF_ERROR(tpu__arg_bool(b, 2, &has_bias));
  TPU_RETURN_IF_ERROR(check_dim(b, c, ghy, 1, "grad_hy", 2));
  int64_t B = ghy->sizes[0], H = ghy->sizes[1];
  int64_t wsz[2] = {B, 5 * H};
  TPU_RETURN_IF_ERROR(check_size(b, c, ws, 2, "workspace", 2, wsz));
  const tpu_view_t* all[2] = {ghy, ws};
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(cell_compute(b, "_thnn_fused_gru_cell_cuda_backward", all, 2, &n->compute));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, ghy));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, ws));
  n->kind = TPU_KIND_GRU_CELL_BACKWARD;
  n->ia[0] = B;
  n->ia[1] = H;
  int64_t gsz[2] = {B, 3 * H}, g = 3 * H;
  tpu__node_add_output(n, ws->dtype, 2, gsz);
  tpu__node_add_output(n, ws->dtype, 2, gsz);
  tpu__node_add_output(n, ghy->dtype, 2, ghy->sizes);
  tpu__node_add_output(n, ws->dtype, has_bias ? 1 : -1, &g);
  /* The fifth result needs a node with room for five outputs. Without it the adapter
   * returns an empty tensor in its place, which autograd never reads when the cell has
   * no bias (grad_hidden_bias is then not needed). */
  if (tpu__node_add_output(n, ws->dtype, has_bias ? 1 : -1, &g) < 0 && has_bias)
    return tpu__err(b, TPU_INTERNAL, "the runtime's nodes hold at most %d outputs; grad_hidden_bias needs a "
                    "fifth (raise TPU_NODE_MAX_OUT in core/internal.h)", TPU_NODE_MAX_OUT);
  return NULL;
}

/* _thnn_fused_lstm_cell_backward (five results) is CompositeImplicitAutograd over the
 * _impl op, so only the _impl is registered. */
const tpu_aten_entry_t tpu__aten_gated[] = {
    {"glu", build_glu, NULL},
    {"glu.out", build_glu, NULL},
    {"glu_backward", build_glu_backward, NULL},
    {"glu_backward.grad_input", build_glu_backward, NULL},
    {"glu_jvp", build_glu_jvp, NULL},
    {"glu_jvp.out", build_glu_jvp, NULL},
    {"_prelu_kernel", build_prelu, NULL},
    {"_prelu_kernel_backward", build_prelu_backward, NULL},
    {"_thnn_fused_lstm_cell", build_cell, &k_lstm},
    {"_thnn_fused_lstm_cell.out", build_cell, &k_lstm},
    {"_thnn_fused_lstm_cell_backward_impl", build_lstm_cell_backward, NULL},
    {"_thnn_fused_lstm_cell_backward_impl.out", build_lstm_cell_backward, NULL},
    {"_thnn_fused_gru_cell", build_cell, &k_gru},
    {"_thnn_fused_gru_cell.out", build_cell, &k_gru},
    {"_thnn_fused_gru_cell_backward", build_gru_cell_backward, NULL},
    {"_thnn_fused_gru_cell_backward.out", build_gru_cell_backward, NULL},
    {NULL, NULL, NULL},
};
