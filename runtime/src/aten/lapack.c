/* ATen ops of the lapack family: the torch.linalg decompositions ATen's CPU backend runs
 * through LAPACK (Cholesky, LU and what is built on it: solve, inverse, determinants,
 * unpacking). The composite ops above them (linalg.cholesky, solve, inv, det, slogdet,
 * lu_factor, ...) decompose into these in ATen and raise from the `info` outputs through
 * ATen's own _linalg_check_errors, with its messages.
 *
 * Validation follows ATen's checks in their order and words. float32 and float64 run
 * natively; other floating dtypes, and the _ex forms called with check_errors=True (which
 * would raise from inside the op), answer UNIMPLEMENTED and run on the counted CPU
 * fallback, where CPU reports its own errors. Outputs are contiguous (ATen's CPU kernels
 * return some with column-major strides; the values are the same). Node layouts are
 * described at the top of host/lapack.c. */
#include <stdio.h>

#include "aten/aten.h"

enum { LU_FACTOR = 0, LU_DET = 1, LU_SLOGDET = 2, LU_PLU = 3, LU_INV = 4 };

static tpu_status_t at_least_2d(tpu_build_t* b, const tpu_view_t* A, const char* api, const char* what) {
  if (A->ndim < 2)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: The input tensor %s must have at least 2 dimensions.", api, what);
  return NULL;
}

/* ATen's squareCheckInputs. */
static tpu_status_t square(tpu_build_t* b, const tpu_view_t* A, const char* api) {
  TPU_RETURN_IF_ERROR(at_least_2d(b, A, api, "A"));
  int64_t r = A->sizes[A->ndim - 2], c = A->sizes[A->ndim - 1];
  if (r != c)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: A must be batches of square matrices, but they are %lld by %lld "
                    "matrices", api, (long long)r, (long long)c);
  return NULL;
}

/* The LAPACK kernels here take float32 and float64; anything else is "not implemented
 * for" CPU's kernel name, as ATen says. */
static tpu_status_t lapack_dtype(tpu_build_t* b, const tpu_view_t* A, const char* kernel) {
  if (A->dtype != TPU_DTYPE_F32 && A->dtype != TPU_DTYPE_F64)
    return tpu__err_not_implemented_for(b, kernel, A->dtype);
  return NULL;
}

/* ATen's checkFloatingOrComplex, then the dtypes that run here (f32, f64). */
static tpu_status_t floating(tpu_build_t* b, const tpu_view_t* A, const char* api, const char* kernel) {
  if (!tpu_dtype_is_floating(A->dtype) && !tpu_dtype_is_complex(A->dtype))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: Expected a floating point or complex tensor as input. Got %s", api,
                    tpu__dtype_c10_name(A->dtype));
  return lapack_dtype(b, A, kernel);
}

/* torch.lu_factor's and lu_unpack's dimension check. */
static tpu_status_t two_or_more(tpu_build_t* b, const tpu_view_t* A, const char* api) {
  if (A->ndim >= 2) return NULL;
  char s[256];
  tpu__fmt_shape(s, sizeof s, A->ndim, A->sizes);
  return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: Expected tensor with 2 or more dimensions. Got size: %s instead", api, s);
}

/* check_errors=True raises from inside the op on CPU: left to the CPU fallback. */
static tpu_status_t no_check_errors(tpu_build_t* b, int i) {
  bool check;
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, i, false, &check));
  if (check) return tpu__err(b, TPU_UNIMPLEMENTED, "check_errors=True runs on the CPU");
  return NULL;
}

/* Declares an output of A's batch dims followed by the given trailing dims. */
static void out_batch(tpu_node_t* n, tpu_dtype_t dt, const tpu_view_t* A, int drop, int nt, int64_t t0, int64_t t1) {
  int64_t shape[TPU_MAX_DIMS];
  int bd = A->ndim - drop;
  memcpy(shape, A->sizes, sizeof(int64_t) * (size_t)bd);
  if (nt > 0) shape[bd] = t0;
  if (nt > 1) shape[bd + 1] = t1;
  tpu__node_add_output(n, dt, bd + nt, shape);
}
static void out_empty(tpu_node_t* n, tpu_dtype_t dt) {
  int64_t z = 0;
  tpu__node_add_output(n, dt, 1, &z);
}

/* Views node input i at the batch shape `batch` (its own batch dims broadcast), keeping
 * its last `core` dims. */
static void view_at_batch(tpu_node_t* n, int i, int bnd, const int64_t* batch, int core) {
  tpu_operand_t* op = &n->in[i];
  tpu_operand_t v = *op;
  int own = op->ndim - core;
  v.ndim = bnd + core;
  for (int d = 0; d < bnd; ++d) {
    int sd = d - (bnd - own);
    v.sizes[d] = batch[d];
    v.strides[d] = sd >= 0 && op->sizes[sd] != 1 ? op->strides[sd] : 0;
  }
  for (int d = 0; d < core; ++d) {
    v.sizes[bnd + d] = op->sizes[own + d];
    v.strides[bnd + d] = op->strides[own + d];
  }
  *op = v;
}

static tpu_status_t input(tpu_build_t* b, const tpu_view_t* A, int kind) {
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, A));
  b->node->kind = kind;
  b->node->compute = A->dtype;
  return NULL;
}

/* linalg_cholesky_ex(Tensor A, *, bool upper=False, bool check_errors=False) -> (L, info) */
static tpu_status_t build_cholesky_ex(tpu_build_t* b) {
  const tpu_view_t* A;
  bool upper;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &A));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 1, false, &upper));
  TPU_RETURN_IF_ERROR(square(b, A, "linalg.cholesky"));
  TPU_RETURN_IF_ERROR(floating(b, A, "linalg.cholesky", "cholesky_cpu"));
  TPU_RETURN_IF_ERROR(no_check_errors(b, 2));
  TPU_RETURN_IF_ERROR(input(b, A, TPU_KIND_CHOLESKY));
  b->node->ia[0] = upper;
  out_batch(b->node, A->dtype, A, 0, 0, 0, 0);
  out_batch(b->node, TPU_DTYPE_I32, A, 2, 0, 0, 0);
  return tpu__out_dtypes_exact(b);
}

/* linalg_lu_factor_ex(Tensor A, *, bool pivot=True, bool check_errors=False)
 *   -> (LU, pivots, info) */
static tpu_status_t build_lu_factor_ex(tpu_build_t* b) {
  const tpu_view_t* A;
  bool pivot;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &A));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 1, true, &pivot));
  TPU_RETURN_IF_ERROR(two_or_more(b, A, "torch.lu_factor"));
  if (!pivot)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "linalg.lu_factor: LU without pivoting is not implemented on the CPU");
  TPU_RETURN_IF_ERROR(floating(b, A, "linalg.lu_factor", "lu_cpu"));
  TPU_RETURN_IF_ERROR(no_check_errors(b, 2));
  TPU_RETURN_IF_ERROR(input(b, A, TPU_KIND_GETRF));
  int64_t m = A->sizes[A->ndim - 2], n = A->sizes[A->ndim - 1];
  b->node->ia[0] = LU_FACTOR;
  out_batch(b->node, A->dtype, A, 0, 0, 0, 0);
  out_batch(b->node, TPU_DTYPE_I32, A, 2, 1, m < n ? m : n, 0);
  out_batch(b->node, TPU_DTYPE_I32, A, 2, 0, 0, 0);
  return tpu__out_dtypes_exact(b);
}

/* linalg_lu(Tensor A, *, bool pivot=True) -> (P, L, U) */
static tpu_status_t build_linalg_lu(tpu_build_t* b) {
  const tpu_view_t* A;
  bool pivot;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &A));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 1, true, &pivot));
  TPU_RETURN_IF_ERROR(two_or_more(b, A, "linalg.lu"));
  if (!pivot)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "linalg.lu_factor: LU without pivoting is not implemented on the CPU");
  TPU_RETURN_IF_ERROR(floating(b, A, "linalg.lu", "lu_cpu"));
  TPU_RETURN_IF_ERROR(input(b, A, TPU_KIND_GETRF));
  int64_t m = A->sizes[A->ndim - 2], n = A->sizes[A->ndim - 1], k = m < n ? m : n;
  b->node->ia[0] = LU_PLU;
  out_batch(b->node, A->dtype, A, 2, 2, m, m);
  out_batch(b->node, A->dtype, A, 2, 2, m, k);
  out_batch(b->node, A->dtype, A, 2, 2, k, n);
  return tpu__out_dtypes_exact(b);
}

/* lu_unpack(Tensor LU_data, Tensor LU_pivots, bool unpack_data=True,
 *           bool unpack_pivots=True) -> (P, L, U); what the flags leave out is empty. */
static tpu_status_t build_lu_unpack(tpu_build_t* b) {
  const tpu_view_t *A, *piv;
  bool data, pivots;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &A));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &piv));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 2, true, &data));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 3, true, &pivots));
  TPU_RETURN_IF_ERROR(two_or_more(b, A, "torch.lu_unpack"));
  if (piv->dtype != TPU_DTYPE_I32)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "torch.lu_unpack: LU_pivots is expected to be a contiguous tensor of "
                    "torch.int32 dtype.\nNote: this function is intended to be used with the output produced by "
                    "torch.linalg.lu_factor");
  int64_t m = A->sizes[A->ndim - 2], n = A->sizes[A->ndim - 1], k = m < n ? m : n;
  bool shape_ok = piv->ndim == A->ndim - 1 && piv->sizes[piv->ndim - 1] == k;
  for (int d = 0; shape_ok && d < A->ndim - 2; ++d) shape_ok = piv->sizes[d] == A->sizes[d];
  if (!shape_ok) {
    int64_t want[TPU_MAX_DIMS];
    memcpy(want, A->sizes, sizeof(int64_t) * (size_t)(A->ndim - 2));
    want[A->ndim - 2] = k;
    char w[256], g[256];
    tpu__fmt_shape(w, sizeof w, A->ndim - 1, want);
    tpu__fmt_shape(g, sizeof g, piv->ndim, piv->sizes);
    return tpu__err(b, TPU_VALUE_ERROR, "Expected LU_pivots to have shape %s but got %s instead.", w, g);
  }
  TPU_RETURN_IF_ERROR(lapack_dtype(b, A, "lu_unpack"));
  TPU_RETURN_IF_ERROR(input(b, A, TPU_KIND_LU_UNPACK));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, piv));
  b->node->ia[0] = data;
  b->node->ia[1] = pivots;
  if (pivots) out_batch(b->node, A->dtype, A, 2, 2, m, m);
  else out_empty(b->node, A->dtype);
  if (data) {
    out_batch(b->node, A->dtype, A, 2, 2, m, k);
    out_batch(b->node, A->dtype, A, 2, 2, k, n);
  } else {
    out_empty(b->node, A->dtype);
    out_empty(b->node, A->dtype);
  }
  return tpu__out_dtypes_exact(b);
}

/* linalg_inv_ex(Tensor A, *, bool check_errors=False) -> (inverse, info) */
static tpu_status_t build_inv_ex(tpu_build_t* b) {
  const tpu_view_t* A;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &A));
  TPU_RETURN_IF_ERROR(square(b, A, "linalg.inv"));
  TPU_RETURN_IF_ERROR(floating(b, A, "linalg.inv", "linalg_inv"));
  TPU_RETURN_IF_ERROR(no_check_errors(b, 1));
  TPU_RETURN_IF_ERROR(input(b, A, TPU_KIND_GETRF));
  b->node->ia[0] = LU_INV;
  out_batch(b->node, A->dtype, A, 0, 0, 0, 0);
  out_batch(b->node, TPU_DTYPE_I32, A, 2, 0, 0, 0);
  return tpu__out_dtypes_exact(b);
}

static bool contiguous(const tpu_view_t* v) { return tpu__is_contiguous(v->ndim, v->sizes, v->strides); }

/* _linalg_det(Tensor A) -> (result, LU, pivots);
 * _linalg_slogdet(Tensor A) -> (sign, logabsdet, LU, pivots). data: the slogdet marker. */
static const int slogdet_tag = 1;
static tpu_status_t build_det(tpu_build_t* b) {
  bool slog = b->data != NULL;
  const char* api = slog ? "linalg.slogdet" : "linalg.det";
  const tpu_view_t* A;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &A));
  TPU_RETURN_IF_ERROR(square(b, A, api));
  TPU_RETURN_IF_ERROR(floating(b, A, api, "lu_cpu"));
  TPU_RETURN_IF_ERROR(input(b, A, TPU_KIND_GETRF));
  if (contiguous(A)) {
    /* ATen factors A^T (the column-major view of a contiguous A's memory) and its
     * backward reads LU and pivots as factors of A^T when A is contiguous */
    tpu_operand_t* op = &b->node->in[0];
    int d = op->ndim;
    int64_t t = op->strides[d - 1];
    op->strides[d - 1] = op->strides[d - 2];
    op->strides[d - 2] = t;
  }
  int64_t n = A->sizes[A->ndim - 1];
  b->node->ia[0] = slog ? LU_SLOGDET : LU_DET;
  out_batch(b->node, A->dtype, A, 2, 0, 0, 0);
  if (slog) out_batch(b->node, A->dtype, A, 2, 0, 0, 0);
  out_batch(b->node, A->dtype, A, 0, 0, 0, 0);
  out_batch(b->node, TPU_DTYPE_I32, A, 2, 1, n, 0);
  return tpu__out_dtypes_exact(b);
}

/* The batch shape of LU (or A) and B broadcast; B a matrix. */
static tpu_status_t solve_batch(tpu_build_t* b, const tpu_view_t* A, const int64_t* bs, int bn, int64_t* batch,
                                int* bnd) {
  TPU_RETURN_IF_ERROR(tpu__broadcast(b, bs, bn - 2, A->sizes, A->ndim - 2, batch, bnd));
  if (*bnd + 2 > TPU_MAX_DIMS) return tpu__err(b, TPU_INVALID_ARGUMENT, "too many dimensions");
  return NULL;
}

static tpu_status_t shapes_fit(tpu_build_t* b, const char* api, bool left, int64_t n, const int64_t* bs, int bn) {
  if (left ? n != bs[bn - 2] : n != bs[bn - 1])
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: Incompatible shapes of A and B for the equation %s (%lldx%lld and "
                    "%lldx%lld)", api, left ? "AX = B" : "XA = B", (long long)n, (long long)n,
                    (long long)bs[bn - 2], (long long)bs[bn - 1]);
  return NULL;
}

/* linalg_lu_solve(Tensor LU, Tensor pivots, Tensor B, *, bool left=True,
 *                 bool adjoint=False) -> Tensor */
static tpu_status_t build_lu_solve(tpu_build_t* b) {
  const tpu_view_t *LU, *piv, *B;
  bool left, adjoint;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &LU));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &piv));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 2, &B));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 3, true, &left));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 4, false, &adjoint));
  const char* api = "linalg.lu_solve";
  TPU_RETURN_IF_ERROR(square(b, LU, "torch.linalg.lu_solve"));
  if (!tpu_dtype_is_floating(LU->dtype) && !tpu_dtype_is_complex(LU->dtype))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "torch.linalg.lu_solve: Expected a floating point or complex tensor as "
                    "input. Got %s", tpu__dtype_c10_name(LU->dtype));
  if (LU->dtype != B->dtype)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: Expected LU and B to have the same dtype, but found LU of type %s "
                    "and B of type %s instead", api, tpu__dtype_c10_name(LU->dtype), tpu__dtype_c10_name(B->dtype));
  if (piv->dtype != TPU_DTYPE_I32)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: pivots should be a Tensor of scalar type torch.int32", api);
  if (piv->ndim < 1 || piv->sizes[piv->ndim - 1] != LU->sizes[LU->ndim - 1])
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: Number of pivots per batch should be same as the dimension of the "
                    "matrix", api);
  bool same = piv->ndim == LU->ndim - 1;
  for (int d = 0; same && d < piv->ndim; ++d) same = piv->sizes[d] == LU->sizes[d];
  if (!same) {
    char s[256];
    tpu__fmt_shape(s, sizeof s, piv->ndim, piv->sizes);
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: Expected LU.shape[:-1] and pivots.shape to be the same, but got "
                    "pivots with shape %s instead", api, s);
  }
  TPU_RETURN_IF_ERROR(at_least_2d(b, B, api, "B"));
  int64_t n = LU->sizes[LU->ndim - 1];
  TPU_RETURN_IF_ERROR(shapes_fit(b, api, left, n, B->sizes, B->ndim));
  int64_t batch[TPU_MAX_DIMS];
  int bnd;
  TPU_RETURN_IF_ERROR(solve_batch(b, LU, B->sizes, B->ndim, batch, &bnd));
  TPU_RETURN_IF_ERROR(lapack_dtype(b, LU, "lu_solve"));
  TPU_RETURN_IF_ERROR(input(b, LU, TPU_KIND_LU_SOLVE));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, piv));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, B));
  view_at_batch(b->node, 2, bnd, batch, 2);
  b->node->ia[0] = left;
  b->node->ia[1] = adjoint;
  int64_t shape[TPU_MAX_DIMS];
  memcpy(shape, batch, sizeof(int64_t) * (size_t)bnd);
  shape[bnd] = B->sizes[B->ndim - 2];
  shape[bnd + 1] = B->sizes[B->ndim - 1];
  tpu__node_add_output(b->node, LU->dtype, bnd + 2, shape);
  return tpu__out_dtypes_exact(b);
}

/* _linalg_solve_ex(Tensor A, Tensor B, *, bool left=True, bool check_errors=False)
 *   -> (result, LU, pivots, info). B is a vector when it is 1-d or has A's shape without
 * the last dim (ATen's linalg_solve_is_vector_rhs); it then solves as B.unsqueeze(-1). */
static tpu_status_t build_solve_ex(tpu_build_t* b) {
  const tpu_view_t *A, *B;
  bool left;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &A));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &B));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 2, true, &left));
  const char* api = "linalg.solve";
  if (!tpu_dtype_is_floating(A->dtype) && !tpu_dtype_is_complex(A->dtype))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: Expected a floating point or complex tensor as input. Got %s", api,
                    tpu__dtype_c10_name(A->dtype));
  if (A->dtype != B->dtype)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: Expected A and B to have the same dtype, but found A of type %s and "
                    "B of type %s instead", api, tpu__dtype_c10_name(A->dtype), tpu__dtype_c10_name(B->dtype));
  bool vec = B->ndim == 1;
  if (!vec && A->ndim >= 1 && B->ndim == A->ndim - 1) {
    vec = true;
    for (int d = 0; d < B->ndim; ++d) vec = vec && B->sizes[d] == A->sizes[d];
  }
  int64_t bs[TPU_MAX_DIMS + 1];
  int bn = B->ndim + (vec ? 1 : 0);
  if (bn > TPU_MAX_DIMS) return tpu__err(b, TPU_INVALID_ARGUMENT, "too many dimensions");
  memcpy(bs, B->sizes, sizeof(int64_t) * (size_t)B->ndim);
  if (vec) bs[B->ndim] = 1;
  TPU_RETURN_IF_ERROR(square(b, A, api));
  if (bn < 2) return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: The input tensor B must have at least 2 dimensions.", api);
  int64_t n = A->sizes[A->ndim - 1];
  TPU_RETURN_IF_ERROR(shapes_fit(b, api, left, n, bs, bn));
  int64_t batch[TPU_MAX_DIMS];
  int bnd;
  TPU_RETURN_IF_ERROR(solve_batch(b, A, bs, bn, batch, &bnd));
  TPU_RETURN_IF_ERROR(lapack_dtype(b, A, "linalg_solve"));
  TPU_RETURN_IF_ERROR(no_check_errors(b, 3));
  TPU_RETURN_IF_ERROR(input(b, A, TPU_KIND_SOLVE));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, B));
  view_at_batch(b->node, 1, bnd, batch, vec ? 1 : 2);
  b->node->ia[0] = left;
  b->node->ia[1] = vec;
  int64_t shape[TPU_MAX_DIMS];
  memcpy(shape, batch, sizeof(int64_t) * (size_t)bnd);
  shape[bnd] = bs[bn - 2];
  shape[bnd + 1] = bs[bn - 1];
  tpu__node_add_output(b->node, A->dtype, bnd + (vec ? 1 : 2), shape);
  out_batch(b->node, A->dtype, A, 0, 0, 0, 0);
  out_batch(b->node, TPU_DTYPE_I32, A, 2, 1, n, 0);
  out_batch(b->node, TPU_DTYPE_I32, A, 2, 0, 0, 0);
  return tpu__out_dtypes_exact(b);
}

/* _cholesky_solve_helper(Tensor self, Tensor A, bool upper) -> Tensor: ATen's
 * cholesky_solve (CompositeExplicitAutograd) has checked and broadcast both already. */
static tpu_status_t build_cholesky_solve(tpu_build_t* b) {
  const tpu_view_t *B, *L;
  bool upper;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &B));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &L));
  TPU_RETURN_IF_ERROR(tpu__arg_bool(b, 2, &upper));
  TPU_RETURN_IF_ERROR(square(b, L, "cholesky_solve"));
  bool same = B->ndim == L->ndim && B->dtype == L->dtype && B->sizes[B->ndim - 2] == L->sizes[L->ndim - 1];
  for (int d = 0; same && d < L->ndim - 2; ++d) same = B->sizes[d] == L->sizes[d];
  if (!same) return tpu__err(b, TPU_INVALID_ARGUMENT, "expects b and A broadcast to one batch shape and dtype");
  TPU_RETURN_IF_ERROR(lapack_dtype(b, L, "cholesky_solve_cpu"));
  TPU_RETURN_IF_ERROR(input(b, B, TPU_KIND_CHOLESKY_SOLVE));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, L));
  b->node->ia[0] = upper;
  out_batch(b->node, B->dtype, B, 0, 0, 0, 0);
  return NULL;
}

/* cholesky_inverse(Tensor self, bool upper=False) -> Tensor */
static tpu_status_t build_cholesky_inverse(tpu_build_t* b) {
  const tpu_view_t* L;
  bool upper;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &L));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 1, false, &upper));
  TPU_RETURN_IF_ERROR(square(b, L, "cholesky_inverse"));
  TPU_RETURN_IF_ERROR(lapack_dtype(b, L, "cholesky_inverse_out_cpu"));
  TPU_RETURN_IF_ERROR(input(b, L, TPU_KIND_CHOLESKY_INVERSE));
  b->node->ia[0] = upper;
  out_batch(b->node, L->dtype, L, 0, 0, 0, 0);
  return NULL; /* out= casts, as on CPU */
}

/* linalg_qr(Tensor A, str mode='reduced') -> (Q, R); mode 'r' returns an empty Q. */
static tpu_status_t build_qr(tpu_build_t* b) {
  const tpu_view_t* A;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &A));
  const tpu_arg_t* ma = tpu__arg(b, 1);
  const char* mode = ma && ma->kind == TPU_ARG_STRING && ma->s ? ma->s : "reduced";
  TPU_RETURN_IF_ERROR(at_least_2d(b, A, "linalg.qr", "A"));
  if (!tpu_dtype_is_floating(A->dtype) && !tpu_dtype_is_complex(A->dtype))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "linalg.qr: Expected a floating point or complex tensor as input. Got %s",
                    tpu__dtype_c10_name(A->dtype));
  bool reduced = !strcmp(mode, "reduced"), complete = !strcmp(mode, "complete"), r_only = !strcmp(mode, "r");
  if (!reduced && !complete && !r_only)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "qr received unrecognized mode '%s' but expected one of 'reduced' "
                    "(default), 'r', or 'complete'", mode);
  TPU_RETURN_IF_ERROR(lapack_dtype(b, A, "geqrf_cpu"));
  TPU_RETURN_IF_ERROR(input(b, A, TPU_KIND_QR));
  int64_t m = A->sizes[A->ndim - 2], n = A->sizes[A->ndim - 1], k = m < n ? m : n;
  int64_t qc = r_only ? 0 : complete ? m : k;
  b->node->ia[0] = qc;
  if (r_only) out_empty(b->node, A->dtype);
  else out_batch(b->node, A->dtype, A, 2, 2, m, qc);
  out_batch(b->node, A->dtype, A, 2, 2, complete ? m : k, n);
  return tpu__out_dtypes_exact(b);
}

/* geqrf(Tensor self) -> (Tensor a, Tensor tau) */
static tpu_status_t build_geqrf(tpu_build_t* b) {
  const tpu_view_t* A;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &A));
  if (A->ndim < 2) return tpu__err(b, TPU_INVALID_ARGUMENT, "torch.geqrf: input must have at least 2 dimensions.");
  TPU_RETURN_IF_ERROR(lapack_dtype(b, A, "geqrf_cpu"));
  TPU_RETURN_IF_ERROR(input(b, A, TPU_KIND_GEQRF));
  int64_t m = A->sizes[A->ndim - 2], n = A->sizes[A->ndim - 1];
  out_batch(b->node, A->dtype, A, 0, 0, 0, 0);
  out_batch(b->node, A->dtype, A, 2, 1, m < n ? m : n, 0);
  return NULL; /* out= casts, as on CPU */
}

/* linalg_householder_product(Tensor input, Tensor tau) -> Tensor */
static tpu_status_t build_householder_product(tpu_build_t* b) {
  const tpu_view_t *A, *tau;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &A));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &tau));
  const char* api = "torch.linalg.householder_product";
  if (A->ndim < 2) return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: input must have at least 2 dimensions.", api);
  int64_t m = A->sizes[A->ndim - 2], n = A->sizes[A->ndim - 1];
  if (m < n)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: input.shape[-2] must be greater than or equal to input.shape[-1]", api);
  if (tau->ndim != A->ndim - 1)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: Expected tau to have one dimension less than input, but got tau.ndim "
                    "equal to %d and input.ndim is equal to %d", api, tau->ndim, A->ndim);
  if (n < tau->sizes[tau->ndim - 1])
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: input.shape[-1] must be greater than or equal to tau.shape[-1]", api);
  for (int d = 0; d < A->ndim - 2; ++d)
    if (tau->sizes[d] != A->sizes[d]) {
      char s[256];
      tpu__fmt_shape(s, sizeof s, tau->ndim - 1, tau->sizes);
      return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: Expected batch dimensions of tau to be equal to input.shape[:-2], "
                      "but got %s", api, s);
    }
  if (tau->dtype != A->dtype)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: tau dtype %s does not match input dtype %s", api,
                    tpu__dtype_c10_name(tau->dtype), tpu__dtype_c10_name(A->dtype));
  TPU_RETURN_IF_ERROR(lapack_dtype(b, A, "orgqr_cpu"));
  TPU_RETURN_IF_ERROR(input(b, A, TPU_KIND_ORGQR));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, tau));
  out_batch(b->node, A->dtype, A, 0, 0, 0, 0);
  return NULL; /* out= casts, as on CPU */
}

/* _linalg_eigh(Tensor A, str UPLO="L", bool compute_v=True) -> (eigenvalues, eigenvectors) */
static tpu_status_t build_eigh(tpu_build_t* b) {
  const tpu_view_t* A;
  bool compute_v;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &A));
  const tpu_arg_t* ua = tpu__arg(b, 1);
  const char* uplo = ua && ua->kind == TPU_ARG_STRING && ua->s ? ua->s : "L";
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 2, true, &compute_v));
  TPU_RETURN_IF_ERROR(square(b, A, "linalg.eigh"));
  bool upper = uplo[0] == 'U' || uplo[0] == 'u';
  if (strlen(uplo) != 1 || !(upper || uplo[0] == 'L' || uplo[0] == 'l'))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected UPLO argument to be 'L' or 'U', but got %s", uplo);
  TPU_RETURN_IF_ERROR(lapack_dtype(b, A, "linalg_eigh_cpu"));
  TPU_RETURN_IF_ERROR(input(b, A, TPU_KIND_EIGH));
  int64_t n = A->sizes[A->ndim - 1];
  b->node->ia[0] = upper;
  b->node->ia[1] = compute_v;
  out_batch(b->node, A->dtype, A, 2, 1, n, 0);
  if (compute_v) out_batch(b->node, A->dtype, A, 0, 0, 0, 0);
  else out_empty(b->node, A->dtype);
  return tpu__out_dtypes_exact(b);
}

/* _linalg_svd(Tensor A, bool full_matrices=False, bool compute_uv=True, *,
 *             str? driver=None) -> (U, S, Vh); without compute_uv U and Vh are empty. */
static tpu_status_t build_svd(tpu_build_t* b) {
  const tpu_view_t* A;
  bool full, uv;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &A));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 1, false, &full));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 2, true, &uv));
  TPU_RETURN_IF_ERROR(at_least_2d(b, A, "linalg.svd", "A"));
  if (!tpu_dtype_is_floating(A->dtype) && !tpu_dtype_is_complex(A->dtype))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "linalg.svd: Expected a floating point or complex tensor as input. Got %s",
                    tpu__dtype_c10_name(A->dtype));
  if (!tpu__arg_is_none(b, 3))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "torch.linalg.svd: keyword argument `driver=` is only supported on CUDA "
                    "inputs with cuSOLVER backend.");
  TPU_RETURN_IF_ERROR(lapack_dtype(b, A, "linalg_svd_cpu"));
  TPU_RETURN_IF_ERROR(input(b, A, TPU_KIND_SVD));
  int64_t m = A->sizes[A->ndim - 2], n = A->sizes[A->ndim - 1], k = m < n ? m : n;
  b->node->ia[0] = full;
  b->node->ia[1] = uv;
  if (uv) out_batch(b->node, A->dtype, A, 2, 2, m, full ? m : k);
  else out_empty(b->node, A->dtype);
  out_batch(b->node, A->dtype, A, 2, 1, k, 0);
  if (uv) out_batch(b->node, A->dtype, A, 2, 2, full ? n : k, n);
  else out_empty(b->node, A->dtype);
  return tpu__out_dtypes_exact(b);
}

const tpu_aten_entry_t tpu__aten_lapack[] = {
    {"linalg_cholesky_ex", build_cholesky_ex, NULL}, {"linalg_cholesky_ex.L", build_cholesky_ex, NULL},
    {"linalg_lu_factor_ex", build_lu_factor_ex, NULL}, {"linalg_lu_factor_ex.out", build_lu_factor_ex, NULL},
    {"linalg_lu_solve", build_lu_solve, NULL}, {"linalg_lu_solve.out", build_lu_solve, NULL},
    {"_linalg_solve_ex", build_solve_ex, NULL}, {"_linalg_solve_ex.result", build_solve_ex, NULL},
    {"linalg_inv_ex", build_inv_ex, NULL}, {"linalg_inv_ex.inverse", build_inv_ex, NULL},
    {"_linalg_det", build_det, NULL}, {"_linalg_det.result", build_det, NULL},
    {"_linalg_slogdet", build_det, &slogdet_tag}, {"_linalg_slogdet.sign", build_det, &slogdet_tag},
    {"linalg_lu", build_linalg_lu, NULL}, {"linalg_lu.out", build_linalg_lu, NULL},
    {"lu_unpack", build_lu_unpack, NULL}, {"lu_unpack.out", build_lu_unpack, NULL},
    {"_cholesky_solve_helper", build_cholesky_solve, NULL},
    {"cholesky_inverse", build_cholesky_inverse, NULL}, {"cholesky_inverse.out", build_cholesky_inverse, NULL},
    {"linalg_qr", build_qr, NULL}, {"linalg_qr.out", build_qr, NULL},
    {"geqrf", build_geqrf, NULL}, {"geqrf.a", build_geqrf, NULL},
    {"linalg_householder_product", build_householder_product, NULL},
    {"linalg_householder_product.out", build_householder_product, NULL},
    {"_linalg_eigh", build_eigh, NULL}, {"_linalg_eigh.eigenvalues", build_eigh, NULL},
    {"_linalg_svd", build_svd, NULL}, {"_linalg_svd.U", build_svd, NULL},
    {NULL, NULL, NULL},
};
