#include <pthread.h>
#include <stdio.h>

#include "core/internal.h"

static _Thread_local char* tls_site;

void tpu_set_call_site(const char* site) {
  tpu__free(tls_site);
  tls_site = site ? tpu__strdup(site) : NULL;
}

const char* tpu__current_site(void) { return tls_site; }

/* Node recycling. Nodes are made on the submitting thread and freed on the queue
 * thread; freeing a 1.5 KB block that another thread allocated takes malloc's arena lock,
 * and the two threads then woke each other through it for every op (a third of a tiny
 * op's time in defer_and_fuse). Freed nodes (with their input arrays) go to a per-thread
 * list and, NODE_BATCH at a time, to one shared cache; a creating thread takes the whole
 * cache when its own spares run out. The cache holds at most NODE_CACHE_MAX nodes; beyond that they are freed. */
#define NODE_BATCH 64
#define NODE_CACHE_MAX 8192

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static tpu_node_t* cache_head;
static atomic_int cache_n; /* read without the lock only to skip an empty cache */
static _Thread_local tpu_node_t* freed_head; /* freed here, not yet returned */
static _Thread_local int freed_n;
static _Thread_local tpu_node_t* spare_head;  /* taken from the cache, not yet used */

static void node_release_memory(tpu_node_t* n) {
  tpu__free(n->in);
  tpu__free(n);
}

/* Starts loading the lines of the next spare node that tpu__node_create writes (the
 * header, the input array's pointer, and the tail with `next`). Another thread freed it
 * last, so each of those lines was a miss taken in turn, the largest part of this
 * function's time; this way they arrive while the current op is prepared. */
static void prefetch_spare(const tpu_node_t* n) {
  const char* p = (const char*)n;
  for (size_t b = 0; b < offsetof(tpu_node_t, out); b += 64) __builtin_prefetch(p + b, 1);
  for (size_t b = offsetof(tpu_node_t, out_bound) & ~(size_t)63; b < sizeof(*n); b += 64) __builtin_prefetch(p + b, 1);
}

tpu_node_t* tpu__node_create(void) {
  if (!spare_head && atomic_load_explicit(&cache_n, memory_order_relaxed) > 0) {
    /* The whole cache at once: walking it node by node missed the cache on every node
     * (the queue thread freed them last) and was most of this function's time. */
    pthread_mutex_lock(&cache_mu);
    spare_head = cache_head;
    cache_head = NULL;
    atomic_store(&cache_n, 0);
    pthread_mutex_unlock(&cache_mu);
  }
  tpu_node_t* n;
  if (spare_head) {
    n = spare_head;
    spare_head = n->next;
    if (spare_head) prefetch_spare(spare_head);
    tpu_operand_t* in = n->in; /* the input array is kept, with its capacity */
    int cap = n->cap_in;
    /* out[] is not cleared: tpu__node_add_output clears each output it declares, and
     * nothing reads past n_out (most of the node's 1.5 KB, in cache lines the thread that
     * freed it last wrote). */
    memset(n, 0, offsetof(tpu_node_t, out));
    memset(&n->out_bound, 0, sizeof(*n) - offsetof(tpu_node_t, out_bound));
    n->in = in;
    n->cap_in = cap;
  } else {
    n = tpu__calloc(1, sizeof(*n));
    if (!n) return NULL;
  }
  n->aten_index = -1;
  n->compute = TPU_DTYPE_INVALID;
  if (tls_site) n->site = tpu__strdup(tls_site);
  return n;
}

void tpu__node_free(tpu_node_t* n) {
  if (!n) return;
  for (int i = 0; i < n->n_in; ++i) tpu__value_release(n->in[i].value);
  for (int i = 0; i < n->n_out; ++i) if (n->out_bound[i]) tpu__value_release(n->out[i].value);
  tpu__free(n->ilist);
  tpu__free(n->site);
  tpu__free(n->then);
  n->then = NULL;
  tpu__event_unref(n->event);
  n->event = NULL;
  n->next = freed_head;
  freed_head = n;
  if (++freed_n < NODE_BATCH) return;
  pthread_mutex_lock(&cache_mu);
  bool keep = atomic_load(&cache_n) < NODE_CACHE_MAX;
  if (keep) {
    tpu_node_t* tail = freed_head;
    while (tail->next) tail = tail->next;
    tail->next = cache_head;
    cache_head = freed_head;
    atomic_fetch_add(&cache_n, freed_n);
  }
  pthread_mutex_unlock(&cache_mu);
  if (!keep)
    for (tpu_node_t* c = freed_head; c;) {
      tpu_node_t* nx = c->next;
      node_release_memory(c);
      c = nx;
    }
  freed_head = NULL;
  freed_n = 0;
}

void tpu_node_discard(tpu_node_t* n) { tpu__node_free(n); }

static tpu_operand_t* grow_in(tpu_node_t* n) {
  if (n->n_in == n->cap_in) {
    int cap = n->cap_in ? n->cap_in * 2 : 4;
    tpu_operand_t* in = tpu__realloc(n->in, (size_t)cap * sizeof(*in));
    if (!in) return NULL;
    n->in = in;
    n->cap_in = cap;
  }
  tpu_operand_t* op = &n->in[n->n_in++];
  memset(op, 0, sizeof(*op));
  return op;
}

static void operand_from_view(tpu_operand_t* op, const tpu_view_t* v) {
  op->value = v->storage->value;
  tpu__value_retain(op->value);
  op->dtype = v->dtype;
  op->ndim = v->ndim;
  op->offset = v->offset;
  memcpy(op->sizes, v->sizes, sizeof(op->sizes));
  memcpy(op->strides, v->strides, sizeof(op->strides));
}

tpu_status_t tpu__node_add_input(tpu_node_t* n, const tpu_view_t* v) {
  tpu_operand_t* op = grow_in(n);
  if (!op) return tpu_status_make(TPU_OUT_OF_MEMORY, "host out of memory");
  operand_from_view(op, v);
  return NULL;
}

tpu_status_t tpu__node_add_scalar(tpu_node_t* n, double d, int64_t i, tpu_dtype_t dtype) {
  tpu_operand_t* op = grow_in(n);
  if (!op) return tpu_status_make(TPU_OUT_OF_MEMORY, "host out of memory");
  op->is_scalar = true;
  op->scalar_d = d;
  op->scalar_i = i;
  op->dtype = dtype;
  return NULL;
}

tpu_status_t tpu__node_add_absent(tpu_node_t* n) {
  tpu_operand_t* op = grow_in(n);
  if (!op) return tpu_status_make(TPU_OUT_OF_MEMORY, "host out of memory");
  op->dtype = TPU_DTYPE_INVALID;
  return NULL;
}

int tpu__node_add_output(tpu_node_t* n, tpu_dtype_t dtype, int32_t ndim, const int64_t* sizes) {
  if (n->n_out >= TPU_NODE_MAX_OUT) return -1;
  tpu_operand_t* op = &n->out[n->n_out];
  memset(op, 0, sizeof(*op));
  op->dtype = dtype;
  op->ndim = ndim;
  for (int i = 0; i < ndim; ++i) op->sizes[i] = sizes[i];
  if (ndim < 0) op->ndim = -1;
  return n->n_out++;
}

tpu_status_t tpu__node_set_ilist(tpu_node_t* n, const int64_t* v, int len) {
  tpu__free(n->ilist);
  n->ilist = tpu__malloc(sizeof(int64_t) * (size_t)(len > 0 ? len : 1));
  if (!n->ilist) return tpu_status_make(TPU_OUT_OF_MEMORY, "host out of memory");
  if (len) memcpy(n->ilist, v, sizeof(int64_t) * (size_t)len);
  n->ilist_len = len;
  return NULL;
}

const char* tpu__fmt_shape(char* buf, size_t cap, int nd, const int64_t* s) {
  size_t o = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < nd && o < cap; ++i)
    o += (size_t)snprintf(buf + o, cap - o, i ? ", %lld" : "%lld", (long long)s[i]);
  if (o < cap) snprintf(buf + o, cap - o, "]");
  return buf;
}

int tpu_node_output_count(const tpu_node_t* n) { return n->n_out; }

bool tpu_node_may_alias_input(const tpu_node_t* n) {
  switch (n->kind) {
    case TPU_KIND_GATHER: case TPU_KIND_SCATTER: case TPU_KIND_INDEX_SELECT: case TPU_KIND_INDEX_ACC:
    case TPU_KIND_INDEX_PUT: case TPU_KIND_MASKED_SELECT: case TPU_KIND_CAT:
      return false;
    default:
      return true;
  }
}

void tpu_node_output_meta(const tpu_node_t* n, int i, tpu_dtype_t* dt, int32_t* nd, int64_t* sz) {
  const tpu_operand_t* op = &n->out[i];
  *dt = op->dtype;
  *nd = op->ndim;
  for (int k = 0; k < op->ndim; ++k) sz[k] = op->sizes[k];
}

tpu_status_t tpu_node_bind_output(tpu_node_t* n, int i, const tpu_view_t* v) {
  if (i < 0 || i >= n->n_out)
    return tpu_status_make(TPU_INTERNAL, "%s: output %d out of range", tpu_node_name(n), i);
  tpu_operand_t* op = &n->out[i];
  if (tpu__output_absent(op))
    return tpu_status_make(TPU_INTERNAL, "%s: output %d is absent", tpu_node_name(n), i);
  bool same = v->ndim == op->ndim;
  for (int k = 0; same && k < v->ndim; ++k) same = v->sizes[k] == op->sizes[k];
  if (!same) {
    char a[256], b[256];
    tpu__fmt_shape(a, sizeof a, v->ndim, v->sizes);
    tpu__fmt_shape(b, sizeof b, op->ndim, op->sizes);
    return tpu_status_make(TPU_INVALID_ARGUMENT,
                           "%s: output with shape %s doesn't match the broadcast shape %s",
                           tpu_node_name(n), a, b);
  }
  if (v->dtype != op->dtype && n->kind != TPU_KIND_COPY) { /* copies cast freely */
    if (n->variant == TPU_VARIANT_FUNCTIONAL || !tpu__can_cast(op->dtype, v->dtype))
      return tpu_status_make(TPU_INVALID_ARGUMENT,
                             "%s: result type %s can't be cast to the desired output type %s",
                             tpu_node_name(n), tpu__dtype_c10_name(op->dtype), tpu__dtype_c10_name(v->dtype));
  }
  /* storage-only dtypes are written by copies of their own dtype (tpu_copy_math) only */
  if (!tpu_dtype_is_supported(v->dtype) && !(n->kind == TPU_KIND_COPY && tpu_dtype_is_storage_only(v->dtype)))
    return tpu_status_make(tpu_dtype_is_storage_only(v->dtype) ? TPU_UNIMPLEMENTED : TPU_TYPE_ERROR,
                           "%s: output dtype %s is not supported on tpu", tpu_node_name(n), tpu_dtype_name(v->dtype));
  if (n->out_bound[i]) tpu__value_release(op->value);
  operand_from_view(op, v);
  n->out_bound[i] = true;
  if (i == 0 && n->then) {
    n->then->out_view = *v;
    n->then->bound = true;
  }
  return NULL;
}

tpu_status_t tpu__node_bind_new_output(tpu_node_t* n, int i, int device) {
  tpu_operand_t* op = &n->out[i];
  uint64_t nbytes = tpu_dtype_size(op->dtype);
  int64_t st = 1;
  for (int k = op->ndim - 1; k >= 0; --k) { op->strides[k] = st; st *= op->sizes[k]; }
  if (!tpu__mul_ok(nbytes, (uint64_t)st, &nbytes))
    return tpu_status_make(TPU_INVALID_ARGUMENT, "output size overflows");
  TPU_RETURN_IF_ERROR(tpu__value_create(device, nbytes, &op->value));
  op->offset = 0;
  n->out_bound[i] = true;
  return NULL;
}

int64_t tpu__operand_numel(const tpu_operand_t* op) {
  int64_t n = 1;
  for (int i = 0; i < op->ndim; ++i) n *= op->sizes[i];
  return n;
}

bool tpu__is_contiguous(int ndim, const int64_t* sizes, const int64_t* strides) {
  int64_t st = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (sizes[i] == 0) return true; /* no elements */
    if (sizes[i] != 1 && strides[i] != st) return false;
    st *= sizes[i];
  }
  return true;
}

bool tpu__operand_is_contiguous(const tpu_operand_t* op) {
  return tpu__is_contiguous(op->ndim, op->sizes, op->strides);
}
