/* The host driver: runs the TPU programming model on the CPU. Device memory is
 * 64-byte-aligned host memory; each node runs through the kernel table. */
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "host/host.h"

static tpu_host_kernel_fn kernels[TPU_KIND_COUNT];
static pthread_once_t kernels_once = PTHREAD_ONCE_INIT;

static tpu_status_t copy_kernel(tpu_node_t* n);

static void init_kernels(void) {
  kernels[TPU_KIND_COPY] = copy_kernel;
#define TPU__REG(f) tpu__host_register_##f(kernels);
  TPU_HOST_FAMILIES(TPU__REG)
#undef TPU__REG
}

/* Read once: every storage creation asks, and getenv walks the whole environment. */
static int device_count = 1;
static pthread_once_t device_count_once = PTHREAD_ONCE_INIT;

static void read_device_count(void) {
  const char* e = getenv("TORCHTPU_NUM_DEVICES");
  if (e && *e) {
    int n = atoi(e);
    device_count = n > 0 && n <= 64 ? n : 1;
    return;
  }
  e = getenv("TPU_VISIBLE_DEVICES");
  if (e && *e) {
    int n = 1;
    for (const char* p = e; *p; ++p) n += *p == ',';
    device_count = n <= 64 ? n : 64;
  }
}

static int host_device_count(tpu_driver_t* d) {
  (void)d;
  pthread_once(&device_count_once, read_device_count);
  return device_count;
}

static tpu_status_t host_props(tpu_driver_t* d, int device, tpu_device_props_t* out) {
  (void)d; (void)device;
  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  uint64_t phys = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : (16ull << 30);
  out->total_memory = phys / 2; /* default HBM: half the host's memory */
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  out->core_count = ncpu > 0 ? (int)ncpu : 1;
  out->major = 1;
  out->minor = 0;
  return NULL;
}

/* Blocks of at least HUGE_MIN bytes are their own mappings, 2 MiB-aligned and advised
 * for transparent huge pages (most distributions enable THP on request only): a first
 * touch then faults in 2 MiB at a time instead of 4 KiB, and a GEMM streaming a large
 * operand misses the TLB 512x less often. A GPT training step at d=1024 touches its
 * weights, gradients, optimizer state and activations for the first time in its first
 * step, taking some 200,000 page faults.
 *
 * Off unless TORCHTPU_HUGE_PAGES=1: on the virtual machines measured (docs/benchmarks.md,
 * stops 30 and 31) a fresh 2 MiB page costs the hypervisor more than 512 fresh 4 KiB
 * pages, and the GPT d=512 first step took 0.47-0.57 s with huge pages against 0.28-0.31 s
 * without (steady steps equal; d=1024's 9% faster at best). Long runs whose steady state
 * matters more than their first step turn it on. */
#define HUGE_MIN (4ull << 20)
#define HUGE_ALIGN (2ull << 20)

static bool huge_pages = false;
static pthread_once_t huge_once = PTHREAD_ONCE_INIT;
static void read_huge(void) {
  const char* e = getenv("TORCHTPU_HUGE_PAGES");
  huge_pages = e && *e && *e != '0';
}

static bool is_huge(uint64_t n) {
  pthread_once(&huge_once, read_huge);
  return huge_pages && n >= HUGE_MIN;
}

static uint64_t page_round(uint64_t n) { return (n + 4095) & ~4095ull; }

static void* map_huge(uint64_t n) {
  uint64_t len = page_round(n);
  char* p = mmap(NULL, len + HUGE_ALIGN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  /* trim to a 2 MiB-aligned start: the kernel backs aligned 2 MiB ranges with huge pages */
  uintptr_t a = ((uintptr_t)p + HUGE_ALIGN - 1) & ~(uintptr_t)(HUGE_ALIGN - 1);
  uint64_t head = a - (uintptr_t)p, tail = HUGE_ALIGN - head;
  if (head) munmap(p, head);
  if (tail) munmap((char*)a + len, tail);
#ifdef MADV_HUGEPAGE
  madvise((void*)a, len, MADV_HUGEPAGE); /* advice only: without THP, ordinary pages */
#endif
  return (void*)a;
}

static tpu_status_t host_alloc(tpu_driver_t* d, int device, uint64_t n, void** out) {
  (void)d;
  void* p = NULL;
  if (is_huge(n)) p = map_huge(n);
  else if (posix_memalign(&p, 64, n ? n : 64) != 0) p = NULL;
  if (!p)
    return tpu_status_make(TPU_OUT_OF_MEMORY, "tpu:%d: host memory exhausted allocating %llu bytes",
                           device, (unsigned long long)n);
  *out = p;
  return NULL;
}

/* n: the size host_alloc was asked for (the pool's class size) */
static void host_free(tpu_driver_t* d, int device, void* p, uint64_t n) {
  (void)d; (void)device;
  if (p && is_huge(n)) munmap(p, page_round(n));
  else free(p);
}

static tpu_status_t host_execute(tpu_driver_t* d, int device, tpu_node_t* n) {
  (void)d; (void)device;
  pthread_once(&kernels_once, init_kernels);
  tpu_host_kernel_fn fn = n->kind >= 0 && n->kind < TPU_KIND_COUNT ? kernels[n->kind] : NULL;
  if (!fn)
    return tpu_status_make(TPU_UNIMPLEMENTED, "host driver has no kernel for op kind %s",
                           tpu__kind_name(n->kind));
  for (int i = 0; i < n->n_out; ++i) {
    if (tpu__output_absent(&n->out[i])) continue;
    if (!n->out_bound[i])
      return tpu_status_make(TPU_INTERNAL, "%s: output %d not bound", tpu__node_describe(n), i);
    TPU_RETURN_IF_ERROR(tpu__value_materialize(n->out[i].value));
  }
  for (int i = 0; i < n->n_in; ++i)
    if (n->in[i].value) TPU_RETURN_IF_ERROR(tpu__value_materialize(n->in[i].value));
  return fn(n);
}

static tpu_status_t host_write(tpu_driver_t* d, tpu_value_t* dst, uint64_t off, const void* src, uint64_t n) {
  (void)d;
  memcpy((char*)dst->data + off, src, n);
  return NULL;
}

static tpu_status_t host_read(tpu_driver_t* d, const tpu_value_t* src, uint64_t off, void* dst, uint64_t n) {
  (void)d;
  memcpy(dst, (const char*)src->data + off, n);
  return NULL;
}

/* Independent small nodes (a fused optimizer step's parameters) split over the pool,
 * whole nodes per thread: alone, each is too small for its kernel to split. */
typedef struct independent_s {
  int device;
  tpu_node_t* const* nodes;
  tpu_status_t* st;
} independent_t;

static tpu_status_t run_independent_chunk(void* arg, int64_t b, int64_t e, int tid) {
  (void)tid;
  independent_t* c = arg;
  for (int64_t i = b; i < e; ++i) c->st[i] = tpu__node_run(c->device, c->nodes[i]);
  return NULL;
}

static tpu_status_t host_run_independent(tpu_driver_t* d, int device, tpu_node_t* const* nodes, int k) {
  (void)d;
  tpu_status_t st[TPU_MAX_INDEPENDENT];
  if (k > TPU_MAX_INDEPENDENT) return tpu_status_make(TPU_INTERNAL, "%d independent nodes at once", k);
  independent_t c = {device, nodes, st};
  tpu_status_t first = tpu__parallel_for(k, 1, run_independent_chunk, &c);
  for (int i = 0; i < k; ++i) {
    if (!first) first = st[i];
    else tpu_status_free(st[i]);
  }
  return first;
}

/* Planning asks these before any node may have run: the tables they read are the kernel
 * tables' (a graph planned first in a process would otherwise be planned, and cached,
 * without fusion). */
static bool host_can_fuse(tpu_driver_t* d, const tpu_node_t* n) {
  pthread_once(&kernels_once, init_kernels);
  return tpu__host_can_fuse(d, n);
}

static bool host_can_end_group(tpu_driver_t* d, const tpu_node_t* producer, const tpu_node_t* n) {
  pthread_once(&kernels_once, init_kernels);
  return tpu__host_can_end_group(d, producer, n);
}

static const tpu_driver_vtable_t host_vtable = {
    .name = "host",
    .device_count = host_device_count,
    .props = host_props,
    .mem_alloc = host_alloc,
    .mem_free = host_free,
    .execute = host_execute,
    .write = host_write,
    .read = host_read,
    .can_fuse = host_can_fuse,
    .run_group = tpu__host_run_group,
    .can_end_group = host_can_end_group,
    .run_independent = host_run_independent,
};

static tpu_driver_t host_driver = {&host_vtable};
tpu_driver_t* tpu__host_driver(void) { return &host_driver; }

/* COPY: out0 = cast(in0), both strided, broadcasting in0 to out0's shape; ia[0]
 * conjugates and ia[1] negates the values on the way (a source's conj / neg bit). */
static void copy_tile(int64_t n, void* out, const void* const* in, const tpu_node_t* node) {
  if (out != in[0]) memcpy(out, in[0], (size_t)n * tpu_dtype_size(node->compute));
  bool conj = node->ia[0] != 0, neg = node->ia[1] != 0;
  switch (node->compute) {
    case TPU_DTYPE_C64: {
      float* v = out;
      if (neg) for (int64_t k = 0; k < 2 * n; ++k) v[k] = -v[k];
      if (conj) for (int64_t k = 0; k < n; ++k) v[2 * k + 1] = -v[2 * k + 1];
      break;
    }
    case TPU_DTYPE_C128: {
      double* v = out;
      if (neg) for (int64_t k = 0; k < 2 * n; ++k) v[k] = -v[k];
      if (conj) for (int64_t k = 0; k < n; ++k) v[2 * k + 1] = -v[2 * k + 1];
      break;
    }
    case TPU_DTYPE_F32: if (neg) for (int64_t k = 0; k < n; ++k) ((float*)out)[k] = -((float*)out)[k]; break;
    case TPU_DTYPE_F64: if (neg) for (int64_t k = 0; k < n; ++k) ((double*)out)[k] = -((double*)out)[k]; break;
    case TPU_DTYPE_I64: if (neg) for (int64_t k = 0; k < n; ++k) ((int64_t*)out)[k] = (int64_t)(0 - (uint64_t)((int64_t*)out)[k]); break;
    default: break;
  }
}

static tpu_status_t copy_kernel(tpu_node_t* n) {
  tpu_operand_t* o = &n->out[0];
  const tpu_operand_t* i = &n->in[0];
  bool math = n->ia[0] || n->ia[1];
  if (tpu_dtype_is_complex(i->dtype) || tpu_dtype_is_complex(o->dtype)) {
    /* complex -> real keeps the real part: load as complex, store the real part */
    n->compute = tpu_dtype_is_complex(o->dtype) ? o->dtype : i->dtype;
    return tpu__tile_run(n, n->compute, copy_tile);
  }
  if (!math && !i->is_scalar && i->dtype == o->dtype && i->ndim == o->ndim &&
      tpu__operand_is_contiguous(i) && tpu__operand_is_contiguous(o)) {
    bool same_shape = true;
    for (int k = 0; k < o->ndim; ++k) same_shape &= i->sizes[k] == o->sizes[k];
    if (same_shape) {
      char* d = tpu__operand_ptr(o);
      const char* s = tpu__operand_ptr(i);
      int64_t numel = tpu__operand_numel(o), one = 1;
      size_t esz = tpu_dtype_size(o->dtype), bytes = (size_t)numel * esz;
      /* disjoint: split over the pool (one thread's memcpy of 64 MiB reached about half
       * of the machine's copy bandwidth); overlapping: one memmove */
      if (d + bytes <= s || s + bytes <= d) tpu__strided_copy(1, &numel, d, &one, s, &one, esz);
      else memmove(d, s, bytes);
      return NULL;
    }
  }
  /* Same dtype between distinct buffers (a transposed .contiguous(), an expand): a
   * strided byte copy, source broadcast to the destination's shape. */
  if (!math && !i->is_scalar && i->dtype == o->dtype && i->value != o->value && i->ndim <= o->ndim) {
    int64_t ist[TPU_MAX_DIMS];
    for (int d = 0; d < o->ndim; ++d) {
      int sd = d - (o->ndim - i->ndim);
      ist[d] = sd >= 0 && i->sizes[sd] != 1 ? i->strides[sd] : 0;
    }
    tpu__strided_copy(o->ndim, o->sizes, tpu__operand_ptr(o), o->strides, tpu__operand_ptr(i), ist,
                      tpu_dtype_size(o->dtype));
    return NULL;
  }
  /* Copy in the destination's dtype when it is exact for the source, else in the
   * widest compute dtype of the pair. */
  tpu_dtype_t c = tpu__compute_dtype(o->dtype);
  if (tpu_dtype_is_floating(i->dtype) && !tpu_dtype_is_floating(o->dtype)) c = TPU_DTYPE_F64;
  if (i->dtype == TPU_DTYPE_F64 || o->dtype == TPU_DTYPE_F64) c = TPU_DTYPE_F64;
  if (i->dtype == TPU_DTYPE_I64 && tpu_dtype_is_floating(o->dtype)) c = TPU_DTYPE_F64;
  n->compute = c;
  return tpu__tile_run(n, c, copy_tile);
}
