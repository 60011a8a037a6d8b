/* ATen ops of the index and shape family: gather/scatter, index_select/add/copy,
 * advanced indexing, masked ops, nonzero, cat, flip, roll, repeat, padding, tril/triu,
 * sort/topk, arange, eye, linspace/logspace, searchsorted/bucketize, isin,
 * repeat_interleave.
 *
 * Host-read cut points: nonzero, masked_select, repeat_interleave without output_size,
 * and index / _index_put_impl_ with a boolean mask have an output (or an
 * indexing-result) shape that depends on the data. Their builders wait for the device
 * queue and read the tensor through tpu_copy_to_host to count the set elements (sum
 * the repeats), exactly as PyTorch CPU/CUDA do
 * (CUDA synchronizes there too). The kernel recounts and fails if the count changed,
 * which only a racing writer on another thread can cause.
 *
 * Index values are only visible at run time: out-of-range indices are reported by the
 * kernels (asynchronously, at the next sync) with the exception class PyTorch CPU uses
 * for that op. The node attribute layout of every kind is documented in
 * host/index.c. */
#include <math.h>
#include <stdio.h>

#include "aten/aten.h"

enum { RED_NONE = 0, RED_SUM, RED_PROD, RED_MEAN, RED_AMAX, RED_AMIN };

/* c10 spellings, for messages that quote them. */
static bool is_index_dtype(tpu_dtype_t t) { return t == TPU_DTYPE_I64 || t == TPU_DTYPE_I32; }

/* 0-dim tensors act as 1-element 1-dim ones in gather/scatter/index_* (ensure_nonempty). */
static int ne_dim(const tpu_view_t* v) { return v->ndim > 0 ? v->ndim : 1; }
static int64_t ne_size(const tpu_view_t* v, int d) { return v->ndim > 0 ? v->sizes[d] : 1; }

/* Reads a bool/uint8 tensor (host-read cut point) and counts its set elements. */
static tpu_status_t count_true(tpu_build_t* b, const tpu_view_t* m, int64_t* out_count) {
  int64_t n = tpu_view_numel(m);
  *out_count = 0;
  if (n == 0) return NULL;
  uint8_t* buf = tpu__malloc((size_t)n);
  if (!buf) return tpu_status_make(TPU_OUT_OF_MEMORY, "host out of memory");
  tpu_status_t st = tpu_copy_to_host(m, buf);
  if (st) { tpu__free(buf); return tpu_status_annotate(st, "%s: reading the mask", b->name); }
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) c += buf[i] != 0;
  tpu__free(buf);
  *out_count = c;
  return NULL;
}

/* ---- gather / scatter ------------------------------------------------------------ */

/* scatter_gather_shape_check: index.size(d) <= self.size(d) for d != dim, and
 * <= src.size(d) for every d. Skipped for empty index, as on CPU. */
static tpu_status_t sg_shape_check(tpu_build_t* b, const tpu_view_t* self, int dim,
                                   const tpu_view_t* index, const tpu_view_t* src, bool gather) {
  if (ne_dim(index) != ne_dim(self))
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    gather ? "Index tensor must have the same number of dimensions as input tensor"
                           : "Index tensor must have the same number of dimensions as self tensor");
  if (src && ne_dim(src) != ne_dim(self))
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "Index tensor must have the same number of dimensions as src tensor");
  if (tpu_view_numel(index) == 0) return NULL;
  for (int d = 0; d < ne_dim(self); ++d) {
    bool bad = (d != dim && ne_size(index, d) > ne_size(self, d)) ||
               (src && ne_size(index, d) > ne_size(src, d));
    if (bad) {
      char a[256], s[256], c[256];
      tpu__fmt_shape(a, sizeof a, index->ndim, index->sizes);
      tpu__fmt_shape(s, sizeof s, self->ndim, self->sizes);
      if (gather)
        return tpu__err(b, TPU_INVALID_ARGUMENT, "Size does not match at dimension %d expected "
                        "index %s to be no larger than self %s apart from dimension %d", d, a, s, dim);
      if (src) {
        tpu__fmt_shape(c, sizeof c, src->ndim, src->sizes);
        return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected index %s to be no larger than self %s "
                        "apart from dimension %d and to be no larger size than src %s", a, s, dim, c);
      }
      return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected index %s to be no larger than self %s "
                      "apart from dimension %d", a, s, dim);
    }
  }
  return NULL;
}

/* gather(self, dim, index, *, sparse_grad) */
static tpu_status_t build_gather(tpu_build_t* b) {
  const tpu_view_t *self, *index;
  int64_t dim64;
  int dim;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 1, &dim64));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 2, &index));
  TPU_RETURN_IF_ERROR(tpu__wrap_dim(b, dim64, self->ndim, &dim));
  if (tpu_view_numel(index) != 0) { /* ATen checks neither for an empty index */
    if (!is_index_dtype(index->dtype))
      return tpu__err(b, TPU_INVALID_ARGUMENT, "gather(): Expected dtype int32/int64 for index");
    TPU_RETURN_IF_ERROR(sg_shape_check(b, self, dim, index, NULL, true));
  }
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, self));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, index));
  b->node->kind = TPU_KIND_GATHER;
  b->node->ia[0] = dim;
  tpu__node_add_output(b->node, self->dtype, index->ndim, index->sizes);
  return NULL;
}

/* data: which schema: bit 0 = src is a value, bits 8.. = fixed reduce (scatter_add),
 * SCATTER_REDUCE_STR = reduce string at arg 4 (scatter.reduce forms),
 * SCATTER_REDUCE_TWO = scatter_reduce.two. */
enum { SC_VALUE = 1, SC_ADD = 2, SC_REDUCE_STR = 4, SC_REDUCE_TWO = 8 };
static const int sc_src = 0, sc_value = SC_VALUE, sc_src_reduce = SC_REDUCE_STR,
                 sc_value_reduce = SC_VALUE | SC_REDUCE_STR, sc_add = SC_ADD, sc_two = SC_REDUCE_TWO;

static tpu_status_t build_scatter(tpu_build_t* b) {
  int flags = *(const int*)b->data;
  const tpu_view_t *self, *index, *src = NULL;
  int64_t dim64;
  int dim;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 1, &dim64));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 2, &index));
  TPU_RETURN_IF_ERROR(tpu__wrap_dim(b, dim64, self->ndim, &dim));
  const char* what = flags & SC_ADD ? "scatter_add" : "scatter";
  if (!(flags & SC_VALUE)) {
    TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 3, &src));
    if (src->dtype != self->dtype)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "%s(): Expected self.dtype to be equal to src.dtype", what);
  }
  if (!is_index_dtype(index->dtype) && tpu_view_numel(index) != 0) /* (none for an empty index) */
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s(): Expected dtype int32/int64 for index", what);
  int red = flags & SC_ADD ? RED_SUM : RED_NONE;
  bool include_self = true;
  if (flags & (SC_REDUCE_STR | SC_REDUCE_TWO)) {
    const tpu_arg_t* r = tpu__arg(b, 4);
    if (!r || r->kind != TPU_ARG_STRING)
      return tpu__err(b, TPU_TYPE_ERROR, "argument 'reduce' must be str");
    const char* s = r->s;
    if (flags & SC_REDUCE_STR) {
      if (!strcmp(s, "add")) red = RED_SUM;
      else if (!strcmp(s, "multiply")) red = RED_PROD;
      else return tpu__err(b, TPU_INVALID_ARGUMENT, "reduce argument must be either add or multiply.");
    } else {
      if (!strcmp(s, "sum")) red = RED_SUM;
      else if (!strcmp(s, "prod")) red = RED_PROD;
      else if (!strcmp(s, "mean")) red = RED_MEAN;
      else if (!strcmp(s, "amax")) red = RED_AMAX;
      else if (!strcmp(s, "amin")) red = RED_AMIN;
      else return tpu__err(b, TPU_INVALID_ARGUMENT,
                           "reduce argument must be either sum, prod, mean, amax or amin, got %s", s);
      TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 5, true, &include_self));
    }
  }
  if (tpu_view_numel(index) != 0) TPU_RETURN_IF_ERROR(sg_shape_check(b, self, dim, index, src, false));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, self));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, index));
  TPU_RETURN_IF_ERROR(tpu__input_from_arg(b, 3));
  b->node->kind = TPU_KIND_SCATTER;
  b->node->ia[0] = dim;
  b->node->ia[1] = red;
  b->node->ia[2] = include_self;
  tpu__node_add_output(b->node, self->dtype, self->ndim, self->sizes);
  return NULL;
}

/* ---- index_select / index_add / index_copy ---------------------------------------- */

static tpu_status_t build_index_select(tpu_build_t* b) {
  const tpu_view_t *self, *index;
  int64_t dim64;
  int dim;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 1, &dim64));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 2, &index));
  TPU_RETURN_IF_ERROR(tpu__wrap_dim(b, dim64, self->ndim, &dim));
  if (index->ndim > 1)
    return tpu__err(b, TPU_INDEX_ERROR, "index_select(): Index is supposed to be a vector");
  if (!is_index_dtype(index->dtype))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "index_select(): Expected dtype int32 or int64 for index");
  int64_t n = tpu_view_numel(index);
  if (self->ndim == 0 && n != 1)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "index_select(): Index to scalar can have only 1 value, got %lld value(s)", (long long)n);
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, self));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, index));
  b->node->kind = TPU_KIND_INDEX_SELECT;
  b->node->ia[0] = dim;
  int64_t shape[TPU_MAX_DIMS];
  memcpy(shape, self->sizes, sizeof shape);
  if (self->ndim > 0) shape[dim] = n;
  tpu__node_add_output(b->node, self->dtype, self->ndim, shape);
  return NULL;
}

/* index_add(self, dim, index, source, *, alpha) and index_copy(self, dim, index, source);
 * data != NULL means add. */
static tpu_status_t build_index_acc(tpu_build_t* b) {
  bool add = b->data != NULL;
  const tpu_view_t *self, *index, *src;
  int64_t dim64;
  int dim;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 1, &dim64));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 2, &index));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 3, &src));
  TPU_RETURN_IF_ERROR(tpu__wrap_dim(b, dim64, self->ndim, &dim));
  int64_t n = tpu_view_numel(index);
  if (add) {
    if (index->ndim > 1)
      return tpu__err(b, TPU_INDEX_ERROR, "index_add_(): Index is supposed to be a vector, but got dim: %d",
                      index->ndim);
    if (!is_index_dtype(index->dtype))
      return tpu__err(b, TPU_INVALID_ARGUMENT, "index_add_(): Expected dtype int32/int64 for index but got: %s",
                      tpu__dtype_c10_name(index->dtype));
    if (src->dtype != self->dtype)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "index_add_(): self (%s) and source (%s) must have the same scalar type",
                      tpu__dtype_c10_name(self->dtype), tpu__dtype_c10_name(src->dtype));
    if (ne_dim(src) != ne_dim(self) && !(src->ndim == 0 && self->ndim == 0))
      return tpu__err(b, TPU_INVALID_ARGUMENT, "source tensor shape must match self tensor shape, excluding the "
                      "specified dimension");
    if (n != ne_size(src, dim))
      return tpu__err(b, TPU_INVALID_ARGUMENT, "index_add_(): Number of indices (%lld) should be equal to "
                      "source.size(dim): (%lld), for dim: %d", (long long)n, (long long)ne_size(src, dim), dim);
    for (int d = 0; d < ne_dim(self); ++d)
      if (d != dim && ne_size(self, d) != ne_size(src, d)) {
        char a[256], s[256];
        tpu__fmt_shape(a, sizeof a, self->ndim, self->sizes);
        tpu__fmt_shape(s, sizeof s, src->ndim, src->sizes);
        return tpu__err(b, TPU_INVALID_ARGUMENT, "source tensor shape must match self tensor shape, excluding "
                        "the specified dimension. Got self.shape = %s source.shape = %s", a, s);
      }
  } else {
    if (index->ndim > 1)
      return tpu__err(b, TPU_INDEX_ERROR, "index_copy_(): Index should have dimension 1 or 0 (got %d)", index->ndim);
    if (index->dtype != TPU_DTYPE_I64)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "index_copy_(): Expected a long tensor for index, but got %s",
                      tpu__dtype_c10_name(index->dtype));
    if (src->dtype != self->dtype)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "index_copy_(): self and source expected to have the same dtype, "
                      "but got (self) %s and (source) %s", tpu__dtype_c10_name(self->dtype), tpu__dtype_c10_name(src->dtype));
    if (self->ndim > 0 && src->ndim > 0 && src->ndim != self->ndim)
      return tpu__err(b, TPU_INDEX_ERROR, "index_copy_(): When source and destination are not scalars, their "
                      "dimensionality must match. Source dimensionality (%d), destination dimensionality (%d)",
                      src->ndim, self->ndim);
    if (n != ne_size(src, dim))
      return tpu__err(b, TPU_INDEX_ERROR, "index_copy_(): Number of indices (%lld) should be equal to "
                      "source.size(dim) (%lld)", (long long)n, (long long)ne_size(src, dim));
    for (int d = 0; d < ne_dim(self); ++d)
      if (d != dim && ne_size(self, d) != ne_size(src, d))
        return tpu__err(b, TPU_INVALID_ARGUMENT, "index_copy_(): Source/destination tensor must have same slice "
                        "shapes. Destination slice shape: %lld at dimension %d and source slice shape: %lld at "
                        "dimension %d.", (long long)ne_size(self, d), d, (long long)ne_size(src, d), d);
  }
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, self));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, index));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, src));
  tpu_node_t* nd = b->node;
  nd->kind = TPU_KIND_INDEX_ACC;
  nd->ia[0] = dim;
  nd->ia[1] = add;
  nd->da[0] = 1;
  nd->ia[2] = 1;
  if (add) {
    TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, 4, 1.0, &nd->da[0]));
    const tpu_arg_t* a = tpu__arg(b, 4);
    bool alpha_float = a && (a->kind == TPU_ARG_DOUBLE ||
                             (a->kind == TPU_ARG_SCALAR && a->scalar_kind == TPU_SCALAR_FLOAT));
    if (alpha_float && !tpu_dtype_is_floating(self->dtype))
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "For integral input tensors, argument alpha must not be a floating point number.");
    nd->ia[2] = alpha_float ? (int64_t)nd->da[0] : (a && a->kind != TPU_ARG_NONE ? a->v.i : 1);
    if (a && a->kind == TPU_ARG_BOOL) nd->ia[2] = a->v.b;
  }
  tpu__node_add_output(nd, self->dtype, self->ndim, self->sizes);
  return NULL;
}

/* ---- advanced indexing ------------------------------------------------------------ */

/* The indexing plan shared by index.Tensor and _index_put_impl_, also stored in the
 * node's ilist for the kernel: [nB, B..., code per self dim..., mask count per entry...]
 * where code is -1 for a sliced dim, else entry * TPU_MAX_DIMS + component. */
typedef struct plan_s {
  int nB;
  int64_t B[TPU_MAX_DIMS];
  int codes[TPU_MAX_DIMS];
  int n_entries;
  int64_t counts[TPU_MAX_DIMS];
  int out_nd;
  int64_t out[TPU_MAX_DIMS];
} plan_t;

static bool is_mask_dtype(tpu_dtype_t t) { return t == TPU_DTYPE_BOOL || t == TPU_DTYPE_U8; }

static tpu_status_t make_plan(tpu_build_t* b, const tpu_view_t* self, int list_arg, plan_t* p) {
  const tpu_arg_t* a = tpu__arg(b, list_arg);
  if (!a || a->kind != TPU_ARG_TENSORLIST)
    return tpu__err(b, TPU_TYPE_ERROR, "argument 'indices' must be a tuple of Tensors");
  memset(p, 0, sizeof *p);
  int nd = self->ndim;
  /* every entry consumes at least one dim (0-dim masks are rejected below) */
  if (a->list_len > nd) return tpu__err(b, TPU_INDEX_ERROR, "too many indices for tensor of dimension %d", nd);
  p->n_entries = (int)a->list_len;
  int64_t shapes[TPU_MAX_DIMS][TPU_MAX_DIMS];
  int shape_nd[TPU_MAX_DIMS];
  int n_shapes = 0;
  int d = 0;
  for (int e = 0; e < p->n_entries; ++e) {
    const tpu_view_t* t = &a->tensors[e];
    p->counts[e] = -1;
    if (!t->storage) {
      if (d >= nd) return tpu__err(b, TPU_INDEX_ERROR, "too many indices for tensor of dimension %d", nd);
      p->codes[d++] = -1;
      continue;
    }
    if (!is_mask_dtype(t->dtype) && !is_index_dtype(t->dtype))
      return tpu__err(b, TPU_INDEX_ERROR, "tensors used as indices must be long, int, byte or bool tensors");
    if (is_mask_dtype(t->dtype)) {
      if (t->ndim == 0)
        return tpu__err(b, TPU_UNIMPLEMENTED, "indexing with a 0-dim boolean mask is not supported on tpu");
      if (d + t->ndim > nd)
        return tpu__err(b, TPU_INDEX_ERROR, "too many indices for tensor of dimension %d", nd);
      for (int j = 0; j < t->ndim; ++j)
        if (t->sizes[j] != self->sizes[d + j]) {
          char ms[256], ss[256];
          tpu__fmt_shape(ms, sizeof ms, t->ndim, t->sizes);
          tpu__fmt_shape(ss, sizeof ss, self->ndim, self->sizes);
          return tpu__err(b, TPU_INDEX_ERROR, "The shape of the mask %s at index %d does not match the shape "
                          "of the indexed tensor %s at index %d", ms, j, ss, d + j);
        }
      TPU_RETURN_IF_ERROR(count_true(b, t, &p->counts[e]));
      for (int j = 0; j < t->ndim; ++j) p->codes[d + j] = e * TPU_MAX_DIMS + j;
      d += t->ndim;
      shape_nd[n_shapes] = 1;
      shapes[n_shapes][0] = p->counts[e];
    } else {
      if (d >= nd) return tpu__err(b, TPU_INDEX_ERROR, "too many indices for tensor of dimension %d", nd);
      p->codes[d++] = e * TPU_MAX_DIMS;
      shape_nd[n_shapes] = t->ndim;
      memcpy(shapes[n_shapes], t->sizes, sizeof(int64_t) * (size_t)t->ndim);
    }
    ++n_shapes;
  }
  for (; d < nd; ++d) p->codes[d] = -1;
  /* broadcast the index shapes */
  for (int s = 0; s < n_shapes; ++s) {
    int n = p->nB > shape_nd[s] ? p->nB : shape_nd[s];
    int64_t out[TPU_MAX_DIMS];
    bool ok = true;
    for (int i = 0; i < n; ++i) {
      int ia = p->nB - n + i, ic = shape_nd[s] - n + i;
      int64_t sa = ia >= 0 ? p->B[ia] : 1, sc = ic >= 0 ? shapes[s][ic] : 1;
      if (sa != sc && sa != 1 && sc != 1) ok = false;
      out[i] = sa == 1 ? sc : sa;
    }
    if (!ok) {
      char msg[768];
      size_t o = 0;
      for (int k = 0; k < n_shapes && o < sizeof msg; ++k) {
        char sh[256];
        tpu__fmt_shape(sh, sizeof sh, shape_nd[k], shapes[k]);
        o += (size_t)snprintf(msg + o, sizeof msg - o, k ? ", %s" : "%s", sh);
      }
      return tpu__err(b, TPU_INDEX_ERROR,
                      "shape mismatch: indexing tensors could not be broadcast together with shapes %s", msg);
    }
    memcpy(p->B, out, sizeof(int64_t) * (size_t)n);
    p->nB = n;
  }
  /* Result layout: the broadcast index shape replaces the indexed dims in place when
   * they are adjacent, else it goes first (numpy's rule). */
  int first = -1, last = -1, n_idx = 0;
  for (int k = 0; k < nd; ++k)
    if (p->codes[k] >= 0) { if (first < 0) first = k; last = k; ++n_idx; }
  bool adjacent = n_idx == 0 || last - first + 1 == n_idx;
  int o = 0;
  if (!adjacent) {
    for (int k = 0; k < p->nB; ++k) p->out[o++] = p->B[k];
    for (int k = 0; k < nd; ++k) if (p->codes[k] < 0) p->out[o++] = self->sizes[k];
  } else {
    for (int k = 0; k < nd; ++k) {
      if (k == first) for (int j = 0; j < p->nB; ++j) p->out[o++] = p->B[j];
      if (p->codes[k] < 0) p->out[o++] = self->sizes[k];
    }
  }
  if (o > TPU_MAX_DIMS) return tpu__err(b, TPU_INVALID_ARGUMENT, "indexing result has too many dimensions");
  p->out_nd = o;
  return NULL;
}

static tpu_status_t plan_to_node(tpu_build_t* b, const tpu_view_t* self, const plan_t* p, int list_arg) {
  int64_t il[1 + 3 * TPU_MAX_DIMS];
  int k = 0;
  il[k++] = p->nB;
  for (int i = 0; i < p->nB; ++i) il[k++] = p->B[i];
  for (int i = 0; i < self->ndim; ++i) il[k++] = p->codes[i];
  for (int i = 0; i < p->n_entries; ++i) il[k++] = p->counts[i];
  TPU_RETURN_IF_ERROR(tpu__node_set_ilist(b->node, il, k));
  const tpu_arg_t* a = tpu__arg(b, list_arg);
  for (int e = 0; e < p->n_entries; ++e) {
    if (a->tensors[e].storage) TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, &a->tensors[e]));
    else TPU_RETURN_IF_ERROR(tpu__node_add_absent(b->node));
  }
  return NULL;
}

/* index.Tensor(self, Tensor?[] indices) */
static tpu_status_t build_index(tpu_build_t* b) {
  const tpu_view_t* self;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  plan_t p;
  TPU_RETURN_IF_ERROR(make_plan(b, self, 1, &p));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, self));
  TPU_RETURN_IF_ERROR(plan_to_node(b, self, &p, 1));
  b->node->kind = TPU_KIND_INDEX;
  tpu__node_add_output(b->node, self->dtype, p.out_nd, p.out);
  return NULL;
}

/* _index_put_impl_(self, indices, values, accumulate, unsafe) */
static tpu_status_t build_index_put(tpu_build_t* b) {
  const tpu_view_t *self, *values;
  bool accumulate;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 2, &values));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 3, false, &accumulate));
  if (values->dtype != self->dtype)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Index put requires the source and destination dtypes match, got "
                    "%s for the destination and %s for the source.", tpu__dtype_c10_name(self->dtype), tpu__dtype_c10_name(values->dtype));
  plan_t p;
  TPU_RETURN_IF_ERROR(make_plan(b, self, 1, &p));
  /* values must broadcast to the indexing result without growing it */
  bool ok = values->ndim <= p.out_nd;
  for (int i = 0; ok && i < values->ndim; ++i) {
    int64_t v = values->sizes[values->ndim - 1 - i], r = p.out[p.out_nd - 1 - i];
    ok = v == 1 || v == r;
  }
  if (!ok) {
    char vs[256], rs[256];
    tpu__fmt_shape(vs, sizeof vs, values->ndim, values->sizes);
    tpu__fmt_shape(rs, sizeof rs, p.out_nd, p.out);
    return tpu__err(b, TPU_INVALID_ARGUMENT, "shape mismatch: value tensor of shape %s cannot be broadcast to "
                    "indexing result of shape %s", vs, rs);
  }
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, self));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, values));
  TPU_RETURN_IF_ERROR(plan_to_node(b, self, &p, 1));
  b->node->kind = TPU_KIND_INDEX_PUT;
  b->node->ia[1] = accumulate;
  tpu__node_add_output(b->node, self->dtype, self->ndim, self->sizes);
  return NULL;
}

/* ---- masked ops, nonzero ------------------------------------------------------------ */

static tpu_status_t build_masked_select(tpu_build_t* b) {
  const tpu_view_t *self, *mask;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &mask));
  if (mask->dtype != TPU_DTYPE_BOOL)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "masked_select: expected BoolTensor for mask");
  int64_t shape[TPU_MAX_DIMS];
  int nd;
  TPU_RETURN_IF_ERROR(tpu__broadcast(b, self->sizes, self->ndim, mask->sizes, mask->ndim, shape, &nd));
  /* count over the broadcast mask: a view of mask with stride 0 on expanded dims */
  tpu_view_t m = *mask;
  m.ndim = nd;
  for (int d = 0; d < nd; ++d) {
    int sd = d - (nd - mask->ndim);
    m.sizes[d] = shape[d];
    m.strides[d] = sd >= 0 && mask->sizes[sd] != 1 ? mask->strides[sd] : 0;
  }
  m.offset = mask->offset;
  int64_t count;
  TPU_RETURN_IF_ERROR(count_true(b, &m, &count));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, self));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, mask));
  TPU_RETURN_IF_ERROR(tpu__node_set_ilist(b->node, shape, nd));
  b->node->kind = TPU_KIND_MASKED_SELECT;
  b->node->ia[0] = count;
  tpu__node_add_output(b->node, self->dtype, 1, &count);
  return NULL;
}

/* masked_scatter_(self, mask, source) */
static tpu_status_t build_masked_scatter(tpu_build_t* b) {
  const tpu_view_t *self, *mask, *src;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &mask));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 2, &src));
  if (mask->dtype != TPU_DTYPE_BOOL)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "masked_scatter_ only supports boolean masks, but got mask with dtype %s",
                    tpu__dtype_c10_name(mask->dtype));
  if (src->dtype != self->dtype)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "masked_scatter: expected self and source to have same dtypes but got "
                    "%s and %s", tpu__dtype_c10_name(self->dtype), tpu__dtype_c10_name(src->dtype));
  int64_t shape[TPU_MAX_DIMS];
  int nd;
  TPU_RETURN_IF_ERROR(tpu__broadcast(b, self->sizes, self->ndim, mask->sizes, mask->ndim, shape, &nd));
  bool same = nd == self->ndim;
  for (int d = 0; same && d < nd; ++d) same = shape[d] == self->sizes[d];
  if (!same) return tpu__err(b, TPU_INVALID_ARGUMENT, "mask cannot be broadcast to the shape of self");
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, self));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, mask));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, src));
  b->node->kind = TPU_KIND_MASKED_SCATTER;
  tpu__node_add_output(b->node, self->dtype, self->ndim, self->sizes);
  return NULL;
}

/* True when the element's bits make it nonzero: floats ignore the sign bit (-0.0 == 0),
 * NaN counts as nonzero, integers and bool are nonzero when any bit is set. */
static bool elem_nonzero(const uint8_t* p, tpu_dtype_t t) {
  size_t n = tpu_dtype_size(t);
  uint64_t v = 0;
  memcpy(&v, p, n);
  if (tpu_dtype_is_floating(t)) v &= ~(1ull << (8 * n - 1));
  return v != 0;
}

static tpu_status_t build_nonzero(tpu_build_t* b) {
  const tpu_view_t* self;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  int64_t n = tpu_view_numel(self), count = 0;
  size_t es = tpu_dtype_size(self->dtype);
  if (n > 0) {
    uint64_t bytes;
    if (!tpu__mul_ok((uint64_t)n, es, &bytes)) return tpu__err(b, TPU_INVALID_ARGUMENT, "tensor too large");
    uint8_t* buf = tpu__malloc(bytes);
    if (!buf) return tpu_status_make(TPU_OUT_OF_MEMORY, "host out of memory");
    tpu_status_t st = tpu_copy_to_host(self, buf);
    if (st) { tpu__free(buf); return tpu_status_annotate(st, "%s: reading the input", b->name); }
    for (int64_t i = 0; i < n; ++i) count += elem_nonzero(buf + (size_t)i * es, self->dtype);
    tpu__free(buf);
  }
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, self));
  b->node->kind = TPU_KIND_NONZERO;
  b->node->ia[0] = count;
  int64_t shape[2] = {count, self->ndim};
  tpu__node_add_output(b->node, TPU_DTYPE_I64, 2, shape);
  return NULL;
}

/* Element p of an integral dtype (bool excluded) as int64. */
static int64_t elem_int(const uint8_t* p, tpu_dtype_t t) {
  switch (t) {
    case TPU_DTYPE_U8: return *p;
    case TPU_DTYPE_I8: { int8_t v; memcpy(&v, p, 1); return v; }
    case TPU_DTYPE_I16: { int16_t v; memcpy(&v, p, 2); return v; }
    case TPU_DTYPE_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    default: { int64_t v; memcpy(&v, p, 8); return v; }
  }
}

/* bincount(self, weights=None, minlength=0): the output length max(max(self) + 1,
 * minlength) depends on the data, so the builder reads the input (a host-read cut point,
 * like nonzero). Checks, their order and the result dtype as ATen's CPU kernel: int64
 * counts; weights summed as float32 when they are float32, else as float64; an empty input
 * gives int64 zeros whatever the weights. */
static tpu_status_t build_bincount(tpu_build_t* b) {
  const tpu_view_t *self, *w;
  int64_t minlength;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor_opt(b, 1, &w));
  TPU_RETURN_IF_ERROR(tpu__arg_int_opt(b, 2, 0, &minlength));
  tpu_dtype_t t = self->dtype;
  if (t != TPU_DTYPE_U8 && t != TPU_DTYPE_I8 && t != TPU_DTYPE_I16 && t != TPU_DTYPE_I32 && t != TPU_DTYPE_I64)
    return tpu__err(b, TPU_UNIMPLEMENTED, "\"bincount_cpu\" not implemented for '%s'", tpu__dtype_c10_name(t));
  if (w && (w->dtype == TPU_DTYPE_C64 || w->dtype == TPU_DTYPE_C128))
    return tpu__err(b, TPU_UNIMPLEMENTED, "bincount with complex weights");
  if (minlength < 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "minlength should be >= 0");
  int64_t n = tpu_view_numel(self), nbins = minlength;
  tpu_dtype_t out_dt = TPU_DTYPE_I64;
  if (!(self->ndim == 1 && n == 0)) {
    if (self->ndim != 1) return tpu__err(b, TPU_INVALID_ARGUMENT, "bincount only supports 1-d non-negative integral inputs.");
    size_t es = tpu_dtype_size(t);
    uint8_t* raw = tpu__malloc(es * (size_t)n);
    tpu_status_t st = raw ? tpu_copy_to_host(self, raw) : tpu_status_make(TPU_OUT_OF_MEMORY, "host out of memory");
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (int64_t i = 0; !st && i < n; ++i) {
      int64_t v = elem_int(raw + (size_t)i * es, t);
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
    tpu__free(raw);
    if (st) return tpu_status_annotate(st, "%s: reading the input", b->name);
    if (lo < 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "bincount only supports 1-d non-negative integral inputs.");
    if (hi == INT64_MAX) return tpu__err(b, TPU_INVALID_ARGUMENT, "maximum value of input overflowed, it should be < %lld", (long long)INT64_MAX);
    if (w && (w->ndim != 1 || w->sizes[0] != n))
      return tpu__err(b, TPU_INVALID_ARGUMENT, "weights should be 1-d and have the same length as input");
    if (hi + 1 > nbins) nbins = hi + 1;
    if (w) out_dt = w->dtype == TPU_DTYPE_F32 ? TPU_DTYPE_F32 : TPU_DTYPE_F64;
  }
  tpu_node_t* node = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(node, self));
  TPU_RETURN_IF_ERROR(tpu__node_add_opt(b, out_dt == TPU_DTYPE_I64 ? NULL : w));
  node->kind = TPU_KIND_BINCOUNT;
  node->compute = out_dt;
  tpu__node_add_output(node, out_dt, 1, &nbins);
  return NULL;
}

/* ---- cat ------------------------------------------------------------------------------- */

static bool cat_skipped(const tpu_view_t* t) { return t->ndim == 1 && t->sizes[0] == 0; }

static tpu_status_t build_cat(tpu_build_t* b) {
  const tpu_arg_t* a = tpu__arg(b, 0);
  if (!a || a->kind != TPU_ARG_TENSORLIST)
    return tpu__err(b, TPU_TYPE_ERROR, "argument 'tensors' must be a tuple of Tensors");
  if (a->list_len == 0) return tpu__err(b, TPU_VALUE_ERROR, "torch.cat(): expected a non-empty list of Tensors");
  int64_t dim64;
  TPU_RETURN_IF_ERROR(tpu__arg_int_opt(b, 1, 0, &dim64));
  tpu_dtype_t dt = TPU_DTYPE_INVALID;
  const tpu_view_t* ref = NULL;
  for (int64_t i = 0; i < a->list_len; ++i) {
    const tpu_view_t* t = &a->tensors[i];
    if (!t->storage) return tpu__err(b, TPU_TYPE_ERROR, "expected Tensor as element %lld", (long long)i);
    if (!tpu_dtype_is_supported(t->dtype)) {
      char what[40];
      snprintf(what, sizeof what, "tensor %lld", (long long)i);
      return tpu__err_dtype(b, t->dtype, what);
    }
    if (t->ndim == 0)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "zero-dimensional tensor (at position %lld) cannot be concatenated",
                      (long long)i);
    dt = dt == TPU_DTYPE_INVALID ? t->dtype : tpu__promote(dt, t->dtype);
    if (!ref && !cat_skipped(t)) ref = t;
  }
  int64_t shape[TPU_MAX_DIMS];
  int nd = 1, dim = 0;
  shape[0] = 0;
  if (ref) {
    TPU_RETURN_IF_ERROR(tpu__wrap_dim(b, dim64, ref->ndim, &dim));
    nd = ref->ndim;
    memcpy(shape, ref->sizes, sizeof shape);
    shape[dim] = 0;
    for (int64_t i = 0; i < a->list_len; ++i) {
      const tpu_view_t* t = &a->tensors[i];
      if (cat_skipped(t)) continue;
      if (t->ndim != nd)
        return tpu__err(b, TPU_INVALID_ARGUMENT, "Tensors must have same number of dimensions: got %d and %d",
                        nd, t->ndim);
      for (int d = 0; d < nd; ++d)
        if (d != dim && t->sizes[d] != ref->sizes[d])
          return tpu__err(b, TPU_INVALID_ARGUMENT, "Sizes of tensors must match except in dimension %d. "
                          "Expected size %lld but got size %lld for tensor number %lld in the list.",
                          dim, (long long)ref->sizes[d], (long long)t->sizes[d], (long long)i);
      shape[dim] += t->sizes[dim];
    }
  }
  for (int64_t i = 0; i < a->list_len; ++i)
    if (!cat_skipped(&a->tensors[i])) TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, &a->tensors[i]));
  b->node->kind = TPU_KIND_CAT;
  b->node->ia[0] = dim;
  tpu__node_add_output(b->node, dt, nd, shape);
  return NULL;
}

/* ---- flip, roll, repeat, constant_pad_nd, tril/triu -------------------------------- */

static tpu_status_t build_flip(tpu_build_t* b) {
  const tpu_view_t* self;
  const int64_t* dims;
  int n;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  TPU_RETURN_IF_ERROR(tpu__arg_intlist(b, 1, &dims, &n));
  int64_t flags[TPU_MAX_DIMS] = {0};
  for (int i = 0; i < n; ++i) {
    int d;
    TPU_RETURN_IF_ERROR(tpu__wrap_dim(b, dims[i], self->ndim, &d));
    if (self->ndim == 0) continue;
    if (flags[d]) return tpu__err(b, TPU_INVALID_ARGUMENT, "dim %d appears multiple times in the list of dims", d);
    flags[d] = 1;
  }
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, self));
  TPU_RETURN_IF_ERROR(tpu__node_set_ilist(b->node, flags, self->ndim));
  b->node->kind = TPU_KIND_FLIP;
  tpu__node_add_output(b->node, self->dtype, self->ndim, self->sizes);
  return NULL;
}

/* roll(self, shifts, dims=[]): ilist = shift per dim in [0, size); with no dims the
 * tensor rolls as if flattened (ia[0] = 1, ia[1] = shift). */
static tpu_status_t build_roll(tpu_build_t* b) {
  const tpu_view_t* self;
  const int64_t *shifts, *dims = NULL;
  int ns, nd = 0;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  TPU_RETURN_IF_ERROR(tpu__arg_intlist(b, 1, &shifts, &ns));
  if (!tpu__arg_is_none(b, 2)) TPU_RETURN_IF_ERROR(tpu__arg_intlist(b, 2, &dims, &nd));
  if (ns == 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "`shifts` required");
  if (ns != nd && !(nd == 0 && ns == 1))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "shifts and dimensions must align. shifts: %d, dims:%d", ns, nd);
  int64_t per[TPU_MAX_DIMS] = {0};
  tpu_node_t* node = b->node;
  if (nd == 0) {
    int64_t n = tpu_view_numel(self);
    node->ia[0] = 1;
    node->ia[1] = n ? ((shifts[0] % n) + n) % n : 0;
  } else {
    for (int i = 0; i < nd; ++i) {
      int d;
      if (self->ndim == 0)
        return tpu__err(b, TPU_INDEX_ERROR, "Dimension specified as %lld but tensor has no dimensions",
                        (long long)dims[i]);
      TPU_RETURN_IF_ERROR(tpu__wrap_dim(b, dims[i], self->ndim, &d));
      int64_t s = self->sizes[d];
      if (s) per[d] = (((per[d] + shifts[i]) % s) + s) % s;
    }
  }
  TPU_RETURN_IF_ERROR(tpu__node_add_input(node, self));
  TPU_RETURN_IF_ERROR(tpu__node_set_ilist(node, per, self->ndim));
  node->kind = TPU_KIND_ROLL;
  tpu__node_add_output(node, self->dtype, self->ndim, self->sizes);
  return NULL;
}

static tpu_status_t build_repeat(tpu_build_t* b) {
  const tpu_view_t* self;
  const int64_t* reps;
  int n;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  TPU_RETURN_IF_ERROR(tpu__arg_intlist(b, 1, &reps, &n));
  if (n < self->ndim)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Number of dimensions of repeat dims can not be smaller than number "
                    "of dimensions of tensor");
  if (n > TPU_MAX_DIMS) return tpu__err(b, TPU_INVALID_ARGUMENT, "too many dimensions");
  int64_t shape[TPU_MAX_DIMS];
  for (int d = 0; d < n; ++d) {
    int sd = d - (n - self->ndim);
    shape[d] = reps[d] * (sd >= 0 ? self->sizes[sd] : 1);
  }
  for (int d = 0; d < n; ++d)
    if (shape[d] < 0) {
      char s[256];
      tpu__fmt_shape(s, sizeof s, n, shape);
      return tpu__err(b, TPU_INVALID_ARGUMENT, "Trying to create tensor with negative dimension %lld: %s",
                      (long long)shape[d], s);
    }
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, self));
  b->node->kind = TPU_KIND_REPEAT;
  tpu__node_add_output(b->node, self->dtype, n, shape);
  return NULL;
}

/* constant_pad_nd(self, pad, value=0): ilist = padding before each dim (negative crops). */
static tpu_status_t build_pad(tpu_build_t* b) {
  const tpu_view_t* self;
  const int64_t* pad;
  int n;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  TPU_RETURN_IF_ERROR(tpu__arg_intlist(b, 1, &pad, &n));
  if (n % 2) return tpu__err(b, TPU_INVALID_ARGUMENT, "Length of pad must be even but instead it equals %d", n);
  if (n / 2 > self->ndim)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Length of pad should be no more than twice the number of dimensions "
                    "of the input. Pad length is %d while the input has %d dimensions.", n, self->ndim);
  int64_t lo[TPU_MAX_DIMS] = {0}, shape[TPU_MAX_DIMS];
  memcpy(shape, self->sizes, sizeof shape);
  for (int i = 0; i < n / 2; ++i) {
    int d = self->ndim - 1 - i;
    lo[d] = pad[2 * i];
    shape[d] = self->sizes[d] + pad[2 * i] + pad[2 * i + 1];
    if (shape[d] < 0)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "The input size %lld, plus negative padding %lld and %lld resulted "
                      "in a negative output size, which is invalid. Check dimension %d of your input.",
                      (long long)self->sizes[d], (long long)pad[2 * i], (long long)pad[2 * i + 1], d);
  }
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, self));
  if (tpu__arg_is_none(b, 2)) TPU_RETURN_IF_ERROR(tpu__node_add_scalar(b->node, 0, 0, TPU_DTYPE_I64));
  else TPU_RETURN_IF_ERROR(tpu__input_from_arg(b, 2));
  TPU_RETURN_IF_ERROR(tpu__node_set_ilist(b->node, lo, self->ndim));
  b->node->kind = TPU_KIND_PAD;
  tpu__node_add_output(b->node, self->dtype, self->ndim, shape);
  return NULL;
}

/* tril / triu; data != NULL means triu. */
static tpu_status_t build_tri(tpu_build_t* b) {
  const tpu_view_t* self;
  int64_t diag;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  TPU_RETURN_IF_ERROR(tpu__arg_int_opt(b, 1, 0, &diag));
  if (self->ndim < 2)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: input tensor must have at least 2 dimensions",
                    b->data ? "triu" : "tril");
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, self));
  b->node->kind = TPU_KIND_TRIL;
  b->node->ia[0] = diag;
  b->node->ia[1] = b->data != NULL;
  tpu__node_add_output(b->node, self->dtype, self->ndim, self->sizes);
  return NULL;
}

/* ---- unfold_backward ---------------------------------------------------------------- */

/* unfold_backward(grad_in, input_sizes, dim, size, step): the gradient of
 * input.unfold(dim, size, step). grad_in has input's shape with dim replaced by the window
 * count, plus a last dim of `size`. ia[0] dim, ia[1] size, ia[2] step. */
static tpu_status_t build_unfold_backward(tpu_build_t* b) {
  const tpu_view_t* g;
  const int64_t* in_sizes;
  int nd, dim;
  int64_t dim64, size, step;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &g));
  TPU_RETURN_IF_ERROR(tpu__arg_intlist(b, 1, &in_sizes, &nd));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 2, &dim64));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 3, &size));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 4, &step));
  if (nd == 0) return tpu__err(b, TPU_UNIMPLEMENTED, "unfold_backward of a 0-dim input");
  if (nd + 1 > TPU_MAX_DIMS) return tpu__err(b, TPU_INVALID_ARGUMENT, "too many dimensions (%d)", nd);
  TPU_RETURN_IF_ERROR(tpu__wrap_dim(b, dim64, nd, &dim));
  if (step <= 0) return tpu__err(b, TPU_VALUE_ERROR, "step is %lld but must be > 0", (long long)step);
  if (size < 0 || size > in_sizes[dim])
    return tpu__err(b, TPU_INVALID_ARGUMENT, "maximum size for tensor at dimension %d is %lld but size is %lld", dim,
                    (long long)in_sizes[dim], (long long)size);
  int64_t want[TPU_MAX_DIMS];
  for (int d = 0; d < nd; ++d) {
    if (in_sizes[d] < 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "negative input size %lld", (long long)in_sizes[d]);
    want[d] = in_sizes[d];
  }
  want[dim] = (in_sizes[dim] - size) / step + 1;
  want[nd] = size;
  bool same = g->ndim == nd + 1;
  for (int d = 0; same && d <= nd; ++d) same = g->sizes[d] == want[d];
  if (!same) {
    char s1[256], s2[256];
    tpu__fmt_shape(s1, sizeof s1, g->ndim, g->sizes);
    tpu__fmt_shape(s2, sizeof s2, nd + 1, want);
    return tpu__err(b, TPU_INVALID_ARGUMENT, "grad_in of shape %s, expected %s", s1, s2);
  }
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, g));
  b->node->kind = TPU_KIND_UNFOLD_BACKWARD;
  b->node->ia[0] = dim;
  b->node->ia[1] = size;
  b->node->ia[2] = step;
  tpu__node_add_output(b->node, g->dtype, nd, in_sizes);
  return NULL;
}

/* ---- sort / topk ------------------------------------------------------------------ */

/* sort.stable(self, *, stable, dim=-1, descending=False). The kernel always sorts
 * stably, which is one of the orders an unstable sort may produce. */
static tpu_status_t build_sort(tpu_build_t* b) {
  const tpu_view_t* self;
  int64_t dim64;
  bool desc;
  int dim;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  TPU_RETURN_IF_ERROR(tpu__arg_int_opt(b, 2, -1, &dim64));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 3, false, &desc));
  TPU_RETURN_IF_ERROR(tpu__wrap_dim(b, dim64, self->ndim, &dim));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, self));
  b->node->kind = TPU_KIND_SORT;
  b->node->ia[0] = dim;
  b->node->ia[1] = desc;
  b->node->ia[2] = -1;
  tpu__node_add_output(b->node, self->dtype, self->ndim, self->sizes);
  tpu__node_add_output(b->node, TPU_DTYPE_I64, self->ndim, self->sizes);
  return NULL;
}

/* topk(self, k, dim=-1, largest=True, sorted=True): always returns sorted results. */
static tpu_status_t build_topk(tpu_build_t* b) {
  const tpu_view_t* self;
  int64_t k, dim64;
  bool largest;
  int dim;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 1, &k));
  TPU_RETURN_IF_ERROR(tpu__arg_int_opt(b, 2, -1, &dim64));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 3, true, &largest));
  TPU_RETURN_IF_ERROR(tpu__wrap_dim(b, dim64, self->ndim, &dim));
  if (self->dtype == TPU_DTYPE_BOOL)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "topk does not support bool dtypes on CPU");
  int64_t size = self->ndim ? self->sizes[dim] : 1;
  if (k < 0 || k > size) return tpu__err(b, TPU_INVALID_ARGUMENT, "selected index k out of range");
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, self));
  b->node->kind = TPU_KIND_SORT;
  b->node->ia[0] = dim;
  b->node->ia[1] = largest;
  b->node->ia[2] = k;
  int64_t shape[TPU_MAX_DIMS];
  memcpy(shape, self->sizes, sizeof shape);
  if (self->ndim) shape[dim] = k;
  tpu__node_add_output(b->node, self->dtype, self->ndim, shape);
  tpu__node_add_output(b->node, TPU_DTYPE_I64, self->ndim, shape);
  return NULL;
}

/* ---- factories: arange.start_out, eye.out, eye.m_out ---------------------------------- */

static bool arg_integral(const tpu_arg_t* a) {
  return a && (a->kind == TPU_ARG_INT || a->kind == TPU_ARG_BOOL ||
               (a->kind == TPU_ARG_SCALAR && a->scalar_kind != TPU_SCALAR_FLOAT));
}

/* The out= tensor is the last argument; its dtype is the result dtype. */
static tpu_status_t out_arg(tpu_build_t* b, int i, const tpu_view_t** out) {
  const tpu_arg_t* a = tpu__arg(b, i);
  *out = NULL;
  if (!a || a->kind != TPU_ARG_TENSOR) return tpu__err(b, TPU_TYPE_ERROR, "missing out= tensor");
  *out = &a->tensor;
  return NULL;
}

static int64_t arg_i64(const tpu_arg_t* a) {
  if (a->kind == TPU_ARG_BOOL) return a->v.b;
  if (a->kind == TPU_ARG_DOUBLE || (a->kind == TPU_ARG_SCALAR && a->scalar_kind == TPU_SCALAR_FLOAT))
    return (int64_t)a->v.d;
  return a->v.i;
}

/* arange.start_out(start, end, step=1, *, out) */
static tpu_status_t build_arange(tpu_build_t* b) {
  const tpu_view_t* out = NULL;
  double start, end, step;
  TPU_RETURN_IF_ERROR(out_arg(b, 3, &out));
  TPU_RETURN_IF_ERROR(tpu__arg_double(b, 0, &start));
  TPU_RETURN_IF_ERROR(tpu__arg_double(b, 1, &end));
  TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, 2, 1.0, &step));
  tpu_dtype_t dt = out->dtype;
  if (dt == TPU_DTYPE_BOOL || !tpu_dtype_is_supported(dt))
    return tpu__err(b, TPU_UNIMPLEMENTED, "\"arange_cpu\" not implemented for '%s'", tpu__dtype_c10_name(dt));
  if (!(step > 0 || step < 0)) return tpu__err(b, TPU_INVALID_ARGUMENT, "step must be nonzero");
  if (!isfinite(start) || !isfinite(end))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "unsupported range: %g -> %g", start, end);
  if (!((step > 0 && end >= start) || (step < 0 && end <= start)))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "upper bound and lower bound inconsistent with step sign");
  bool all_int = arg_integral(tpu__arg(b, 0)) && arg_integral(tpu__arg(b, 1)) &&
                 (tpu__arg_is_none(b, 2) || arg_integral(tpu__arg(b, 2)));
  double size_d;
  int64_t si = arg_i64(tpu__arg(b, 0)), ei = arg_i64(tpu__arg(b, 1));
  int64_t sti = tpu__arg_is_none(b, 2) ? 1 : arg_i64(tpu__arg(b, 2));
  if (dt == TPU_DTYPE_I64 && all_int) {
    int64_t sgn = (sti > 0) - (sti < 0);
    size_d = (double)((ei - si + sti - sgn) / sti);
  } else {
    size_d = ceil((end - start) / step);
  }
  if (!(size_d >= 0 && size_d <= 9.2e18))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "invalid size, possible overflow?");
  int64_t n = (int64_t)size_d;
  tpu_node_t* node = b->node;
  node->kind = TPU_KIND_ARANGE;
  node->da[0] = start;
  node->da[1] = step;
  /* integer outputs use the scalars truncated to int64, as CPU's acc type does */
  node->ia[0] = si;
  node->ia[1] = sti;
  tpu__node_add_output(node, dt, 1, &n);
  return NULL;
}

/* eye.out(n, *, out) / eye.m_out(n, m, *, out) */
static tpu_status_t build_eye(tpu_build_t* b) {
  bool has_m = b->data != NULL;
  int64_t n, m;
  const tpu_view_t* out = NULL;
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 0, &n));
  if (has_m) TPU_RETURN_IF_ERROR(tpu__arg_int(b, 1, &m)); else m = n;
  TPU_RETURN_IF_ERROR(out_arg(b, has_m ? 2 : 1, &out));
  if (n < 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "n must be greater or equal to 0, got %lld", (long long)n);
  if (m < 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "m must be greater or equal to 0, got %lld", (long long)m);
  if (!tpu_dtype_is_supported(out->dtype)) return tpu__err_dtype(b, out->dtype, "out");
  b->node->kind = TPU_KIND_EYE;
  int64_t shape[2] = {n, m};
  tpu__node_add_output(b->node, out->dtype, 2, shape);
  return NULL;
}

/* ---- linspace.out / logspace.out ---------------------------------------------------- */

/* c10's spelling of a dtype in "value cannot be converted" messages. */
static const char* c10_type(tpu_dtype_t t) {
  switch (t) {
    case TPU_DTYPE_U8: return "uint8_t";
    case TPU_DTYPE_I8: return "int8_t";
    case TPU_DTYPE_I16: return "int16_t";
    case TPU_DTYPE_I32: return "int";
    case TPU_DTYPE_I64: return "int64_t";
    case TPU_DTYPE_F16: return "c10::Half";
    case TPU_DTYPE_BF16: return "c10::BFloat16";
    case TPU_DTYPE_F32: return "float";
    case TPU_DTYPE_F64: return "double";
    default: return "bool";
  }
}

static bool arg_is_float(const tpu_arg_t* a) {
  return a->kind == TPU_ARG_DOUBLE || (a->kind == TPU_ARG_SCALAR && a->scalar_kind == TPU_SCALAR_FLOAT);
}

/* c10's checked Scalar::to<T>(): a float value (is_float, d) or an integer i fits dtype
 * t. Floating types take inf and NaN; unsigned types take negative integers (they wrap);
 * bool takes anything. */
static bool scalar_fits(bool is_float, double d, int64_t i, tpu_dtype_t t) {
  static const double top[] = {[TPU_DTYPE_U8] = 255, [TPU_DTYPE_I8] = 127, [TPU_DTYPE_I16] = 32767,
                               [TPU_DTYPE_I32] = 2147483647.0, [TPU_DTYPE_I64] = 0x1p63,
                               [TPU_DTYPE_F16] = 65504, [TPU_DTYPE_F32] = 0x1.fffffep127,
                               [TPU_DTYPE_BF16] = 0x1.fep127};
  if (t == TPU_DTYPE_BOOL || t == TPU_DTYPE_F64) return true;
  double hi = top[t];
  if (tpu_dtype_is_floating(t)) return is_float ? !(fabs(d) > hi) || isinf(d) : fabs((double)i) <= hi;
  double lo = t == TPU_DTYPE_U8 ? 0 : -hi - 1;
  if (is_float) return d >= lo && d <= hi;
  if (t == TPU_DTYPE_U8) return i <= 255 && i >= -255;
  return (double)i >= lo && (double)i <= hi;
}

static tpu_status_t check_fits(tpu_build_t* b, bool is_float, double d, int64_t i, tpu_dtype_t t) {
  if (scalar_fits(is_float, d, i, t)) return NULL;
  return tpu__err(b, TPU_INVALID_ARGUMENT, "value cannot be converted to type %s without overflow", c10_type(t));
}

/* linspace.out(start, end, steps, *, out) and logspace.out(start, end, steps, base, *,
 * out); data != NULL means logspace. The functional forms and the Tensor start/end
 * overloads are composite in PyTorch and arrive here with Scalars (CPU and CUDA read
 * 0-dim start/end tensors with item()). Node: da[0..1] start/end, ia[1..2] the same as
 * integers, ia[4] bit 0/1: start/end is an integer; da[2] base; ia[3] logspace. The
 * result keeps out's shape when it already has `steps` elements, as CPU does. */
static tpu_status_t build_linspace(tpu_build_t* b) {
  bool log = b->data != NULL;
  const tpu_view_t* out = NULL;
  int64_t steps;
  double base = 10.0;
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(out_arg(b, log ? 4 : 3, &out));
  TPU_RETURN_IF_ERROR(tpu__arg_double(b, 0, &n->da[0]));
  TPU_RETURN_IF_ERROR(tpu__arg_double(b, 1, &n->da[1]));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 2, &steps));
  if (log) TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, 3, 10.0, &base));
  if (steps < 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "number of steps must be non-negative");
  tpu_dtype_t t = out->dtype;
  const char* fn = log ? "logspace_cpu" : "linspace_cpu";
  if (t == TPU_DTYPE_BOOL && steps > 1)
    return tpu__err(b, TPU_UNIMPLEMENTED, "\"%s\" not implemented for 'Bool'", fn);
  bool fl[2];
  for (int k = 0; k < 2; ++k) {
    const tpu_arg_t* a = tpu__arg(b, k);
    fl[k] = arg_is_float(a);
    n->ia[1 + k] = fl[k] ? 0 : arg_i64(a);
  }
  if (steps == 1 && log) {
    /* fill_(pow(base, start)): the filled value is the checked one */
    TPU_RETURN_IF_ERROR(check_fits(b, true, pow(base, n->da[0]), 0, t));
  } else if (steps > 0) {
    for (int k = 0; k < (steps == 1 ? 1 : 2); ++k)
      TPU_RETURN_IF_ERROR(check_fits(b, fl[k], n->da[k], n->ia[1 + k], t));
  }
  n->kind = TPU_KIND_LINSPACE;
  n->ia[0] = steps;
  n->ia[3] = log;
  n->ia[4] = (int64_t)!fl[0] | (int64_t)!fl[1] << 1;
  n->da[2] = base;
  if (tpu_view_numel(out) == steps && out->ndim > 0) tpu__node_add_output(n, t, out->ndim, out->sizes);
  else tpu__node_add_output(n, t, 1, &steps);
  return NULL;
}

/* ---- searchsorted / bucketize ---------------------------------------------------------- */

enum { SS_BUCKETIZE = 1, SS_SCALAR = 2 };
static const int ss_tensor = 0, ss_scalar = SS_SCALAR, bk_tensor = SS_BUCKETIZE,
                 bk_scalar = SS_BUCKETIZE | SS_SCALAR;

/* searchsorted.Tensor(sorted_sequence, self, *, out_int32, right, side, sorter),
 * searchsorted.Scalar, bucketize.Tensor(self, boundaries, *, out_int32, right) and
 * bucketize.Scalar, with their out= forms. Checks in searchsorted_pre_check's order.
 * Node: in[0] boundaries, in[1] values (a scalar operand for the Scalar forms), in[2]
 * sorter or absent; ia[0] right, ia[1] the dtype both are compared in. */
static tpu_status_t build_searchsorted(tpu_build_t* b) {
  int flags = *(const int*)b->data;
  bool bucket = flags & SS_BUCKETIZE;
  int bi = bucket ? 1 : 0, vi = bucket ? 0 : 1;
  const tpu_view_t *bd, *v = NULL, *sorter = NULL;
  bool out_int32, right;
  const char* side = NULL;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, bi, &bd));
  /* a CPU 0-dim tensor arrives as a scalar: a 0-dim input */
  const tpu_arg_t* va = tpu__arg(b, vi);
  if (!(flags & SS_SCALAR) && !(va && va->kind == TPU_ARG_SCALAR)) TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, vi, &v));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 2, false, &out_int32));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 3, false, &right));
  if (!bucket) {
    const tpu_arg_t* s = tpu__arg(b, 4);
    if (s && s->kind == TPU_ARG_STRING) side = s->s;
    if (!tpu__arg_is_none(b, 5)) TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 5, &sorter));
  }
  if (bucket && bd->ndim != 1)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "boundaries tensor must be 1 dimension, but got dim(%d)", bd->ndim);
  const char* who = "torch.searchsorted()";
  if (side) {
    if (strcmp(side, "left") && strcmp(side, "right"))
      return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: side can only be 'left' or 'right' but got %s", who, side);
    if (right && strcmp(side, "right"))
      return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: side and right can't be set to opposites, got side of %s while "
                      "right was True", who, side);
    right = !strcmp(side, "right");
  }
  char s1[256], s2[256];
  if (sorter) {
    bool same = sorter->ndim == bd->ndim;
    for (int d = 0; same && d < bd->ndim; ++d) same = sorter->sizes[d] == bd->sizes[d];
    if (!same) {
      tpu__fmt_shape(s1, sizeof s1, bd->ndim, bd->sizes);
      tpu__fmt_shape(s2, sizeof s2, sorter->ndim, sorter->sizes);
      return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: boundary and sorter must have the same size, but got boundary "
                      "tensor %sand got sorter tensor %s", who, s1, s2);
    }
    if (sorter->dtype != TPU_DTYPE_I64)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: sorter must be a tensor of long dtype but got dtype %s", who,
                      tpu__dtype_c10_name(sorter->dtype));
  }
  int vnd = v ? v->ndim : 0;
  if (vnd == 0 && bd->ndim != 1)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: input value can be a scalar only when boundaries tensor dimension "
                    "is 1, but we got boundaries tensor dim(%d) and input value's dim(0) numel(1)", who, bd->ndim);
  if (bd->ndim == 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: boundaries tensor should have positive dimension, but got 0 "
                    "dimension", who);
  bool match = bd->ndim == 1 || bd->ndim == vnd;
  for (int d = 0; match && bd->ndim > 1 && d + 1 < bd->ndim; ++d) match = bd->sizes[d] == v->sizes[d];
  if (!match) {
    tpu__fmt_shape(s1, sizeof s1, bd->ndim, bd->sizes);
    tpu__fmt_shape(s2, sizeof s2, vnd, v ? v->sizes : NULL);
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: boundaries tensor should be 1 dimension or the first N-1 "
                    "dimensions of boundaries tensor and input value tensor must match, but we got boundaries "
                    "tensor %s and input value tensor %s", who, s1, s2);
  }
  tpu_dtype_t want = out_int32 ? TPU_DTYPE_I32 : TPU_DTYPE_I64;
  const tpu_view_t* out = NULL;
  if (b->variant == TPU_VARIANT_OUT) {
    TPU_RETURN_IF_ERROR(out_arg(b, b->nargs - 1, &out));
    if (out->dtype != want)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: output tensor's dtype is wrong, it can only be Int(int32) or "
                      "Long(int64) depending on whether out_int32 flag is True, but we got output tensor's dtype %s "
                      "and out_int32 flag is %s", who, tpu__dtype_c10_name(out->dtype), out_int32 ? "True" : "False");
  }
  if (out_int32 && bd->sizes[bd->ndim - 1] >= 2147483647)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s: the size of boundaries' last dimension should be less than "
                    "2147483647, but we got %lld", who, (long long)bd->sizes[bd->ndim - 1]);
  int idx[2] = {bi, vi};
  tpu_dtype_t common = tpu__result_type(b, idx, 2);
  if (common == TPU_DTYPE_BOOL)
    return tpu__err(b, TPU_UNIMPLEMENTED, "\"searchsorted_out_cpu\" not implemented for 'Bool'");
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, bd));
  TPU_RETURN_IF_ERROR(tpu__input_from_arg(b, vi));
  if (sorter) TPU_RETURN_IF_ERROR(tpu__node_add_input(n, sorter));
  else TPU_RETURN_IF_ERROR(tpu__node_add_absent(n));
  n->kind = TPU_KIND_SEARCHSORTED;
  n->ia[0] = right;
  n->ia[1] = common;
  tpu__node_add_output(n, want, vnd, v ? v->sizes : NULL);
  return NULL;
}

/* ---- isin ------------------------------------------------------------------------------ */

enum { ISIN_TT = 0, ISIN_TS = 1, ISIN_ST = 2 };
static const int isin_tt = ISIN_TT, isin_ts = ISIN_TS, isin_st = ISIN_ST;

/* isin.Tensor_Tensor(elements, test_elements, *, assume_unique, invert), isin.Tensor_Scalar,
 * isin.Scalar_Tensor and their out= forms. CPU compares each element with every test
 * element in result_type(elements, test_elements) when the test set is small (numpy's
 * heuristic), else sorts both in their promoted dtype; with assume_unique it then marks
 * the element of each adjacent equal pair, which differs from membership when the
 * inputs repeat. The kernel reproduces both. Node: in[0] elements, in[1] test elements
 * (either may be a scalar operand); ia[0] invert, ia[1] the comparison dtype, ia[2] 1
 * for the sorting path with assume_unique. */
static tpu_status_t build_isin(tpu_build_t* b) {
  int form = *(const int*)b->data;
  const tpu_view_t *el = NULL, *te = NULL;
  bool unique, invert;
  /* a CPU 0-dim tensor arrives as a scalar: it acts as a 0-dim tensor */
  const tpu_arg_t *a0 = tpu__arg(b, 0), *a1 = tpu__arg(b, 1);
  if (form != ISIN_ST && !(a0 && a0->kind == TPU_ARG_SCALAR)) TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &el));
  if (form != ISIN_TS && !(a1 && a1->kind == TPU_ARG_SCALAR)) TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &te));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 2, false, &unique));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 3, false, &invert));
  for (int k = 0; k < 2; ++k) {
    const tpu_arg_t* a = tpu__arg(b, k);
    if (!a || a->kind == TPU_ARG_NONE) return tpu__err(b, TPU_TYPE_ERROR, "argument %d must be a Tensor or Number", k);
    if (tpu__arg_dtype(a) == TPU_DTYPE_BOOL)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "Unsupported input type encountered for isin(): Bool");
  }
  if (b->variant == TPU_VARIANT_OUT) {
    const tpu_view_t* out;
    TPU_RETURN_IF_ERROR(out_arg(b, b->nargs - 1, &out));
    if (out->dtype != TPU_DTYPE_BOOL)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected out tensor to have dtype bool, but got %s instead",
                      tpu_dtype_name(out->dtype));
  }
  int64_t ne = el ? tpu_view_numel(el) : 1, nt = te ? tpu_view_numel(te) : 1;
  int idx[2] = {0, 1};
  tpu_dtype_t common = tpu__result_type(b, idx, 2);
  bool sorting = form != ISIN_TS && ne > 0 && !(nt < (int64_t)(10.0f * pow((double)ne, 0.145)));
  if (sorting) /* both are flattened to 1-d and concatenated: plain promotion */
    common = tpu__promote(tpu__arg_dtype(tpu__arg(b, 0)), tpu__arg_dtype(tpu__arg(b, 1)));
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__input_from_arg(b, 0));
  TPU_RETURN_IF_ERROR(tpu__input_from_arg(b, 1));
  n->kind = TPU_KIND_ISIN;
  n->ia[0] = invert;
  n->ia[1] = common;
  n->ia[2] = sorting && unique;
  tpu__node_add_output(n, TPU_DTYPE_BOOL, el ? el->ndim : 0, el ? el->sizes : NULL);
  return NULL;
}

/* ---- repeat_interleave ------------------------------------------------------------------- */

/* repeat_interleave.Tensor(repeats, *, output_size=None): [0]*r0 + [1]*r1 + ... in repeats'
 * dtype. Without output_size the length depends on the data: the builder reads repeats
 * back (a host-read cut point, as nonzero; CPU and CUDA synchronize there too) and the
 * kernel checks the sum again. The self_int/self_Tensor forms are composite over this
 * and index_select. Node: in[0] repeats; ia[0] the output length. */
static tpu_status_t build_repeat_interleave(tpu_build_t* b) {
  const tpu_view_t* r;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &r));
  if (!is_index_dtype(r->dtype))
    return tpu__err(b, TPU_UNIMPLEMENTED, "\"repeat_interleave_cpu\" not implemented for '%s'",
                    tpu__dtype_c10_name(r->dtype));
  if (r->ndim != 1) return tpu__err(b, TPU_INVALID_ARGUMENT, "repeat_interleave only accept 1D vector as repeat");
  int64_t total = 0, n = r->sizes[0];
  if (!tpu__arg_is_none(b, 1)) {
    TPU_RETURN_IF_ERROR(tpu__arg_int(b, 1, &total));
  } else if (n > 0) {
    bool wide = r->dtype == TPU_DTYPE_I64;
    void* buf = tpu__malloc((size_t)n * (wide ? 8 : 4));
    if (!buf) return tpu_status_make(TPU_OUT_OF_MEMORY, "host out of memory");
    tpu_status_t st = tpu_copy_to_host(r, buf);
    bool neg = false;
    for (int64_t i = 0; !st && i < n; ++i) {
      int64_t v = wide ? ((int64_t*)buf)[i] : ((int32_t*)buf)[i];
      total += v;
      neg |= v < 0;
    }
    tpu__free(buf);
    if (st) return tpu_status_annotate(st, "%s: reading repeats", b->name);
    if (neg) return tpu__err(b, TPU_INVALID_ARGUMENT, "repeats can not be negative");
  }
  if (n == 0) total = 0;
  if (total < 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "allocated size does not match required size");
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, r));
  b->node->kind = TPU_KIND_REPEAT_INTERLEAVE;
  b->node->ia[0] = total;
  tpu__node_add_output(b->node, r->dtype, 1, &total);
  return NULL;
}

/* ---- unique_consecutive, _assert_async ------------------------------------------------ */

/* unique_consecutive(self, return_inverse=False, return_counts=False, dim=None) [.out]:
 * the first of each run of equal elements (dim None: of the flattened input) or of equal
 * slices along dim. The run count sizes the outputs, so the builder reads self (a
 * host-read cut point, as nonzero); the kernel finds the runs again and fails if the
 * count changed. Outputs as ATen's CPU kernels: values (dim None: 1-d; else self's shape
 * with dim's size the run count), inverse (self's shape for dim None, else [size(dim)]),
 * counts ([runs]), both int64; with dim None each is [0] when not asked for (with a dim,
 * CPU computes and returns both whatever the flags say). Node UNIQUE_CONSECUTIVE: in[0] self; ia[0] runs, ia[1] dim (-1: None), ia[2]
 * inverse asked, ia[3] counts asked. */
static tpu_status_t build_unique_consecutive(tpu_build_t* b) {
  const tpu_view_t* x;
  bool want_inv, want_cnt;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 1, false, &want_inv));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 2, false, &want_cnt));
  int dim = -1;
  if (!tpu__arg_is_none(b, 3)) {
    int64_t d64;
    TPU_RETURN_IF_ERROR(tpu__arg_int(b, 3, &d64));
    if (x->ndim == 0)
      return tpu__err(b, TPU_INDEX_ERROR, "Dimension specified as %lld but tensor has no dimensions", (long long)d64);
    TPU_RETURN_IF_ERROR(tpu__wrap_dim(b, d64, x->ndim, &dim));
  }
  const int64_t n = tpu_view_numel(x);
  int64_t slices = n, len = 1;
  if (dim >= 0) {
    int zeros = 0;
    for (int d = 0; d < x->ndim; ++d) zeros += x->sizes[d] == 0;
    if (x->sizes[dim] == 0 && zeros > 1)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "Number of zero sized dimensions is more than one, so unique cannot be applied ");
    if (x->sizes[dim] != 0 && zeros > 0)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "There are 0 sized dimensions, and they aren't selected, so unique cannot be applied");
    slices = x->sizes[dim];
    len = slices ? n / slices : 0;
  }
  int64_t runs = 0;
  if (n > 0) {
    uint64_t bytes;
    if (!tpu__mul_ok((uint64_t)n, tpu_dtype_size(x->dtype), &bytes)) return tpu__err(b, TPU_INVALID_ARGUMENT, "tensor too large");
    void* buf = tpu__malloc(bytes);
    if (!buf) return tpu_status_make(TPU_OUT_OF_MEMORY, "host out of memory");
    tpu_status_t st = tpu_copy_to_host(x, buf);
    if (st) { tpu__free(buf); return tpu_status_annotate(st, "%s: reading the input", b->name); }
    /* row-major bytes: slices along dim are strided; the builder only needs the count,
     * which the kernel's permuted layout gives the same way */
    if (dim > 0) {
      void* p = tpu__malloc(bytes);
      if (!p) { tpu__free(buf); return tpu_status_make(TPU_OUT_OF_MEMORY, "host out of memory"); }
      size_t es = tpu_dtype_size(x->dtype);
      int64_t outer = 1, inner = 1, sd = x->sizes[dim];
      for (int d = 0; d < dim; ++d) outer *= x->sizes[d];
      for (int d = dim + 1; d < x->ndim; ++d) inner *= x->sizes[d];
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t s = 0; s < sd; ++s)
          memcpy((char*)p + ((size_t)(s * outer + o) * (size_t)inner) * es,
                 (char*)buf + ((size_t)(o * sd + s) * (size_t)inner) * es, (size_t)inner * es);
      tpu__free(buf);
      buf = p;
    }
    runs = tpu__runs(buf, x->dtype, slices, len, NULL);
    tpu__free(buf);
  }
  tpu_node_t* node = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(node, x));
  node->kind = TPU_KIND_UNIQUE_CONSECUTIVE;
  node->ia[0] = runs;
  node->ia[1] = dim;
  int64_t vshape[TPU_MAX_DIMS], zero = 0;
  if (dim < 0) {
    tpu__node_add_output(node, x->dtype, 1, &runs);
  } else {
    memcpy(vshape, x->sizes, sizeof(int64_t) * (size_t)x->ndim);
    vshape[dim] = runs;
    tpu__node_add_output(node, x->dtype, x->ndim, vshape);
  }
  if (dim >= 0) want_inv = want_cnt = true; /* CPU's unique_dim_consecutive gives both always */
  node->ia[2] = want_inv;
  node->ia[3] = want_cnt;
  if (!want_inv) tpu__node_add_output(node, TPU_DTYPE_I64, 1, &zero);
  else if (dim < 0) tpu__node_add_output(node, TPU_DTYPE_I64, x->ndim, x->sizes);
  else tpu__node_add_output(node, TPU_DTYPE_I64, 1, &x->sizes[dim]);
  tpu__node_add_output(node, TPU_DTYPE_I64, 1, want_cnt ? &runs : &zero);
  return tpu__out_dtypes_exact(b);
}

/* _unique2(self, sorted=True, return_inverse=False, return_counts=False) [.out]: the
 * distinct values of self in ascending order (NaN last, each NaN its own value, -0.0 and
 * 0.0 one value, the first of them in input order kept), the index of each element's
 * value (self's shape) and each value's count; an output not asked for is [0]. CPU sorts
 * whatever `sorted` says, and so does this. The value count sizes the outputs, so the
 * builder reads self (a host-read cut point, as nonzero); the kernel finds the groups
 * again. Node UNIQUE: in[0] self; ia[0] groups, ia[1] inverse asked, ia[2] counts asked. */
static tpu_status_t build_unique2(tpu_build_t* b) {
  const tpu_view_t* x;
  bool want_inv, want_cnt, sorted_;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 1, true, &sorted_));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 2, false, &want_inv));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 3, false, &want_cnt));
  if (tpu_dtype_is_complex(x->dtype)) return tpu__err(b, TPU_UNIMPLEMENTED, "complex input");
  const int64_t n = tpu_view_numel(x);
  int64_t groups = 0;
  if (n > 0) {
    uint64_t bytes;
    if (!tpu__mul_ok((uint64_t)n, tpu_dtype_size(x->dtype) + sizeof(int64_t), &bytes))
      return tpu__err(b, TPU_INVALID_ARGUMENT, "tensor too large");
    void* buf = tpu__malloc((size_t)n * tpu_dtype_size(x->dtype));
    int64_t* order = tpu__malloc((size_t)n * sizeof(int64_t));
    if (!buf || !order) { tpu__free(buf); tpu__free(order); return tpu_status_make(TPU_OUT_OF_MEMORY, "host out of memory"); }
    tpu_status_t st = tpu_copy_to_host(x, buf);
    if (!st) groups = tpu__unique_groups(buf, x->dtype, n, order, NULL);
    tpu__free(buf);
    tpu__free(order);
    if (st) return tpu_status_annotate(st, "%s: reading the input", b->name);
    if (groups < 0) return tpu_status_make(TPU_OUT_OF_MEMORY, "host out of memory");
  }
  tpu_node_t* node = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(node, x));
  node->kind = TPU_KIND_UNIQUE;
  node->ia[0] = groups;
  node->ia[1] = want_inv;
  node->ia[2] = want_cnt;
  int64_t zero = 0;
  tpu__node_add_output(node, x->dtype, 1, &groups);
  if (want_inv) tpu__node_add_output(node, TPU_DTYPE_I64, x->ndim, x->sizes);
  else tpu__node_add_output(node, TPU_DTYPE_I64, 1, &zero);
  tpu__node_add_output(node, TPU_DTYPE_I64, 1, want_cnt ? &groups : &zero);
  return tpu__out_dtypes_exact(b);
}

/* _assert_async(self) / _assert_async.msg(self, assert_msg): self (one element) must be
 * nonzero. The element count is checked here, at the call; the value when the node runs,
 * as on CUDA: a zero is the op's error, reported like any running op's (strict and
 * defer_and_fuse: by the next synchronization, naming the op; debug: at the call). The
 * message is ATen's: the given one, "Assertion is failed" for an empty one, and
 * "Expected Tensor with single nonzero value, but got zero" without one. Node
 * ASSERT_NONZERO: in[0] self; no outputs; ilist holds the message's bytes, NUL-ended. */
static tpu_status_t build_assert_async(tpu_build_t* b) {
  const tpu_view_t* x;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  int64_t n = tpu_view_numel(x);
  if (n == 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "Boolean value of Tensor with no values is ambiguous");
  if (n > 1) return tpu__err(b, TPU_INVALID_ARGUMENT, "Boolean value of Tensor with more than one value is ambiguous");
  const char* msg = "Expected Tensor with single nonzero value, but got zero";
  const tpu_arg_t* a = tpu__arg(b, 1);
  if (a && a->kind == TPU_ARG_STRING && a->s) msg = *a->s ? a->s : "Assertion is failed";
  size_t len = strlen(msg);
  if (len > 4096) len = 4096;
  int64_t words[4096 / 8 + 1];
  memset(words, 0, sizeof words);
  memcpy(words, msg, len);
  TPU_RETURN_IF_ERROR(tpu__node_set_ilist(b->node, words, (int)(len / 8 + 1)));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, x));
  b->node->kind = TPU_KIND_ASSERT_NONZERO;
  return NULL;
}

/* ---- table ------------------------------------------------------------------------ */

static const int yes = 1;

const tpu_aten_entry_t tpu__aten_index[] = {
    {"gather", build_gather, NULL}, {"gather.out", build_gather, NULL},
    {"scatter.src", build_scatter, &sc_src}, {"scatter_.src", build_scatter, &sc_src},
    {"scatter.src_out", build_scatter, &sc_src},
    {"scatter.value", build_scatter, &sc_value}, {"scatter_.value", build_scatter, &sc_value},
    {"scatter.value_out", build_scatter, &sc_value},
    {"scatter.reduce", build_scatter, &sc_src_reduce}, {"scatter_.reduce", build_scatter, &sc_src_reduce},
    {"scatter.reduce_out", build_scatter, &sc_src_reduce},
    {"scatter.value_reduce", build_scatter, &sc_value_reduce},
    {"scatter_.value_reduce", build_scatter, &sc_value_reduce},
    {"scatter.value_reduce_out", build_scatter, &sc_value_reduce},
    {"scatter_add", build_scatter, &sc_add}, {"scatter_add_", build_scatter, &sc_add},
    {"scatter_add.out", build_scatter, &sc_add},
    {"scatter_reduce.two", build_scatter, &sc_two}, {"scatter_reduce_.two", build_scatter, &sc_two},
    {"scatter_reduce.two_out", build_scatter, &sc_two},
    {"index_select", build_index_select, NULL, TPU_ATEN_COMPLEX}, {"index_select.out", build_index_select, NULL, TPU_ATEN_COMPLEX},
    {"index_add", build_index_acc, &yes}, {"index_add_", build_index_acc, &yes},
    {"index_add.out", build_index_acc, &yes},
    {"index_copy", build_index_acc, NULL}, {"index_copy_", build_index_acc, NULL},
    {"index_copy.out", build_index_acc, NULL},
    {"index.Tensor", build_index, NULL, TPU_ATEN_COMPLEX}, {"index.Tensor_out", build_index, NULL, TPU_ATEN_COMPLEX},
    {"_index_put_impl_", build_index_put, NULL},
    {"masked_select", build_masked_select, NULL}, {"masked_select.out", build_masked_select, NULL},
    {"masked_scatter_", build_masked_scatter, NULL},
    {"nonzero", build_nonzero, NULL}, {"nonzero.out", build_nonzero, NULL},
    {"bincount", build_bincount, NULL},
    {"unique_consecutive", build_unique_consecutive, NULL},
    {"unique_consecutive.out", build_unique_consecutive, NULL},
    {"_unique2", build_unique2, NULL}, {"_unique2.out", build_unique2, NULL},
    {"_assert_async", build_assert_async, NULL, TPU_ATEN_COMPLEX},
    {"_assert_async.msg", build_assert_async, NULL, TPU_ATEN_COMPLEX},
    {"cat", build_cat, NULL, TPU_ATEN_COMPLEX}, {"cat.out", build_cat, NULL, TPU_ATEN_COMPLEX},
    {"flip", build_flip, NULL, TPU_ATEN_COMPLEX},
    {"unfold_backward", build_unfold_backward, NULL},
    {"roll", build_roll, NULL, TPU_ATEN_COMPLEX},
    {"repeat", build_repeat, NULL, TPU_ATEN_COMPLEX},
    {"constant_pad_nd", build_pad, NULL, TPU_ATEN_COMPLEX},
    {"tril", build_tri, NULL, TPU_ATEN_COMPLEX}, {"tril_", build_tri, NULL, TPU_ATEN_COMPLEX}, {"tril.out", build_tri, NULL, TPU_ATEN_COMPLEX},
    {"triu", build_tri, &yes, TPU_ATEN_COMPLEX}, {"triu_", build_tri, &yes, TPU_ATEN_COMPLEX}, {"triu.out", build_tri, &yes, TPU_ATEN_COMPLEX},
    {"sort.stable", build_sort, NULL}, {"sort.values_stable", build_sort, NULL},
    {"topk", build_topk, NULL}, {"topk.values", build_topk, NULL},
    {"arange.start_out", build_arange, NULL},
    {"eye.out", build_eye, NULL}, {"eye.m_out", build_eye, &yes},
    {"linspace.out", build_linspace, NULL}, {"logspace.out", build_linspace, &yes},
    {"searchsorted.Tensor", build_searchsorted, &ss_tensor},
    {"searchsorted.Tensor_out", build_searchsorted, &ss_tensor},
    {"searchsorted.Scalar", build_searchsorted, &ss_scalar},
    {"searchsorted.Scalar_out", build_searchsorted, &ss_scalar},
    {"bucketize.Tensor", build_searchsorted, &bk_tensor},
    {"bucketize.Tensor_out", build_searchsorted, &bk_tensor},
    {"bucketize.Scalar", build_searchsorted, &bk_scalar},
    {"bucketize.Scalar_out", build_searchsorted, &bk_scalar},
    {"isin.Tensor_Tensor", build_isin, &isin_tt}, {"isin.Tensor_Tensor_out", build_isin, &isin_tt},
    {"isin.Tensor_Scalar", build_isin, &isin_ts}, {"isin.Tensor_Scalar_out", build_isin, &isin_ts},
    {"isin.Scalar_Tensor", build_isin, &isin_st}, {"isin.Scalar_Tensor_out", build_isin, &isin_st},
    {"repeat_interleave.Tensor", build_repeat_interleave, NULL},
    {"repeat_interleave.Tensor_out", build_repeat_interleave, NULL},
    {NULL, NULL, NULL},
};
