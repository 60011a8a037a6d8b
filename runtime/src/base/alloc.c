/* The one host allocation interface; counted so tests can fail the Nth allocation. */
#include <stdlib.h>
#include <string.h>

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
void* tpu__malloc(size_t n) { return should_fail() ? NULL : malloc(n ? n : 1); }
void* tpu__calloc(size_t c, size_t n) { return should_fail() ? NULL : calloc(c ? c : 1, n ? n : 1); }
void* tpu__realloc(void* p, size_t n) { return should_fail() ? NULL : realloc(p, n ? n : 1); }
void tpu__free(void* p) { free(p); }
char* tpu__strdup(const char* s) {
  size_t n = strlen(s) + 1;
  char* d = tpu__malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}
