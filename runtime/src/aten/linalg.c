/* ATen ops of the linalg family: matrix products, triangular solves, convolution, 2-d
 * and 3-d pooling.
 *
 * Validation follows PyTorch's CPU kernels check by check, in their order, so the same
 * call fails with the same exception class and (after the op-name prefix) the same text.
 * Node layouts are described at the top of host/linalg.c. */
#include <stdio.h>

#include "aten/aten.h"

/* ---- matrix products ------------------------------------------------------------------ */

typedef enum gemm_op_e { GM_MM, GM_BMM, GM_ADDMM, GM_BADDBMM, GM_ADDBMM, GM_ADDMV, GM_MV, GM_DOT } gemm_op_t;
static const gemm_op_t g_mm = GM_MM, g_bmm = GM_BMM, g_addmm = GM_ADDMM, g_baddbmm = GM_BADDBMM,
                       g_addbmm = GM_ADDBMM, g_addmv = GM_ADDMV, g_mv = GM_MV, g_dot = GM_DOT;

/* Views operand i of the node as [batch, rows, cols] with the given strides. */
static void as3d(tpu_node_t* n, int i, int64_t bt, int64_t r, int64_t c, int64_t sb, int64_t sr, int64_t sc) {
  tpu_operand_t* op = &n->in[i];
  op->ndim = 3;
  op->sizes[0] = bt; op->sizes[1] = r; op->sizes[2] = c;
  op->strides[0] = sb; op->strides[1] = sr; op->strides[2] = sc;
}

static int64_t scalar_as_int(const tpu_arg_t* a, double d) {
  if (!a || a->kind == TPU_ARG_NONE) return 1;
  if (a->kind == TPU_ARG_INT || (a->kind == TPU_ARG_SCALAR && a->scalar_kind != TPU_SCALAR_FLOAT))
    return a->v.i;
  if (a->kind == TPU_ARG_BOOL) return a->v.b;
  return (int64_t)d;
}

static tpu_status_t gemm_checks(tpu_build_t* b, gemm_op_t op, const tpu_view_t* c,
                                const tpu_view_t* x, const tpu_view_t* y, int* out_nd, int64_t* out) {
  const int64_t* xs = x->sizes;
  const int64_t* ys = y->sizes;
  switch (op) {
    case GM_MM:
      if (x->ndim != 2) return tpu__err(b, TPU_INVALID_ARGUMENT, "self must be a matrix");
      if (y->ndim != 2) return tpu__err(b, TPU_INVALID_ARGUMENT, "mat2 must be a matrix");
      if (xs[1] != ys[0])
        return tpu__err(b, TPU_INVALID_ARGUMENT, "mat1 and mat2 shapes cannot be multiplied (%lldx%lld and %lldx%lld)",
                        (long long)xs[0], (long long)xs[1], (long long)ys[0], (long long)ys[1]);
      if (x->dtype != y->dtype)
        return tpu__err(b, TPU_INVALID_ARGUMENT, "expected m1 and m2 to have the same dtype, but got: %s != %s",
                        tpu__dtype_cpp_name(x->dtype), tpu__dtype_cpp_name(y->dtype));
      *out_nd = 2; out[0] = xs[0]; out[1] = ys[1];
      if (x->dtype == TPU_DTYPE_BOOL) return tpu__err_not_implemented_for(b, "addmm_impl_cpu_", x->dtype);
      return NULL;
    case GM_ADDMM:
      if (c->dtype != y->dtype)
        return tpu__err(b, TPU_INVALID_ARGUMENT, "self and mat2 must have the same dtype, but got %s and %s",
                        tpu__dtype_c10_name(c->dtype), tpu__dtype_c10_name(y->dtype));
      if (x->dtype != y->dtype)
        return tpu__err(b, TPU_INVALID_ARGUMENT, "mat1 and mat2 must have the same dtype, but got %s and %s",
                        tpu__dtype_c10_name(x->dtype), tpu__dtype_c10_name(y->dtype));
      if (x->ndim != 2) return tpu__err(b, TPU_INVALID_ARGUMENT, "mat1 must be a matrix, got %d-D tensor", x->ndim);
      if (y->ndim != 2) return tpu__err(b, TPU_INVALID_ARGUMENT, "mat2 must be a matrix, got %d-D tensor", y->ndim);
      if (xs[1] != ys[0])
        return tpu__err(b, TPU_INVALID_ARGUMENT, "mat1 and mat2 shapes cannot be multiplied (%lldx%lld and %lldx%lld)",
                        (long long)xs[0], (long long)xs[1], (long long)ys[0], (long long)ys[1]);
      *out_nd = 2; out[0] = xs[0]; out[1] = ys[1];
      TPU_RETURN_IF_ERROR(tpu__check_expand(b, c, 2, out));
      if (x->dtype == TPU_DTYPE_BOOL) return tpu__err_not_implemented_for(b, "addmm_impl_cpu_", x->dtype);
      return NULL;
    case GM_BMM:
    case GM_BADDBMM:
      if (op == GM_BADDBMM && c->dtype != x->dtype)
        return tpu__err(b, TPU_INVALID_ARGUMENT, "Input dtypes must be the same, got: input %s, batch1: %s, batch2: %s",
                        tpu__dtype_cpp_name(c->dtype), tpu__dtype_cpp_name(x->dtype), tpu__dtype_cpp_name(y->dtype));
      if (x->ndim != 3) return tpu__err(b, TPU_INVALID_ARGUMENT, "batch1 must be a 3D tensor");
      if (y->ndim != 3) return tpu__err(b, TPU_INVALID_ARGUMENT, "batch2 must be a 3D tensor");
      if (ys[0] != xs[0] || ys[1] != xs[2])
        return tpu__err(b, TPU_INVALID_ARGUMENT,
                        "Expected size for first two dimensions of batch2 tensor to be: [%lld, %lld] but got: [%lld, %lld].",
                        (long long)xs[0], (long long)xs[2], (long long)ys[0], (long long)ys[1]);
      *out_nd = 3; out[0] = xs[0]; out[1] = xs[1]; out[2] = ys[2];
      if (op == GM_BADDBMM) TPU_RETURN_IF_ERROR(tpu__check_expand(b, c, 3, out));
      if (x->dtype != y->dtype)
        return tpu__err(b, TPU_INVALID_ARGUMENT, "expected scalar type %s but found %s",
                        tpu__dtype_c10_name(x->dtype), tpu__dtype_c10_name(y->dtype));
      if (x->dtype == TPU_DTYPE_BOOL) return tpu__err_not_implemented_for(b, op == GM_BMM ? "bmm" : "baddbmm", x->dtype);
      return NULL;
    case GM_ADDBMM:
      if (x->ndim != 3) return tpu__err(b, TPU_INVALID_ARGUMENT, "batch1 must be a 3D tensor");
      if (y->ndim != 3) return tpu__err(b, TPU_INVALID_ARGUMENT, "batch2 must be a 3D tensor");
      if (xs[0] != ys[0])
        return tpu__err(b, TPU_INVALID_ARGUMENT, "batch1 and batch2 must have same number of batches, got %lld and %lld",
                        (long long)xs[0], (long long)ys[0]);
      if (xs[2] != ys[1])
        return tpu__err(b, TPU_INVALID_ARGUMENT, "Incompatible matrix sizes for bmm (%lldx%lld and %lldx%lld)",
                        (long long)xs[1], (long long)xs[2], (long long)ys[1], (long long)ys[2]);
      *out_nd = 2; out[0] = xs[1]; out[1] = ys[2];
      TPU_RETURN_IF_ERROR(tpu__check_expand(b, c, 2, out));
      if (c->dtype != y->dtype)
        return tpu__err(b, TPU_INVALID_ARGUMENT, "self and mat2 must have the same dtype, but got %s and %s",
                        tpu__dtype_c10_name(c->dtype), tpu__dtype_c10_name(y->dtype));
      if (x->dtype != y->dtype)
        return tpu__err(b, TPU_INVALID_ARGUMENT, "mat1 and mat2 must have the same dtype, but got %s and %s",
                        tpu__dtype_c10_name(x->dtype), tpu__dtype_c10_name(y->dtype));
      if (x->dtype == TPU_DTYPE_BOOL) return tpu__err_not_implemented_for(b, "addmm_impl_cpu_", x->dtype);
      return NULL;
    case GM_ADDMV:
    case GM_MV: {
      /* mv runs as addmv into an empty result of vec's dtype. */
      int cnd = op == GM_MV ? 1 : c->ndim;
      tpu_dtype_t cdt = op == GM_MV ? y->dtype : c->dtype;
      if (!((cnd == 1 || (op == GM_ADDMV && cnd == 0)) && x->ndim == 2 && y->ndim == 1))
        return tpu__err(b, TPU_INVALID_ARGUMENT, "vector + matrix @ vector expected, got %d, %d, %d",
                        cnd, x->ndim, y->ndim);
      int64_t csz = op == GM_MV ? xs[0] : c->ndim ? c->sizes[0] : 1;
      if (xs[1] != ys[0] || (csz != xs[0] && csz != 1))
        return tpu__err(b, TPU_INVALID_ARGUMENT, "size mismatch, got input (%lld), mat (%lldx%lld), vec (%lld)",
                        (long long)csz, (long long)xs[0], (long long)xs[1], (long long)ys[0]);
      if (cdt != x->dtype || x->dtype != y->dtype)
        return tpu__err(b, TPU_INVALID_ARGUMENT, "addmv input tensors must have the same dtype, but got %s, %s, and %s",
                        tpu__dtype_c10_name(cdt), tpu__dtype_c10_name(x->dtype), tpu__dtype_c10_name(y->dtype));
      *out_nd = 1; out[0] = xs[0];
      if (x->dtype == TPU_DTYPE_BOOL) return tpu__err_not_implemented_for(b, "addmv_impl_cpu", x->dtype);
      return NULL;
    }
    case GM_DOT:
      if (x->ndim != 1 || y->ndim != 1)
        return tpu__err(b, TPU_INVALID_ARGUMENT, "1D tensors expected, but got %dD and %dD tensors", x->ndim, y->ndim);
      if (x->dtype != y->dtype)
        return tpu__err(b, TPU_INVALID_ARGUMENT, "dot : expected both vectors to have same dtype, but found %s and %s",
                        tpu__dtype_c10_name(x->dtype), tpu__dtype_c10_name(y->dtype));
      if (xs[0] != ys[0])
        return tpu__err(b, TPU_INVALID_ARGUMENT,
                        "inconsistent tensor size, expected tensor [%lld] and src [%lld] to have the same number "
                        "of elements, but got %lld and %lld elements respectively",
                        (long long)xs[0], (long long)ys[0], (long long)xs[0], (long long)ys[0]);
      *out_nd = 0;
      if (x->dtype == TPU_DTYPE_BOOL) return tpu__err_not_implemented_for(b, "dot", x->dtype);
      return NULL;
  }
  return tpu__err(b, TPU_INTERNAL, "unknown product");
}

static tpu_status_t build_gemm(tpu_build_t* b) {
  gemm_op_t op = *(const gemm_op_t*)b->data;
  bool has_c = op == GM_ADDMM || op == GM_BADDBMM || op == GM_ADDBMM || op == GM_ADDMV;
  int ai = has_c ? 1 : 0;
  const tpu_view_t *c = NULL, *x, *y;
  if (has_c) TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &c));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, ai, &x));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, ai + 1, &y));
  int out_nd = 0;
  int64_t out[3] = {0, 0, 0};
  TPU_RETURN_IF_ERROR(gemm_checks(b, op, c, x, y, &out_nd, out));
  tpu_node_t* n = b->node;
  double alpha = 1, beta = 1;
  if (has_c) {
    TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, 3, 1.0, &beta));
    TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, 4, 1.0, &alpha));
  }
  n->da[0] = alpha; n->da[1] = beta;
  n->ia[1] = has_c ? scalar_as_int(tpu__arg(b, 4), alpha) : 1;
  n->ia[2] = has_c ? scalar_as_int(tpu__arg(b, 3), beta) : 1;
  n->ia[0] = op == GM_ADDBMM;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, y));
  if (has_c) TPU_RETURN_IF_ERROR(tpu__node_add_input(n, c));
  else TPU_RETURN_IF_ERROR(tpu__node_add_absent(n));
  const int64_t* xs = x->sizes;
  const int64_t* xt = x->strides;
  const int64_t* yt = y->strides;
  switch (op) {
    case GM_MM: case GM_ADDMM:
      as3d(n, 0, 1, xs[0], xs[1], 0, xt[0], xt[1]);
      as3d(n, 1, 1, y->sizes[0], y->sizes[1], 0, yt[0], yt[1]);
      break;
    case GM_ADDMV: case GM_MV:
      as3d(n, 0, 1, xs[0], xs[1], 0, xt[0], xt[1]);
      as3d(n, 1, 1, y->sizes[0], 1, 0, yt[0], 1);
      break;
    case GM_DOT:
      as3d(n, 0, 1, 1, xs[0], 0, 0, xt[0]);
      as3d(n, 1, 1, y->sizes[0], 1, 0, yt[0], 1);
      break;
    default: break; /* already [batch, rows, cols] */
  }
  n->kind = TPU_KIND_GEMM;
  n->compute = tpu__compute_dtype(x->dtype);
  tpu__node_add_output(n, x->dtype, out_nd, out);
  return NULL;
}

/* _addmm_activation(self, mat1, mat2, *, beta, alpha, use_gelu) [.out]: addmm, then relu
 * or exact gelu in place on the result, as ATen's CPU kernel does it (the FFN of the
 * transformer encoder's inference fast path). A composite: the addmm node, and the
 * activation as its own in-place elementwise node (tpu__build_then). out= must have the
 * result's dtype exactly (a structured kernel). */
static tpu_status_t build_addmm_activation(tpu_build_t* b) {
  bool gelu;
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 5, false, &gelu));
  tpu_build_t g = *b;
  g.data = &g_addmm;
  TPU_RETURN_IF_ERROR(build_gemm(&g));
  TPU_RETURN_IF_ERROR(tpu__out_dtypes_exact(b));
  return tpu__build_then(b, gelu ? "gelu_" : "relu_", NULL, 0);
}

/* ---- convolution ---------------------------------------------------------------------- */

typedef struct conv_args_s {
  const tpu_view_t *x, *w;
  int nd;
  int64_t stride[3], pad[3], dil[3], outpad[3], groups;
  bool transposed;
  int64_t out[TPU_MAX_DIMS]; /* output shape */
} conv_args_t;

static tpu_status_t conv_list(tpu_build_t* b, int i, const char* what, int nd, int64_t* dst) {
  const int64_t* v;
  int len;
  TPU_RETURN_IF_ERROR(tpu__arg_intlist(b, i, &v, &len));
  if (len != 1 && len != nd) {
    char s[256];
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "expected %s to be a single integer value or a list of %d values to match the "
                    "convolution dimensions, but got %s=%s", what, nd, what, tpu__fmt_shape(s, sizeof s, len, v));
  }
  for (int d = 0; d < nd; ++d) dst[d] = v[len == 1 ? 0 : d];
  return NULL;
}

/* Shared by forward and backward: args 3..8 hold stride .. groups; x at xi, w at wi. */
static tpu_status_t conv_parse(tpu_build_t* b, int xi, int wi, conv_args_t* c) {
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, xi, &c->x));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, wi, &c->w));
  const tpu_view_t *x = c->x, *w = c->w;
  char s1[256], s2[256];
  if (x->ndim < 3 || x->ndim > 5)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expected a 3-, 4- or 5-dimensional input, got input of size %s",
                    tpu__fmt_shape(s1, sizeof s1, x->ndim, x->sizes));
  if (w->ndim != x->ndim)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "Expected %d-dimensional input for %d-dimensional weight %s, but got %d-dimensional "
                    "input of size %s instead", w->ndim, w->ndim, tpu__fmt_shape(s1, sizeof s1, w->ndim, w->sizes),
                    x->ndim, tpu__fmt_shape(s2, sizeof s2, x->ndim, x->sizes));
  int nd = c->nd = x->ndim - 2;
  TPU_RETURN_IF_ERROR(conv_list(b, 3, "stride", nd, c->stride));
  TPU_RETURN_IF_ERROR(conv_list(b, 4, "padding", nd, c->pad));
  TPU_RETURN_IF_ERROR(conv_list(b, 5, "dilation", nd, c->dil));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 6, false, &c->transposed));
  TPU_RETURN_IF_ERROR(conv_list(b, 7, "output_padding", nd, c->outpad));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 8, &c->groups));
  for (int d = 0; d < nd; ++d) {
    if (c->stride[d] <= 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "non-positive stride is not supported");
    if (c->pad[d] < 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "negative padding is not supported");
    if (c->dil[d] <= 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "dilation should be greater than zero");
    if (c->outpad[d] < 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "negative output_padding is not supported");
    if (!c->transposed && c->outpad[d] != 0)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "output_padding is only supported for transposed convolution");
    if (c->transposed && c->outpad[d] >= c->stride[d] && c->outpad[d] >= c->dil[d])
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "output padding must be smaller than either stride or dilation, but got "
                      "output_padding=%lld, stride=%lld, dilation=%lld", (long long)c->outpad[d],
                      (long long)c->stride[d], (long long)c->dil[d]);
  }
  if (c->groups <= 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "non-positive groups is not supported");
  int64_t g = c->groups, cin = x->sizes[1];
  if (!c->transposed) {
    if (w->sizes[0] % g != 0)
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "Given groups=%lld, expected weight to be divisible by %lld at dimension 0, but got "
                      "weight of size %s instead", (long long)g, (long long)g,
                      tpu__fmt_shape(s1, sizeof s1, w->ndim, w->sizes));
    if (w->sizes[1] * g != cin)
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "Given groups=%lld, weight of size %s, expected input%s to have %lld channels, but "
                      "got %lld channels instead", (long long)g, tpu__fmt_shape(s1, sizeof s1, w->ndim, w->sizes),
                      tpu__fmt_shape(s2, sizeof s2, x->ndim, x->sizes), (long long)(w->sizes[1] * g), (long long)cin);
  } else {
    if (w->sizes[0] != cin || cin % g != 0)
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "Given transposed=1, weight of size %s, expected input%s to have %lld channels, but "
                      "got %lld channels instead", tpu__fmt_shape(s1, sizeof s1, w->ndim, w->sizes),
                      tpu__fmt_shape(s2, sizeof s2, x->ndim, x->sizes), (long long)w->sizes[0], (long long)cin);
  }
  c->out[0] = x->sizes[0];
  c->out[1] = c->transposed ? w->sizes[1] * g : w->sizes[0];
  for (int d = 0; d < nd; ++d) {
    int64_t in = x->sizes[2 + d], k = w->sizes[2 + d];
    int64_t ek = c->dil[d] * (k - 1) + 1;
    if (c->transposed) {
      c->out[2 + d] = (in - 1) * c->stride[d] - 2 * c->pad[d] + ek + c->outpad[d];
    } else {
      if (in + 2 * c->pad[d] < ek) {
        return tpu__err(b, TPU_INVALID_ARGUMENT,
                        "Calculated padded input size per channel: (%lld). Kernel size: (%lld). Kernel "
                        "size can't be greater than actual input size",
                        (long long)(in + 2 * c->pad[d]), (long long)ek);
      }
      c->out[2 + d] = (in + 2 * c->pad[d] - ek) / c->stride[d] + 1;
    }
    if (c->out[2 + d] < 0)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "convolution output size is negative");
  }
  if (w->dtype != x->dtype)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expected scalar type %s but found %s", tpu__dtype_c10_name(x->dtype),
                    tpu__dtype_c10_name(w->dtype));
  if (!tpu_dtype_is_floating(x->dtype) && x->dtype != TPU_DTYPE_I64)
    return tpu__err_not_implemented_for(b, "slow_conv2d_cpu", x->dtype);
  return NULL;
}

static tpu_status_t conv_node(tpu_build_t* b, const conv_args_t* c, tpu_kind_t kind) {
  tpu_node_t* n = b->node;
  int64_t attrs[9];
  for (int d = 0; d < c->nd; ++d) {
    attrs[d] = c->stride[d];
    attrs[c->nd + d] = c->pad[d];
    attrs[2 * c->nd + d] = c->dil[d];
  }
  TPU_RETURN_IF_ERROR(tpu__node_set_ilist(n, attrs, 3 * c->nd));
  n->ia[0] = c->nd;
  n->ia[1] = c->groups;
  n->ia[2] = c->transposed;
  n->kind = kind;
  n->compute = tpu__compute_dtype(c->x->dtype);
  return NULL;
}

static tpu_status_t build_conv(tpu_build_t* b) {
  conv_args_t c;
  TPU_RETURN_IF_ERROR(conv_parse(b, 0, 1, &c));
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, c.x));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, c.w));
  if (tpu__arg_is_none(b, 2)) {
    TPU_RETURN_IF_ERROR(tpu__node_add_absent(n));
  } else {
    const tpu_view_t* bias;
    TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 2, &bias));
    char s1[256], s2[256];
    if (bias->ndim != 1 || bias->sizes[0] != c.out[1])
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "Given weight of size %s, expected bias to be 1-dimensional with %lld elements, but "
                      "got bias of size %s instead", tpu__fmt_shape(s1, sizeof s1, c.w->ndim, c.w->sizes),
                      (long long)c.out[1], tpu__fmt_shape(s2, sizeof s2, bias->ndim, bias->sizes));
    if (bias->dtype != c.x->dtype)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "Input type (%s) and bias type (%s) should be the same",
                      tpu__dtype_cpp_name(c.x->dtype), tpu__dtype_cpp_name(bias->dtype));
    TPU_RETURN_IF_ERROR(tpu__node_add_input(n, bias));
  }
  TPU_RETURN_IF_ERROR(conv_node(b, &c, TPU_KIND_CONV));
  tpu__node_add_output(n, c.x->dtype, c.x->ndim, c.out);
  return NULL;
}

static tpu_status_t build_conv_bwd(tpu_build_t* b) {
  conv_args_t c;
  const tpu_view_t* go;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &go));
  TPU_RETURN_IF_ERROR(conv_parse(b, 1, 2, &c));
  bool same = go->ndim == c.x->ndim;
  for (int d = 0; same && d < go->ndim; ++d) same = go->sizes[d] == c.out[d];
  char s1[256], s2[256];
  if (!same)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "grad_output has wrong shape: expected %s, got %s",
                    tpu__fmt_shape(s1, sizeof s1, c.x->ndim, c.out), tpu__fmt_shape(s2, sizeof s2, go->ndim, go->sizes));
  if (go->dtype != c.x->dtype)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expected scalar type %s but found %s", tpu__dtype_c10_name(c.x->dtype),
                    tpu__dtype_c10_name(go->dtype));
  const tpu_arg_t* m = tpu__arg(b, 9);
  bool mask[3] = {true, true, true};
  if (m && m->kind == TPU_ARG_INTLIST && m->list_len == 3) {
    for (int i = 0; i < 3; ++i) mask[i] = m->list[i] != 0;
  } else if (m && m->kind != TPU_ARG_NONE) {
    return tpu__err(b, TPU_TYPE_ERROR, "output_mask must be a list of 3 bools");
  }
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, go));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, c.x));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, c.w));
  TPU_RETURN_IF_ERROR(conv_node(b, &c, TPU_KIND_CONV_BWD));
  for (int i = 0; i < 3; ++i) n->ia[3 + i] = mask[i];
  /* Gradients output_mask does not ask for are absent (undefined tensors), as in ATen. */
  tpu__node_add_output(n, c.x->dtype, mask[0] ? c.x->ndim : -1, c.x->sizes);
  tpu__node_add_output(n, c.w->dtype, mask[1] ? c.w->ndim : -1, c.w->sizes);
  tpu__node_add_output(n, c.x->dtype, mask[2] ? 1 : -1, &c.out[1]);
  return NULL;
}

/* ---- pooling -------------------------------------------------------------------------- */

/* ---- pooling ------------------------------------------------------------------------------
 * 2-d and 3-d pools share one parser and one node layout (host/linalg.c): windows are kept
 * as (D, H, W), and a 2-d pool is a 3-d pool of depth 1. Each builder names its variant
 * with a pool_op_t: the op name used in argument messages, the function name CPU's shape
 * checks use, and the number of spatial dims. */
typedef struct pool_op_s {
  const char* name; /* "max_pool3d": list-length messages */
  const char* who;  /* "avg_pool3d()": 3-d shape-check messages */
  int ns;           /* spatial dims: 2 or 3 */
} pool_op_t;

static const pool_op_t g_max2 = {"max_pool2d", "max_pool2d", 2};
static const pool_op_t g_max2_bwd = {"max_pool2d_with_indices_backward", "max_pool2d_backward", 2};
static const pool_op_t g_avg2 = {"avg_pool2d", "avg_pool2d", 2};
static const pool_op_t g_max3 = {"max_pool3d", "max_pool3d_with_indices_out_cpu_template()", 3};
static const pool_op_t g_max3_bwd = {"max_pool3d", "max_pool3d_with_indices_backward_out_cpu_template()", 3};
static const pool_op_t g_avg3 = {"avg_pool3d", "avg_pool3d()", 3};
static const pool_op_t g_avg3_bwd = {"avg_pool3d", "avg_pool3d_backward()", 3};
static const pool_op_t g_aavg2 = {"adaptive_avg_pool2d", "adaptive_avg_pool2d_backward_out_cpu_template", 2};
static const pool_op_t g_amax2 = {"adaptive_max_pool2d", "adaptive_max_pool2d_backward", 2};
static const pool_op_t g_aavg3 = {"adaptive_avg_pool3d", "adaptive_avg_pool3d_backward_out_cpu_template", 3};
static const pool_op_t g_amax3 = {"adaptive_max_pool3d", "adaptive_max_pool3d_backward", 3};

typedef struct pool_args_s {
  int64_t k[3], s[3], p[3], d[3]; /* (D, H, W); depth (1, 1, 0, 1) for 2-d pools */
  bool ceil_mode;
  int64_t out[TPU_MAX_DIMS];
} pool_args_t;

/* A 1- or ns-element int list into the last ns entries of dst (the depth of a 2-d pool
 * keeps what dst holds); None or empty -> dflt (NULL: not allowed). */
static tpu_status_t spatial_list(tpu_build_t* b, int i, int ns, const int64_t* dflt, const char* msg,
                                 int64_t* dst) {
  const int64_t* v;
  int len;
  if (tpu__arg_is_none(b, i) && dflt) { memmove(dst, dflt, 3 * sizeof *dst); return NULL; }
  TPU_RETURN_IF_ERROR(tpu__arg_intlist(b, i, &v, &len));
  if (len == 0 && dflt) { memmove(dst, dflt, 3 * sizeof *dst); return NULL; }
  if (len != 1 && len != ns) return tpu__err(b, TPU_INVALID_ARGUMENT, "%s", msg);
  for (int j = 0; j < ns; ++j) dst[3 - ns + j] = v[len == 1 ? 0 : j];
  return NULL;
}

static tpu_status_t pool_out_size(tpu_build_t* b, int64_t in, int64_t k, int64_t p, int64_t s,
                                  int64_t d, bool ceil_mode, int64_t* out) {
  if (s == 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "stride should not be zero");
  if (p < 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "pad must be non-negative, but got pad: %lld", (long long)p);
  if (p > ((k - 1) * d + 1) / 2)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "pad should be at most half of effective kernel size, but got pad=%lld, kernel_size=%lld "
                    "and dilation=%lld", (long long)p, (long long)k, (long long)d);
  int64_t num = in + 2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
  int64_t q = num / s;
  if ((num % s != 0) && ((num < 0) != (s < 0))) --q; /* floor division */
  int64_t o = q + 1;
  if (ceil_mode && (o - 1) * s >= in + p) --o;
  *out = o;
  return NULL;
}

/* "kH: 2 kW: 3" or "kT: 1 kH: 2 kW: 3": a (D, H, W) triple as CPU's messages print it. */
static const char* fmt_khw(char* buf, size_t cap, int ns, const char* pre, const int64_t* v) {
  if (ns == 3)
    snprintf(buf, cap, "%sT: %lld %sH: %lld %sW: %lld", pre, (long long)v[0], pre, (long long)v[1], pre,
             (long long)v[2]);
  else
    snprintf(buf, cap, "%sH: %lld %sW: %lld", pre, (long long)v[1], pre, (long long)v[2]);
  return buf;
}

/* Arguments at ki (kernel), ki+1 (stride), ki+2 (padding), and for max pooling ki+3
 * (dilation) then ceil_mode; avg pooling has ceil_mode at ki+3. x is the input. Checks
 * in CPU's order: output sizes, then pool{2,3}d_shape_check. */
static tpu_status_t pool_parse(tpu_build_t* b, const pool_op_t* op, const tpu_view_t* x, int ki, bool has_dil,
                               pool_args_t* a) {
  int ns = op->ns;
  const char* cnt = ns == 3 ? "three" : "two";
  bool avg3 = ns == 3 && !has_dil; /* avg_pool3d words its list messages differently */
  char msg[200];
  for (int j = 0; j < 3; ++j) { a->k[j] = 1; a->s[j] = 1; a->p[j] = 0; a->d[j] = 1; }
  snprintf(msg, sizeof msg, "%s: kernel_size must %sbe a single int, or a tuple of %s ints", op->name,
           avg3 ? "" : "either ", cnt);
  TPU_RETURN_IF_ERROR(spatial_list(b, ki, ns, NULL, msg, a->k));
  snprintf(msg, sizeof msg, "%s: stride must %sbe omitted, a single int, or a tuple of %s ints", op->name,
           avg3 ? "" : "either ", cnt);
  TPU_RETURN_IF_ERROR(spatial_list(b, ki + 1, ns, a->k, msg, a->s));
  snprintf(msg, sizeof msg, "%s: padding must %sbe a single int, or a tuple of %s ints", op->name,
           avg3 ? "" : "either ", cnt);
  TPU_RETURN_IF_ERROR(spatial_list(b, ki + 2, ns, NULL, msg, a->p));
  if (has_dil) {
    snprintf(msg, sizeof msg, "%s: dilation must be either a single int, or a tuple of %s ints", op->name, cnt);
    TPU_RETURN_IF_ERROR(spatial_list(b, ki + 3, ns, NULL, msg, a->d));
  }
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, ki + (has_dil ? 4 : 3), false, &a->ceil_mode));
  int nd = x->ndim;
  if (nd != ns + 1 && nd != ns + 2) {
    if (ns == 2 && !has_dil && nd < 3)
      return tpu__err(b, TPU_INDEX_ERROR, "Dimension out of range (expected to be in range of [%d, %d], but got -3)",
                      -(nd ? nd : 1), (nd ? nd : 1) - 1);
    return tpu__err(b, TPU_INVALID_ARGUMENT, "non-empty %dD or %dD (batch mode) tensor expected for input", ns + 1,
                    ns + 2);
  }
  int64_t in[3] = {ns == 3 ? x->sizes[nd - 3] : 1, x->sizes[nd - 2], x->sizes[nd - 1]};
  int64_t C = x->sizes[nd - ns - 1], o[3];
  for (int j = 0; j < 3; ++j)
    TPU_RETURN_IF_ERROR(pool_out_size(b, in[j], a->k[j], a->p[j], a->s[j], a->d[j], a->ceil_mode, &o[j]));
  char s1[256], s2[256];
  if (a->k[0] <= 0 || a->k[1] <= 0 || a->k[2] <= 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "kernel size should be greater than zero, but got %s",
                    fmt_khw(s1, sizeof s1, ns, "k", a->k));
  if (a->s[0] <= 0 || a->s[1] <= 0 || a->s[2] <= 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "stride should be greater than zero, but got %s",
                    fmt_khw(s1, sizeof s1, ns, "d", a->s));
  if (a->d[0] <= 0 || a->d[1] <= 0 || a->d[2] <= 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "dilation should be greater than zero, but got %s",
                    fmt_khw(s1, sizeof s1, ns, "dilation", a->d));
  bool ok = true;
  for (int d = nd - ns - 1; d < nd; ++d) ok &= x->sizes[d] != 0;
  if (!ok && ns == 2)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size for input, but got:%s",
                    tpu__fmt_shape(s1, sizeof s1, nd, x->sizes));
  if (!ok)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "%s: Expected input's non-batch dimensions to have positive length, but input has a shape of "
                    "%s and non-batch dimension 0 has length zero!", op->who, tpu__fmt_shape(s1, sizeof s1, nd, x->sizes));
  if (avg3 && (in[0] < a->k[0] || in[1] < a->k[1] || in[2] < a->k[2]))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "input image (%s) smaller than kernel size (%s)",
                    fmt_khw(s1, sizeof s1, 3, "", in), fmt_khw(s2, sizeof s2, 3, "k", a->k));
  if (o[0] < 1 || o[1] < 1 || o[2] < 1) {
    if (ns == 3)
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "Given input size: (%lldx%lldx%lldx%lld). Calculated output size: (%lldx%lldx%lldx%lld). "
                      "Output size is too small", (long long)C, (long long)in[0], (long long)in[1],
                      (long long)in[2], (long long)C, (long long)o[0], (long long)o[1], (long long)o[2]);
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "Given input size: (%lldx%lldx%lld). Calculated output size: (%lldx%lldx%lld). Output size is too small",
                    (long long)C, (long long)in[1], (long long)in[2], (long long)C, (long long)o[1], (long long)o[2]);
  }
  for (int d = 0; d < nd - ns; ++d) a->out[d] = x->sizes[d];
  for (int j = 0; j < ns; ++j) a->out[nd - ns + j] = o[3 - ns + j];
  return NULL;
}

static void pool_attrs(tpu_node_t* n, const pool_args_t* a, int ns) {
  for (int j = 0; j < 3; ++j) {
    n->ia[j] = a->k[j]; n->ia[3 + j] = a->s[j]; n->ia[6 + j] = a->p[j]; n->ia[9 + j] = a->d[j];
  }
  n->ia[14] = ns;
}

/* grad_output must have the forward's output shape; message as PyTorch's
 * check_dim_size. Batched inputs (ns + 2 dims) check the batch dim last. */
static tpu_status_t check_grad_shape(tpu_build_t* b, const tpu_view_t* go, int nd, int ns, const int64_t* out) {
  for (int d = (nd == ns + 2 ? 1 : 0); d < nd; ++d) {
    if (go->ndim != nd || go->sizes[d] != out[d])
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "Expected a tensor of dimension %d and tensor.size[%d] == %lld but got: dimension %d and "
                      "tensor.size[%d] = %lld", nd, d, (long long)out[d], go->ndim, d,
                      (long long)(d < go->ndim ? go->sizes[d] : 0));
  }
  if (go->sizes[0] != out[0])
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "Expected a tensor of dimension %d and tensor.size[0] == %lld but got: dimension %d and "
                    "tensor.size[0] = %lld", nd, (long long)out[0], go->ndim, (long long)go->sizes[0]);
  return NULL;
}

/* max_pool{2,3}d_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode) */
static tpu_status_t build_maxpool(tpu_build_t* b) {
  const pool_op_t* op = b->data;
  const tpu_view_t* x;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  pool_args_t a;
  TPU_RETURN_IF_ERROR(pool_parse(b, op, x, 1, true, &a));
  if (x->dtype == TPU_DTYPE_BOOL) return tpu__err_not_implemented_for(b, op->name, x->dtype);
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  pool_attrs(n, &a, op->ns);
  n->kind = TPU_KIND_MAXPOOL2D;
  n->compute = tpu__compute_dtype(x->dtype);
  tpu__node_add_output(n, x->dtype, x->ndim, a.out);
  tpu__node_add_output(n, TPU_DTYPE_I64, x->ndim, a.out);
  return NULL;
}

static tpu_status_t indices_check(tpu_build_t* b, const tpu_view_t* ind) {
  if (ind->dtype != TPU_DTYPE_I64)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expected scalar type Long but found %s", tpu__dtype_c10_name(ind->dtype));
  return NULL;
}

/* max_pool{2,3}d_with_indices_backward(grad_output, self, kernel_size, stride, padding,
 * dilation, ceil_mode, indices) */
static tpu_status_t build_maxpool_bwd(tpu_build_t* b) {
  const pool_op_t* op = b->data;
  const tpu_view_t *go, *x, *ind;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &go));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &x));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 7, &ind));
  pool_args_t a;
  TPU_RETURN_IF_ERROR(pool_parse(b, op, x, 2, true, &a));
  if (go->dtype != x->dtype)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expected dtype %s for `gradOutput` but got dtype %s",
                    tpu__dtype_cpp_name(x->dtype), tpu__dtype_cpp_name(go->dtype));
  TPU_RETURN_IF_ERROR(indices_check(b, ind));
  TPU_RETURN_IF_ERROR(check_grad_shape(b, go, x->ndim, op->ns, a.out));
  TPU_RETURN_IF_ERROR(check_grad_shape(b, ind, x->ndim, op->ns, a.out));
  if (x->dtype == TPU_DTYPE_BOOL) return tpu__err_not_implemented_for(b, op->who, x->dtype);
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, go));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, ind));
  pool_attrs(n, &a, op->ns);
  n->kind = TPU_KIND_MAXPOOL2D_BWD;
  n->compute = tpu__compute_dtype(x->dtype);
  tpu__node_add_output(n, x->dtype, x->ndim, x->sizes);
  return NULL;
}

static tpu_status_t avg_common(tpu_build_t* b, const pool_op_t* op, const tpu_view_t* x, int ki, pool_args_t* a,
                               tpu_node_t* n) {
  TPU_RETURN_IF_ERROR(pool_parse(b, op, x, ki, false, a));
  bool cip;
  int64_t div;
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, ki + 4, true, &cip));
  TPU_RETURN_IF_ERROR(tpu__arg_int_opt(b, ki + 5, 0, &div));
  if (!tpu__arg_is_none(b, ki + 5) && div == 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "divisor must be not zero");
  if (!tpu_dtype_is_floating(x->dtype) && x->dtype != TPU_DTYPE_I64)
    return tpu__err_not_implemented_for(b, op->ns == 3 ? "avg_pool3d_out_frame" : "avg_pool2d", x->dtype);
  pool_attrs(n, a, op->ns);
  n->ia[12] = cip;
  n->ia[13] = div;
  n->compute = tpu__compute_dtype(x->dtype);
  return NULL;
}

/* avg_pool{2,3}d(self, kernel_size, stride, padding, ceil_mode, count_include_pad,
 * divisor_override) */
static tpu_status_t build_avgpool(tpu_build_t* b) {
  const pool_op_t* op = b->data;
  const tpu_view_t* x;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  pool_args_t a;
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(avg_common(b, op, x, 1, &a, n));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  n->kind = TPU_KIND_AVGPOOL2D;
  tpu__node_add_output(n, x->dtype, x->ndim, a.out);
  return NULL;
}

static tpu_status_t build_avgpool_bwd(tpu_build_t* b) {
  const pool_op_t* op = b->data;
  const tpu_view_t *go, *x;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &go));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &x));
  pool_args_t a;
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(avg_common(b, op, x, 2, &a, n));
  if (go->dtype != x->dtype && op->ns == 3)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expected scalar type %s but found %s", tpu__dtype_c10_name(x->dtype),
                    tpu__dtype_c10_name(go->dtype));
  if (go->dtype != x->dtype)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expected dtype %s for `gradOutput` but got dtype %s",
                    tpu__dtype_cpp_name(x->dtype), tpu__dtype_cpp_name(go->dtype));
  TPU_RETURN_IF_ERROR(check_grad_shape(b, go, x->ndim, op->ns, a.out));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, go));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  n->kind = TPU_KIND_AVGPOOL2D_BWD;
  tpu__node_add_output(n, x->dtype, x->ndim, x->sizes);
  return NULL;
}

/* _adaptive_avg_pool{2,3}d / adaptive_max_pool{2,3}d forward checks; out = output shape. */
static tpu_status_t adaptive_parse(tpu_build_t* b, const pool_op_t* op, bool is_max, const tpu_view_t* x,
                                   int64_t* out) {
  const char* name = op->name;
  int ns = op->ns;
  const int64_t* os;
  int len;
  TPU_RETURN_IF_ERROR(tpu__arg_intlist(b, 1, &os, &len));
  if (len != ns)
    return is_max ? tpu__err(b, TPU_INVALID_ARGUMENT, "%s(): internal error: output_size.size() must be %d", name, ns)
                  : tpu__err(b, TPU_INVALID_ARGUMENT, "%s: output_size must be %d", name, ns);
  char s1[256];
  int nd = x->ndim;
  if (nd != ns + 1 && nd != ns + 2)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s(): Expected %dD or %dD tensor, but got%s %s", name, ns + 1, ns + 2,
                    is_max ? ":" : "", tpu__fmt_shape(s1, sizeof s1, nd, x->sizes));
  for (int d = 1; d < nd; ++d)
    if (x->sizes[d] == 0)
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "%s(): Expected input to have non-zero size for non-batch dimensions, but input has "
                      "sizes %s with dimension %d being empty", name, tpu__fmt_shape(s1, sizeof s1, nd, x->sizes), d);
  for (int j = 0; j < ns; ++j)
    if (os[j] < 0) {
      tpu__fmt_shape(s1, sizeof s1, ns, os);
      s1[0] = '{';
      s1[strlen(s1) - 1] = '}';
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "%s: elements of output_size must be greater than or equal to 0 but received %s", name, s1);
    }
  if (!tpu_dtype_is_floating(x->dtype))
    return tpu__err_not_implemented_for(b, ns == 3 ? (is_max ? "adaptive_max_pool3d_cpu" : "adaptive_avg_pool3d_cpu") : name,
                           x->dtype);
  for (int d = 0; d < nd - ns; ++d) out[d] = x->sizes[d];
  for (int j = 0; j < ns; ++j) out[nd - ns + j] = os[j];
  return NULL;
}

static tpu_status_t build_adaptive_avg(tpu_build_t* b) {
  const pool_op_t* op = b->data;
  const tpu_view_t* x;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  int64_t out[TPU_MAX_DIMS];
  TPU_RETURN_IF_ERROR(adaptive_parse(b, op, false, x, out));
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  n->kind = TPU_KIND_ADAPTIVE_AVGPOOL2D;
  n->ia[14] = op->ns;
  n->compute = tpu__compute_dtype(x->dtype);
  tpu__node_add_output(n, x->dtype, x->ndim, out);
  return NULL;
}

static tpu_status_t build_adaptive_max(tpu_build_t* b) {
  const pool_op_t* op = b->data;
  const tpu_view_t* x;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  int64_t out[TPU_MAX_DIMS];
  TPU_RETURN_IF_ERROR(adaptive_parse(b, op, true, x, out));
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  n->kind = TPU_KIND_ADAPTIVE_MAXPOOL2D;
  n->ia[14] = op->ns;
  n->compute = tpu__compute_dtype(x->dtype);
  tpu__node_add_output(n, x->dtype, x->ndim, out);
  tpu__node_add_output(n, TPU_DTYPE_I64, x->ndim, out);
  return NULL;
}

static tpu_status_t build_adaptive_avg_bwd(tpu_build_t* b) {
  const pool_op_t* op = b->data;
  int ns = op->ns;
  const tpu_view_t *go, *x;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &go));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &x));
  const char* who = op->who;
  if (go->ndim != x->ndim)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: Expected dimensions %d for `%s` but got dimensions %d", who,
                    x->ndim, ns == 3 ? "gradOutput_" : "grad_output", go->ndim);
  if (x->ndim != ns + 1 && x->ndim != ns + 2)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: Expected %dD or %dD tensor for `grad_output`", who, ns + 1, ns + 2);
  for (int d = 0; d < x->ndim - ns; ++d)
    if (go->sizes[d] != x->sizes[d])
      return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: grad_output and input sizes differ at dimension %d", who, d);
  if (go->dtype != x->dtype && ns == 3)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expected scalar type %s but found %s", tpu__dtype_c10_name(x->dtype),
                    tpu__dtype_c10_name(go->dtype));
  if (go->dtype != x->dtype)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: Expected dtype %s for `grad_output` but got dtype %s", who,
                    tpu__dtype_cpp_name(x->dtype), tpu__dtype_cpp_name(go->dtype));
  if (!tpu_dtype_is_floating(x->dtype))
    return tpu__err_not_implemented_for(b, ns == 3 ? "adaptive_avg_pool3d_backward_cpu" : "adaptive_avg_pool2d_backward_cpu",
                           x->dtype);
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, go));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  n->kind = TPU_KIND_ADAPTIVE_AVGPOOL2D_BWD;
  n->ia[14] = ns;
  n->compute = tpu__compute_dtype(x->dtype);
  tpu__node_add_output(n, x->dtype, x->ndim, x->sizes);
  return NULL;
}

static tpu_status_t build_adaptive_max_bwd(tpu_build_t* b) {
  const pool_op_t* op = b->data;
  int ns = op->ns;
  const tpu_view_t *go, *x, *ind;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &go));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &x));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 2, &ind));
  if (x->ndim != ns + 1 && x->ndim != ns + 2)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s(): Expected %dD or %dD grad_output", op->who, ns + 1, ns + 2);
  if (go->dtype != x->dtype)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expected dtype %s for `gradOutput` but got dtype %s",
                    tpu__dtype_cpp_name(x->dtype), tpu__dtype_cpp_name(go->dtype));
  TPU_RETURN_IF_ERROR(indices_check(b, ind));
  char s1[256], s2[256];
  if (ns == 3 && ind->ndim != x->ndim)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expected dimensions %d for `indices` but got dimensions %d", x->ndim,
                    ind->ndim);
  bool same = go->ndim == x->ndim && ind->ndim == x->ndim;
  for (int d = 0; same && d < x->ndim; ++d)
    same = go->sizes[d] == ind->sizes[d] && (d >= x->ndim - ns || go->sizes[d] == x->sizes[d]);
  if (!same && ns == 3)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expected sizes %s for `gradOutput` but got sizes %s",
                    tpu__fmt_shape(s1, sizeof s1, ind->ndim, ind->sizes), tpu__fmt_shape(s2, sizeof s2, go->ndim, go->sizes));
  if (!same)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expected sizes of grad_output %s and indices %s to match",
                    tpu__fmt_shape(s1, sizeof s1, go->ndim, go->sizes), tpu__fmt_shape(s2, sizeof s2, ind->ndim, ind->sizes));
  if (!tpu_dtype_is_floating(x->dtype)) return tpu__err_not_implemented_for(b, op->who, x->dtype);
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, go));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, ind));
  n->kind = TPU_KIND_MAXPOOL2D_BWD;
  n->ia[14] = ns;
  n->compute = tpu__compute_dtype(x->dtype);
  tpu__node_add_output(n, x->dtype, x->ndim, x->sizes);
  return NULL;
}

/* ---- triangular solves ---------------------------------------------------------------- */

/* Re-views input operand i at the batch shape (bnd dims, zero strides where it
 * broadcasts) followed by its own last two dims. */
static void view_at_batch(tpu_node_t* n, int i, int bnd, const int64_t* batch) {
  tpu_operand_t* op = &n->in[i];
  tpu_operand_t v = *op;
  int own = op->ndim - 2;
  v.ndim = bnd + 2;
  for (int d = 0; d < bnd; ++d) {
    int sd = d - (bnd - own);
    v.sizes[d] = batch[d];
    v.strides[d] = sd >= 0 && op->sizes[sd] != 1 ? op->strides[sd] : 0;
  }
  for (int d = 0; d < 2; ++d) {
    v.sizes[bnd + d] = op->sizes[own + d];
    v.strides[bnd + d] = op->strides[own + d];
  }
  *op = v;
}

/* linalg_solve_triangular(A, B, *, upper, left=True, unitriangular=False) and the legacy
 * triangular_solve(b, A, upper=True, transpose=False, unitriangular=False) -> (X, A),
 * with their out= forms; data != NULL means triangular_solve. Batch dims broadcast. The
 * solution has A's dtype (linalg_solve_triangular casts B to it); float and double only,
 * as CPU's LAPACK-backed kernel. Checks in CPU's order and words. Node: in[0] A, in[1]
 * B, both viewed at the broadcast batch shape; ia[0] upper, ia[1] left, ia[2]
 * unitriangular, ia[3] transpose. triangular_solve's second output is A broadcast. */
static const int legacy_solve = 1;
static tpu_status_t build_trsm(tpu_build_t* b) {
  bool legacy = b->data != NULL;
  const tpu_view_t *A, *B;
  bool upper, left = true, unit, trans = false;
  if (legacy) {
    TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &B));
    TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &A));
    TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 2, true, &upper));
    TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 3, false, &trans));
    TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 4, false, &unit));
    const char* who = "torch.triangular_solve";
    if (B->ndim < 2)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: Expected b to have at least 2 dimensions, but it has %d "
                      "dimensions instead", who, B->ndim);
    if (A->ndim < 2)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: Expected A to have at least 2 dimensions, but it has %d "
                      "dimensions instead", who, A->ndim);
    if (A->dtype != B->dtype)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected b and A to have the same dtype, but found b of type %s and "
                      "A of type %s instead.", tpu__dtype_c10_name(B->dtype), tpu__dtype_c10_name(A->dtype));
  } else {
    TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &A));
    TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &B));
    TPU_RETURN_IF_ERROR(tpu__arg_bool(b, 2, &upper));
    TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 3, true, &left));
    TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 4, false, &unit));
    const char* who = "linalg.solve_triangular";
    if (A->ndim < 2)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: The input tensor A must have at least 2 dimensions.", who);
  }
  int an = A->ndim, bn = B->ndim;
  int64_t ar = A->sizes[an - 2], ac = A->sizes[an - 1];
  if (legacy) {
    if (ar != ac)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "A must be batches of square matrices, but they are %lld by %lld "
                      "matrices", (long long)ar, (long long)ac);
    if (ac != B->sizes[bn - 2])
      return tpu__err(b, TPU_INVALID_ARGUMENT, "Incompatible matrix sizes for triangular_solve: each A matrix is "
                      "%lld by %lld but each b matrix is %lld by %lld", (long long)ac, (long long)ac,
                      (long long)B->sizes[bn - 2], (long long)B->sizes[bn - 1]);
  } else {
    const char* who = "linalg.solve_triangular";
    if (ar != ac)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: A must be batches of square matrices, but they are %lld by "
                      "%lld matrices", who, (long long)ar, (long long)ac);
    if (bn < 2)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: The input tensor B must have at least 2 dimensions.", who);
    if (left ? ar != B->sizes[bn - 2] : ac != B->sizes[bn - 1])
      return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: Incompatible shapes of A and B for the equation %s (%lldx%lld "
                      "and %lldx%lld)", who, left ? "AX = B" : "XA = B", (long long)ar, (long long)ac,
                      (long long)B->sizes[bn - 2], (long long)B->sizes[bn - 1]);
  }
  int64_t batch[TPU_MAX_DIMS];
  int bnd;
  TPU_RETURN_IF_ERROR(tpu__broadcast(b, B->sizes, bn - 2, A->sizes, an - 2, batch, &bnd));
  if (bnd + 2 > TPU_MAX_DIMS) return tpu__err(b, TPU_INVALID_ARGUMENT, "too many dimensions");
  if (A->dtype != TPU_DTYPE_F32 && A->dtype != TPU_DTYPE_F64) return tpu__err_not_implemented_for(b, "triangular_solve_cpu", A->dtype);
  if (b->variant == TPU_VARIANT_OUT) {
    const tpu_arg_t* o = tpu__arg(b, b->nargs - (legacy ? 2 : 1));
    if (o && o->kind == TPU_ARG_TENSOR && o->tensor.dtype != A->dtype)
      return legacy ? tpu__err(b, TPU_INVALID_ARGUMENT, "Expected out tensor to have dtype %s, but got %s instead",
                               tpu__dtype_cpp_name(A->dtype), tpu__dtype_cpp_name(o->tensor.dtype))
                    : tpu__err(b, TPU_INVALID_ARGUMENT, "expected scalar type %s but found %s", tpu__dtype_c10_name(A->dtype),
                               tpu__dtype_c10_name(o->tensor.dtype));
  }
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, A));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, B));
  view_at_batch(n, 0, bnd, batch);
  view_at_batch(n, 1, bnd, batch);
  n->kind = TPU_KIND_TRSM;
  n->compute = A->dtype;
  n->ia[0] = upper;
  n->ia[1] = left;
  n->ia[2] = unit;
  n->ia[3] = trans;
  int64_t shape[TPU_MAX_DIMS];
  memcpy(shape, batch, sizeof(int64_t) * (size_t)bnd);
  shape[bnd] = B->sizes[bn - 2];
  shape[bnd + 1] = B->sizes[bn - 1];
  tpu__node_add_output(n, A->dtype, bnd + 2, shape);
  if (legacy) {
    shape[bnd] = ar;
    shape[bnd + 1] = ac;
    tpu__node_add_output(n, A->dtype, bnd + 2, shape);
  }
  return NULL;
}

const tpu_aten_entry_t tpu__aten_linalg[] = {
    {"mm", build_gemm, &g_mm}, {"mm.out", build_gemm, &g_mm},
    {"bmm", build_gemm, &g_bmm}, {"bmm.out", build_gemm, &g_bmm},
    {"addmm", build_gemm, &g_addmm}, {"addmm_", build_gemm, &g_addmm}, {"addmm.out", build_gemm, &g_addmm},
    {"_addmm_activation", build_addmm_activation, NULL}, {"_addmm_activation.out", build_addmm_activation, NULL},
    {"baddbmm", build_gemm, &g_baddbmm}, {"baddbmm_", build_gemm, &g_baddbmm},
    {"baddbmm.out", build_gemm, &g_baddbmm},
    {"addbmm", build_gemm, &g_addbmm}, {"addbmm_", build_gemm, &g_addbmm, TPU_ATEN_RESIZES_SELF}, {"addbmm.out", build_gemm, &g_addbmm},
    {"addmv", build_gemm, &g_addmv}, {"addmv_", build_gemm, &g_addmv}, {"addmv.out", build_gemm, &g_addmv},
    {"mv", build_gemm, &g_mv}, {"mv.out", build_gemm, &g_mv},
    {"dot", build_gemm, &g_dot}, {"dot.out", build_gemm, &g_dot},
    {"linalg_solve_triangular", build_trsm, NULL}, {"linalg_solve_triangular.out", build_trsm, NULL},
    {"triangular_solve", build_trsm, &legacy_solve}, {"triangular_solve.X", build_trsm, &legacy_solve},
    {"vdot", build_gemm, &g_dot}, {"vdot.out", build_gemm, &g_dot},
    {"convolution_overrideable", build_conv, NULL},
    {"convolution_backward_overrideable", build_conv_bwd, NULL},
    {"max_pool2d_with_indices", build_maxpool, &g_max2},
    {"max_pool2d_with_indices.out", build_maxpool, &g_max2},
    {"max_pool2d_with_indices_backward", build_maxpool_bwd, &g_max2_bwd},
    {"max_pool2d_with_indices_backward.grad_input", build_maxpool_bwd, &g_max2_bwd},
    {"avg_pool2d", build_avgpool, &g_avg2}, {"avg_pool2d.out", build_avgpool, &g_avg2},
    {"avg_pool2d_backward", build_avgpool_bwd, &g_avg2},
    {"avg_pool2d_backward.grad_input", build_avgpool_bwd, &g_avg2},
    {"_adaptive_avg_pool2d", build_adaptive_avg, &g_aavg2},
    {"_adaptive_avg_pool2d_backward", build_adaptive_avg_bwd, &g_aavg2},
    {"adaptive_max_pool2d", build_adaptive_max, &g_amax2}, {"adaptive_max_pool2d.out", build_adaptive_max, &g_amax2},
    {"adaptive_max_pool2d_backward", build_adaptive_max_bwd, &g_amax2},
    {"adaptive_max_pool2d_backward.grad_input", build_adaptive_max_bwd, &g_amax2},
    {"max_pool3d_with_indices", build_maxpool, &g_max3},
    {"max_pool3d_with_indices.out", build_maxpool, &g_max3},
    {"max_pool3d_with_indices_backward", build_maxpool_bwd, &g_max3_bwd},
    {"max_pool3d_with_indices_backward.grad_input", build_maxpool_bwd, &g_max3_bwd},
    {"avg_pool3d", build_avgpool, &g_avg3}, {"avg_pool3d.out", build_avgpool, &g_avg3},
    {"avg_pool3d_backward", build_avgpool_bwd, &g_avg3_bwd},
    {"avg_pool3d_backward.grad_input", build_avgpool_bwd, &g_avg3_bwd},
    {"_adaptive_avg_pool3d", build_adaptive_avg, &g_aavg3}, {"_adaptive_avg_pool3d.out", build_adaptive_avg, &g_aavg3},
    {"adaptive_avg_pool3d.out", build_adaptive_avg, &g_aavg3},
    {"_adaptive_avg_pool3d_backward", build_adaptive_avg_bwd, &g_aavg3},
    {"_adaptive_avg_pool3d_backward.out", build_adaptive_avg_bwd, &g_aavg3},
    {"adaptive_avg_pool3d_backward.grad_input", build_adaptive_avg_bwd, &g_aavg3},
    {"adaptive_max_pool3d", build_adaptive_max, &g_amax3}, {"adaptive_max_pool3d.out", build_adaptive_max, &g_amax3},
    {"adaptive_max_pool3d_backward", build_adaptive_max_bwd, &g_amax3},
    {"adaptive_max_pool3d_backward.grad_input", build_adaptive_max_bwd, &g_amax3},
    {NULL, NULL, NULL},
};
