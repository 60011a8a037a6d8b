/* Caching device-memory pool with an HBM capacity, per device.
 *
 * Blocks are rounded to size classes (four per power of two, at least 512 B) and kept
 * on per-class free lists when released, so a training loop that allocates the same
 * shapes every step reaches a steady state with no driver allocations. allocated counts
 * class sizes of live blocks (as PyTorch's caching allocator does); reserved adds the
 * cached ones. Capacity bounds reserved: when a request would exceed it, the cache is
 * returned to the driver first, and only then is TPU_OUT_OF_MEMORY reported. */
#include <pthread.h>
#include <stdlib.h>

#include "core/internal.h"

#define NUM_CLASSES 256
#define MAX_DEVICES 64

typedef struct free_block_s { struct free_block_s* next; void* ptr; } free_block_t;

typedef struct pool_s {
  pthread_mutex_t mu;
  bool init;
  uint64_t hbm;      /* the device's memory: TORCHTPU_HBM_BYTES or the driver's figure */
  uint64_t capacity; /* this process's limit: hbm unless set_per_process_memory_fraction */
  tpu_memory_stats_t st;
  free_block_t* free_lists[NUM_CLASSES];
} pool_t;

static pool_t pools[MAX_DEVICES];
static pthread_mutex_t pools_mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t default_capacity(void) {
  const char* e = getenv("TORCHTPU_HBM_BYTES");
  if (e && *e) {
    char* end;
    unsigned long long v = strtoull(e, &end, 10);
    if (end != e && v > 0) return v;
  }
  tpu_device_props_t p;
  tpu_status_t st = tpu__driver()->vt->props(tpu__driver(), 0, &p);
  if (st) { tpu_status_free(st); return 16ull << 30; }
  return p.total_memory;
}

static pool_t* get_pool(int device) {
  if (device < 0 || device >= MAX_DEVICES) return NULL;
  pool_t* p = &pools[device];
  pthread_mutex_lock(&pools_mu);
  if (!p->init) {
    pthread_mutex_init(&p->mu, NULL);
    p->hbm = p->capacity = default_capacity();
    p->st.capacity = p->capacity;
    p->init = true;
  }
  pthread_mutex_unlock(&pools_mu);
  return p;
}

/* Size class: 512 B minimum, then 4 classes per power of two. */
static int size_class(uint64_t n, uint64_t* out_size) {
  if (n <= 512) { *out_size = 512; return 0; }
  int k = 63 - __builtin_clzll(n - 1); /* 2^k < n <= 2^(k+1) */
  uint64_t base = 1ull << k, step = base >> 2;
  uint64_t sub = (n - base + step - 1) / step; /* 1..4 */
  *out_size = base + sub * step;
  int c = 1 + (k - 9) * 4 + (int)(sub - 1);
  return c < NUM_CLASSES ? c : NUM_CLASSES - 1;
}

static void release_cache_locked(int device, pool_t* p) {
  for (int c = 0; c < NUM_CLASSES; ++c) {
    free_block_t* b = p->free_lists[c];
    while (b) {
      free_block_t* nx = b->next;
      uint64_t sz;
      /* recompute the class size from the class index */
      if (c == 0) sz = 512;
      else { int k = (c - 1) / 4 + 9, sub = (c - 1) % 4 + 1; sz = (1ull << k) + (uint64_t)sub * ((1ull << k) >> 2); }
      tpu__driver()->vt->mem_free(tpu__driver(), device, b->ptr, sz);
      p->st.reserved -= sz;
      tpu__free(b);
      b = nx;
    }
    p->free_lists[c] = NULL;
  }
}

tpu_status_t tpu__pool_alloc(int device, uint64_t nbytes, void** out_ptr) {
  pool_t* p = get_pool(device);
  if (!p) return tpu_status_make(TPU_INVALID_ARGUMENT, "invalid device index %d", device);
  uint64_t sz;
  int c = size_class(nbytes, &sz);
  pthread_mutex_lock(&p->mu);
  free_block_t* b = p->free_lists[c];
  if (b) {
    p->free_lists[c] = b->next;
    *out_ptr = b->ptr;
    tpu__free(b);
  } else {
    if (p->st.reserved + sz > p->capacity) release_cache_locked(device, p);
    if (p->st.reserved + sz > p->capacity) {
      p->st.oom_count++;
      tpu_memory_stats_t s = p->st;
      pthread_mutex_unlock(&p->mu);
      return tpu_status_make(TPU_OUT_OF_MEMORY,
          "tpu:%d out of memory: tried to allocate %llu bytes; %llu bytes allocated, "
          "%llu reserved, capacity %llu bytes (TORCHTPU_HBM_BYTES)", device,
          (unsigned long long)nbytes, (unsigned long long)s.allocated,
          (unsigned long long)s.reserved, (unsigned long long)s.capacity);
    }
    tpu_status_t st = tpu__driver()->vt->mem_alloc(tpu__driver(), device, sz, out_ptr);
    if (st) { p->st.oom_count++; pthread_mutex_unlock(&p->mu); return st; }
    p->st.reserved += sz;
    if (p->st.reserved > p->st.peak_reserved) p->st.peak_reserved = p->st.reserved;
  }
  p->st.allocated += sz;
  p->st.alloc_count++;
  if (p->st.allocated > p->st.peak_allocated) p->st.peak_allocated = p->st.allocated;
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

void tpu__pool_free(int device, void* ptr, uint64_t nbytes) {
  pool_t* p = get_pool(device);
  if (!p || !ptr) return;
  uint64_t sz;
  int c = size_class(nbytes, &sz);
  free_block_t* b = tpu__malloc(sizeof(*b));
  pthread_mutex_lock(&p->mu);
  p->st.allocated -= sz;
  p->st.free_count++;
  if (b) {
    b->ptr = ptr;
    b->next = p->free_lists[c];
    p->free_lists[c] = b;
  } else { /* cannot cache it: give it back */
    tpu__driver()->vt->mem_free(tpu__driver(), device, ptr, sz);
    p->st.reserved -= sz;
  }
  pthread_mutex_unlock(&p->mu);
}

tpu_status_t tpu_memory_stats(int device, tpu_memory_stats_t* out) {
  if (device < 0 || device >= tpu_device_count())
    return tpu_status_make(TPU_INVALID_ARGUMENT, "invalid device index %d (device count %d)",
                           device, tpu_device_count());
  pool_t* p = get_pool(device);
  pthread_mutex_lock(&p->mu);
  *out = p->st;
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

uint64_t tpu__pool_hbm(int device) {
  pool_t* p = get_pool(device);
  return p ? p->hbm : 0;
}

tpu_status_t tpu_memory_set_capacity(int device, uint64_t bytes) {
  if (device < 0 || device >= tpu_device_count())
    return tpu_status_make(TPU_INVALID_ARGUMENT, "invalid device index %d (device count %d)",
                           device, tpu_device_count());
  pool_t* p = get_pool(device);
  pthread_mutex_lock(&p->mu);
  p->capacity = bytes;
  p->st.capacity = bytes;
  if (p->st.reserved > bytes) release_cache_locked(device, p); /* what is in use stays */
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

void tpu_memory_reset_peak(int device) {
  pool_t* p = get_pool(device);
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->st.peak_allocated = p->st.allocated;
  p->st.peak_reserved = p->st.reserved;
  pthread_mutex_unlock(&p->mu);
}

void tpu_memory_empty_cache(int device) {
  tpu__scratch_release(); /* kernels' host scratch too (base/alloc.c) */
  pool_t* p = get_pool(device);
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  release_cache_locked(device, p);
  pthread_mutex_unlock(&p->mu);
}
