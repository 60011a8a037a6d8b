/* Events: markers in a device's queue (torch.Event / torch.tpu.Event). */
#include <pthread.h>
#include <time.h>

#include "core/internal.h"

struct tpu_event_s {
  atomic_int refs;          /* the handle and each queued marker */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int device;               /* of the last record, -1 if never recorded */
  uint64_t seq;             /* records so far */
  uint64_t done_seq;        /* the last record whose marker has run */
  double done_us;           /* when it ran (CLOCK_MONOTONIC) */
};

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

tpu_event_t* tpu_event_create(void) {
  tpu_event_t* e = tpu__calloc(1, sizeof(*e));
  if (!e) return NULL;
  atomic_init(&e->refs, 1);
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  e->device = -1;
  return e;
}

void tpu__event_unref(tpu_event_t* e) {
  if (!e || atomic_fetch_sub(&e->refs, 1) != 1) return;
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cv);
  tpu__free(e);
}

void tpu_event_destroy(tpu_event_t* e) { tpu__event_unref(e); }

tpu_status_t tpu_event_record(tpu_event_t* e, int device) {
  if (device < 0 || device >= tpu_device_count())
    return tpu_status_make(TPU_INVALID_ARGUMENT, "event record: invalid device index %d (device count %d)",
                           device, tpu_device_count());
  TPU_RETURN_IF_ERROR(tpu_flush(device, "event record (torch.Event.record)"));
  tpu_node_t* n = tpu__node_create();
  if (!n) return tpu_status_make(TPU_OUT_OF_MEMORY, "host out of memory recording an event");
  n->kind = TPU_KIND_MARKER;
  pthread_mutex_lock(&e->mu);
  e->device = device;
  n->event_seq = ++e->seq;
  pthread_mutex_unlock(&e->mu);
  atomic_fetch_add(&e->refs, 1);
  n->event = e;
  uint64_t seq = n->event_seq;
  tpu_status_t st = tpu__queue_push(device, n, false);
  if (st) { /* the marker was never queued (it is freed): nothing will complete it */
    pthread_mutex_lock(&e->mu);
    if (e->done_seq < seq) { e->done_seq = seq; e->done_us = now_us(); }
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
  }
  return st;
}

void tpu__marker_run(tpu_node_t* n) {
  tpu_event_t* e = n->event;
  double t = now_us();
  pthread_mutex_lock(&e->mu);
  if (n->event_seq > e->done_seq) { e->done_seq = n->event_seq; e->done_us = t; }
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
}

bool tpu_event_query(const tpu_event_t* e) {
  tpu_event_t* m = (tpu_event_t*)e;
  pthread_mutex_lock(&m->mu);
  bool done = m->done_seq == m->seq;
  pthread_mutex_unlock(&m->mu);
  return done;
}

tpu_status_t tpu_event_synchronize(tpu_event_t* e) {
  pthread_mutex_lock(&e->mu);
  int device = e->device;
  uint64_t want = e->seq;
  pthread_mutex_unlock(&e->mu);
  if (device < 0) return NULL;
  /* The marker runs in queue order; waiting for the device also reports its error. */
  tpu_status_t st = tpu_device_synchronize(device);
  pthread_mutex_lock(&e->mu);
  while (e->done_seq < want) pthread_cond_wait(&e->cv, &e->mu);
  pthread_mutex_unlock(&e->mu);
  return st;
}

tpu_status_t tpu_event_elapsed_ms(const tpu_event_t* a, const tpu_event_t* b, double* out_ms) {
  tpu_event_t *x = (tpu_event_t*)a, *y = (tpu_event_t*)b;
  pthread_mutex_lock(&x->mu);
  bool xa = x->seq > 0 && x->done_seq == x->seq;
  double tx = x->done_us;
  pthread_mutex_unlock(&x->mu);
  pthread_mutex_lock(&y->mu);
  bool ya = y->seq > 0 && y->done_seq == y->seq;
  double ty = y->done_us;
  pthread_mutex_unlock(&y->mu);
  if (!xa || !ya)
    return tpu_status_make(TPU_INVALID_ARGUMENT, "elapsed_time: both events must be recorded and "
                           "completed (call synchronize() on the end event first)");
  *out_ms = (ty - tx) / 1e3;
  return NULL;
}
