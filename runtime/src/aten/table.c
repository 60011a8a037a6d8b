/* The ATen op table: the concatenation of every family's entries, and tpu_op_prepare. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

#include "aten/aten.h"

static const tpu_aten_entry_t** entries;
static int n_entries;
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static const tpu_aten_entry_t* const families[] = {
#define TPU__FAM(f) tpu__aten_##f,
    TPU_ATEN_FAMILIES(TPU__FAM)
#undef TPU__FAM
};

static void build_table(void) {
  int n = 0;
  for (size_t f = 0; f < sizeof families / sizeof *families; ++f)
    for (const tpu_aten_entry_t* e = families[f]; e->name; ++e) ++n;
  entries = tpu__calloc((size_t)n, sizeof(*entries));
  if (!entries) return;
  for (size_t f = 0; f < sizeof families / sizeof *families; ++f)
    for (const tpu_aten_entry_t* e = families[f]; e->name; ++e) entries[n_entries++] = e;
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
  tpu_node_t* n = tpu__node_create();
  if (!n) return tpu_status_make(TPU_OUT_OF_MEMORY, "host out of memory");
  n->aten_index = index;
  n->variant = variant;
  tpu_build_t b = {e->name, variant, args, nargs, n, e->data};
  tpu_status_t st = e->build(&b);
  if (st) { tpu__node_free(n); return st; }
  *out_node = n;
  return NULL;
}

tpu_status_t tpu_node_submit(tpu_node_t* n) {
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
  if (device < 0) device = 0;
  return tpu__queue_submit(device, n);
}
