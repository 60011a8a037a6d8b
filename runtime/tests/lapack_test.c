/* lapack family: Cholesky (and solves and inverses from its factor), LU and what is built
 * on it, QR, eigh and SVD on small matrices with hand-computed results; argument errors and kernel errors check class and text. */
#include "tensors.h"

static const int64_t S22[2] = {2, 2};

static void test_cholesky(void) {
  const double a[4] = {4, 2, 2, 3}, l[4] = {2, 0, 1, sqrt(2.0)}, u[4] = {2, 1, 0, sqrt(2.0)};
  for (int up = 0; up < 2; ++up) {
    tpu_arg_t args[3] = {a_t(t_make(TPU_DTYPE_F64, 2, S22, a)), a_bool(up), a_bool(false)};
    tpu_view_t o[2];
    CHECK_OK(run("linalg_cholesky_ex", args, 3, o));
    expect(&o[0], up ? u : l, 1e-12);
    const double zero = 0;
    expect(&o[1], &zero, 0);
    CHECK(o[1].dtype == TPU_DTYPE_I32 && o[1].ndim == 0);
  }
  /* not positive definite at order 2; a batch of two reports per element */
  const double bad[8] = {4, 2, 2, 3, 1, 2, 2, 1}, info[2] = {0, 2};
  const int64_t s[3] = {2, 2, 2};
  tpu_arg_t args[1] = {a_t(t_make(TPU_DTYPE_F32, 3, s, bad))};
  tpu_view_t o[2];
  CHECK_OK(run("linalg_cholesky_ex", args, 1, o));
  expect(&o[1], info, 0);
  double got[8];
  t_read(&o[0], got); /* element 0 only: a failed factor's contents are LAPACK's own */
  for (int i = 0; i < 4; ++i) CHECK_NEAR(got[i], l[i], 1e-6);
  const int64_t s23[2] = {2, 3};
  tpu_arg_t ns[1] = {a_t(t_make(TPU_DTYPE_F32, 2, s23, bad))};
  expect_err(run("linalg_cholesky_ex", ns, 1, o), TPU_INVALID_ARGUMENT,
             "linalg.cholesky: A must be batches of square matrices, but they are 2 by 3 matrices");
  /* from the factor L = [[2, 0], [1, 1]] of [[4, 2], [2, 2]]: its inverse, and a solve */
  const double f[4] = {2, 0, 1, 1}, finv[4] = {0.5, -0.5, -0.5, 1}, rhs[2] = {6, 4}, x[2] = {1, 1};
  tpu_arg_t ci[2] = {a_t(t_make(TPU_DTYPE_F64, 2, S22, f)), a_bool(false)};
  CHECK_OK(run("cholesky_inverse", ci, 2, o));
  expect(&o[0], finv, 1e-12);
  const int64_t s21[2] = {2, 1};
  tpu_arg_t cs[3] = {a_t(t_make(TPU_DTYPE_F64, 2, s21, rhs)), a_t(t_make(TPU_DTYPE_F64, 2, S22, f)), a_bool(false)};
  CHECK_OK(run("_cholesky_solve_helper", cs, 3, o));
  expect(&o[0], x, 1e-12);
  const double sing[4] = {1, 0, 0, 0};
  tpu_arg_t cz[2] = {a_t(t_make(TPU_DTYPE_F64, 2, S22, sing)), a_bool(false)};
  CHECK_OK(run("cholesky_inverse", cz, 2, o));
  expect_err(tpu_device_synchronize(0), TPU_INVALID_ARGUMENT,
             "cholesky_inverse: The diagonal element 2 is zero, the inversion could not be completed");
  tpu_arg_t hf[1] = {a_t(t_make(TPU_DTYPE_F16, 2, S22, a))};
  expect_err(run("linalg_cholesky_ex", hf, 1, o), TPU_UNIMPLEMENTED, "not implemented for 'Half'");
  tpu_arg_t ce[3] = {a_t(t_make(TPU_DTYPE_F32, 2, S22, a)), a_bool(false), a_bool(true)};
  expect_err(run("linalg_cholesky_ex", ce, 3, o), TPU_UNIMPLEMENTED, "check_errors=True");
  t_reset();
}

/* [[1, 2], [3, 4]] = P L U with rows swapped: LU = [[3, 4], [1/3, 2/3]], pivots [2, 2]. */
static const double M[4] = {1, 2, 3, 4};

static void test_lu(void) {
  tpu_arg_t args[1] = {a_t(t_make(TPU_DTYPE_F64, 2, S22, M))};
  tpu_view_t o[4];
  CHECK_OK(run("linalg_lu_factor_ex", args, 1, o));
  const double lu[4] = {3, 4, 1.0 / 3, 2.0 / 3}, piv[2] = {2, 2}, zero = 0;
  expect(&o[0], lu, 1e-12);
  expect(&o[1], piv, 0);
  expect(&o[2], &zero, 0);
  CHECK(o[1].dtype == TPU_DTYPE_I32);
  const double p[4] = {0, 1, 1, 0}, l[4] = {1, 0, 1.0 / 3, 1}, u[4] = {3, 4, 0, 2.0 / 3};
  CHECK_OK(run("linalg_lu", args, 1, o));
  expect(&o[0], p, 0);
  expect(&o[1], l, 1e-12);
  expect(&o[2], u, 1e-12);
  tpu_arg_t un[2] = {a_t(t_make(TPU_DTYPE_F64, 2, S22, lu)), a_t(t_make(TPU_DTYPE_I32, 1, S22, piv))};
  CHECK_OK(run("lu_unpack", un, 2, o));
  expect(&o[0], p, 0);
  expect(&o[1], l, 1e-12);
  expect(&o[2], u, 1e-12);
  /* det = -2 (one row swap); slogdet: sign -1, log 2 */
  const double det = -2, sign = -1, lg = log(2.0);
  CHECK_OK(run("_linalg_det", args, 1, o));
  expect(&o[0], &det, 1e-12);
  CHECK_OK(run("_linalg_slogdet", args, 1, o));
  expect(&o[0], &sign, 0);
  expect(&o[1], &lg, 1e-12);
  /* a pivot out of range is the node's error, reported at the next synchronization */
  const double badpiv[2] = {5, 2};
  tpu_arg_t bp[2] = {a_t(t_make(TPU_DTYPE_F64, 2, S22, lu)), a_t(t_make(TPU_DTYPE_I32, 1, S22, badpiv))};
  CHECK_OK(run("lu_unpack", bp, 2, o));
  expect_err(tpu_device_synchronize(0), TPU_INVALID_ARGUMENT, "pivots passed to lu_unpack must be between 1");
  t_reset();
}

static void test_solve_inv(void) {
  const double a[4] = {2, 0, 0, 4}, b[2] = {2, 8}, x[2] = {1, 2};
  tpu_arg_t args[2] = {a_t(t_make(TPU_DTYPE_F32, 2, S22, a)), a_t(t_make(TPU_DTYPE_F32, 1, S22, b))};
  tpu_view_t o[4];
  CHECK_OK(run("_linalg_solve_ex", args, 2, o));
  CHECK(o[0].ndim == 1 && o[0].sizes[0] == 2); /* a vector B gives a vector X */
  expect(&o[0], x, 1e-6);
  /* X A = B with B [[2, 8]] */
  const int64_t s12[2] = {1, 2};
  tpu_arg_t right[3] = {a_t(t_make(TPU_DTYPE_F32, 2, S22, a)), a_t(t_make(TPU_DTYPE_F32, 2, s12, b)), a_bool(false)};
  CHECK_OK(run("_linalg_solve_ex", right, 3, o));
  expect(&o[0], x, 1e-6);
  const double m[4] = {4, 7, 2, 6}, inv[4] = {0.6, -0.7, -0.2, 0.4}, zero = 0;
  tpu_arg_t ia[1] = {a_t(t_make(TPU_DTYPE_F64, 2, S22, m))};
  CHECK_OK(run("linalg_inv_ex", ia, 1, o));
  expect(&o[0], inv, 1e-12);
  expect(&o[1], &zero, 0);
  /* lu_solve with the factors of [[1, 2], [3, 4]]: A x = [5, 11] -> [1, 2]; A^T x = [7, 10] -> [1, 2] */
  const double lu[4] = {3, 4, 1.0 / 3, 2.0 / 3}, piv[2] = {2, 2}, rhs[2] = {5, 11}, rhs_t[2] = {7, 10};
  const int64_t s21[2] = {2, 1};
  for (int adj = 0; adj < 2; ++adj) {
    tpu_arg_t ls[5] = {a_t(t_make(TPU_DTYPE_F64, 2, S22, lu)), a_t(t_make(TPU_DTYPE_I32, 1, S22, piv)),
                       a_t(t_make(TPU_DTYPE_F64, 2, s21, adj ? rhs_t : rhs)), a_bool(true), a_bool(adj)};
    CHECK_OK(run("linalg_lu_solve", ls, 5, o));
    expect(&o[0], x, 1e-12);
  }
  tpu_arg_t mixed[2] = {a_t(t_make(TPU_DTYPE_F32, 2, S22, a)), a_t(t_make(TPU_DTYPE_F64, 1, S22, b))};
  expect_err(run("_linalg_solve_ex", mixed, 2, o), TPU_INVALID_ARGUMENT,
             "linalg.solve: Expected A and B to have the same dtype, but found A of type Float and B of type Double");
  t_reset();
}

static void test_qr_eigh_svd(void) {
  const double a[2] = {3, 4};
  const int64_t s21[2] = {2, 1};
  tpu_view_t o[3];
  tpu_arg_t qa[1] = {a_t(t_make(TPU_DTYPE_F64, 2, s21, a))};
  CHECK_OK(run("linalg_qr", qa, 1, o));
  const double q[2] = {-0.6, -0.8}, r = -5; /* LAPACK's Householder sign, as CPU */
  expect(&o[0], q, 1e-12);
  expect(&o[1], &r, 1e-12);
  const double s[4] = {2, 1, 1, 2}, w[2] = {1, 3};
  tpu_arg_t ea[1] = {a_t(t_make(TPU_DTYPE_F32, 2, S22, s))};
  CHECK_OK(run("_linalg_eigh", ea, 1, o));
  expect(&o[0], w, 1e-6);
  const double d[4] = {3, 0, 0, -4}, sv[2] = {4, 3};
  tpu_arg_t sa[1] = {a_t(t_make(TPU_DTYPE_F64, 2, S22, d))};
  CHECK_OK(run("_linalg_svd", sa, 1, o));
  expect(&o[1], sv, 1e-12);
  tpu_arg_t bad_uplo[2] = {a_t(t_make(TPU_DTYPE_F32, 2, S22, s)), {0}};
  bad_uplo[1].kind = TPU_ARG_STRING;
  bad_uplo[1].s = "X";
  expect_err(run("_linalg_eigh", bad_uplo, 2, o), TPU_INVALID_ARGUMENT, "Expected UPLO argument to be 'L' or 'U'");
  t_reset();
}

int main(void) {
  test_cholesky();
  test_lu();
  test_solve_inv();
  test_qr_eigh_svd();
  TEST_MAIN_END();
}
