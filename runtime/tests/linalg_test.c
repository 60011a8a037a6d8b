/* linalg family: matrix products, convolution, pooling, checked against hand-computed
 * values and naive reference loops; error cases check the status class and text. */
#include "tensors.h"

/* ---- matrix products ------------------------------------------------------------------- */

static const double A23[6] = {1, 2, 3, 4, 5, 6};      /* [[1,2,3],[4,5,6]] */
static const double B32[6] = {7, 8, 9, 10, 11, 12};   /* [[7,8],[9,10],[11,12]] */
static const double AB[4] = {58, 64, 139, 154};

static void test_mm_dtypes(void) {
  const tpu_dtype_t dts[] = {TPU_DTYPE_F32, TPU_DTYPE_F64, TPU_DTYPE_I64, TPU_DTYPE_I32,
                             TPU_DTYPE_BF16, TPU_DTYPE_F16, TPU_DTYPE_U8};
  int64_t sa[2] = {2, 3}, sb[2] = {3, 2};
  for (size_t k = 0; k < sizeof dts / sizeof *dts; ++k) {
    tpu_arg_t args[2] = {a_t(t_make(dts[k], 2, sa, A23)), a_t(t_make(dts[k], 2, sb, B32))};
    tpu_view_t out[1];
    CHECK_OK(run("mm", args, 2, out));
    CHECK(out[0].dtype == dts[k]);
    if (dts[k] == TPU_DTYPE_U8) { double w[4] = {58, 64, 139, 154 - 256 + 0}; w[3] = 154; expect(&out[0], w, 0); }
    else expect(&out[0], AB, dts[k] == TPU_DTYPE_BF16 ? 1.0 : 0.0);
  }
  t_reset();
}

static void test_mm_strided(void) {
  /* mat1 as the transpose of a [3,2] tensor, mat2 a column-sliced [3,4] tensor. */
  int64_t s32[2] = {3, 2}, s34[2] = {3, 4};
  double at[6] = {1, 4, 2, 5, 3, 6};
  double b34[12] = {7, 8, -1, -1, 9, 10, -1, -1, 11, 12, -1, -1};
  tpu_view_t a = t_make(TPU_DTYPE_F32, 2, s32, at);
  a.sizes[0] = 2; a.sizes[1] = 3; a.strides[0] = 1; a.strides[1] = 2;
  tpu_view_t bb = t_make(TPU_DTYPE_F32, 2, s34, b34);
  bb.sizes[1] = 2;
  tpu_arg_t args[2] = {a_t(a), a_t(bb)};
  tpu_view_t out[1];
  CHECK_OK(run("mm", args, 2, out));
  expect(&out[0], AB, 0);
  /* a non-BLAS-able layout (both strides != 1) goes through packing */
  tpu_view_t e = t_make(TPU_DTYPE_F64, 2, s34, b34);
  e.sizes[0] = 2; e.sizes[1] = 2; e.strides[0] = 8; e.strides[1] = 1; /* rows 0 and 2 */
  tpu_view_t f = t_make(TPU_DTYPE_F64, 2, s34, b34);
  f.sizes[0] = 2; f.sizes[1] = 2; f.strides[0] = 2; f.strides[1] = 4; /* strided both ways */
  tpu_arg_t args2[2] = {a_t(e), a_t(f)};
  CHECK_OK(run("mm", args2, 2, out));
  /* e = [[7,8],[11,12]], f[i][j] = b34[2i+4j] = [[7,9],[-1,-1]] */
  double w[4] = {7 * 7 - 8, 7 * 9 - 8, 11 * 7 - 12, 11 * 9 - 12};
  expect(&out[0], w, 0);
  t_reset();
}

static void test_addmm_family(void) {
  int64_t sa[2] = {2, 3}, sb[2] = {3, 2}, s1[1] = {2}, s22[2] = {2, 2};
  double bias[2] = {1, -1};
  tpu_view_t a = t_make(TPU_DTYPE_F32, 2, sa, A23), b = t_make(TPU_DTYPE_F32, 2, sb, B32);
  tpu_arg_t args[5] = {a_t(t_make(TPU_DTYPE_F32, 1, s1, bias)), a_t(a), a_t(b), a_sc(2), a_sc(0.5)};
  tpu_view_t out[1];
  CHECK_OK(run("addmm", args, 5, out));
  double w[4] = {2 + 29, -2 + 32, 2 + 69.5, -2 + 77};
  expect(&out[0], w, 1e-5);
  /* beta = 0 ignores NaN in self */
  double nan4[4] = {NAN, NAN, NAN, NAN};
  args[0] = a_t(t_make(TPU_DTYPE_F32, 2, s22, nan4));
  args[3] = a_sc(0);
  CHECK_OK(run("addmm", args, 5, out));
  double w2[4] = {29, 32, 69.5, 77};
  expect(&out[0], w2, 1e-5);
  /* in-place addmm_ on an integer self */
  double c4[4] = {1, 2, 3, 4};
  tpu_view_t ci = t_make(TPU_DTYPE_I64, 2, s22, c4);
  tpu_arg_t iargs[5] = {a_t(ci), a_t(t_make(TPU_DTYPE_I64, 2, sa, A23)), a_t(t_make(TPU_DTYPE_I64, 2, sb, B32)),
                        a_int(3), a_int(2)};
  tpu_node_t* n;
  CHECK_OK(tpu_op_prepare(check_op_index("addmm_"), TPU_VARIANT_INPLACE, iargs, 5, &n));
  CHECK_OK(tpu_node_bind_output(n, 0, &ci));
  CHECK_OK(tpu_node_submit(n));
  double w3[4] = {3 + 116, 6 + 128, 9 + 278, 12 + 308};
  expect(&ci, w3, 0);
  /* bmm / baddbmm / addbmm with two batches: batch 1 = batch 0 negated */
  int64_t s223[3] = {2, 2, 3}, s232[3] = {2, 3, 2};
  double a2[12], b2[12];
  for (int i = 0; i < 6; ++i) { a2[i] = A23[i]; a2[6 + i] = -A23[i]; b2[i] = B32[i]; b2[6 + i] = B32[i]; }
  tpu_view_t ba = t_make(TPU_DTYPE_F64, 3, s223, a2), bb = t_make(TPU_DTYPE_F64, 3, s232, b2);
  tpu_arg_t bargs[2] = {a_t(ba), a_t(bb)};
  CHECK_OK(run("bmm", bargs, 2, out));
  double w4[8] = {58, 64, 139, 154, -58, -64, -139, -154};
  expect(&out[0], w4, 0);
  double one[1] = {1};
  int64_t s0[1] = {1};
  tpu_arg_t cargs[5] = {a_t(t_make(TPU_DTYPE_F64, 1, s0, one)), a_t(ba), a_t(bb), a_int(1), a_int(1)};
  CHECK_OK(run("baddbmm", cargs, 5, out));
  double w5[8];
  for (int i = 0; i < 8; ++i) w5[i] = w4[i] + 1;
  expect(&out[0], w5, 0);
  cargs[3] = a_int(2);
  CHECK_OK(run("addbmm", cargs, 5, out));
  double w6[4] = {2, 2, 2, 2};
  expect(&out[0], w6, 0);
  t_reset();
}

static void test_mv_dot(void) {
  int64_t sa[2] = {2, 3}, s3[1] = {3}, s6[1] = {6};
  double v3[3] = {1, -1, 2}, v6[6] = {1, 9, -1, 9, 2, 9};
  tpu_view_t a = t_make(TPU_DTYPE_F32, 2, sa, A23);
  tpu_view_t v = t_make(TPU_DTYPE_F32, 1, s6, v6);
  v.sizes[0] = 3; v.strides[0] = 2; /* every other element: [1, -1, 2] */
  tpu_arg_t args[2] = {a_t(a), a_t(v)};
  tpu_view_t out[1];
  CHECK_OK(run("mv", args, 2, out));
  double w[2] = {1 - 2 + 6, 4 - 5 + 12};
  expect(&out[0], w, 0);
  tpu_arg_t dargs[2] = {a_t(t_make(TPU_DTYPE_I64, 1, s3, v3)), a_t(t_make(TPU_DTYPE_I64, 1, s3, A23))};
  CHECK_OK(run("dot", dargs, 2, out));
  CHECK(out[0].ndim == 0);
  double w2[1] = {1 - 2 + 6};
  expect(&out[0], w2, 0);
  double c2[2] = {10, 20};
  int64_t s2[1] = {2};
  tpu_arg_t margs[5] = {a_t(t_make(TPU_DTYPE_F32, 1, s2, c2)), a_t(a), a_t(v), a_sc(1), a_sc(-1)};
  CHECK_OK(run("addmv", margs, 5, out));
  double w3[2] = {5, 9};
  expect(&out[0], w3, 0);
  t_reset();
}

static void test_gemm_errors(void) {
  int64_t sa[2] = {2, 3}, sb[2] = {4, 5}, s3[3] = {2, 3, 4};
  double z[64] = {0};
  tpu_view_t out[1];
  tpu_arg_t args[2] = {a_t(t_make(TPU_DTYPE_F32, 2, sa, z)), a_t(t_make(TPU_DTYPE_F32, 2, sb, z))};
  expect_err(run("mm", args, 2, out), TPU_INVALID_ARGUMENT,
             "mm: mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)");
  int64_t sc[2] = {3, 5};
  args[1] = a_t(t_make(TPU_DTYPE_F64, 2, sc, z));
  expect_err(run("mm", args, 2, out), TPU_INVALID_ARGUMENT,
             "expected m1 and m2 to have the same dtype, but got: float != double");
  args[1] = a_t(t_make(TPU_DTYPE_F32, 3, s3, z));
  expect_err(run("mm", args, 2, out), TPU_INVALID_ARGUMENT, "mat2 must be a matrix");
  args[0] = a_t(t_make(TPU_DTYPE_BOOL, 2, sa, z));
  args[1] = a_t(t_make(TPU_DTYPE_BOOL, 2, sc, z));
  expect_err(run("mm", args, 2, out), TPU_UNIMPLEMENTED, "not implemented for 'Bool'");
  int64_t s4[1] = {4};
  tpu_arg_t d[2] = {a_t(t_make(TPU_DTYPE_F32, 1, &sa[1], z)), a_t(t_make(TPU_DTYPE_F32, 1, s4, z))};
  expect_err(run("dot", d, 2, out), TPU_INVALID_ARGUMENT, "inconsistent tensor size");
  int64_t s33[2] = {3, 3};
  tpu_arg_t e[5] = {a_t(t_make(TPU_DTYPE_F32, 2, s33, z)), a_t(t_make(TPU_DTYPE_F32, 2, sa, z)),
                    a_t(t_make(TPU_DTYPE_F32, 2, s33, z)), a_sc(1), a_sc(1)};
  expect_err(run("addmm", e, 5, out), TPU_INVALID_ARGUMENT,
             "The expanded size of the tensor (2) must match the existing size (3) at non-singleton dimension 0");
  int64_t b1[3] = {2, 3, 4}, b2[3] = {3, 4, 4};
  tpu_arg_t f[2] = {a_t(t_make(TPU_DTYPE_F32, 3, b1, z)), a_t(t_make(TPU_DTYPE_F32, 3, b2, z))};
  expect_err(run("bmm", f, 2, out), TPU_INVALID_ARGUMENT,
             "Expected size for first two dimensions of batch2 tensor to be: [2, 4] but got: [3, 4].");
  t_reset();
}

static void test_gemm_empty(void) {
  int64_t sa[2] = {2, 0}, sb[2] = {0, 3};
  double z[1] = {0};
  tpu_arg_t args[2] = {a_t(t_make(TPU_DTYPE_F32, 2, sa, z)), a_t(t_make(TPU_DTYPE_F32, 2, sb, z))};
  tpu_view_t out[1];
  CHECK_OK(run("mm", args, 2, out));
  double w[6] = {0};
  expect(&out[0], w, 0);
  t_reset();
}

/* ---- bf16 and f32 GEMM ------------------------------------------------------------------ */
/* bf16 x bf16 products (the AVX512-BF16 kernel where the CPU has it, widen + sgemm
 * otherwise) and f32 products (the AVX-512 kernel where the CPU has it, sgemm otherwise)
 * against a double reference. Operand values are multiples of 1/8 up to 2 in magnitude:
 * exact in bf16, with every partial sum exact in f32, so whatever the summation order the
 * result is the reference rounded once to the dtype, and a packing or stride mistake
 * shows as a mismatch. One case per layout: contiguous, transposed, strided both ways. */

static double bf16_rne(double x) {
  float f = (float)x;
  uint32_t u;
  memcpy(&u, &f, 4);
  u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000u;
  memcpy(&f, &u, 4);
  return f;
}

/* x rounded to dt (bf16 or f32) */
static double round_to(tpu_dtype_t dt, double x) { return dt == TPU_DTYPE_BF16 ? bf16_rne(x) : (float)x; }

static double exact_val(void) { return (double)(rand() % 33 - 16) / 8.0; }

/* A [bt, rows, cols] operand (bf16 or f32) in one of three layouts: 0 contiguous, 1 transposed
 * (stored [bt, cols, rows]), 2 every other row and column of a [bt, 2 rows, 2 cols]
 * storage (the others NaN). vals gets the storage contents; element (b, r, c) is vals[b*s0 + r*s1 + c*s2]. */
typedef struct bmat_s { tpu_view_t v; double* vals; int64_t s[3]; } bmat_t;

static bmat_t bmat_make(tpu_dtype_t dt, int nd, int64_t bt, int64_t rows, int64_t cols, int layout, bool exact) {
  bmat_t m;
  int64_t n = bt * rows * cols * (layout == 2 ? 4 : 1);
  m.vals = malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; ++i) {
    /* layout 2: the elements the view skips are NaN, so reading past a row or column
     * (a pad that should be zero) poisons the result */
    bool skipped = layout == 2 && ((i % (2 * cols)) % 2 != 0 || (i / (2 * cols)) % 2 != 0);
    m.vals[i] = skipped ? NAN : exact ? exact_val() : bf16_rne((double)rand() / RAND_MAX * 2.0 - 1.0);
  }
  int64_t s1[1] = {n};
  m.v = t_make(dt, 1, s1, m.vals);
  if (layout == 0) { m.s[0] = rows * cols; m.s[1] = cols; m.s[2] = 1; }
  else if (layout == 1) { m.s[0] = rows * cols; m.s[1] = 1; m.s[2] = rows; }
  else { m.s[0] = 4 * rows * cols; m.s[1] = 4 * cols; m.s[2] = 2; }
  int64_t sz[3] = {bt, rows, cols};
  m.v.ndim = nd;
  for (int d = 0; d < nd; ++d) { m.v.sizes[d] = sz[3 - nd + d]; m.v.strides[d] = m.s[3 - nd + d]; }
  return m;
}

static double bmat_at(const bmat_t* m, int64_t b, int64_t r, int64_t c) {
  return m->vals[b * m->s[0] + r * m->s[1] + c * m->s[2]];
}

typedef enum { BG_MM, BG_ADDMM, BG_BMM, BG_BADDBMM, BG_ADDBMM } bg_op_t;

static void gemm_case(tpu_dtype_t dt, bg_op_t op, int64_t bt, int64_t M, int64_t K, int64_t N, int la, int lb,
                           double alpha, double beta, bool exact) {
  bool batched = op == BG_BMM || op == BG_BADDBMM || op == BG_ADDBMM;
  bool has_c = op == BG_ADDMM || op == BG_BADDBMM || op == BG_ADDBMM;
  int nd = batched ? 3 : 2;
  if (!batched) bt = 1;
  bmat_t a = bmat_make(dt, nd, bt, M, K, la, exact), b = bmat_make(dt, nd, bt, K, N, lb, exact);
  /* C: a bias row [N] for addmm, [bt, M, N] for baddbmm, [M, N] for addbmm */
  int64_t cn = op == BG_ADDMM ? N : op == BG_BADDBMM ? bt * M * N : M * N;
  double* cv = malloc(sizeof(double) * (size_t)(cn ? cn : 1));
  for (int64_t i = 0; i < cn; ++i) cv[i] = exact_val();
  int64_t csz[3] = {bt, M, N};
  tpu_view_t c = {0};
  if (op == BG_ADDMM) c = t_make(dt, 1, &csz[2], cv);
  else if (op == BG_BADDBMM) c = t_make(dt, 3, csz, cv);
  else if (op == BG_ADDBMM) c = t_make(dt, 2, &csz[1], cv);
  static const char* names[] = {"mm", "addmm", "bmm", "baddbmm", "addbmm"};
  tpu_arg_t args[5] = {a_t(c), a_t(a.v), a_t(b.v), a_sc(beta), a_sc(alpha)};
  tpu_view_t out[1];
  CHECK_OK(has_c ? run(names[op], args, 5, out) : run(names[op], args + 1, 2, out));
  int64_t on = (op == BG_ADDBMM ? 1 : bt) * M * N;
  double ulp = dt == TPU_DTYPE_BF16 ? 0x1p-7 : 0x1p-23;
  double* want = malloc(sizeof(double) * (size_t)(on ? on : 1));
  double* tol = malloc(sizeof(double) * (size_t)(on ? on : 1));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = op == BG_ADDMM ? beta * cv[j] : op == BG_ADDBMM ? beta * cv[i * N + j] : 0;
      double mag = fabs(acc);
      for (int64_t bi = 0; bi < bt; ++bi) {
        double s = 0, sa = 0;
        for (int64_t k = 0; k < K; ++k) {
          s += bmat_at(&a, bi, i, k) * bmat_at(&b, bi, k, j);
          sa += fabs(bmat_at(&a, bi, i, k) * bmat_at(&b, bi, k, j));
        }
        if (op == BG_ADDBMM) {
          /* PyTorch's addbmm rounds the result after every batch */
          acc = round_to(dt, acc + alpha * s);
          mag = fabs(acc) + fabs(alpha) * sa;
          continue;
        }
        double base = op == BG_BADDBMM ? beta * cv[(bi * M + i) * N + j] : acc;
        want[(bi * M + i) * N + j] = round_to(dt, base + alpha * s);
        /* inexact values: f32 accumulation error, then both results rounded to the dtype,
         * each within half an ulp, so one ulp apart where the two straddle a rounding
         * midpoint */
        tol[(bi * M + i) * N + j] = exact ? 0 : ulp * fabs(base + alpha * s) + (double)K * 0x1p-23 * fabs(alpha) * sa;
      }
      if (op == BG_ADDBMM) { want[i * N + j] = acc; tol[i * N + j] = exact ? 0 : ulp * mag; }
    }
  double* got = malloc(sizeof(double) * (size_t)(on ? on : 1));
  t_read(&out[0], got);
  for (int64_t i = 0; i < on; ++i)
    if (!(fabs(got[i] - want[i]) <= tol[i])) {
      fprintf(stderr, "  %s %s bt=%lld %lldx%lldx%lld layouts %d/%d alpha %g beta %g: element %lld got %g want %g\n",
              dt == TPU_DTYPE_BF16 ? "bf16" : "f32", names[op], (long long)bt, (long long)M, (long long)K, (long long)N, la, lb, alpha, beta,
              (long long)i, got[i], want[i]);
      ++check_failures;
      break;
    }
  free(got); free(want); free(tol); free(cv); free(a.vals); free(b.vals);
  t_reset();
}

static void test_bf16_gemm(void) {
  /* (M, K, N): K = 1 and odd K (a zero-padded last pair), M and N off the 6 x 64
   * register block, N across two column panels and several column tasks; 203 x 515 x
   * 261 is large enough to run on the pool; 67 x 1031 x 93 spans two K blocks (516 pairs,
   * split 258 + 258), the last pair odd; with an even K, contiguous A (layout 0) is read
   * in place: 203 x 1032 x 261 over two K blocks, 67 x 2050 x 131 over three of 342, 342
   * and 341 pairs, a last row panel of one row. M <= 4 with a unit-stride B takes the
   * few-rows kernels (K across 32-element vectors, N across their column blocks). */
  static const int64_t shapes[][3] = {{1, 1, 1}, {7, 1, 45}, {5, 2, 64}, {13, 3, 70}, {6, 64, 64},
                                      {67, 131, 93}, {203, 515, 261}, {2, 64, 17}, {3, 33, 70},
                                      {4, 1001, 77}, {67, 1031, 93}, {203, 1032, 261}, {67, 2050, 131}};
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; ++s)
    for (int la = 0; la < 3; ++la)
      for (int lb = 0; lb < 3; ++lb)
        gemm_case(TPU_DTYPE_BF16, BG_MM, 1, shapes[s][0], shapes[s][1], shapes[s][2], la, lb, 1, 0, true);
  /* On AMX (host/gemm_amx.c) K = 2040 (64 K tiles) makes chunks of 4 tile pairs: the
   * larger operand's 7 pairs are a whole chunk and a last one of 3, B held and A held. */
  for (int l = 0; l < 3; ++l) {
    gemm_case(TPU_DTYPE_BF16, BG_MM, 1, 40, 2040, 200, l, (l + 1) % 3, 1, 0, true);
    gemm_case(TPU_DTYPE_BF16, BG_MM, 1, 200, 2040, 40, (l + 2) % 3, l, 1, 0, true);
  }
  gemm_case(TPU_DTYPE_BF16, BG_ADDMM, 1, 67, 131, 93, 0, 1, 0.5, -2, true);
  gemm_case(TPU_DTYPE_BF16, BG_ADDMM, 1, 203, 515, 261, 1, 0, 2, 0.25, true);
  gemm_case(TPU_DTYPE_BF16, BG_ADDMM, 1, 9, 7, 70, 2, 2, -1, 0, true); /* beta 0: C not read */
  gemm_case(TPU_DTYPE_BF16, BG_ADDMM, 1, 3, 131, 93, 0, 1, 0.5, -2, true);
  gemm_case(TPU_DTYPE_BF16, BG_ADDMM, 1, 4, 131, 93, 1, 0, -2, 0.25, true);
  gemm_case(TPU_DTYPE_BF16, BG_BMM, 3, 13, 33, 70, 0, 1, 1, 0, true);
  gemm_case(TPU_DTYPE_BF16, BG_BMM, 2, 1, 33, 70, 0, 0, 1, 0, true);
  gemm_case(TPU_DTYPE_BF16, BG_BADDBMM, 3, 13, 33, 70, 1, 2, 0.5, 2, true);
  gemm_case(TPU_DTYPE_BF16, BG_ADDBMM, 3, 13, 33, 70, 0, 0, 0.5, -1, true);
  /* values that are not exact: within f32 accumulation error and a bf16 ulp */
  gemm_case(TPU_DTYPE_BF16, BG_MM, 1, 203, 515, 261, 0, 1, 1, 0, false);
  gemm_case(TPU_DTYPE_BF16, BG_BADDBMM, 2, 67, 1001, 93, 1, 0, 0.75, 1.5, false);
  gemm_case(TPU_DTYPE_BF16, BG_MM, 1, 3, 2049, 300, 0, 1, 1, 0, false);
  gemm_case(TPU_DTYPE_BF16, BG_MM, 1, 3, 2049, 300, 1, 0, 1, 0, false);
}

static void test_f32_gemm(void) {
  /* (M, K, N) for the AVX-512 kernel (host/gemm_avx512f32.c, at least 8 rows) where the
   * CPU has it: M off the 6 x 64 register block (a last row panel of 1..5 rows), N
   * across column panels and tasks of 128, K = 1 and K across blocks of at most 512
   * (1031: two of 516; 2050: five of 410); 203 x 515 x 261 runs on the pool. Up to 6
   * rows take the few-rows kernels where B is row-major or both are K-contiguous (K
   * across 16-value steps with a masked tail, N across 64-column and 16-column blocks,
   * 6 x 1025 x 1100 over the pool); 7 rows, and transposed A with transposed B, stay on
   * sgemm. */
  static const int64_t shapes[][3] = {{8, 1, 1}, {13, 3, 70}, {6, 64, 64}, {7, 5, 9}, {67, 131, 93},
                                      {203, 515, 261}, {9, 1031, 129}, {67, 2050, 131}, {512, 64, 257},
                                      {1, 1, 1}, {1, 37, 70}, {2, 16, 16}, {3, 300, 129}, {5, 17, 5},
                                      {6, 1025, 1100}};
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; ++s)
    for (int la = 0; la < 3; ++la)
      for (int lb = 0; lb < 3; ++lb)
        gemm_case(TPU_DTYPE_F32, BG_MM, 1, shapes[s][0], shapes[s][1], shapes[s][2], la, lb, 1, 0, true);
  gemm_case(TPU_DTYPE_F32, BG_ADDMM, 1, 67, 131, 93, 0, 1, 0.5, -2, true);
  gemm_case(TPU_DTYPE_F32, BG_ADDMM, 1, 203, 1031, 261, 1, 0, 2, 0.25, true); /* beta on the first K block only */
  gemm_case(TPU_DTYPE_F32, BG_ADDMM, 1, 9, 7, 70, 2, 2, -1, 0, true); /* beta 0: C not read */
  gemm_case(TPU_DTYPE_F32, BG_ADDMM, 1, 3, 131, 93, 0, 1, 0.5, -2, true);
  gemm_case(TPU_DTYPE_F32, BG_ADDMM, 1, 4, 131, 93, 1, 0, -2, 0.25, true);
  gemm_case(TPU_DTYPE_F32, BG_BADDBMM, 3, 13, 33, 70, 1, 2, 0.5, 2, true);
  gemm_case(TPU_DTYPE_F32, BG_ADDBMM, 3, 13, 33, 70, 0, 0, 0.5, -1, true);
  /* values that are not exact: within f32 accumulation error */
  gemm_case(TPU_DTYPE_F32, BG_MM, 1, 203, 515, 261, 0, 1, 1, 0, false);
  gemm_case(TPU_DTYPE_F32, BG_BADDBMM, 2, 67, 1001, 93, 1, 0, 0.75, 1.5, false);
}

/* ---- convolution ------------------------------------------------------------------------ */

/* Naive 2-d reference (non-transposed), double. */
static void ref_conv2d(const double* x, const double* w, const double* bias, int N, int C, int H, int W,
                       int O, int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw, int g,
                       int OH, int OW, double* y) {
  int Cg = C / g, Og = O / g;
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < O; ++o)
      for (int oh = 0; oh < OH; ++oh)
        for (int ow = 0; ow < OW; ++ow) {
          double s = bias ? bias[o] : 0;
          int gi = o / Og;
          for (int c = 0; c < Cg; ++c)
            for (int i = 0; i < kh; ++i)
              for (int j = 0; j < kw; ++j) {
                int h = oh * sh - ph + i * dh, ww = ow * sw - pw + j * dw;
                if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
                s += x[((n * C + gi * Cg + c) * H + h) * W + ww] * w[((o * Cg + c) * kh + i) * kw + j];
              }
          y[((n * O + o) * OH + oh) * OW + ow] = s;
        }
}

static double dotv(const double* a, const double* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

static void test_conv2d(void) {
  enum { N = 2, C = 4, H = 5, W = 6, O = 6, KH = 3, KW = 2, G = 2 };
  int64_t xs[4] = {N, C, H, W}, ws[4] = {O, C / G, KH, KW}, bs[1] = {O};
  double x[N * C * H * W], w[O * (C / G) * KH * KW], bias[O];
  for (int i = 0; i < N * C * H * W; ++i) x[i] = (double)((i * 7) % 11) - 5;
  for (int i = 0; i < O * (C / G) * KH * KW; ++i) w[i] = (double)((i * 5) % 7) - 3;
  for (int i = 0; i < O; ++i) bias[i] = i;
  int64_t stride[2] = {2, 1}, pad[2] = {1, 1}, dil[2] = {1, 2}, opad[2] = {0, 0};
  int OH = (H + 2 - 3) / 2 + 1, OW = (W + 2 - 3) / 1 + 1; /* 3 x 6 */
  tpu_view_t vx = t_make(TPU_DTYPE_F64, 4, xs, x), vw = t_make(TPU_DTYPE_F64, 4, ws, w);
  tpu_arg_t args[9] = {a_t(vx), a_t(vw), a_t(t_make(TPU_DTYPE_F64, 1, bs, bias)), a_list(stride, 2),
                       a_list(pad, 2), a_list(dil, 2), a_bool(false), a_list(opad, 2), a_int(G)};
  tpu_view_t out[3];
  CHECK_OK(run("convolution_overrideable", args, 9, out));
  CHECK(out[0].ndim == 4 && out[0].sizes[1] == O && out[0].sizes[2] == OH && out[0].sizes[3] == OW);
  double ref[N * O * 3 * 6];
  ref_conv2d(x, w, bias, N, C, H, W, O, KH, KW, 2, 1, 1, 1, 1, 2, G, OH, OW, ref);
  expect(&out[0], ref, 1e-9);
  /* the same in f32 and bf16-free paths */
  tpu_arg_t fargs[9];
  memcpy(fargs, args, sizeof fargs);
  fargs[0] = a_t(t_make(TPU_DTYPE_F32, 4, xs, x));
  fargs[1] = a_t(t_make(TPU_DTYPE_F32, 4, ws, w));
  fargs[2] = a_none();
  CHECK_OK(run("convolution_overrideable", fargs, 9, out));
  double ref2[N * O * 3 * 6];
  ref_conv2d(x, w, NULL, N, C, H, W, O, KH, KW, 2, 1, 1, 1, 1, 2, G, OH, OW, ref2);
  expect(&out[0], ref2, 1e-4);

  /* backward: adjoint identities <conv(x), go> = <x, gi> = <w, gw>, gb = sum(go) */
  int ny = N * O * OH * OW;
  double go[N * O * 3 * 6];
  for (int i = 0; i < ny; ++i) go[i] = (double)((i * 3) % 5) - 2;
  int64_t ys[4] = {N, O, OH, OW};
  int64_t mask[3] = {1, 1, 1};
  tpu_arg_t bargs[10] = {a_t(t_make(TPU_DTYPE_F64, 4, ys, go)), a_t(vx), a_t(vw), a_list(stride, 2),
                         a_list(pad, 2), a_list(dil, 2), a_bool(false), a_list(opad, 2), a_int(G),
                         a_list(mask, 3)};
  CHECK_OK(run("convolution_backward_overrideable", bargs, 10, out));
  double gi[N * C * H * W], gw[O * (C / G) * KH * KW], gb[O];
  t_read(&out[0], gi); t_read(&out[1], gw); t_read(&out[2], gb);
  double lhs = dotv(ref2, go, ny);
  CHECK_NEAR(dotv(x, gi, N * C * H * W), lhs, 1e-6);
  CHECK_NEAR(dotv(w, gw, O * (C / G) * KH * KW), lhs, 1e-6);
  for (int o = 0; o < O; ++o) {
    double s = 0;
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < OH * OW; ++k) s += go[(n * O + o) * OH * OW + k];
    CHECK_NEAR(gb[o], s, 1e-9);
  }
  /* single-element probes pin grad_input / grad_weight down beyond the identities */
  double e_go[N * O * 3 * 6] = {0};
  e_go[((1 * O + 3) * OH + 1) * OW + 2] = 1;
  bargs[0] = a_t(t_make(TPU_DTYPE_F64, 4, ys, e_go));
  CHECK_OK(run("convolution_backward_overrideable", bargs, 10, out));
  t_read(&out[0], gi);
  /* d y[1,3,1,2] / d x[1, c, h, w] = w[3, c - g*Cg, i, j] where h = 1*2-1+i, w = 2-1+2j */
  double want_gi[N * C * H * W] = {0};
  for (int c = 0; c < C / G; ++c)
    for (int i = 0; i < KH; ++i)
      for (int j = 0; j < KW; ++j) {
        int h = 2 - 1 + i, ww = 2 - 1 + 2 * j;
        if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
        want_gi[((1 * C + 2 + c) * H + h) * W + ww] += w[((3 * (C / G) + c) * KH + i) * KW + j];
      }
  for (int i = 0; i < N * C * H * W; ++i) CHECK_NEAR(gi[i], want_gi[i], 1e-12);
  /* errors */
  int64_t badw[4] = {O, C, KH, KW};
  static const double wbad[O * C * KH * KW];
  args[1] = a_t(t_make(TPU_DTYPE_F64, 4, badw, wbad));
  expect_err(run("convolution_overrideable", args, 9, out), TPU_INVALID_ARGUMENT,
             "expected input[2, 4, 5, 6] to have 8 channels, but got 4 channels instead");
  t_reset();
}

static void test_conv_transposed_and_1d(void) {
  /* 1-d transposed convolution, stride 2, checked against scatter by definition */
  enum { N = 1, C = 2, L = 3, O = 2, K = 3 };
  int64_t xs[3] = {N, C, L}, ws[3] = {C, O, K};
  double x[N * C * L] = {1, 2, 3, -1, 0, 2}, w[C * O * K] = {1, 0, -1, 2, 1, 0, 0, 1, 1, -2, 3, 1};
  int64_t stride[1] = {2}, pad[1] = {1}, dil[1] = {1}, opad[1] = {1};
  int OL = (L - 1) * 2 - 2 + K + 1;
  tpu_arg_t args[9] = {a_t(t_make(TPU_DTYPE_F32, 3, xs, x)), a_t(t_make(TPU_DTYPE_F32, 3, ws, w)), a_none(),
                       a_list(stride, 1), a_list(pad, 1), a_list(dil, 1), a_bool(true), a_list(opad, 1),
                       a_int(1)};
  tpu_view_t out[3];
  CHECK_OK(run("convolution_overrideable", args, 9, out));
  CHECK(out[0].sizes[2] == OL);
  double ref[N * O * 8] = {0};
  for (int c = 0; c < C; ++c)
    for (int o = 0; o < O; ++o)
      for (int l = 0; l < L; ++l)
        for (int k = 0; k < K; ++k) {
          int p = l * 2 - 1 + k;
          if (p >= 0 && p < OL) ref[o * OL + p] += x[c * L + l] * w[(c * O + o) * K + k];
        }
  expect(&out[0], ref, 1e-5);
  /* its backward: <y, go> = <x, gi> = <w, gw> */
  double go[N * O * 8];
  for (int i = 0; i < O * OL; ++i) go[i] = (i % 3) - 1;
  int64_t ys[3] = {N, O, OL}, mask[3] = {1, 1, 0};
  tpu_arg_t bargs[10] = {a_t(t_make(TPU_DTYPE_F32, 3, ys, go)), args[0], args[1], a_list(stride, 1),
                         a_list(pad, 1), a_list(dil, 1), a_bool(true), a_list(opad, 1), a_int(1),
                         a_list(mask, 3)};
  CHECK_OK(run("convolution_backward_overrideable", bargs, 10, out));
  double gi[N * C * L], gw[C * O * K];
  t_read(&out[0], gi); t_read(&out[1], gw);
  double lhs = dotv(ref, go, O * OL);
  CHECK_NEAR(dotv(x, gi, C * L), lhs, 1e-4);
  CHECK_NEAR(dotv(w, gw, C * O * K), lhs, 1e-4);
  CHECK(out[2].ndim == -1); /* masked out: absent (an undefined tensor in PyTorch) */
  t_reset();
}

/* ---- pooling ------------------------------------------------------------------------------ */

static void test_max_pool(void) {
  int64_t xs[3] = {1, 4, 4};
  double x[16] = {1, 5, 2, 0, 3, 4, NAN, 1, 9, 8, 7, 6, -1, -2, -3, -4};
  tpu_view_t vx = t_make(TPU_DTYPE_F32, 3, xs, x);
  int64_t k[1] = {2}, st[1] = {2}, pad[1] = {0}, dil[1] = {1};
  tpu_arg_t args[6] = {a_t(vx), a_list(k, 1), a_list(st, 0), a_list(pad, 1), a_list(dil, 1), a_bool(false)};
  tpu_view_t out[2];
  CHECK_OK(run("max_pool2d_with_indices", args, 6, out));
  double w[4] = {5, NAN, 9, 7}, wi[4] = {1, 6, 8, 10};
  expect(&out[0], w, 0);
  expect(&out[1], wi, 0);
  /* backward scatters to the saved indices */
  double g[4] = {1, 2, 3, 4};
  int64_t gs[3] = {1, 2, 2};
  tpu_arg_t bargs[8] = {a_t(t_make(TPU_DTYPE_F32, 3, gs, g)), a_t(vx), a_list(k, 1), a_list(st, 1),
                        a_list(pad, 1), a_list(dil, 1), a_bool(false), a_t(out[1])};
  tpu_view_t gout[1];
  CHECK_OK(run("max_pool2d_with_indices_backward", bargs, 8, gout));
  double wg[16] = {0, 1, 0, 0, 0, 0, 2, 0, 3, 0, 4, 0, 0, 0, 0, 0};
  expect(&gout[0], wg, 0);
  /* out-of-range saved index: an IndexError at the next sync, not a crash */
  double badi[4] = {0, 1, 99, 2};
  bargs[7] = a_t(t_make(TPU_DTYPE_I64, 3, gs, badi));
  CHECK_OK(run("max_pool2d_with_indices_backward", bargs, 8, gout));
  expect_err(tpu_device_synchronize(0), TPU_INDEX_ERROR, "out of range");
  /* padding + ceil_mode + dilation on an int64 input */
  int64_t k3[2] = {3, 2}, s2[2] = {2, 2}, p1[2] = {1, 1}, d2[2] = {1, 2};
  double xi[16];
  for (int i = 0; i < 16; ++i) xi[i] = i;
  tpu_arg_t iargs[6] = {a_t(t_make(TPU_DTYPE_I64, 3, xs, xi)), a_list(k3, 2), a_list(s2, 2), a_list(p1, 2),
                        a_list(d2, 2), a_bool(true)};
  CHECK_OK(run("max_pool2d_with_indices", iargs, 6, out));
  /* ceil_mode adds a last row/column of windows that start inside the input */
  CHECK(out[0].sizes[1] == 3 && out[0].sizes[2] == 3);
  double wm[9] = {5, 7, 7, 13, 15, 15, 13, 15, 15};
  expect(&out[0], wm, 0);
  /* errors */
  int64_t k5[1] = {5};
  args[1] = a_list(k5, 1);
  expect_err(run("max_pool2d_with_indices", args, 6, out), TPU_INVALID_ARGUMENT, "Output size is too small");
  int64_t k3b[3] = {2, 2, 2};
  args[1] = a_list(k3b, 3);
  expect_err(run("max_pool2d_with_indices", args, 6, out), TPU_INVALID_ARGUMENT,
             "max_pool2d: kernel_size must either be a single int, or a tuple of two ints");
  args[1] = a_list(k, 1);
  int64_t p2[1] = {2};
  args[3] = a_list(p2, 1);
  expect_err(run("max_pool2d_with_indices", args, 6, out), TPU_INVALID_ARGUMENT,
             "pad should be at most half of effective kernel size, but got pad=2, kernel_size=2 and dilation=1");
  t_reset();
}

/* 3-d pools share the 2-d parser and kernels with a depth window; unbatched 4-d input. */
static void test_pool3d(void) {
  int64_t xs[4] = {1, 2, 3, 2}; /* C, D, H, W */
  double x[12];
  for (int i = 0; i < 12; ++i) x[i] = i;
  x[7] = NAN; /* d 1, h 0, w 1 */
  tpu_view_t vx = t_make(TPU_DTYPE_F32, 4, xs, x);
  int64_t k[3] = {2, 2, 2}, st[1] = {1}, pad[1] = {0}, dil[1] = {1};
  tpu_arg_t args[6] = {a_t(vx), a_list(k, 3), a_list(st, 1), a_list(pad, 1), a_list(dil, 1), a_bool(false)};
  tpu_view_t out[2];
  CHECK_OK(run("max_pool3d_with_indices", args, 6, out));
  CHECK(out[0].ndim == 4 && out[0].sizes[1] == 1 && out[0].sizes[2] == 2 && out[0].sizes[3] == 1);
  double w[2] = {NAN, 11}, wi[2] = {7, 11}; /* NaN wins; indices into D*H*W */
  expect(&out[0], w, 0);
  expect(&out[1], wi, 0);
  /* avg_pool3d, padding 1 without count_include_pad: a corner window sees 1 element */
  double y[12];
  for (int i = 0; i < 12; ++i) y[i] = i;
  tpu_view_t vy = t_make(TPU_DTYPE_F64, 4, xs, y);
  int64_t p1[1] = {1}, s2[1] = {2};
  tpu_arg_t aargs[7] = {a_t(vy), a_list(k, 3), a_list(s2, 1), a_list(p1, 1), a_bool(false), a_bool(false), a_none()};
  tpu_view_t ao[1];
  CHECK_OK(run("avg_pool3d", aargs, 7, ao));
  CHECK(ao[0].sizes[1] == 2 && ao[0].sizes[2] == 2 && ao[0].sizes[3] == 2);
  double wa[8] = {0, 1, 3, 4, 6, 7, 9, 10};
  expect(&ao[0], wa, 1e-12);
  /* avg_pool3d's own check: the input must not be smaller than the kernel */
  int64_t k3[1] = {3};
  aargs[1] = a_list(k3, 1); aargs[3] = a_list(p1, 1);
  expect_err(run("avg_pool3d", aargs, 7, ao), TPU_INVALID_ARGUMENT,
             "input image (T: 2 H: 3 W: 2) smaller than kernel size (kT: 3 kH: 3 kW: 3)");
  int64_t k2[2] = {2, 2};
  args[1] = a_list(k2, 2);
  expect_err(run("max_pool3d_with_indices", args, 6, out), TPU_INVALID_ARGUMENT,
             "max_pool3d: kernel_size must either be a single int, or a tuple of three ints");
  /* bf16 max backward rounds after every add, as CPU's loop in bf16 does: 256 + 1 + 1
   * stays 256 (1 is below half an ulp of 256), where one f32 sum would round to 258 */
  int64_t bs[4] = {1, 1, 1, 3}, gs[4] = {1, 1, 1, 3};
  double bx[3] = {5, 0, 0}, bg[3] = {256, 1, 1}, bi[3] = {0, 0, 0};
  int64_t kk[3] = {1, 1, 1};
  tpu_arg_t bargs[8] = {a_t(t_make(TPU_DTYPE_BF16, 4, gs, bg)), a_t(t_make(TPU_DTYPE_BF16, 4, bs, bx)),
                        a_list(kk, 3), a_list(st, 1), a_list(pad, 1), a_list(dil, 1), a_bool(false),
                        a_t(t_make(TPU_DTYPE_I64, 4, gs, bi))};
  tpu_view_t go[1];
  CHECK_OK(run("max_pool3d_with_indices_backward", bargs, 8, go));
  double wg[3] = {256, 0, 0};
  expect(&go[0], wg, 0);
  t_reset();
}

static void test_avg_pool(void) {
  int64_t xs[4] = {1, 1, 3, 3};
  double x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  tpu_view_t vx = t_make(TPU_DTYPE_F64, 4, xs, x);
  int64_t k[1] = {2}, st[1] = {2}, pad[1] = {1};
  tpu_arg_t args[7] = {a_t(vx), a_list(k, 1), a_list(st, 1), a_list(pad, 1), a_bool(false), a_bool(true), a_none()};
  tpu_view_t out[1];
  CHECK_OK(run("avg_pool2d", args, 7, out));
  double w[4] = {1 / 4.0, 5 / 4.0, 11 / 4.0, 28 / 4.0};
  expect(&out[0], w, 1e-12);
  args[5] = a_bool(false);
  CHECK_OK(run("avg_pool2d", args, 7, out));
  double w2[4] = {1, 2.5, 5.5, 7};
  expect(&out[0], w2, 1e-12);
  args[6] = a_int(3);
  CHECK_OK(run("avg_pool2d", args, 7, out));
  double w3[4] = {1 / 3.0, 5 / 3.0, 11 / 3.0, 28 / 3.0};
  expect(&out[0], w3, 1e-12);
  /* backward with divisor_override 3: each input gets the grad of its one window / 3 */
  double g[4] = {3, 6, 9, 12};
  int64_t gs[4] = {1, 1, 2, 2};
  tpu_arg_t bargs[8] = {a_t(t_make(TPU_DTYPE_F64, 4, gs, g)), a_t(vx), a_list(k, 1), a_list(st, 1),
                        a_list(pad, 1), a_bool(false), a_bool(false), a_int(3)};
  CHECK_OK(run("avg_pool2d_backward", bargs, 8, out));
  double wg[9] = {1, 2, 2, 3, 4, 4, 3, 4, 4};
  expect(&out[0], wg, 1e-12);
  args[6] = a_int(0);
  expect_err(run("avg_pool2d", args, 7, out), TPU_INVALID_ARGUMENT, "divisor must be not zero");
  args[6] = a_none();
  args[0] = a_t(t_make(TPU_DTYPE_I32, 4, xs, x));
  expect_err(run("avg_pool2d", args, 7, out), TPU_UNIMPLEMENTED, "\"avg_pool2d\" not implemented for 'Int'");
  t_reset();
}

static void test_adaptive(void) {
  int64_t xs[3] = {1, 3, 5};
  double x[15];
  for (int i = 0; i < 15; ++i) x[i] = i;
  tpu_view_t vx = t_make(TPU_DTYPE_F32, 3, xs, x);
  int64_t os[2] = {2, 3};
  tpu_arg_t args[2] = {a_t(vx), a_list(os, 2)};
  tpu_view_t out[2];
  CHECK_OK(run("_adaptive_avg_pool2d", args, 2, out));
  /* rows {0,1},{1,2}; cols {0,1},{1,2,3},{3,4} */
  double w[6] = {3, 4.5, 6, 8, 9.5, 11};
  expect(&out[0], w, 1e-5);
  CHECK_OK(run("adaptive_max_pool2d", args, 2, out));
  double wm[6] = {6, 8, 9, 11, 13, 14}, wi[6] = {6, 8, 9, 11, 13, 14};
  expect(&out[0], wm, 0);
  expect(&out[1], wi, 0);
  double g[6] = {1, 1, 1, 1, 1, 1};
  int64_t gs[3] = {1, 2, 3};
  tpu_view_t vg = t_make(TPU_DTYPE_F32, 3, gs, g);
  tpu_arg_t bargs[3] = {a_t(vg), a_t(vx), a_t(out[1])};
  tpu_view_t gout[1];
  CHECK_OK(run("adaptive_max_pool2d_backward", bargs, 3, gout));
  double wgm[15] = {0, 0, 0, 0, 0, 0, 1, 0, 1, 1, 0, 1, 0, 1, 1};
  expect(&gout[0], wgm, 0);
  CHECK_OK(run("_adaptive_avg_pool2d_backward", bargs, 2, gout));
  /* input (r, c) receives sum over windows containing it of 1/area */
  double ra[2][3] = {{4, 6, 4}, {4, 6, 4}};
  double wga[15] = {0};
  int r0[2] = {0, 1}, r1[2] = {2, 3}, c0[3] = {0, 1, 3}, c1[3] = {2, 4, 5};
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int r = r0[i]; r < r1[i]; ++r)
        for (int c = c0[j]; c < c1[j]; ++c) wga[r * 5 + c] += 1.0 / ra[i][j];
  expect(&gout[0], wga, 1e-6);
  int64_t bad[1] = {2};
  args[1] = a_list(bad, 1);
  expect_err(run("_adaptive_avg_pool2d", args, 2, out), TPU_INVALID_ARGUMENT,
             "adaptive_avg_pool2d: output_size must be 2");
  t_reset();
}

int main(void) {
  test_mm_dtypes();
  test_mm_strided();
  test_addmm_family();
  test_mv_dot();
  test_gemm_errors();
  test_gemm_empty();
  test_bf16_gemm();
  test_f32_gemm();
  test_conv2d();
  test_conv_transposed_and_1d();
  test_max_pool();
  test_pool3d();
  test_avg_pool();
  test_adaptive();
  TEST_MAIN_END();
}
