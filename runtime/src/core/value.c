/* Values (immutable device buffers) and storages (mutable handles to a current value). */
#include "core/internal.h"

tpu_status_t tpu__value_create(int device, uint64_t nbytes, tpu_value_t** out) {
  tpu_value_t* v = tpu__malloc(sizeof(*v));
  if (!v) return tpu_status_make(TPU_OUT_OF_MEMORY, "host out of memory creating a value");
  atomic_init(&v->refs, 1);
  v->device = device;
  v->nbytes = nbytes;
  v->data = NULL;
  if (atomic_load_explicit(&tpu__eager_mode, memory_order_relaxed) == TPU_EAGER_DEFER) {
    *out = v; /* memory is taken at materialization, if the value is ever written */
    return NULL;
  }
  tpu_status_t st = tpu__pool_alloc(device, nbytes, &v->data);
  if (st && tpu_status_code(st) == TPU_OUT_OF_MEMORY) {
    /* Values released by queued ops come back only when those ops have run: drain the
     * queue once and retry before reporting out-of-memory. */
    tpu_status_free(st);
    tpu_status_t sync = tpu_device_synchronize(device);
    st = tpu__pool_alloc(device, nbytes, &v->data);
    if (sync) {
      if (!st) { tpu__pool_free(device, v->data, nbytes); }
      tpu_status_free(st);
      st = sync; /* an async error is older news than this allocation: report it first */
    }
  }
  if (st) { tpu__free(v); return st; }
  *out = v;
  return NULL;
}

tpu_status_t tpu__value_materialize(tpu_value_t* v) {
  if (v->data) return NULL;
  /* Runs on the queue thread: the device's earlier work has completed, so there is no
   * queue to drain for memory before reporting out-of-memory. */
  return tpu__pool_alloc(v->device, v->nbytes, &v->data);
}

void tpu__value_retain(tpu_value_t* v) { if (v) atomic_fetch_add(&v->refs, 1); }

void tpu__value_release(tpu_value_t* v) {
  if (!v || atomic_fetch_sub(&v->refs, 1) != 1) return;
  if (v->data) tpu__pool_free(v->device, v->data, v->nbytes);
  tpu__free(v);
}

tpu_status_t tpu_storage_create(int device, uint64_t nbytes, tpu_storage_t** out) {
  if (device < 0 || device >= tpu_device_count())
    return tpu_status_make(TPU_INVALID_ARGUMENT,
                           "invalid device index tpu:%d (device count %d)", device,
                           tpu_device_count());
  tpu_storage_t* s = tpu__malloc(sizeof(*s));
  if (!s) return tpu_status_make(TPU_OUT_OF_MEMORY, "host out of memory creating a storage");
  atomic_init(&s->refs, 1);
  s->device = device;
  s->nbytes = nbytes;
  s->value = NULL;
  tpu_status_t st = tpu__value_create(device, nbytes, &s->value);
  if (st) { tpu__free(s); return st; }
  *out = s;
  return NULL;
}

void tpu_storage_retain(tpu_storage_t* s) { if (s) atomic_fetch_add(&s->refs, 1); }

void tpu_storage_release(tpu_storage_t* s) {
  if (!s || atomic_fetch_sub(&s->refs, 1) != 1) return;
  tpu__value_release(s->value);
  tpu__free(s);
}

uint64_t tpu_storage_nbytes(const tpu_storage_t* s) { return s->nbytes; }
int tpu_storage_device(const tpu_storage_t* s) { return s->device; }

tpu_status_t tpu_storage_resize(tpu_storage_t* s, uint64_t nbytes) {
  if (nbytes == s->nbytes) return NULL;
  tpu_value_t* nv;
  TPU_RETURN_IF_ERROR(tpu__value_create(s->device, nbytes, &nv));
  uint64_t keep = nbytes < s->nbytes ? nbytes : s->nbytes;
  if (keep > 0) {
    /* A byte copy node, queued so it is ordered after writers of the old value. */
    tpu_node_t* n = tpu__node_create();
    if (!n) { tpu__value_release(nv); return tpu_status_make(TPU_OUT_OF_MEMORY, "host OOM"); }
    n->kind = TPU_KIND_COPY;
    n->aten_index = -1;
    n->n_in = 1;
    n->cap_in = 1;
    n->in = tpu__calloc(1, sizeof(tpu_operand_t));
    if (!n->in) { tpu__node_free(n); tpu__value_release(nv); return tpu_status_make(TPU_OUT_OF_MEMORY, "host OOM"); }
    tpu_operand_t* in = &n->in[0];
    in->value = s->value; tpu__value_retain(s->value);
    in->dtype = TPU_DTYPE_U8; in->ndim = 1; in->sizes[0] = (int64_t)keep; in->strides[0] = 1;
    n->n_out = 1;
    n->out[0] = *in;
    n->out[0].value = nv; tpu__value_retain(nv);
    n->out_bound[0] = true;
    tpu_status_t st = tpu__queue_submit(s->device, n);
    if (st) { tpu__value_release(nv); return st; }
  }
  tpu__value_release(s->value);
  s->value = nv;
  s->nbytes = nbytes;
  return NULL;
}

int64_t tpu_view_numel(const tpu_view_t* v) {
  int64_t n = 1;
  for (int i = 0; i < v->ndim; ++i) n *= v->sizes[i];
  return n;
}
