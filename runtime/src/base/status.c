#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

struct tpu_status_s {
  tpu_status_code_t code;
  bool is_static;
  char* message;
};

/* Returned when even the status cannot be allocated: out of memory is sticky, not fatal. */
static struct tpu_status_s tpu__oom_status = {TPU_OUT_OF_MEMORY, true,
                                               "host out of memory while reporting an error"};

static char* vformat(const char* fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) n = 0;
  char* s = malloc((size_t)n + 1);
  if (s) vsnprintf(s, (size_t)n + 1, fmt, ap);
  return s;
}

tpu_status_t tpu_status_make(tpu_status_code_t code, const char* fmt, ...) {
  struct tpu_status_s* st = malloc(sizeof(*st));
  if (!st) return &tpu__oom_status;
  va_list ap;
  va_start(ap, fmt);
  st->message = vformat(fmt, ap);
  va_end(ap);
  if (!st->message) { free(st); return &tpu__oom_status; }
  st->code = code == TPU_OK ? TPU_INTERNAL : code;
  st->is_static = false;
  return st;
}

tpu_status_t tpu_status_annotate(tpu_status_t st, const char* fmt, ...) {
  if (!st || st->is_static) return st;
  va_list ap;
  va_start(ap, fmt);
  char* prefix = vformat(fmt, ap);
  va_end(ap);
  if (!prefix) return st;
  size_t n = strlen(prefix) + strlen(st->message) + 3;
  char* m = malloc(n);
  if (m) {
    snprintf(m, n, "%s: %s", prefix, st->message);
    free(st->message);
    st->message = m;
  }
  free(prefix);
  return st;
}

tpu_status_code_t tpu_status_code(tpu_status_t st) { return st ? st->code : TPU_OK; }
const char* tpu_status_message(tpu_status_t st) { return st ? st->message : ""; }

void tpu_status_free(tpu_status_t st) {
  if (!st || st->is_static) return;
  free(st->message);
  free(st);
}

tpu_status_t tpu_status_clone(tpu_status_t st) {
  if (!st) return NULL;
  return tpu_status_make(st->code, "%s", st->message);
}
