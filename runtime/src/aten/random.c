/* ATen ops of the random family: distributions that fill a tensor, randperm,
 * multinomial and dropout.
 *
 * Every sampling op carries the 64-bit seed that the adapter drew from the tpu Generator
 * for this call in ia[0] (0 when the Generator argument is None, which only C tests do).
 * The kernels key Philox with it and count by logical element index, so a result depends
 * only on (seed, shape), never on strides, tiling or threads.
 *
 * Validation follows ATen's CPU kernels: argument checks that CPU makes before sampling
 * happen here; checks CPU makes on tensor data (p of bernoulli_.Tensor, std tensors of
 * normal, multinomial's probabilities) happen in the kernel and surface at the next
 * sync. */
#include <math.h>

#include "aten/aten.h"

/* c10::toString(ScalarType): used in NotImplementedError dispatch messages. */
/* Mantissa digits (std::numeric_limits<T>::digits) of the floating dtypes. */
static int float_digits(tpu_dtype_t t) {
  return t == TPU_DTYPE_F64 ? 53 : t == TPU_DTYPE_F32 ? 24 : t == TPU_DTYPE_F16 ? 11 : 8;
}

static double float_max(tpu_dtype_t t) {
  return t == TPU_DTYPE_F64 ? 1.7976931348623157e308
         : t == TPU_DTYPE_F32 ? 3.4028234663852886e38
         : t == TPU_DTYPE_F16 ? 65504.0 : 3.3895313892515355e38;
}

static void int_bounds(tpu_dtype_t t, int64_t* lo, int64_t* hi) {
  switch (t) {
    case TPU_DTYPE_U8: *lo = 0; *hi = 255; break;
    case TPU_DTYPE_I8: *lo = -128; *hi = 127; break;
    case TPU_DTYPE_I16: *lo = INT16_MIN; *hi = INT16_MAX; break;
    case TPU_DTYPE_I32: *lo = INT32_MIN; *hi = INT32_MAX; break;
    case TPU_DTYPE_BOOL: *lo = 0; *hi = 1; break;
    default: *lo = INT64_MIN; *hi = INT64_MAX; break;
  }
}

static tpu_status_t not_implemented(tpu_build_t* b, const char* kernel, tpu_dtype_t t) {
  return tpu__err(b, TPU_UNIMPLEMENTED, "\"%s\" not implemented for '%s'", kernel, tpu__dtype_c10_name(t));
}

/* The Generator argument: a seed, or None (C tests only). */
static tpu_status_t read_seed(tpu_build_t* b, int i) {
  b->node->runtime_ia |= 1u; /* the seed is a run-time input, not part of a plan's key */
  return tpu__arg_int_opt(b, i, 0, &b->node->ia[0]);
}

/* For out= forms the output keeps the out tensor's dtype (CPU resizes out and samples
 * into it); the out tensor is the last argument. */
static tpu_dtype_t out_dtype_or(tpu_build_t* b, tpu_dtype_t dflt) {
  if (b->variant != TPU_VARIANT_OUT) return dflt;
  const tpu_arg_t* a = tpu__arg(b, b->nargs - 1);
  return a && a->kind == TPU_ARG_TENSOR ? a->tensor.dtype : dflt;
}

/* Declares output 0 with self's shape and dtype (the in-place distribution ops). */
static tpu_status_t self_output(tpu_build_t* b, const tpu_view_t** out_self) {
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, out_self));
  const tpu_view_t* s = *out_self;
  if (tpu__node_add_output(b->node, s->dtype, s->ndim, s->sizes) < 0)
    return tpu__err(b, TPU_INTERNAL, "too many outputs");
  b->node->compute = tpu__compute_dtype(s->dtype);
  return NULL;
}

/* ---- uniform_(self, from, to, *, generator) ----------------------------------------- */

/* float -> bfloat16 -> float, round to nearest even (finite inputs: bounds are checked). */
static tpu_status_t build_uniform(tpu_build_t* b) {
  const tpu_view_t* self;
  TPU_RETURN_IF_ERROR(self_output(b, &self));
  double from = 0, to = 1;
  TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, 1, 0.0, &from));
  TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, 2, 1.0, &to));
  TPU_RETURN_IF_ERROR(read_seed(b, 3));
  tpu_dtype_t t = self->dtype;
  if (!tpu_dtype_is_floating(t)) return not_implemented(b, "check_uniform_bounds", t);
  double mx = float_max(t);
  if (!(from >= -mx && from <= mx))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "from is out of bounds for %s", tpu__dtype_cpp_name(t));
  if (!(to >= -mx && to <= mx))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "to is out of bounds for %s", tpu__dtype_cpp_name(t));
  if (from > to)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "uniform_ expects to return a [from, to) range, but found from=%g > to=%g", from, to);
  if (to - from > mx)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "uniform_ expects to-from <= std::numeric_limits<%s>::max(), but found to=%g "
                    "and from=%g which result in to-from to exceed the limit",
                    tpu__dtype_c10_name(t), to, from);
  /* CPU casts the bounds to the tensor's dtype before sampling. */
  b->node->kind = TPU_KIND_RAND_UNIFORM;
  b->node->da[0] = tpu__round_to_dtype(from, t);
  b->node->da[1] = tpu__round_to_dtype(to, t);
  b->node->ia[1] = float_digits(t);
  return NULL;
}

/* ---- normal ------------------------------------------------------------------------- */

typedef enum { NORMAL_INPLACE, NORMAL_TF, NORMAL_FT, NORMAL_TT } normal_form_t;

/* normal_(self, mean, std), normal.Tensor_float(mean, std), normal.float_Tensor(mean,
 * std), normal.Tensor_Tensor(mean, std) and their out= forms. Inputs: 0 = mean, 1 = std
 * (scalar or tensor), broadcast to the output by the kernel. */
static tpu_status_t build_normal(tpu_build_t* b) {
  normal_form_t form = (normal_form_t)(intptr_t)b->data;
  tpu_node_t* n = b->node;
  int64_t shape[TPU_MAX_DIMS];
  int nd = 0;
  tpu_dtype_t dt;
  int seed_arg = form == NORMAL_INPLACE ? 3 : 2;
  if (form == NORMAL_INPLACE) {
    const tpu_view_t* self;
    TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
    double mean, std;
    TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, 1, 0.0, &mean));
    TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, 2, 1.0, &std));
    if (!(std >= 0.0))
      return tpu__err(b, TPU_INVALID_ARGUMENT, "normal expects std >= 0.0, but found std %g", std);
    dt = self->dtype;
    nd = self->ndim;
    memcpy(shape, self->sizes, sizeof(int64_t) * (size_t)nd);
    TPU_RETURN_IF_ERROR(tpu__node_add_scalar(n, mean, (int64_t)mean, TPU_DTYPE_F64));
    TPU_RETURN_IF_ERROR(tpu__node_add_scalar(n, std, (int64_t)std, TPU_DTYPE_F64));
  } else {
    const tpu_view_t *mean = NULL, *std = NULL;
    double dmean = 0, dstd = 1;
    if (form == NORMAL_FT) TPU_RETURN_IF_ERROR(tpu__arg_double(b, 0, &dmean));
    else TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &mean));
    if (form == NORMAL_TF) TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, 1, 1.0, &dstd));
    else TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &std));
    if (!std && !(dstd >= 0.0))
      return tpu__err(b, TPU_INVALID_ARGUMENT, "normal expects std >= 0.0, but found std %g", dstd);
    if (mean && std) {
      TPU_RETURN_IF_ERROR(tpu__broadcast(b, mean->sizes, mean->ndim, std->sizes, std->ndim, shape, &nd));
    } else {
      const tpu_view_t* t = mean ? mean : std;
      nd = t->ndim;
      memcpy(shape, t->sizes, sizeof(int64_t) * (size_t)nd);
    }
    dt = out_dtype_or(b, mean ? mean->dtype : std->dtype);
    if (mean) TPU_RETURN_IF_ERROR(tpu__node_add_input(n, mean));
    else TPU_RETURN_IF_ERROR(tpu__node_add_scalar(n, dmean, (int64_t)dmean, TPU_DTYPE_F64));
    if (std) TPU_RETURN_IF_ERROR(tpu__node_add_input(n, std));
    else TPU_RETURN_IF_ERROR(tpu__node_add_scalar(n, dstd, (int64_t)dstd, TPU_DTYPE_F64));
    n->ia[1] = std != NULL; /* the kernel checks std >= 0 on the data */
  }
  if (!tpu_dtype_is_floating(dt)) return not_implemented(b, "normal_kernel_cpu", dt);
  TPU_RETURN_IF_ERROR(read_seed(b, seed_arg));
  n->kind = TPU_KIND_RAND_NORMAL;
  n->compute = tpu__compute_dtype(dt);
  tpu__node_add_output(n, dt, nd, shape);
  return NULL;
}

/* ---- bernoulli ---------------------------------------------------------------------- */

/* bernoulli_.float(self, p=0.5): p checked here. */
static tpu_status_t build_bernoulli_float(tpu_build_t* b) {
  const tpu_view_t* self;
  TPU_RETURN_IF_ERROR(self_output(b, &self));
  double p;
  TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, 1, 0.5, &p));
  TPU_RETURN_IF_ERROR(read_seed(b, 2));
  if (!(p >= 0 && p <= 1))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "bernoulli_ expects p to be in [0, 1], but got p=%g", p);
  b->node->kind = TPU_KIND_RAND_BERNOULLI;
  return tpu__node_add_scalar(b->node, p, 0, TPU_DTYPE_F64);
}

/* bernoulli_.Tensor(self, p): p expands to self's shape; its values are checked by the
 * kernel (CPU asserts inside its kernel too). */
static tpu_status_t build_bernoulli_tensor(tpu_build_t* b) {
  const tpu_view_t *self, *p;
  TPU_RETURN_IF_ERROR(self_output(b, &self));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &p));
  TPU_RETURN_IF_ERROR(read_seed(b, 2));
  if (!tpu_dtype_is_floating(p->dtype)) return not_implemented(b, "bernoulli_tensor_cpu_p_", p->dtype);
  bool ok = p->ndim <= self->ndim;
  for (int i = 0; ok && i < p->ndim; ++i) {
    int64_t ps = p->sizes[p->ndim - 1 - i], ss = self->sizes[self->ndim - 1 - i];
    ok = ps == ss || ps == 1;
  }
  if (!ok) {
    /* at::expand_inplace's message, naming the first mismatching dim of p */
    int bad = 0;
    for (int i = 0; i < p->ndim && i < self->ndim; ++i) {
      int64_t ps = p->sizes[p->ndim - 1 - i], ss = self->sizes[self->ndim - 1 - i];
      if (ps != ss && ps != 1) { bad = i; break; }
    }
    if (p->ndim > self->ndim)
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "expand: the number of sizes provided (%d) must be greater or equal to the "
                      "number of dimensions in the tensor (%d)", self->ndim, p->ndim);
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "The expanded size of the tensor (%lld) must match the existing size (%lld) "
                    "at non-singleton dimension %d",
                    (long long)self->sizes[self->ndim - 1 - bad],
                    (long long)p->sizes[p->ndim - 1 - bad], self->ndim - 1 - bad);
  }
  b->node->kind = TPU_KIND_RAND_BERNOULLI;
  b->node->ia[1] = 1;
  return tpu__node_add_input(b->node, p);
}

/* bernoulli(self) and bernoulli.out(self, out): p is self. */
static tpu_status_t build_bernoulli_self(tpu_build_t* b) {
  const tpu_view_t* self;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  TPU_RETURN_IF_ERROR(read_seed(b, 1));
  if (!tpu_dtype_is_floating(self->dtype))
    return not_implemented(b, "bernoulli_tensor_cpu_p_", self->dtype);
  tpu_dtype_t dt = out_dtype_or(b, self->dtype);
  tpu_node_t* n = b->node;
  n->kind = TPU_KIND_RAND_BERNOULLI;
  n->ia[1] = 1;
  n->compute = tpu__compute_dtype(dt);
  tpu__node_add_output(n, dt, self->ndim, self->sizes);
  return tpu__node_add_input(n, self);
}

/* ---- random_ ------------------------------------------------------------------------ */

enum { RANDINT_DEFAULT = 0, RANDINT_RANGE = 1, RANDINT_FULL64 = 2 };

static tpu_status_t check_from_to_in_range(tpu_build_t* b, int64_t from, int64_t to_inc, tpu_dtype_t t) {
  if (tpu_dtype_is_floating(t)) {
    double mx = float_max(t);
    if ((double)from < -mx || (double)from > mx)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "from is out of bounds for %s", tpu__dtype_cpp_name(t));
    if ((double)to_inc < -mx || (double)to_inc > mx)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "to - 1 is out of bounds for %s", tpu__dtype_cpp_name(t));
    /* CPU also warns (UserWarning) when a bound exceeds +-2^digits; a C builder has no
     * channel for warnings, so that one is not reproduced. */
  } else {
    int64_t lo, hi;
    int_bounds(t, &lo, &hi);
    if (from < lo || from > hi)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "from is out of bounds for %s", tpu__dtype_cpp_name(t));
    if (to_inc < lo || to_inc > hi)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "to - 1 is out of bounds for %s", tpu__dtype_cpp_name(t));
  }
  return NULL;
}

/* random_(self), random_.to(self, to), random_.from(self, from, to?). data: 0, 1, 2. */
static tpu_status_t build_random(tpu_build_t* b) {
  int form = (int)(intptr_t)b->data;
  const tpu_view_t* self;
  TPU_RETURN_IF_ERROR(self_output(b, &self));
  tpu_dtype_t t = self->dtype;
  tpu_node_t* n = b->node;
  n->kind = TPU_KIND_RAND_INT;
  if (form == 0) {
    TPU_RETURN_IF_ERROR(read_seed(b, 1));
    n->ia[1] = RANDINT_DEFAULT;
    return NULL;
  }
  int64_t from = 0, to = 0;
  bool has_to = true;
  if (form == 1) {
    TPU_RETURN_IF_ERROR(tpu__arg_int(b, 1, &to));
    TPU_RETURN_IF_ERROR(read_seed(b, 2));
  } else {
    TPU_RETURN_IF_ERROR(tpu__arg_int(b, 1, &from));
    has_to = !tpu__arg_is_none(b, 2);
    if (has_to) TPU_RETURN_IF_ERROR(tpu__arg_int(b, 2, &to));
    TPU_RETURN_IF_ERROR(read_seed(b, 3));
  }
  if (has_to) {
    if (from >= to)
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "random_ expects 'from' to be less than 'to', but got from=%lld >= to=%lld",
                      (long long)from, (long long)to);
    TPU_RETURN_IF_ERROR(check_from_to_in_range(b, from, to - 1, t));
    n->ia[1] = RANDINT_RANGE;
    n->ia[2] = (int64_t)((uint64_t)to - (uint64_t)from);
    n->ia[3] = from;
    return NULL;
  }
  if (from == INT64_MIN) {
    if (t == TPU_DTYPE_I64 || t == TPU_DTYPE_F64 || t == TPU_DTYPE_F32 || t == TPU_DTYPE_BF16) {
      n->ia[1] = RANDINT_FULL64;
      return NULL;
    }
    if (t == TPU_DTYPE_F16 || t == TPU_DTYPE_BOOL)
      return not_implemented(b, "random_full_64_bits_range_kernel_cpu", t);
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "random_full_64_bits_range_kernel_cpu handles only int64, double, float and bfloat16");
  }
  /* [from, largest value of the dtype] */
  int64_t to_inc;
  if (tpu_dtype_is_floating(t)) {
    int d = float_digits(t);
    to_inc = d >= 63 ? INT64_MAX : (int64_t)1 << d;
    if (from >= to_inc)
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "random_ expects 'from' casted to dtype to be less than or equal to 'to_inc' "
                      "casted to dtype, but got from=%lld > to_inc=%lld",
                      (long long)from, (long long)to_inc);
  } else {
    int64_t lo;
    int_bounds(t, &lo, &to_inc);
  }
  TPU_RETURN_IF_ERROR(check_from_to_in_range(b, from, to_inc, t));
  n->ia[1] = RANDINT_RANGE;
  n->ia[2] = (int64_t)((uint64_t)to_inc - (uint64_t)from + 1u);
  n->ia[3] = from;
  return NULL;
}

/* ---- exponential_, log_normal_, geometric_, cauchy_ ---------------------------------- */

static tpu_status_t build_exponential(tpu_build_t* b) {
  const tpu_view_t* self;
  TPU_RETURN_IF_ERROR(self_output(b, &self));
  double lambd;
  TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, 1, 1.0, &lambd));
  TPU_RETURN_IF_ERROR(read_seed(b, 2));
  if (!(lambd > 0.0))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "exponential_ expects lambda > 0.0, but found lambda=%g", lambd);
  if (!tpu_dtype_is_floating(self->dtype))
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "Exponential distribution is a continuous probability distribution. dtype must "
                    "be a floating point but you specified %s", tpu__dtype_c10_name(self->dtype));
  b->node->kind = TPU_KIND_RAND_EXPONENTIAL;
  b->node->da[0] = lambd;
  return NULL;
}

static tpu_status_t build_log_normal(tpu_build_t* b) {
  const tpu_view_t* self;
  TPU_RETURN_IF_ERROR(self_output(b, &self));
  double mean, std;
  TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, 1, 1.0, &mean));
  TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, 2, 2.0, &std));
  TPU_RETURN_IF_ERROR(read_seed(b, 3));
  if (!(std > 0.0))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "log_normal_ expects std > 0.0, but found std=%g", std);
  if (!tpu_dtype_is_floating(self->dtype)) return not_implemented(b, "log_normal_cpu", self->dtype);
  b->node->kind = TPU_KIND_RAND_LOG_NORMAL;
  b->node->da[0] = mean;
  b->node->da[1] = std;
  return NULL;
}

static tpu_status_t build_geometric(tpu_build_t* b) {
  const tpu_view_t* self;
  TPU_RETURN_IF_ERROR(self_output(b, &self));
  double p;
  TPU_RETURN_IF_ERROR(tpu__arg_double(b, 1, &p));
  TPU_RETURN_IF_ERROR(read_seed(b, 2));
  if (!(p > 0 && p < 1))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "geometric_ expects p to be in (0, 1), but got p=%g", p);
  if (self->dtype == TPU_DTYPE_BOOL) return not_implemented(b, "geometric_cpu", self->dtype);
  b->node->kind = TPU_KIND_RAND_GEOMETRIC;
  b->node->da[0] = p;
  return NULL;
}

static tpu_status_t build_cauchy(tpu_build_t* b) {
  const tpu_view_t* self;
  TPU_RETURN_IF_ERROR(self_output(b, &self));
  double median, sigma;
  TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, 1, 0.0, &median));
  TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, 2, 1.0, &sigma));
  TPU_RETURN_IF_ERROR(read_seed(b, 3));
  if (!(sigma > 0.0))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "cauchy_ expects sigma > 0.0, but found sigma=%g", sigma);
  if (!tpu_dtype_is_floating(self->dtype))
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "Cauchy distribution is a continuous probability distribution. dtype must be "
                    "a floating point but you specified %s", tpu__dtype_cpp_name(self->dtype));
  b->node->kind = TPU_KIND_RAND_CAUCHY;
  b->node->da[0] = median;
  b->node->da[1] = sigma;
  return NULL;
}

/* ---- randperm.generator_out(n, *, generator, out) ----------------------------------- */

static tpu_status_t build_randperm(tpu_build_t* b) {
  int64_t n;
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 0, &n));
  TPU_RETURN_IF_ERROR(read_seed(b, 1));
  const tpu_view_t* out;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 2, &out));
  if (n < 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "n must be non-negative, got%lld", (long long)n);
  tpu_dtype_t t = out->dtype;
  if (tpu_dtype_is_floating(t) && t != TPU_DTYPE_F64) {
    /* every value up to n-1 must be exactly representable */
    int64_t mx = ((int64_t)1 << float_digits(t)) + 1;
    if (n > mx)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "n cannot be greater than %lld for %s type.",
                      (long long)mx, tpu__dtype_c10_name(t));
  } else if (tpu_dtype_is_integral(t, false)) {
    int64_t lo, hi;
    int_bounds(t, &lo, &hi);
    static const char* ctype[] = {[TPU_DTYPE_U8] = "uint8_t", [TPU_DTYPE_I8] = "int8_t",
                                  [TPU_DTYPE_I16] = "int16_t", [TPU_DTYPE_I32] = "int"};
    if (n - 1 > hi)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "value cannot be converted to type %s without overflow",
                      ctype[t]);
  }
  if (t == TPU_DTYPE_BOOL) return not_implemented(b, "randperm", t);
  b->node->kind = TPU_KIND_RAND_PERM;
  b->node->ia[1] = n;
  b->node->compute = TPU_DTYPE_I64;
  tpu__node_add_output(b->node, t, 1, &n);
  return NULL;
}

/* ---- multinomial(self, num_samples, replacement=False, *, generator) ----------------- */

static tpu_status_t build_multinomial(tpu_build_t* b) {
  const tpu_view_t* self;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  int64_t n_sample;
  bool repl;
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 1, &n_sample));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 2, false, &repl));
  TPU_RETURN_IF_ERROR(read_seed(b, 3));
  if (self->ndim < 1 || self->ndim > 2)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "prob_dist must be 1 or 2 dim");
  if (!tpu_dtype_is_floating(self->dtype))
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "multinomial only supports floating-point dtypes for input, got: %s",
                    tpu__dtype_c10_name(self->dtype));
  tpu_dtype_t ot = out_dtype_or(b, TPU_DTYPE_I64);
  if (ot != TPU_DTYPE_I64)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "multinomial expects Long tensor out, got: %s", tpu__dtype_c10_name(ot));
  if (n_sample <= 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "cannot sample n_sample <= 0 samples");
  int64_t n_cat = self->sizes[self->ndim - 1];
  if (!repl && n_sample > n_cat)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "cannot sample n_sample > prob_dist.size(-1) samples without replacement");
  if (n_cat > ((int64_t)1 << 24))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "number of categories cannot exceed 2^24");
  tpu_node_t* n = b->node;
  n->kind = TPU_KIND_RAND_MULTINOMIAL;
  n->ia[1] = n_sample;
  n->ia[2] = repl;
  n->compute = tpu__compute_dtype(self->dtype);
  int64_t shape[2] = {self->ndim == 2 ? self->sizes[0] : n_sample, n_sample};
  tpu__node_add_output(n, TPU_DTYPE_I64, self->ndim, shape);
  return tpu__node_add_input(n, self);
}

/* ---- native_dropout(input, p, train?) -> (output, mask) ------------------------------ */

static tpu_status_t build_dropout(tpu_build_t* b) {
  const tpu_view_t* in;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &in));
  double p;
  bool train;
  TPU_RETURN_IF_ERROR(tpu__arg_double(b, 1, &p));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 2, true, &train));
  tpu_node_t* n = b->node;
  /* native_dropout's schema has no Generator: the entry is flagged TPU_ATEN_NEEDS_SEED,
   * so the adapter appends a seed drawn from the tpu generator as argument 3. */
  n->runtime_ia |= 1u;
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 3, &n->ia[0]));
  int64_t numel = 1;
  for (int i = 0; i < in->ndim; ++i) numel *= in->sizes[i];
  if (train && numel > 0) {
    double p1m = 1. - p;
    if (!(p1m >= 0 && p1m <= 1))
      return tpu__err(b, TPU_INVALID_ARGUMENT, "bernoulli_ expects p to be in [0, 1], but got p=%g", p1m);
    /* CPU computes input * mask, then mul_(scale) in place: a float scalar into an
     * integer tensor fails the in-place cast check. */
    if (!tpu_dtype_is_floating(in->dtype))
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "result type Float can't be cast to the desired output type %s", tpu__dtype_c10_name(in->dtype));
    n->da[0] = p1m;
    n->da[1] = p1m == 0 ? 0. : 1. / p1m;
  }
  n->kind = TPU_KIND_DROPOUT;
  n->ia[1] = train;
  n->compute = tpu__compute_dtype(in->dtype);
  tpu__node_add_output(n, in->dtype, in->ndim, in->sizes);
  /* CPU returns an empty mask of the input's dtype for an empty input */
  tpu__node_add_output(n, numel > 0 ? TPU_DTYPE_BOOL : in->dtype, in->ndim, in->sizes);
  return tpu__node_add_input(n, in);
}

/* native_dropout_backward(grad_output, mask, scale) = grad_output * mask * scale. */
static tpu_status_t build_dropout_backward(tpu_build_t* b) {
  const tpu_view_t *g, *m;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &g));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &m));
  double scale;
  TPU_RETURN_IF_ERROR(tpu__arg_double(b, 2, &scale));
  int64_t shape[TPU_MAX_DIMS];
  int nd;
  TPU_RETURN_IF_ERROR(tpu__broadcast(b, g->sizes, g->ndim, m->sizes, m->ndim, shape, &nd));
  int idx[3] = {0, 1, 2};
  tpu_dtype_t rt = tpu__result_type(b, idx, 3); /* the double scale makes integers float */
  tpu_node_t* n = b->node;
  n->kind = TPU_KIND_DROPOUT_BACKWARD;
  n->compute = tpu__compute_dtype(rt);
  n->da[0] = scale;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, g));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, m));
  tpu__node_add_output(n, rt, nd, shape);
  return NULL;
}

#define FORM(x) ((const void*)(intptr_t)(x))

const tpu_aten_entry_t tpu__aten_random[] = {
    {"uniform_", build_uniform, NULL},
    {"normal_", build_normal, FORM(NORMAL_INPLACE)},
    {"normal.Tensor_float", build_normal, FORM(NORMAL_TF)},
    {"normal.Tensor_float_out", build_normal, FORM(NORMAL_TF)},
    {"normal.float_Tensor", build_normal, FORM(NORMAL_FT)},
    {"normal.float_Tensor_out", build_normal, FORM(NORMAL_FT)},
    {"normal.Tensor_Tensor", build_normal, FORM(NORMAL_TT)},
    {"normal.Tensor_Tensor_out", build_normal, FORM(NORMAL_TT)},
    {"bernoulli_.float", build_bernoulli_float, NULL},
    {"bernoulli_.Tensor", build_bernoulli_tensor, NULL},
    {"bernoulli", build_bernoulli_self, NULL},
    {"bernoulli.out", build_bernoulli_self, NULL},
    {"random_", build_random, FORM(0)},
    {"random_.to", build_random, FORM(1)},
    {"random_.from", build_random, FORM(2)},
    {"exponential_", build_exponential, NULL},
    {"log_normal_", build_log_normal, NULL},
    {"geometric_", build_geometric, NULL},
    {"cauchy_", build_cauchy, NULL},
    {"randperm.generator_out", build_randperm, NULL},
    {"multinomial", build_multinomial, NULL},
    {"multinomial.out", build_multinomial, NULL},
    {"native_dropout", build_dropout, NULL, TPU_ATEN_NEEDS_SEED},
    {"native_dropout_backward", build_dropout_backward, NULL},
    {"native_dropout_backward.out", build_dropout_backward, NULL},
    {NULL, NULL, NULL},
};
