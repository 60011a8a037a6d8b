/* The ATen op table: the concatenation of every family's entries, and tpu_op_prepare. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aten/aten.h"

static const tpu_aten_entry_t** entries;
/* Per entry: the builder for calls with a complex argument or output (NULL: none). */
static const tpu_aten_entry_t** complex_entries;
static int n_entries;
/* Entry indices sorted by name (find_entry's binary search). */
static int* by_name;
/* Per entry: the element op's index of a foreach entry (-1: none, or not a foreach). */
static int* element_of;
/* Per entry: its out= dtype rule (out_rule_t). */
static unsigned char* out_rule;
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static const tpu_aten_entry_t* const families[] = {
#define TPU__FAM(f) tpu__aten_##f,
    TPU_ATEN_FAMILIES(TPU__FAM)
#undef TPU__FAM
};

/* out= tensors of another dtype than the result's. ATen's CPU kernels differ: TensorIterator
 * ops cast into any dtype the result can be cast to (checked in tpu_node_bind_output: the
 * default), structured kernels and some others require the result's dtype exactly, each
 * with its own message. Found by calling every OpInfo op that has out= with out= tensors
 * of float64, float16 and int64 on CPU; the OpInfo runner's out_dtype variant keeps it. */
typedef enum { OUT_CAST, OUT_EXACT, OUT_FOUND, OUT_WHERE, OUT_RESULT, OUT_SELF_RESULT, OUT_SCALAR_TYPE,
               OUT_NAN_TO_NUM, OUT_CAT } out_rule_t;
static const struct { const char* name; out_rule_t rule; } out_rules[] = {
    /* structured kernels' generated out= wrappers */
    {"addmm.out", OUT_EXACT}, {"addmv.out", OUT_EXACT}, {"addbmm.out", OUT_EXACT}, {"baddbmm.out", OUT_EXACT},
    {"bmm.out", OUT_EXACT}, {"mm.out", OUT_EXACT}, {"mv.out", OUT_EXACT}, {"avg_pool2d.out", OUT_EXACT},
    {"avg_pool3d.out", OUT_EXACT}, {"topk.values", OUT_EXACT}, {"sort.values_stable", OUT_EXACT},
    {"gather.out", OUT_EXACT}, {"index_copy.out", OUT_EXACT}, {"index_add.out", OUT_EXACT},
    {"scatter.src_out", OUT_EXACT}, {"scatter.value_out", OUT_EXACT}, {"scatter.reduce_out", OUT_EXACT},
    {"scatter.value_reduce_out", OUT_EXACT}, {"scatter_add.out", OUT_EXACT}, {"scatter_reduce.two_out", OUT_EXACT},
    {"tril.out", OUT_EXACT}, {"triu.out", OUT_EXACT},
    /* TensorIterator ops built with check_all_same_dtype */
    {"abs.out", OUT_FOUND}, {"ceil.out", OUT_FOUND}, {"floor.out", OUT_FOUND}, {"round.out", OUT_FOUND},
    {"round.decimals_out", OUT_FOUND}, {"trunc.out", OUT_FOUND}, {"frac.out", OUT_FOUND}, {"sign.out", OUT_FOUND},
    {"sgn.out", OUT_FOUND}, {"neg.out", OUT_FOUND}, {"conj_physical.out", OUT_FOUND}, {"gelu.out", OUT_FOUND},
    {"softplus.out", OUT_FOUND}, {"hardshrink.out", OUT_FOUND}, {"softshrink.out", OUT_FOUND},
    {"heaviside.out", OUT_FOUND},
    /* kernels with checks of their own */
    {"where.self_out", OUT_WHERE}, {"dot.out", OUT_RESULT}, {"vdot.out", OUT_RESULT},
    {"index_select.out", OUT_SELF_RESULT}, {"masked_select.out", OUT_SELF_RESULT},
    {"log_sigmoid_forward.output", OUT_SCALAR_TYPE}, {"_native_batch_norm_legit.out", OUT_SCALAR_TYPE},
    {"_native_batch_norm_legit.no_stats_out", OUT_SCALAR_TYPE}, {"nan_to_num.out", OUT_NAN_TO_NUM},
    {"cat.out", OUT_CAT}, /* casts, but refuses what it cannot cast with a TypeError */
};

/* The out= dtype check of `rule` for a built OUT node (NULL: every out= tensor passes). */
static tpu_status_t check_out_dtypes(tpu_build_t* b, out_rule_t rule) {
  const tpu_node_t* n = b->node;
  for (int k = 0; k < n->n_out; ++k) {
    const tpu_arg_t* a = tpu__arg(b, b->nargs - n->n_out + k);
    if (!a || a->kind != TPU_ARG_TENSOR || tpu__output_absent(&n->out[k])) continue;
    tpu_dtype_t want = n->out[k].dtype, got = a->tensor.dtype;
    if (got == want) continue;
    const char *w = tpu__dtype_c10_name(want), *g = tpu__dtype_c10_name(got);
    switch (rule) {
      case OUT_CAST: return NULL;
      case OUT_EXACT: return tpu__out_dtypes_exact(b);
      case OUT_FOUND: return tpu__err(b, TPU_INVALID_ARGUMENT, "Found dtype %s but expected %s", g, w);
      case OUT_WHERE: return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected out type to be %s but got %s", w, g);
      case OUT_RESULT:
        return tpu__err(b, TPU_INVALID_ARGUMENT, "result dtype %s does not match input dtype %s", g, w);
      case OUT_SELF_RESULT: {
        int len = (int)strcspn(b->name, ".");
        return tpu__err(b, TPU_INVALID_ARGUMENT, "%.*s(): self and result must have the same scalar type",
                        len, b->name);
      }
      case OUT_SCALAR_TYPE: return tpu__err(b, TPU_INVALID_ARGUMENT, "expected scalar type %s but found %s", w, g);
      case OUT_NAN_TO_NUM:
        return tpu__err(b, TPU_INVALID_ARGUMENT, "nan_to_num: dtype of out: %s should be same as input: %s", g, w);
      case OUT_CAT:
        if (tpu__can_cast(want, got)) continue;
        return tpu__err(b, TPU_TYPE_ERROR, "torch.cat(): input types can't be cast to the desired output type %s", g);
    }
  }
  return NULL;
}

static int by_entry_name(const void* a, const void* b) {
  return strcmp(entries[*(const int*)a]->name, entries[*(const int*)b]->name);
}

/* The entry named `name` (-1: none); the table must be built. */
static int find_entry(const char* name) {
  int lo = 0, hi = n_entries - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2;
    int c = strcmp(entries[by_name[mid]]->name, name);
    if (!c) return by_name[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid - 1;
  }
  return -1;
}

static void build_table(void) {
  int n = 0;
  for (size_t f = 0; f < sizeof families / sizeof *families; ++f)
    for (const tpu_aten_entry_t* e = families[f]; e->name; ++e) ++n;
  entries = tpu__calloc((size_t)n, sizeof(*entries));
  if (!entries) return;
  complex_entries = tpu__calloc((size_t)n, sizeof(*complex_entries));
  if (!complex_entries) { tpu__free(entries); entries = NULL; return; }
  for (size_t f = 0; f < sizeof families / sizeof *families; ++f)
    for (const tpu_aten_entry_t* e = families[f]; e->name; ++e) {
      const tpu_aten_entry_t* c = families[f] == tpu__aten_complex || (e->flags & TPU_ATEN_COMPLEX) ? e : NULL;
      for (const tpu_aten_entry_t* a = tpu__aten_complex_alt; !c && a->name; ++a)
        if (!strcmp(a->name, e->name)) c = a;
      complex_entries[n_entries] = c;
      entries[n_entries++] = e;
    }
  by_name = tpu__calloc((size_t)n, sizeof(*by_name));
  element_of = tpu__calloc((size_t)n, sizeof(*element_of));
  out_rule = tpu__calloc((size_t)n, sizeof(*out_rule));
  if (!by_name || !element_of || !out_rule) {
    tpu__free(entries);
    tpu__free(complex_entries);
    tpu__free(by_name);
    tpu__free(element_of);
    tpu__free(out_rule);
    entries = NULL;
    n_entries = 0;
    return;
  }
  for (int i = 0; i < n; ++i) by_name[i] = i;
  qsort(by_name, (size_t)n, sizeof(*by_name), by_entry_name);
  for (int i = 0; i < n; ++i)
    element_of[i] = entries[i]->flags & TPU_ATEN_FOREACH ? find_entry(tpu__foreach_element(entries[i])) : -1;
  for (size_t r = 0; r < sizeof out_rules / sizeof *out_rules; ++r) {
    int i = find_entry(out_rules[r].name);
    if (i >= 0) out_rule[i] = (unsigned char)out_rules[r].rule;
  }
}

/* The first complex dtype among the call's tensors and numbers (INVALID: none). */
static tpu_dtype_t complex_arg(const tpu_arg_t* args, int nargs) {
  for (int i = 0; i < nargs; ++i) {
    const tpu_arg_t* a = &args[i];
    if (a->kind == TPU_ARG_TENSOR && a->tensor.storage && tpu_dtype_is_complex(a->tensor.dtype))
      return a->tensor.dtype;
    if (a->kind == TPU_ARG_SCALAR && a->scalar_kind == TPU_SCALAR_COMPLEX)
      return TPU_DTYPE_C128;
    if (a->kind == TPU_ARG_SCALAR && a->scalar_is_tensor && tpu_dtype_is_complex(a->scalar_dtype))
      return a->scalar_dtype;
    if (a->kind == TPU_ARG_TENSORLIST)
      for (int64_t k = 0; k < a->list_len; ++k)
        if (a->tensors[k].storage && tpu_dtype_is_complex(a->tensors[k].dtype)) return a->tensors[k].dtype;
  }
  return TPU_DTYPE_INVALID;
}

int tpu_aten_op_count(void) {
  pthread_once(&table_once, build_table);
  return n_entries;
}

const char* tpu_aten_op_name(int i) {
  return i >= 0 && i < tpu_aten_op_count() ? entries[i]->name : NULL;
}

bool tpu_aten_op_needs_seed(int i) {
  return i >= 0 && i < tpu_aten_op_count() && (entries[i]->flags & TPU_ATEN_NEEDS_SEED);
}

bool tpu_aten_op_resizes_self(int i) {
  return i >= 0 && i < tpu_aten_op_count() && (entries[i]->flags & TPU_ATEN_RESIZES_SELF);
}

/* ATen's per-op exceptions to its memory-overlap rules, by schema name without the
 * overload ("fill_" or "aten::fill_"). */
int tpu_aten_overlap_rule(const char* schema_name) {
  static const struct { const char* name; int rule; } rules[] = {
      /* fill_ skips the check; the others warn that writing an expanded tensor is deprecated */
      {"fill_", TPU_OVERLAP_EXPANDED_WRITE_OK}, {"zero_", TPU_OVERLAP_EXPANDED_WRITE_OK},
      {"masked_fill_", TPU_OVERLAP_EXPANDED_WRITE_OK}, {"index_put_", TPU_OVERLAP_EXPANDED_WRITE_OK},
      {"_index_put_impl_", TPU_OVERLAP_EXPANDED_WRITE_OK}, {"index_fill_", TPU_OVERLAP_EXPANDED_WRITE_OK},
      {"put_", TPU_OVERLAP_EXPANDED_WRITE_OK},
      /* CPU kernels that assert no overlap at all (ops libtpurt leaves to the CPU fallback,
       * whose host copies never alias; native kinds answer tpu_node_may_alias_input) */
      {"take", TPU_OVERLAP_NO_FULL_ALIAS}, {"kthvalue", TPU_OVERLAP_NO_FULL_ALIAS},
  };
  if (!schema_name) return 0;
  if (!strncmp(schema_name, "aten::", 6)) schema_name += 6;
  for (size_t i = 0; i < sizeof rules / sizeof rules[0]; ++i)
    if (!strcmp(rules[i].name, schema_name)) return rules[i].rule;
  return 0;
}

/* ATen's is_non_overlapping_and_dense: empty (contiguous, for ATen), or, ignoring dims
 * of size < 2, the strides sorted ascending are a contiguous tensor's. */
static bool non_overlapping_and_dense(const tpu_view_t* v) {
  if (tpu_view_numel(v) == 0) return true;
  int perm[TPU_MAX_DIMS], m = 0;
  for (int d = 0; d < v->ndim; ++d)
    if (v->sizes[d] >= 2) perm[m++] = d;
  for (int i = 1; i < m; ++i) { /* insertion sort by stride */
    int p = perm[i], j = i;
    for (; j > 0 && v->strides[perm[j - 1]] > v->strides[p]; --j) perm[j] = perm[j - 1];
    perm[j] = p;
  }
  int64_t want = 1;
  for (int i = 0; i < m; ++i) {
    if (v->strides[perm[i]] != want) return false;
    want *= v->sizes[perm[i]];
  }
  return true;
}

typedef enum { OVERLAP_NO, OVERLAP_FULL, OVERLAP_PARTIAL, OVERLAP_TOO_HARD } overlap_t;

/* at::get_overlap_status(a, b); b == a means the same tensor. */
static overlap_t overlap_status(const tpu_view_t* a, const tpu_view_t* b) {
  if (a == b) return OVERLAP_FULL;
  int64_t na = tpu_view_numel(a), nb = tpu_view_numel(b);
  if (na == 0 || nb == 0) return OVERLAP_NO;
  if (!non_overlapping_and_dense(a) || !non_overlapping_and_dense(b)) return OVERLAP_TOO_HARD;
  if (!a->storage || a->storage != b->storage) return OVERLAP_NO;
  int64_t ea = (int64_t)tpu_dtype_size(a->dtype), eb = (int64_t)tpu_dtype_size(b->dtype);
  int64_t a0 = a->offset * ea, a1 = a0 + na * ea, b0 = b->offset * eb, b1 = b0 + nb * eb;
  if (a0 == b0 && a1 == b1) {
    bool same = a->ndim == b->ndim;
    for (int d = 0; same && d < a->ndim; ++d) same = a->strides[d] == b->strides[d];
    return same ? OVERLAP_FULL : OVERLAP_PARTIAL;
  }
  return a0 < b1 && b0 < a1 ? OVERLAP_PARTIAL : OVERLAP_NO;
}

tpu_status_t tpu_aten_check_overlap(const char* op, const tpu_view_t* w, const tpu_view_t* const* ins,
                                    int n_ins, bool in_place, bool may_alias) {
  if (!non_overlapping_and_dense(w) && !(in_place && (tpu_aten_overlap_rule(op) & TPU_OVERLAP_EXPANDED_WRITE_OK)))
    for (int d = 0; d < w->ndim; ++d)
      if (w->strides[d] == 0 && w->sizes[d] > 1)
        return tpu_status_make(TPU_INVALID_ARGUMENT,
                               "%s: unsupported operation: more than one element of the written-to tensor refers "
                               "to a single memory location. Please clone() the tensor before performing the "
                               "operation.", op);
  for (int i = 0; i < n_ins; ++i) {
    if (ins[i] == w && may_alias) continue;
    overlap_t st = overlap_status(w, ins[i]);
    if (st == OVERLAP_PARTIAL || (st == OVERLAP_FULL && !may_alias))
      return tpu_status_make(TPU_INVALID_ARGUMENT,
                             "%s: unsupported operation: some elements of the input tensor and the written-to "
                             "tensor refer to a single memory location. Please clone() the tensor before "
                             "performing the operation.", op);
  }
  return NULL;
}

const char* tpu_node_name(const tpu_node_t* n) { return tpu__node_describe(n); }

const char* tpu__node_describe(const tpu_node_t* n) {
  const char* name = tpu_aten_op_name(n->aten_index);
  return name ? name : tpu__kind_name(n->kind);
}

const char* tpu__kind_name(tpu_kind_t k) {
  static const char* const names[] = {
#define TPU_KIND(name) #name,
#include "core/kinds.def"
#undef TPU_KIND
  };
  return k >= 0 && k < TPU_KIND_COUNT ? names[k] : "unknown";
}

tpu_status_t tpu_op_prepare(int index, tpu_variant_t variant, const tpu_arg_t* args,
                            int nargs, tpu_node_t** out_node) {
  if (index < 0 || index >= tpu_aten_op_count())
    return tpu_status_make(TPU_INTERNAL, "no ATen entry %d", index);
  const tpu_aten_entry_t* e = entries[index];
  tpu_dtype_t cplx = complex_arg(args, nargs);
  if (cplx != TPU_DTYPE_INVALID) {
    if (!complex_entries[index])
      return tpu_status_make(TPU_UNIMPLEMENTED, "%s: not implemented on tpu for complex dtypes (got %s)",
                             e->name, tpu__dtype_c10_name(cplx));
    e = complex_entries[index];
  }
  tpu_node_t* n = tpu__node_create();
  if (!n) return tpu_status_make(TPU_OUT_OF_MEMORY, "host out of memory");
  n->aten_index = index;
  n->variant = variant;
  tpu_build_t b = {e->name, variant, args, nargs, n, e->data};
  tpu_status_t st = e->build(&b);
  if (!st && variant == TPU_VARIANT_OUT) st = check_out_dtypes(&b, (out_rule_t)out_rule[index]);
  /* An op whose dtype argument asks for a complex result from real inputs. */
  for (int i = 0; !st && e != complex_entries[index] && i < n->n_out; ++i)
    if (!tpu__output_absent(&n->out[i]) && tpu_dtype_is_complex(n->out[i].dtype))
      st = tpu_status_make(TPU_UNIMPLEMENTED, "%s: not implemented on tpu for complex dtypes (got %s)",
                           e->name, tpu__dtype_c10_name(n->out[i].dtype));
  if (st) { tpu__node_free(n); return st; }
  *out_node = n;
  return NULL;
}

bool tpu_aten_op_is_foreach(int index) {
  return index >= 0 && index < tpu_aten_op_count() && (entries[index]->flags & TPU_ATEN_FOREACH);
}

tpu_status_t tpu_foreach_length(int index, const tpu_arg_t* args, int nargs, int64_t* out_len) {
  if (!tpu_aten_op_is_foreach(index)) return tpu_status_make(TPU_INTERNAL, "entry %d is not a foreach op", index);
  return tpu__foreach_length(entries[index], args, nargs, out_len);
}

tpu_status_t tpu_foreach_prepare(int index, tpu_variant_t variant, const tpu_arg_t* args,
                                 int nargs, int64_t k, tpu_node_t** out_node) {
  if (!tpu_aten_op_is_foreach(index)) return tpu_status_make(TPU_INTERNAL, "entry %d is not a foreach op", index);
  const tpu_aten_entry_t* e = entries[index];
  if (element_of[index] < 0)
    return tpu_status_make(TPU_UNIMPLEMENTED, "%s: its element op %s is not implemented on tpu", e->name,
                           tpu__foreach_element(e));
  tpu_arg_t el[TPU_FOREACH_MAX_ARGS];
  int n = 0;
  TPU_RETURN_IF_ERROR(tpu__foreach_args(e, args, nargs, k, el, &n));
  TPU_RETURN_IF_ERROR(tpu_op_prepare(element_of[index], variant, el, n, out_node));
  (*out_node)->aten_index = index; /* named as the op the user called */
  return NULL;
}

tpu_status_t tpu__build_then(tpu_build_t* b, const char* op, const tpu_arg_t* extra, int n) {
  tpu_node_t* node = b->node;
  if (n + 1 > TPU_THEN_MAX_ARGS || node->n_out < 1 || node->then)
    return tpu_status_make(TPU_INTERNAL, "%s: bad follow-up %s", b->name, op);
  int index = find_entry(op);
  if (index < 0) return tpu_status_make(TPU_INTERNAL, "%s: no ATen entry %s", b->name, op);
  tpu_then_t* t = tpu__calloc(1, sizeof(*t));
  if (!t) return tpu_status_make(TPU_OUT_OF_MEMORY, "host out of memory");
  t->index = index;
  t->nargs = n + 1;
  for (int i = 0; i < n; ++i) t->args[i + 1] = extra[i];
  /* Validation on output 0 as declared: a dense view of a stand-in storage (the
   * follow-up's builder only reads metadata and takes no reference to a NULL value). */
  const tpu_operand_t* o = &node->out[0];
  tpu_storage_t standin;
  memset(&standin, 0, sizeof standin);
  tpu_view_t v;
  memset(&v, 0, sizeof v);
  v.storage = &standin;
  v.dtype = o->dtype;
  v.ndim = o->ndim;
  int64_t st = 1;
  for (int d = o->ndim - 1; d >= 0; --d) { v.sizes[d] = o->sizes[d]; v.strides[d] = st; st *= o->sizes[d]; }
  t->args[0].kind = TPU_ARG_TENSOR;
  t->args[0].tensor = v;
  tpu_node_t* f = NULL;
  tpu_status_t s = tpu_op_prepare(index, TPU_VARIANT_INPLACE, t->args, t->nargs, &f);
  tpu_node_discard(f);
  if (s) { tpu__free(t); return s; }
  node->then = t;
  return NULL;
}

/* Builds the node's follow-up on output 0 as bound, then queues the node and it. */
static tpu_status_t submit_with_then(tpu_node_t* n) {
  tpu_then_t* t = n->then;
  n->then = NULL;
  tpu_status_t st = t->bound ? NULL : tpu_status_make(TPU_INTERNAL, "%s: output 0 not bound", tpu__node_describe(n));
  tpu_node_t* f = NULL;
  if (!st) {
    t->args[0].kind = TPU_ARG_TENSOR;
    t->args[0].tensor = t->out_view;
    st = tpu_op_prepare(t->index, TPU_VARIANT_INPLACE, t->args, t->nargs, &f);
  }
  if (!st) st = tpu_node_bind_output(f, 0, &t->out_view);
  tpu__free(t);
  if (st) { tpu_node_discard(f); tpu__node_free(n); return st; }
  f->aten_index = n->aten_index; /* named as the op the user called */
  st = tpu_node_submit(n);
  if (st) { tpu_node_discard(f); return st; }
  return tpu_node_submit(f);
}

tpu_status_t tpu_node_submit(tpu_node_t* n) {
  if (n->then) return submit_with_then(n);
  int device = -1;
  for (int i = 0; i < n->n_out && device < 0; ++i)
    if (n->out_bound[i]) device = n->out[i].value->device;
  for (int i = 0; i < n->n_out; ++i)
    if (!n->out_bound[i] && !tpu__output_absent(&n->out[i])) {
      tpu_status_t st = tpu_status_make(TPU_INTERNAL, "%s: output %d not bound", tpu__node_describe(n), i);
      tpu__node_free(n);
      return st;
    }
  for (int i = 0; i < n->n_in; ++i)
    if (n->in[i].value && n->in[i].value->device != device && device >= 0) {
      tpu_status_t st = tpu_status_make(TPU_INVALID_ARGUMENT,
          "%s: Expected all tensors to be on the same device, but found at least two "
          "devices, tpu:%d and tpu:%d!", tpu__node_describe(n), device, n->in[i].value->device);
      tpu__node_free(n);
      return st;
    }
  for (int i = 0; i < n->n_in && device < 0; ++i) /* a node with no outputs (_assert_async) */
    if (n->in[i].value) device = n->in[i].value->device;
  if (device < 0) device = 0;
  return tpu__queue_submit(device, n);
}
