/* Devices: the device table (opened on first use, closed by
 * sl_rt_shutdown), each device's built-in streams and its stream registry.
 *
 * Process state: `g_dev` below, the runtime's device table. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt/rt_impl.h"

static struct {
  pthread_mutex_t mu;
  sl_device_t *devices[SL__MAX_DEVICES];
} g_rt = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
};

static sl_status device_open(sl_device_kind kind, int index,
                             const sl__backend_ops *ops, sl_device_t **out) {
  sl_device_t *dev = sl_calloc(1, sizeof *dev);
  if (!dev)
    return SL_ERR_NOMEM;
  dev->kind = kind;
  dev->index = index;
  dev->ops = ops;
  if (kind == SL_DEVICE_CPU)
    snprintf(dev->name, sizeof dev->name, "cpu");
  else
    snprintf(dev->name, sizeof dev->name, "cuda:%d", index);
  pthread_mutex_init(&dev->streams_mu, NULL);
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&dev->access_mu, &ma);
  pthread_mutexattr_destroy(&ma);
  sl__alloc_init(dev);
  sl_status st = ops->device_open(dev);
  if (st != SL_OK)
    goto fail_open;
  st = sl__stream_new(dev, SL__STREAM_DEFAULT, "default", &dev->default_stream);
  if (st != SL_OK)
    goto fail_default;
  st = sl__stream_new(dev, SL__STREAM_GENERATION, "generation",
                      &dev->gen_stream);
  if (st != SL_OK)
    goto fail_gen;
  *out = dev;
  return SL_OK;
fail_gen:
  sl__stream_free(dev->default_stream);
fail_default:
  ops->device_close(dev);
fail_open:
  sl__alloc_fini(dev);
  pthread_mutex_destroy(&dev->access_mu);
  pthread_mutex_destroy(&dev->streams_mu);
  sl_free(dev);
  return st;
}

sl_status sl_device_get(sl_device_kind kind, int index, sl_device_t **out) {
  if (!out || index < 0)
    return SL_ERR_INVALID_ARG;
  const sl__backend_ops *ops;
  int slot;
  if (kind == SL_DEVICE_CPU) {
    if (index != 0)
      return SL_ERR_NO_DEVICE;
    ops = &sl__cpu_backend;
    slot = 0;
  } else if (kind == SL_DEVICE_CUDA) {
    ops = sl__cuda_backend();
    if (!ops)
      return SL_ERR_UNSUPPORTED;
    if (index >= SL__MAX_CUDA)
      return SL_ERR_NO_DEVICE;
    slot = 1 + index;
  } else {
    return SL_ERR_INVALID_ARG;
  }
  (void)sl_rt_debug(); /* fix the debug mode before any buffer exists */
  pthread_mutex_lock(&g_rt.mu);
  sl_status st = SL_OK;
  if (!g_rt.devices[slot])
    st = device_open(kind, index, ops, &g_rt.devices[slot]);
  if (st == SL_OK)
    *out = g_rt.devices[slot];
  pthread_mutex_unlock(&g_rt.mu);
  return st;
}

sl_device_t *sl_cpu_device(void) {
  sl_device_t *d = NULL;
  sl_status st = sl_device_get(SL_DEVICE_CPU, 0, &d);
  SL_ASSERT_MSG(st == SL_OK, "the CPU device cannot be opened");
  return d;
}

bool sl_cuda_available(void) {
  sl_device_t *d;
  return sl_device_get(SL_DEVICE_CUDA, 0, &d) == SL_OK;
}

sl_device_kind sl_device_kind_of(const sl_device_t *dev) {
  return dev->kind;
}
const char *sl_device_name(const sl_device_t *dev) {
  return dev->name;
}

int sl_device_stream_count(sl_device_t *dev) {
  pthread_mutex_lock(&dev->streams_mu);
  int n = dev->nstreams;
  pthread_mutex_unlock(&dev->streams_mu);
  return n;
}

/* Calls fn on every registered stream of dev, holding the registry lock (fn
 * must not create or destroy streams). */
void sl__device_each_stream(sl_device_t *dev,
                            void (*fn)(sl_stream_t *s, void *ud), void *ud) {
  pthread_mutex_lock(&dev->streams_mu);
  for (sl_stream_t *s = dev->streams; s; s = s->reg_next)
    fn(s, ud);
  pthread_mutex_unlock(&dev->streams_mu);
}

void sl_rt_shutdown(void) {
  sl_clear_thread_streams();
  pthread_mutex_lock(&g_rt.mu);
  for (int i = SL__MAX_DEVICES - 1; i >= 0; i--) {
    sl_device_t *dev = g_rt.devices[i];
    if (!dev)
      continue;
    g_rt.devices[i] = NULL;
    if (dev->nstreams > 2)
      SL_LOGW("%s: %d stream(s) still alive at shutdown", dev->name,
              dev->nstreams - 2);
    /* user streams left alive are the caller's leak; free them anyway */
    while (dev->streams) {
      sl_stream_t *s = dev->streams;
      sl__stream_free(s);
    }
    sl__alloc_fini(dev);
    dev->ops->device_close(dev);
    pthread_mutex_destroy(&dev->access_mu);
    pthread_mutex_destroy(&dev->streams_mu);
    sl_free(dev);
  }
  pthread_mutex_unlock(&g_rt.mu);
}

#ifndef SLUICE_HAVE_CUDA
const sl__backend_ops *sl__cuda_backend(void) {
  return NULL;
}
#endif

uint64_t sl_device_mem_available(sl_device_t *dev, uint64_t *total) {
  if (total)
    *total = 0;
  if (!dev || !dev->ops->mem_avail)
    return 0;
  return dev->ops->mem_avail(dev, total);
}
