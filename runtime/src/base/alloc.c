/* The one host allocation interface; counted so tests can fail the Nth allocation.
 *
 * Large blocks are kept for reuse. Kernels take their scratch (packed operands, converted
 * bf16 rows, GEMM panels, score matrices) from here for the length of one call. glibc
 * serves blocks past its mmap threshold (128 KiB at first, raised by frees up to 32 MiB)
 * with fresh mappings, and gives heap memory above its trim threshold back to the OS on
 * free, so a kernel that takes a few MiB per call page-faulted all of it in again on
 * every call: bf16 attention (8 x 4 x 128 x 64, causal) spent a quarter of its time in the
 * kernel's page-fault and page-clearing paths, and ran 2.5x slower than with glibc told to
 * keep its memory (GLIBC_TUNABLES mmap and trim thresholds), 2222 -> 882 us per forward.
 * Freed blocks of SCRATCH_MIN bytes or more (up to SCRATCH_BLOCK_MAX) wait here instead,
 * SCRATCH_SLOTS of them and SCRATCH_BYTES_MAX in all; an allocation takes the smallest
 * that fits and is at most twice its size. tpu__scratch_release hands them all back
 * (torch.tpu.empty_cache); TORCHTPU_SCRATCH_CACHE=0 keeps nothing (read once; for
 * side-by-side runs). Not built under the address sanitizer, which must see every free,
 * nor where the C library cannot say a block's size (malloc_usable_size). */
#include <stdlib.h>
#include <string.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "core/internal.h"

static _Atomic int64_t tpu__fail_after = -1;

static bool should_fail(void) {
  int64_t n = atomic_load(&tpu__fail_after);
  if (n < 0) return false;
  if (n == 0) return true;
  atomic_fetch_sub(&tpu__fail_after, 1);
  return false;
}

void tpu__alloc_fail_after(int64_t n) { atomic_store(&tpu__fail_after, n); }

#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
#define SCRATCH_MIN ((size_t)64 << 10)
#define SCRATCH_BLOCK_MAX ((size_t)32 << 20)
#define SCRATCH_BYTES_MAX ((size_t)128 << 20)
#define SCRATCH_SLOTS 32

static struct {
  pthread_mutex_t mu;
  void* p[SCRATCH_SLOTS];
  size_t size[SCRATCH_SLOTS]; /* usable bytes; 0: empty slot */
  size_t bytes;
} scratch = {PTHREAD_MUTEX_INITIALIZER, {0}, {0}, 0};

static bool scratch_enabled(void) {
  static atomic_int enabled = -1;
  int e = atomic_load(&enabled);
  if (e < 0) {
    const char* v = getenv("TORCHTPU_SCRATCH_CACHE");
    e = !(v && *v == '0');
    atomic_store(&enabled, e);
  }
  return e;
}

/* A kept block of at least n usable bytes and at most 2n, or NULL. */
static void* scratch_take(size_t n) {
  if (n < SCRATCH_MIN || n > SCRATCH_BLOCK_MAX) return NULL;
  pthread_mutex_lock(&scratch.mu);
  int best = -1;
  for (int i = 0; i < SCRATCH_SLOTS; ++i)
    if (scratch.size[i] >= n && scratch.size[i] <= 2 * n && (best < 0 || scratch.size[i] < scratch.size[best]))
      best = i;
  void* p = NULL;
  if (best >= 0) {
    p = scratch.p[best];
    scratch.bytes -= scratch.size[best];
    scratch.size[best] = 0;
    scratch.p[best] = NULL;
  }
  pthread_mutex_unlock(&scratch.mu);
  return p;
}

/* Keeps p when it is a large block and there is room; false: the caller frees it. */
static bool scratch_keep(void* p) {
  size_t sz = malloc_usable_size(p);
  if (sz < SCRATCH_MIN || sz > SCRATCH_BLOCK_MAX || !scratch_enabled()) return false;
  bool kept = false;
  pthread_mutex_lock(&scratch.mu);
  if (scratch.bytes + sz <= SCRATCH_BYTES_MAX)
    for (int i = 0; i < SCRATCH_SLOTS && !kept; ++i)
      if (!scratch.size[i]) {
        scratch.p[i] = p;
        scratch.size[i] = sz;
        scratch.bytes += sz;
        kept = true;
      }
  pthread_mutex_unlock(&scratch.mu);
  return kept;
}

void tpu__scratch_release(void) {
  pthread_mutex_lock(&scratch.mu);
  for (int i = 0; i < SCRATCH_SLOTS; ++i) {
    free(scratch.p[i]);
    scratch.p[i] = NULL;
    scratch.size[i] = 0;
  }
  scratch.bytes = 0;
  pthread_mutex_unlock(&scratch.mu);
}

size_t tpu__scratch_kept_bytes(void) {
  pthread_mutex_lock(&scratch.mu);
  size_t b = scratch.bytes;
  pthread_mutex_unlock(&scratch.mu);
  return b;
}
#else
static void* scratch_take(size_t n) { (void)n; return NULL; }
static bool scratch_keep(void* p) { (void)p; return false; }
void tpu__scratch_release(void) {}
size_t tpu__scratch_kept_bytes(void) { return 0; }
#endif

void* tpu__malloc(size_t n) {
  if (should_fail()) return NULL;
  void* p = scratch_take(n);
  return p ? p : malloc(n ? n : 1);
}

void* tpu__calloc(size_t c, size_t n) {
  if (should_fail()) return NULL;
  size_t bytes;
  if (!__builtin_mul_overflow(c, n, &bytes)) {
    void* p = scratch_take(bytes); /* zeroing a kept block costs less than faulting fresh pages */
    if (p) return memset(p, 0, bytes);
  }
  return calloc(c ? c : 1, n ? n : 1);
}

void* tpu__realloc(void* p, size_t n) { return should_fail() ? NULL : realloc(p, n ? n : 1); }

void tpu__free(void* p) {
  if (p && !scratch_keep(p)) free(p);
}

char* tpu__strdup(const char* s) {
  size_t n = strlen(s) + 1;
  char* d = tpu__malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}
