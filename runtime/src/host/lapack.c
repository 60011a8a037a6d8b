/* Host kernels of the lapack family: matrix decompositions through the LAPACK of the
 * pinned scipy-openblas32 wheel (LAPACKE's _work entry points, column-major, so LAPACKE
 * never allocates behind the runtime's allocator).
 *
 * Every kernel packs its matrices into dense column-major scratch in the compute dtype
 * (f32 or f64; the transposed view of a matrix packed row-major is its column-major
 * form), runs the batch elements over the pool, one single-threaded LAPACK call chain
 * per matrix, and unpacks. A matrix's result depends only on that matrix, so results do
 * not depend on the thread count. `info` outputs are int32 per batch element, as LAPACK
 * reports them (ATen's _linalg_check_errors turns them into its messages); pivots are
 * LAPACK's 1-based int32 row interchanges.
 *
 * Node layouts (set by aten/lapack.c; batch dims lead every operand):
 *  CHOLESKY  in[0] A [*, n, n]; ia[0] upper. out[0] L (the other triangle zeroed),
 *            out[1] info [*].
 *  GETRF     in[0] A [*, m, n]; ia[0] what the node returns:
 *              LU_FACTOR: out LU [*, m, n], pivots [*, k], info [*]   (k = min(m, n))
 *              LU_DET:    out det [*], LU, pivots
 *              LU_SLOGDET:out sign [*], logabsdet [*], LU, pivots
 *              LU_PLU:    out P [*, m, m], L [*, m, k], U [*, k, n]   (linalg_lu)
 *              LU_INV:    out inverse [*, n, n], info [*]             (getrf + getri)
 *  LU_UNPACK in[0] LU [*, m, n], in[1] pivots [*, k]; ia[0] unpack_data, ia[1]
 *            unpack_pivots. out P [*, m, m], L [*, m, k], U [*, k, n]; an output the
 *            flags leave out has no elements.
 *  LU_SOLVE  in[0] LU [*a, n, n], in[1] pivots [*a, n], in[2] B viewed at the result's
 *            batch [*, n, r] (left) or [*, r, n]; ia[0] left, ia[1] adjoint.
 *            out[0] X [*, ...]; *a broadcasts to * (matrix i of X uses LU's matching one).
 *  SOLVE     in[0] A [*a, n, n], in[1] B as LU_SOLVE's; ia[0] left, ia[1] B is a vector
 *            (X and B then lack the last dim). out X, LU [*a, n, n], pivots, info [*a].
 *  CHOLESKY_SOLVE  in[0] B [*, n, r], in[1] the factor [*, n, n] (same batch: ATen's
 *            cholesky_solve broadcasts first); ia[0] upper. out X [*, n, r].
 *  CHOLESKY_INVERSE in[0] the factor [*, n, n]; ia[0] upper. out the inverse of L L^T
 *            (U^T U), both triangles; a zero on the factor's diagonal is the node's error,
 *            with ATen's message.
 *  QR        in[0] A [*, m, n]; ia[0] Q's columns (k = min(m, n) reduced, m complete; 0:
 *            mode 'r', Q empty); out Q [*, m, ia[0]], R [*, rows, n] (rows = ia[0] or k).
 *  GEQRF     in[0] A [*, m, n]. out a [*, m, n] (R above the diagonal, the reflectors
 *            below, as LAPACK leaves them), tau [*, k].
 *  ORGQR     in[0] A [*, m, n] (m >= n), in[1] tau [*, t] (t <= n). out Q [*, m, n], the
 *            first n columns of the product of the t reflectors (householder_product).
 *  EIGH      in[0] A [*, n, n]; ia[0] upper (UPLO='U'), ia[1] compute_v. out eigenvalues
 *            [*, n] ascending, eigenvectors [*, n, n] as columns (empty without compute_v).
 *  SVD       in[0] A [*, m, n]; ia[0] full_matrices, ia[1] compute_uv (gesdd, as CPU).
 *            out U [*, m, m or k], S [*, k], Vh [*, n or k, n] (U, Vh empty without
 *            compute_uv). A convergence failure is the node's error, with ATen's message. */
#include <lapacke.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "host/host.h"

enum { LU_FACTOR = 0, LU_DET = 1, LU_SLOGDET = 2, LU_PLU = 3, LU_INV = 4 };

static bool fits_lapack(int64_t v) { return v >= 0 && v <= INT32_MAX; }

/* op with its last two dims swapped: the same memory seen transposed. */
static tpu_operand_t swapped(const tpu_operand_t* op) {
  tpu_operand_t t = *op;
  int d = t.ndim;
  if (d >= 2) {
    int64_t s = t.sizes[d - 1], st = t.strides[d - 1];
    t.sizes[d - 1] = t.sizes[d - 2];
    t.strides[d - 1] = t.strides[d - 2];
    t.sizes[d - 2] = s;
    t.strides[d - 2] = st;
  }
  return t;
}

/* A dense scratch array of n elements of es bytes (at least one byte: empty batches). */
static void* scratch(int64_t n, size_t es) {
  uint64_t bytes;
  if (n < 0 || !tpu__mul_ok((uint64_t)n, es, &bytes)) return NULL;
  return tpu__malloc((size_t)bytes + 16);
}

/* op's matrices, each column-major, dense, in cd (colmajor) or row-major (!colmajor). */
static void* pack_mats(const tpu_operand_t* op, tpu_dtype_t cd, bool colmajor) {
  void* buf = scratch(tpu__operand_numel(op), tpu_dtype_size(cd));
  if (!buf) return NULL;
  tpu_operand_t t = colmajor ? swapped(op) : *op;
  tpu__pack(&t, NULL, cd, buf);
  return buf;
}
static void unpack_mats(const tpu_operand_t* op, const void* buf, tpu_dtype_t cd, bool colmajor) {
  tpu_operand_t t = colmajor ? swapped(op) : *op;
  tpu__unpack(&t, buf, cd);
}
static bool present(const tpu_node_t* n, int i) {
  return i < n->n_out && !tpu__output_absent(&n->out[i]) && tpu__operand_numel(&n->out[i]) > 0;
}

/* Matrices per chunk: enough work (about 64k flops) that a chunk is worth a thread. */
static int64_t grain(int64_t m, int64_t n) {
  int64_t f = m * n * (m < n ? m : n) + 1;
  return 1 + 65536 / f;
}

/* Index into a batch of `own` (right-aligned sizes, broadcast against `full`) of the
 * full batch's element i. */
static int64_t batch_source(const int64_t* full, int nf, const int64_t* own, int no, int64_t i) {
  int64_t src = 0, mul = 1;
  for (int d = nf - 1, od = no - 1; d >= 0; --d, --od) {
    int64_t c = i % full[d];
    i /= full[d];
    if (od >= 0) {
      if (own[od] != 1) src += c * mul;
      mul *= own[od];
    }
  }
  return src;
}

/* ---- LAPACK calls on void pointers (f32 or f64 by cd) ----------------------------- */

static lapack_int x_potrf(tpu_dtype_t cd, char uplo, lapack_int n, void* a) {
  return cd == TPU_DTYPE_F32 ? scipy_LAPACKE_spotrf_work(LAPACK_COL_MAJOR, uplo, n, a, n ? n : 1)
                             : scipy_LAPACKE_dpotrf_work(LAPACK_COL_MAJOR, uplo, n, a, n ? n : 1);
}
static lapack_int x_getrf(tpu_dtype_t cd, lapack_int m, lapack_int n, void* a, lapack_int* ipiv) {
  return cd == TPU_DTYPE_F32 ? scipy_LAPACKE_sgetrf_work(LAPACK_COL_MAJOR, m, n, a, m ? m : 1, ipiv)
                             : scipy_LAPACKE_dgetrf_work(LAPACK_COL_MAJOR, m, n, a, m ? m : 1, ipiv);
}
static lapack_int x_getrs(tpu_dtype_t cd, char tr, lapack_int n, lapack_int r, const void* a,
                          const lapack_int* ipiv, void* b) {
  lapack_int ld = n ? n : 1;
  return cd == TPU_DTYPE_F32 ? scipy_LAPACKE_sgetrs_work(LAPACK_COL_MAJOR, tr, n, r, a, ld, ipiv, b, ld)
                             : scipy_LAPACKE_dgetrs_work(LAPACK_COL_MAJOR, tr, n, r, a, ld, ipiv, b, ld);
}
static lapack_int x_getri(tpu_dtype_t cd, lapack_int n, void* a, const lapack_int* ipiv, void* w, lapack_int lw) {
  lapack_int ld = n ? n : 1;
  return cd == TPU_DTYPE_F32 ? scipy_LAPACKE_sgetri_work(LAPACK_COL_MAJOR, n, a, ld, ipiv, w, lw)
                             : scipy_LAPACKE_dgetri_work(LAPACK_COL_MAJOR, n, a, ld, ipiv, w, lw);
}

static double ld_el(const void* p, tpu_dtype_t cd, int64_t i) {
  return cd == TPU_DTYPE_F32 ? (double)((const float*)p)[i] : ((const double*)p)[i];
}
static void st_el(void* p, tpu_dtype_t cd, int64_t i, double v) {
  if (cd == TPU_DTYPE_F32) ((float*)p)[i] = (float)v;
  else ((double*)p)[i] = v;
}

/* The number of matrices: the product of an operand's batch dims (all but the last two). */
static int64_t batch_of(const tpu_operand_t* op) {
  int64_t mats = 1;
  for (int d = 0; d < op->ndim - 2; ++d) mats *= op->sizes[d];
  return mats;
}

/* ---- Cholesky ------------------------------------------------------------------------- */

typedef struct chol_s {
  tpu_dtype_t cd;
  char* a;
  int64_t n;
  int64_t* info;
  bool upper;
} chol_t;

static tpu_status_t chol_run(void* ctx, int64_t b, int64_t e, int tid) {
  chol_t* c = ctx;
  size_t es = tpu_dtype_size(c->cd);
  int64_t n = c->n;
  for (int64_t i = b; i < e; ++i) {
    char* p = c->a + (size_t)(i * n * n) * es;
    c->info[i] = x_potrf(c->cd, c->upper ? 'U' : 'L', (lapack_int)n, p);
    for (int64_t j = 0; j < n; ++j) /* column j: clear the triangle LAPACK did not write */
      for (int64_t r = c->upper ? j + 1 : 0; r < (c->upper ? n : j); ++r) st_el(p, c->cd, j * n + r, 0.0);
  }
  return NULL;
}

static tpu_status_t cholesky_kernel(tpu_node_t* nd) {
  const tpu_operand_t* A = &nd->in[0];
  int64_t n = A->sizes[A->ndim - 1];
  int64_t mats = batch_of(A);
  if (!fits_lapack(n)) return tpu_status_make(TPU_UNIMPLEMENTED, "%s: matrix too large", tpu__node_describe(nd));
  chol_t c = {nd->compute, pack_mats(A, nd->compute, true), n, scratch(mats, sizeof(int64_t)), nd->ia[0] != 0};
  tpu_status_t st = NULL;
  if (!c.a || !c.info) { st = TPU_HOST_NOMEM(); goto done; }
  tpu__blas_prepare();
  st = tpu__parallel_for(mats, grain(n, n), chol_run, &c);
  if (st) goto done;
  unpack_mats(&nd->out[0], c.a, c.cd, true);
  if (present(nd, 1)) tpu__unpack(&nd->out[1], c.info, TPU_DTYPE_I64);
done:
  tpu__free(c.a);
  tpu__free(c.info);
  return st;
}

/* ---- LU factorization and what is built on it --------------------------------------- */

typedef struct lu_s {
  tpu_dtype_t cd;
  int mode;
  int64_t m, n, k;
  char* a;          /* LU, column-major */
  int64_t* piv;     /* [mats, k], 1-based */
  int64_t* info;    /* [mats] */
  char* r0;         /* det / sign / P / inverse (row-major) */
  char* r1;         /* logabsdet / L */
  char* r2;         /* U */
} lu_t;

/* P, L and U of matrix i (row-major) from its column-major LU and pivots, each when wanted. */
static tpu_status_t unpack_plu(const lu_t* c, int64_t i, lapack_int* perm) {
  size_t es = tpu_dtype_size(c->cd);
  int64_t m = c->m, n = c->n, k = c->k;
  const char* lu = c->a + (size_t)(i * m * n) * es;
  if (c->r0) {
    for (int64_t r = 0; r < m; ++r) perm[r] = (lapack_int)r;
    for (int64_t j = 0; j < k; ++j) {
      int64_t p = c->piv[i * k + j] - 1;
      if (p < 0 || p >= m)
        return tpu_status_make(TPU_INVALID_ARGUMENT, "pivots passed to lu_unpack must be between 1 and LU.size(-2) "
                               "inclusive.Did you properly pass the result of lu_factor?");
      lapack_int t = perm[j];
      perm[j] = perm[p];
      perm[p] = t;
    }
    char* P = c->r0 + (size_t)(i * m * m) * es;
    memset(P, 0, (size_t)(m * m) * es);
    for (int64_t j = 0; j < m; ++j) st_el(P, c->cd, (int64_t)perm[j] * m + j, 1.0);
  }
  if (c->r1) {
    char* L = c->r1 + (size_t)(i * m * k) * es;
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < k; ++j) st_el(L, c->cd, r * k + j, r > j ? ld_el(lu, c->cd, j * m + r) : r == j);
  }
  if (c->r2) {
    char* U = c->r2 + (size_t)(i * k * n) * es;
    for (int64_t r = 0; r < k; ++r)
      for (int64_t j = 0; j < n; ++j) st_el(U, c->cd, r * n + j, j >= r ? ld_el(lu, c->cd, j * m + r) : 0.0);
  }
  return NULL;
}

static tpu_status_t lu_run(void* ctx, int64_t b, int64_t e, int tid) {
  lu_t* c = ctx;
  size_t es = tpu_dtype_size(c->cd);
  int64_t m = c->m, n = c->n, k = c->k;
  int64_t lw = c->mode == LU_INV ? 64 * (n ? n : 1) : 0;
  lapack_int* ip = tpu__malloc(sizeof(lapack_int) * (size_t)(m + 1));
  void* w = lw ? scratch(lw, es) : NULL;
  tpu_status_t st = NULL;
  if (!ip || (lw && !w)) { st = TPU_HOST_NOMEM(); goto done; }
  for (int64_t i = b; i < e && !st; ++i) {
    char* lu = c->a + (size_t)(i * m * n) * es;
    lapack_int info = x_getrf(c->cd, (lapack_int)m, (lapack_int)n, lu, ip);
    if (c->info) c->info[i] = info;
    if (c->piv)
      for (int64_t j = 0; j < k; ++j) c->piv[i * k + j] = ip[j];
    if (c->mode == LU_DET || c->mode == LU_SLOGDET) {
      /* ATen's: the product of U's diagonal with the permutation's sign; slogdet sums the
       * logs of the magnitudes and multiplies the signs */
      bool odd = false;
      for (int64_t j = 0; j < k; ++j) odd ^= ip[j] != j + 1;
      if (c->mode == LU_DET) {
        double d = odd ? -1.0 : 1.0;
        for (int64_t j = 0; j < n; ++j) d = tpu__round_to_dtype(d * ld_el(lu, c->cd, j * n + j), c->cd);
        st_el(c->r0, c->cd, i, d);
      } else {
        double s = odd ? -1.0 : 1.0, l = 0.0;
        for (int64_t j = 0; j < n; ++j) {
          double u = ld_el(lu, c->cd, j * n + j);
          s *= u > 0 ? 1.0 : u < 0 ? -1.0 : 0.0;
          l = tpu__round_to_dtype(l + tpu__round_to_dtype(log(fabs(u)), c->cd), c->cd);
        }
        st_el(c->r0, c->cd, i, s);
        st_el(c->r1, c->cd, i, l);
      }
    } else if (c->mode == LU_PLU) {
      st = unpack_plu(c, i, ip);
    } else if (c->mode == LU_INV && info == 0) {
      x_getri(c->cd, (lapack_int)n, lu, ip, w, (lapack_int)lw);
    }
  }
done:
  tpu__free(ip);
  tpu__free(w);
  return st;
}

static tpu_status_t getrf_kernel(tpu_node_t* nd) {
  const tpu_operand_t* A = &nd->in[0];
  tpu_dtype_t cd = nd->compute;
  size_t es = tpu_dtype_size(cd);
  int64_t m = A->sizes[A->ndim - 2], n = A->sizes[A->ndim - 1];
  int64_t mats = batch_of(A);
  if (!fits_lapack(m) || !fits_lapack(n))
    return tpu_status_make(TPU_UNIMPLEMENTED, "%s: matrix too large", tpu__node_describe(nd));
  int mode = (int)nd->ia[0];
  lu_t c = {cd, mode, m, n, m < n ? m : n, pack_mats(A, cd, true)};
  /* What each mode keeps: pivots except for the inverse, info for factor and inverse,
   * r0..r2 the det / slogdet results or P, L, U. */
  bool want_piv = mode != LU_INV, want_info = mode == LU_FACTOR || mode == LU_INV;
  int64_t r_sizes[3] = {-1, -1, -1}; /* elements of r0..r2; -1: not kept */
  if (mode == LU_DET || mode == LU_SLOGDET) r_sizes[0] = mats;
  if (mode == LU_SLOGDET) r_sizes[1] = mats;
  if (mode == LU_PLU) r_sizes[0] = mats * m * m, r_sizes[1] = mats * m * c.k, r_sizes[2] = mats * c.k * n;
  char** rs[3] = {&c.r0, &c.r1, &c.r2};
  bool nomem = !c.a;
  if (want_piv) nomem |= !(c.piv = scratch(mats * c.k, sizeof(int64_t)));
  if (want_info) nomem |= !(c.info = scratch(mats, sizeof(int64_t)));
  for (int q = 0; q < 3; ++q)
    if (r_sizes[q] >= 0) nomem |= !(*rs[q] = scratch(r_sizes[q], es));
  tpu_status_t st = NULL;
  if (nomem) {
    st = TPU_HOST_NOMEM();
    goto done;
  }
  tpu__blas_prepare();
  st = tpu__parallel_for(mats, grain(m, n), lu_run, &c);
  if (st) goto done;
  switch (mode) {
    case LU_FACTOR:
      unpack_mats(&nd->out[0], c.a, cd, true);
      if (present(nd, 1)) tpu__unpack(&nd->out[1], c.piv, TPU_DTYPE_I64);
      if (present(nd, 2)) tpu__unpack(&nd->out[2], c.info, TPU_DTYPE_I64);
      break;
    case LU_DET:
    case LU_SLOGDET: {
      int o = mode == LU_DET ? 1 : 2;
      tpu__unpack(&nd->out[0], c.r0, cd);
      if (mode == LU_SLOGDET) tpu__unpack(&nd->out[1], c.r1, cd);
      if (present(nd, o)) unpack_mats(&nd->out[o], c.a, cd, true);
      if (present(nd, o + 1)) tpu__unpack(&nd->out[o + 1], c.piv, TPU_DTYPE_I64);
      break;
    }
    case LU_PLU:
      if (present(nd, 0)) tpu__unpack(&nd->out[0], c.r0, cd);
      if (present(nd, 1)) tpu__unpack(&nd->out[1], c.r1, cd);
      if (present(nd, 2)) tpu__unpack(&nd->out[2], c.r2, cd);
      break;
    case LU_INV:
      unpack_mats(&nd->out[0], c.a, cd, true);
      if (present(nd, 1)) tpu__unpack(&nd->out[1], c.info, TPU_DTYPE_I64);
      break;
  }
done:
  tpu__free(c.a);
  tpu__free(c.piv);
  tpu__free(c.info);
  tpu__free(c.r0);
  tpu__free(c.r1);
  tpu__free(c.r2);
  return st;
}

/* lu_unpack: P, L, U from a given LU and pivots. */
static tpu_status_t unpack_run(void* ctx, int64_t b, int64_t e, int tid) {
  lu_t* c = ctx;
  lapack_int* perm = tpu__malloc(sizeof(lapack_int) * (size_t)(c->m + 1));
  if (!perm) return TPU_HOST_NOMEM();
  tpu_status_t st = NULL;
  for (int64_t i = b; i < e && !st; ++i) st = unpack_plu(c, i, perm);
  tpu__free(perm);
  return st;
}

static tpu_status_t lu_unpack_kernel(tpu_node_t* nd) {
  const tpu_operand_t* A = &nd->in[0];
  tpu_dtype_t cd = nd->compute;
  size_t es = tpu_dtype_size(cd);
  int64_t m = A->sizes[A->ndim - 2], n = A->sizes[A->ndim - 1];
  int64_t mats = batch_of(A);
  lu_t c = {cd, LU_PLU, m, n, m < n ? m : n, pack_mats(A, cd, true)};
  c.piv = scratch(tpu__operand_numel(&nd->in[1]), sizeof(int64_t));
  if (c.piv) tpu__pack(&nd->in[1], NULL, TPU_DTYPE_I64, c.piv);
  bool data = nd->ia[0] != 0, pivots = nd->ia[1] != 0;
  if (pivots) c.r0 = scratch(mats * m * m, es);
  if (data) {
    c.r1 = scratch(mats * m * c.k, es);
    c.r2 = scratch(mats * c.k * n, es);
  }
  tpu_status_t st = NULL;
  if (!c.a || !c.piv || (pivots && !c.r0) || (data && (!c.r1 || !c.r2))) {
    st = TPU_HOST_NOMEM();
    goto done;
  }
  st = tpu__parallel_for(mats, grain(m, n), unpack_run, &c);
  if (st) goto done;
  if (pivots && present(nd, 0)) tpu__unpack(&nd->out[0], c.r0, cd);
  if (data && present(nd, 1)) tpu__unpack(&nd->out[1], c.r1, cd);
  if (data && present(nd, 2)) tpu__unpack(&nd->out[2], c.r2, cd);
done:
  tpu__free(c.a);
  tpu__free(c.piv);
  tpu__free(c.r0);
  tpu__free(c.r1);
  tpu__free(c.r2);
  return st;
}

/* ---- solves ---------------------------------------------------------------------------- */

typedef struct solve_s {
  tpu_dtype_t cd;
  int64_t n, r;          /* order, right-hand sides */
  const char* lu;        /* [own mats, n, n] column-major */
  const int64_t* piv;    /* [own mats, n] */
  char* x;               /* [mats, n, r] column-major (B in, X out) */
  const int64_t *full, *own;
  int nf, no;
  char tr;
} solve_t;

static tpu_status_t solve_run(void* ctx, int64_t b, int64_t e, int tid) {
  solve_t* c = ctx;
  size_t es = tpu_dtype_size(c->cd);
  int64_t n = c->n;
  lapack_int* ip = tpu__malloc(sizeof(lapack_int) * (size_t)(n + 1));
  if (!ip) return TPU_HOST_NOMEM();
  for (int64_t i = b; i < e; ++i) {
    int64_t s = batch_source(c->full, c->nf, c->own, c->no, i);
    for (int64_t j = 0; j < n; ++j) ip[j] = (lapack_int)c->piv[s * n + j];
    x_getrs(c->cd, c->tr, (lapack_int)n, (lapack_int)c->r, c->lu + (size_t)(s * n * n) * es, ip,
            c->x + (size_t)(i * n * c->r) * es);
  }
  tpu__free(ip);
  return NULL;
}

/* Solves with the factors lu/piv (batch `own`, right-aligned against X's batch) for B (in
 * operand, at X's batch): left: op(A) X = B; right: X op(A) = B, as op(A)^T X^T = B^T.
 * The right form's X^T and B^T column-major are X and B row-major. */
static tpu_status_t solve_with(tpu_node_t* nd, const tpu_operand_t* B, tpu_operand_t* X, const char* lu,
                               const int64_t* piv, const int64_t* own, int no, bool left, bool adjoint) {
  tpu_dtype_t cd = nd->compute;
  int xd = X->ndim;
  int64_t n = left ? X->sizes[xd - 2] : X->sizes[xd - 1], r = left ? X->sizes[xd - 1] : X->sizes[xd - 2];
  if (!fits_lapack(n) || !fits_lapack(r))
    return tpu_status_make(TPU_UNIMPLEMENTED, "%s: matrix too large", tpu__node_describe(nd));
  int64_t mats = batch_of(X);
  solve_t c = {cd, n, r, lu, piv, pack_mats(B, cd, left), X->sizes, own, xd - 2, no};
  c.tr = (adjoint != !left) ? 'T' : 'N';
  if (!c.x) return TPU_HOST_NOMEM();
  tpu_status_t st = NULL;
  if (n > 0 && r > 0) {
    tpu__blas_prepare();
    st = tpu__parallel_for(mats, grain(n, n + r), solve_run, &c);
  }
  if (!st) unpack_mats(X, c.x, cd, left);
  tpu__free(c.x);
  return st;
}

static tpu_status_t lu_solve_kernel(tpu_node_t* nd) {
  const tpu_operand_t* LU = &nd->in[0];
  tpu_dtype_t cd = nd->compute;
  char* lu = pack_mats(LU, cd, true);
  int64_t* piv = scratch(tpu__operand_numel(&nd->in[1]), sizeof(int64_t));
  tpu_status_t st = NULL;
  if (!lu || !piv) { st = TPU_HOST_NOMEM(); goto done; }
  tpu__pack(&nd->in[1], NULL, TPU_DTYPE_I64, piv);
  st = solve_with(nd, &nd->in[2], &nd->out[0], lu, piv, LU->sizes, LU->ndim - 2, nd->ia[0] != 0, nd->ia[1] != 0);
done:
  tpu__free(lu);
  tpu__free(piv);
  return st;
}

/* A vector right-hand side (…, n) as the matrix (…, n, 1) of the same memory. */
static tpu_operand_t as_column(const tpu_operand_t* op) {
  tpu_operand_t t = *op;
  t.sizes[t.ndim] = 1;
  t.strides[t.ndim] = 1;
  t.ndim += 1;
  return t;
}

static tpu_status_t solve_kernel(tpu_node_t* nd) {
  const tpu_operand_t* A = &nd->in[0];
  tpu_dtype_t cd = nd->compute;
  int64_t n = A->sizes[A->ndim - 1];
  int64_t mats = batch_of(A);
  if (!fits_lapack(n)) return tpu_status_make(TPU_UNIMPLEMENTED, "%s: matrix too large", tpu__node_describe(nd));
  lu_t c = {cd, LU_FACTOR, n, n, n, pack_mats(A, cd, true)};
  c.piv = scratch(mats * n, sizeof(int64_t));
  c.info = scratch(mats, sizeof(int64_t));
  tpu_status_t st = NULL;
  if (!c.a || !c.piv || !c.info) { st = TPU_HOST_NOMEM(); goto done; }
  tpu__blas_prepare();
  st = tpu__parallel_for(mats, grain(n, n), lu_run, &c);
  if (st) goto done;
  bool vec = nd->ia[1] != 0;
  tpu_operand_t B = vec ? as_column(&nd->in[1]) : nd->in[1];
  tpu_operand_t X = vec ? as_column(&nd->out[0]) : nd->out[0];
  /* a singular matrix's solution is what getrs gives, as on CPU (info reports it) */
  st = solve_with(nd, &B, &X, c.a, c.piv, A->sizes, A->ndim - 2, nd->ia[0] != 0, false);
  if (st) goto done;
  if (present(nd, 1)) unpack_mats(&nd->out[1], c.a, cd, true);
  if (present(nd, 2)) tpu__unpack(&nd->out[2], c.piv, TPU_DTYPE_I64);
  if (present(nd, 3)) tpu__unpack(&nd->out[3], c.info, TPU_DTYPE_I64);
done:
  tpu__free(c.a);
  tpu__free(c.piv);
  tpu__free(c.info);
  return st;
}

/* ---- solves and inverses from a Cholesky factor -------------------------------------- */

static lapack_int x_potrs(tpu_dtype_t cd, char uplo, lapack_int n, lapack_int r, const void* a, void* b) {
  lapack_int ld = n ? n : 1;
  return cd == TPU_DTYPE_F32 ? scipy_LAPACKE_spotrs_work(LAPACK_COL_MAJOR, uplo, n, r, a, ld, b, ld)
                             : scipy_LAPACKE_dpotrs_work(LAPACK_COL_MAJOR, uplo, n, r, a, ld, b, ld);
}
static lapack_int x_potri(tpu_dtype_t cd, char uplo, lapack_int n, void* a) {
  return cd == TPU_DTYPE_F32 ? scipy_LAPACKE_spotri_work(LAPACK_COL_MAJOR, uplo, n, a, n ? n : 1)
                             : scipy_LAPACKE_dpotri_work(LAPACK_COL_MAJOR, uplo, n, a, n ? n : 1);
}

typedef struct pot_s {
  tpu_dtype_t cd;
  int64_t n, r, mats;
  char* a;    /* factors, column-major */
  char* b;    /* right-hand sides (solve), column-major */
  bool upper, batched;
} pot_t;

static tpu_status_t potrs_run(void* ctx, int64_t b, int64_t e, int tid) {
  pot_t* c = ctx;
  size_t es = tpu_dtype_size(c->cd);
  int64_t n = c->n, r = c->r;
  for (int64_t i = b; i < e; ++i)
    x_potrs(c->cd, c->upper ? 'U' : 'L', (lapack_int)n, (lapack_int)r, c->a + (size_t)(i * n * n) * es,
            c->b + (size_t)(i * n * r) * es);
  return NULL;
}

static tpu_status_t potri_run(void* ctx, int64_t b, int64_t e, int tid) {
  pot_t* c = ctx;
  size_t es = tpu_dtype_size(c->cd);
  int64_t n = c->n;
  for (int64_t i = b; i < e; ++i) {
    char* p = c->a + (size_t)(i * n * n) * es;
    lapack_int info = x_potri(c->cd, c->upper ? 'U' : 'L', (lapack_int)n, p);
    if (info > 0) {
      char where[64] = "";
      if (c->batched) snprintf(where, sizeof where, "(Batch element %lld): ", (long long)i);
      return tpu_status_make(TPU_INVALID_ARGUMENT, "cholesky_inverse: %sThe diagonal element %d is zero, the "
                             "inversion could not be completed because the input matrix is singular.", where, (int)info);
    }
    for (int64_t j = 0; j < n; ++j) /* mirror the computed triangle */
      for (int64_t k = j + 1; k < n; ++k) {
        if (c->upper) st_el(p, c->cd, j * n + k, ld_el(p, c->cd, k * n + j));
        else st_el(p, c->cd, k * n + j, ld_el(p, c->cd, j * n + k));
      }
  }
  return NULL;
}

static tpu_status_t cholesky_solve_kernel(tpu_node_t* nd) {
  const tpu_operand_t *B = &nd->in[0], *L = &nd->in[1];
  tpu_dtype_t cd = nd->compute;
  int64_t n = L->sizes[L->ndim - 1], r = B->sizes[B->ndim - 1], mats = batch_of(L);
  if (!fits_lapack(n) || !fits_lapack(r))
    return tpu_status_make(TPU_UNIMPLEMENTED, "%s: matrix too large", tpu__node_describe(nd));
  pot_t c = {cd, n, r, mats, pack_mats(L, cd, true), pack_mats(B, cd, true), nd->ia[0] != 0};
  tpu_status_t st = NULL;
  if (!c.a || !c.b) { st = TPU_HOST_NOMEM(); goto done; }
  tpu__blas_prepare();
  if (n > 0 && r > 0) st = tpu__parallel_for(mats, grain(n, n + r), potrs_run, &c);
  if (!st) unpack_mats(&nd->out[0], c.b, cd, true);
done:
  tpu__free(c.a);
  tpu__free(c.b);
  return st;
}

static tpu_status_t cholesky_inverse_kernel(tpu_node_t* nd) {
  const tpu_operand_t* L = &nd->in[0];
  tpu_dtype_t cd = nd->compute;
  int64_t n = L->sizes[L->ndim - 1], mats = batch_of(L);
  if (!fits_lapack(n)) return tpu_status_make(TPU_UNIMPLEMENTED, "%s: matrix too large", tpu__node_describe(nd));
  pot_t c = {cd, n, 0, mats, pack_mats(L, cd, true), NULL, nd->ia[0] != 0, L->ndim > 2};
  if (!c.a) return TPU_HOST_NOMEM();
  tpu__blas_prepare();
  tpu_status_t st = n > 0 ? tpu__parallel_for(mats, grain(n, n), potri_run, &c) : NULL;
  if (!st) unpack_mats(&nd->out[0], c.a, cd, true);
  tpu__free(c.a);
  return st;
}

/* ---- QR, symmetric eigendecomposition, SVD ------------------------------------------- */

static lapack_int x_geqrf(tpu_dtype_t cd, lapack_int m, lapack_int n, void* a, void* tau, void* w, lapack_int lw) {
  lapack_int ld = m ? m : 1;
  return cd == TPU_DTYPE_F32 ? scipy_LAPACKE_sgeqrf_work(LAPACK_COL_MAJOR, m, n, a, ld, tau, w, lw)
                             : scipy_LAPACKE_dgeqrf_work(LAPACK_COL_MAJOR, m, n, a, ld, tau, w, lw);
}
static lapack_int x_orgqr(tpu_dtype_t cd, lapack_int m, lapack_int n, lapack_int k, void* a, const void* tau,
                          void* w, lapack_int lw) {
  lapack_int ld = m ? m : 1;
  return cd == TPU_DTYPE_F32 ? scipy_LAPACKE_sorgqr_work(LAPACK_COL_MAJOR, m, n, k, a, ld, tau, w, lw)
                             : scipy_LAPACKE_dorgqr_work(LAPACK_COL_MAJOR, m, n, k, a, ld, tau, w, lw);
}
static lapack_int x_syevd(tpu_dtype_t cd, char jobz, char uplo, lapack_int n, void* a, void* w, void* work,
                          lapack_int lw, lapack_int* iw, lapack_int liw) {
  lapack_int ld = n ? n : 1;
  return cd == TPU_DTYPE_F32 ? scipy_LAPACKE_ssyevd_work(LAPACK_COL_MAJOR, jobz, uplo, n, a, ld, w, work, lw, iw, liw)
                             : scipy_LAPACKE_dsyevd_work(LAPACK_COL_MAJOR, jobz, uplo, n, a, ld, w, work, lw, iw, liw);
}
static lapack_int x_gesdd(tpu_dtype_t cd, char jobz, lapack_int m, lapack_int n, void* a, void* s, void* u,
                          lapack_int ldu, void* vt, lapack_int ldvt, void* work, lapack_int lw, lapack_int* iw) {
  lapack_int ld = m ? m : 1;
  return cd == TPU_DTYPE_F32
             ? scipy_LAPACKE_sgesdd_work(LAPACK_COL_MAJOR, jobz, m, n, a, ld, s, u, ldu, vt, ldvt, work, lw, iw)
             : scipy_LAPACKE_dgesdd_work(LAPACK_COL_MAJOR, jobz, m, n, a, ld, s, u, ldu, vt, ldvt, work, lw, iw);
}

typedef struct dec_s {
  tpu_node_t* nd;
  tpu_dtype_t cd;
  int64_t m, n, k;
  char* a;               /* inputs, column-major; destroyed */
  char* r0;              /* QR: Q; EIGH: eigenvalues; SVD: U (column-major) */
  char* r1;              /* QR: R (column-major); EIGH: -; SVD: S */
  char* r2;              /* SVD: Vh (column-major) */
  int64_t qc, rr;        /* QR: Q's columns, R's rows; SVD: U's columns, Vh's rows */
  bool flag0, flag1;     /* EIGH: upper, compute_v; SVD: full, compute_uv */
} dec_t;

/* ATen's "(Batch element i): " prefix of a batched input's error, or nothing. */
typedef struct where_s { char s[48]; } where_t;
static where_t batch_where(const dec_t* c, int64_t i) {
  where_t w = {""};
  if (c->nd->in[0].ndim > 2) snprintf(w.s, sizeof w.s, "(Batch element %lld): ", (long long)i);
  return w;
}

static tpu_status_t qr_run(void* ctx, int64_t b, int64_t e, int tid) {
  dec_t* c = ctx;
  size_t es = tpu_dtype_size(c->cd);
  int64_t m = c->m, n = c->n, k = c->k, qc = c->qc, rr = c->rr;
  int64_t lw = 64 * ((m > n ? m : n) + 1);
  char* w = scratch(lw + k + 1, es);
  if (!w) return TPU_HOST_NOMEM();
  char* tau = w + (size_t)lw * es;
  for (int64_t i = b; i < e; ++i) {
    char* a = c->a + (size_t)(i * m * n) * es;
    x_geqrf(c->cd, (lapack_int)m, (lapack_int)n, a, tau, w, (lapack_int)lw);
    char* R = c->r1 + (size_t)(i * rr * n) * es;
    for (int64_t j = 0; j < n; ++j)
      for (int64_t r = 0; r < rr; ++r) st_el(R, c->cd, j * rr + r, r <= j && r < m ? ld_el(a, c->cd, j * m + r) : 0.0);
    if (qc > 0) {
      char* Q = c->r0 + (size_t)(i * m * qc) * es;
      int64_t cols = qc < n ? qc : n;
      memcpy(Q, a, (size_t)(m * cols) * es);
      memset(Q + (size_t)(m * cols) * es, 0, (size_t)(m * (qc - cols)) * es);
      if (m > 0) x_orgqr(c->cd, (lapack_int)m, (lapack_int)qc, (lapack_int)k, Q, tau, w, (lapack_int)lw);
    }
  }
  tpu__free(w);
  return NULL;
}

static tpu_status_t eigh_run(void* ctx, int64_t b, int64_t e, int tid) {
  dec_t* c = ctx;
  size_t es = tpu_dtype_size(c->cd);
  int64_t n = c->n;
  char jobz = c->flag1 ? 'V' : 'N';
  double q = 0;
  lapack_int liw = 0;
  char qb[16];
  x_syevd(c->cd, jobz, c->flag0 ? 'U' : 'L', (lapack_int)n, c->a, qb, qb, -1, &liw, -1);
  q = ld_el(qb, c->cd, 0);
  int64_t lw = (int64_t)q + 1;
  char* w = scratch(lw, es);
  lapack_int* iw = tpu__malloc(sizeof(lapack_int) * (size_t)(liw + 1));
  tpu_status_t st = NULL;
  if (!w || !iw) { st = TPU_HOST_NOMEM(); goto done; }
  for (int64_t i = b; i < e && !st; ++i) {
    char* a = c->a + (size_t)(i * n * n) * es;
    lapack_int info = x_syevd(c->cd, jobz, c->flag0 ? 'U' : 'L', (lapack_int)n, a, c->r0 + (size_t)(i * n) * es, w,
                              (lapack_int)lw, iw, liw);
    if (info > 0)
      st = tpu_status_make(TPU_INVALID_ARGUMENT, "linalg.eigh: %sThe algorithm failed to converge because the input "
                           "matrix is ill-conditioned or has too many repeated eigenvalues (error code: %d).",
                           batch_where(c, i).s, (int)info);
  }
done:
  tpu__free(w);
  tpu__free(iw);
  return st;
}

static tpu_status_t svd_run(void* ctx, int64_t b, int64_t e, int tid) {
  dec_t* c = ctx;
  size_t es = tpu_dtype_size(c->cd);
  int64_t m = c->m, n = c->n, k = c->k;
  char jobz = !c->flag1 ? 'N' : c->flag0 ? 'A' : 'S';
  lapack_int ldu = (lapack_int)(m ? m : 1), ldvt = (lapack_int)(c->rr ? c->rr : 1);
  char qb[16];
  lapack_int* iw = tpu__malloc(sizeof(lapack_int) * (size_t)(8 * k + 1));
  if (!iw) return TPU_HOST_NOMEM();
  char dummy[16];
  x_gesdd(c->cd, jobz, (lapack_int)m, (lapack_int)n, c->a, dummy, dummy, ldu, dummy, ldvt, qb, -1, iw);
  int64_t lw = (int64_t)ld_el(qb, c->cd, 0) + 1;
  char* w = scratch(lw, es);
  tpu_status_t st = NULL;
  if (!w) { st = TPU_HOST_NOMEM(); goto done; }
  for (int64_t i = b; i < e && !st; ++i) {
    char* a = c->a + (size_t)(i * m * n) * es;
    char* u = c->flag1 ? c->r0 + (size_t)(i * m * c->qc) * es : dummy;
    char* vt = c->flag1 ? c->r2 + (size_t)(i * c->rr * n) * es : dummy;
    /* this LAPACK's gesdd does not check A for NaN and Inf (MKL's answers -4, which ATen
     * reports as below): check first */
    bool finite = true;
    for (int64_t j = 0; j < m * n && finite; ++j) finite = isfinite(ld_el(a, c->cd, j));
    lapack_int info = !finite ? -4 : x_gesdd(c->cd, jobz, (lapack_int)m, (lapack_int)n, a, c->r1 + (size_t)(i * k) * es, u, ldu, vt,
                              ldvt, w, (lapack_int)lw, iw);
    if (info == -4) /* A has a NaN or Inf */
      st = tpu_status_make(TPU_INVALID_ARGUMENT, "linalg.svd: %sThe algorithm failed to converge because the input "
                           "matrix contained non-finite values.", batch_where(c, i).s);
    else if (info > 0)
      st = tpu_status_make(TPU_INVALID_ARGUMENT, "linalg.svd: %sThe algorithm failed to converge because the input "
                           "matrix is ill-conditioned or has too many repeated singular values (error code: %d).",
                           batch_where(c, i).s, (int)info);
  }
done:
  tpu__free(w);
  tpu__free(iw);
  return st;
}

/* geqrf and householder_product: the Householder form itself. */
typedef struct hh_s {
  tpu_dtype_t cd;
  int64_t m, n, t;
  char *a, *tau;
  bool orgqr;
} hh_t;

static tpu_status_t hh_run(void* ctx, int64_t b, int64_t e, int tid) {
  hh_t* c = ctx;
  size_t es = tpu_dtype_size(c->cd);
  int64_t m = c->m, n = c->n, t = c->t, lw = 64 * (n + 1);
  char* w = scratch(lw, es);
  if (!w) return TPU_HOST_NOMEM();
  for (int64_t i = b; i < e; ++i) {
    char* a = c->a + (size_t)(i * m * n) * es;
    char* tau = c->tau + (size_t)(i * t) * es;
    if (c->orgqr) x_orgqr(c->cd, (lapack_int)m, (lapack_int)n, (lapack_int)t, a, tau, w, (lapack_int)lw);
    else x_geqrf(c->cd, (lapack_int)m, (lapack_int)n, a, tau, w, (lapack_int)lw);
  }
  tpu__free(w);
  return NULL;
}

static tpu_status_t householder_kernel(tpu_node_t* nd) {
  const tpu_operand_t* A = &nd->in[0];
  tpu_dtype_t cd = nd->compute;
  int64_t m = A->sizes[A->ndim - 2], n = A->sizes[A->ndim - 1], mats = batch_of(A);
  if (!fits_lapack(m) || !fits_lapack(n))
    return tpu_status_make(TPU_UNIMPLEMENTED, "%s: matrix too large", tpu__node_describe(nd));
  bool org = nd->kind == TPU_KIND_ORGQR;
  const tpu_operand_t* T = org ? &nd->in[1] : &nd->out[1];
  hh_t c = {cd, m, n, T->sizes[T->ndim - 1], pack_mats(A, cd, true), NULL, org};
  c.tau = org ? pack_mats(T, cd, false) : scratch(mats * c.t, tpu_dtype_size(cd));
  tpu_status_t st = NULL;
  if (!c.a || !c.tau) { st = TPU_HOST_NOMEM(); goto done; }
  tpu__blas_prepare();
  if (m > 0 && n > 0) st = tpu__parallel_for(mats, grain(m, n), hh_run, &c);
  if (st) goto done;
  unpack_mats(&nd->out[0], c.a, cd, true);
  if (!org && present(nd, 1)) tpu__unpack(&nd->out[1], c.tau, cd);
done:
  tpu__free(c.a);
  tpu__free(c.tau);
  return st;
}

/* Sets each matrix of a column-major [mats, r, c] buffer to the identity's first columns. */
static void identity(char* p, tpu_dtype_t cd, int64_t mats, int64_t r, int64_t c) {
  size_t es = tpu_dtype_size(cd);
  memset(p, 0, (size_t)(mats * r * c) * es);
  for (int64_t i = 0; i < mats; ++i)
    for (int64_t j = 0; j < r && j < c; ++j) st_el(p, cd, i * r * c + j * r + j, 1.0);
}

static tpu_status_t decomp_kernel(tpu_node_t* nd) {
  const tpu_operand_t* A = &nd->in[0];
  tpu_dtype_t cd = nd->compute;
  size_t es = tpu_dtype_size(cd);
  int64_t m = A->sizes[A->ndim - 2], n = A->sizes[A->ndim - 1];
  int64_t mats = batch_of(A);
  if (!fits_lapack(m) || !fits_lapack(n) || m * n > INT32_MAX / 8)
    return tpu_status_make(TPU_UNIMPLEMENTED, "%s: matrix too large", tpu__node_describe(nd));
  dec_t c = {nd, cd, m, n, m < n ? m : n, pack_mats(A, cd, true)};
  tpu_parallel_fn fn;
  if (nd->kind == TPU_KIND_QR) {
    c.qc = nd->ia[0];
    c.rr = c.qc ? (c.qc > c.k ? m : c.k) : c.k;
    c.r0 = scratch(mats * m * c.qc, es);
    c.r1 = scratch(mats * c.rr * n, es);
    fn = qr_run;
  } else if (nd->kind == TPU_KIND_EIGH) {
    c.flag0 = nd->ia[0] != 0;
    c.flag1 = nd->ia[1] != 0;
    c.r0 = scratch(mats * n, es);
    c.r1 = scratch(1, es);
    fn = eigh_run;
  } else {
    c.flag0 = nd->ia[0] != 0;
    c.flag1 = nd->ia[1] != 0;
    c.qc = c.flag0 ? m : c.k;
    c.rr = c.flag0 ? n : c.k;
    c.r0 = scratch(c.flag1 ? mats * m * c.qc : 1, es);
    c.r1 = scratch(mats * c.k, es);
    c.r2 = scratch(c.flag1 ? mats * c.rr * n : 1, es);
    fn = svd_run;
  }
  tpu_status_t st = NULL;
  if (!c.a || !c.r0 || !c.r1 || (nd->kind == TPU_KIND_SVD && !c.r2)) { st = TPU_HOST_NOMEM(); goto done; }
  if (nd->kind == TPU_KIND_SVD && c.k == 0 && c.flag1) {
    /* gesdd returns at once for an empty matrix; the full factors are identities */
    identity(c.r0, cd, mats, m, c.qc);
    identity(c.r2, cd, mats, c.rr, n);
  }
  tpu__blas_prepare();
  if (c.k > 0 || nd->kind == TPU_KIND_QR) st = tpu__parallel_for(mats, grain(m, n), fn, &c);
  if (st) goto done;
  if (nd->kind == TPU_KIND_QR) {
    if (present(nd, 0)) unpack_mats(&nd->out[0], c.r0, cd, true);
    if (present(nd, 1)) unpack_mats(&nd->out[1], c.r1, cd, true);
  } else if (nd->kind == TPU_KIND_EIGH) {
    if (present(nd, 0)) tpu__unpack(&nd->out[0], c.r0, cd);
    if (c.flag1 && present(nd, 1)) unpack_mats(&nd->out[1], c.a, cd, true);
  } else {
    if (c.flag1 && present(nd, 0)) unpack_mats(&nd->out[0], c.r0, cd, true);
    if (present(nd, 1)) tpu__unpack(&nd->out[1], c.r1, cd);
    if (c.flag1 && present(nd, 2)) unpack_mats(&nd->out[2], c.r2, cd, true);
  }
done:
  tpu__free(c.a);
  tpu__free(c.r0);
  tpu__free(c.r1);
  tpu__free(c.r2);
  return st;
}

void tpu__host_register_lapack(tpu_host_kernel_fn* table) {
  table[TPU_KIND_CHOLESKY] = cholesky_kernel;
  table[TPU_KIND_GETRF] = getrf_kernel;
  table[TPU_KIND_LU_UNPACK] = lu_unpack_kernel;
  table[TPU_KIND_LU_SOLVE] = lu_solve_kernel;
  table[TPU_KIND_SOLVE] = solve_kernel;
  table[TPU_KIND_CHOLESKY_SOLVE] = cholesky_solve_kernel;
  table[TPU_KIND_CHOLESKY_INVERSE] = cholesky_inverse_kernel;
  table[TPU_KIND_QR] = decomp_kernel;
  table[TPU_KIND_GEQRF] = householder_kernel;
  table[TPU_KIND_ORGQR] = householder_kernel;
  table[TPU_KIND_EIGH] = decomp_kernel;
  table[TPU_KIND_SVD] = decomp_kernel;
}
