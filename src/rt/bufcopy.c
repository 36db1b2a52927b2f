/* Host <-> buffer copies (sl_buf_write / sl_buf_read): a task on the
 * buffer's owner stream, waited for. Apart from alloc.c, so that the
 * allocator does not call back into stream submission. */
#include "rt/rt_impl.h"

typedef struct copy_arg {
  sl_buf_t *b;
  size_t off, n;
  void *host;
  bool to_device;
} copy_arg;

static sl_status copy_task(const sl_task_ctx *ctx, void *arg) {
  copy_arg *c = arg;
  char *dptr = (char *)sl_buf_ptr(c->b) + c->off;
  sl_device_t *dev = c->b->dev;
  if (c->to_device)
    return dev->ops->copy(ctx, dptr, c->host, c->n, true);
  return dev->ops->copy(ctx, c->host, dptr, c->n, false);
}

static sl_status buf_copy(sl_buf_t *b, size_t off, void *host, size_t n,
                          bool to_device) {
  if (!b || (!host && n) || off > b->size || n > b->size - off)
    return SL_ERR_INVALID_ARG;
  if (!n)
    return SL_OK;
  copy_arg c = {b, off, n, host, to_device};
  uint64_t seq;
  sl_status st =
      sl_stream_submit(b->owner, copy_task, &c, sizeof c, &b, 1, &seq);
  if (st != SL_OK)
    return st;
  return sl_stream_wait_seq(b->owner, seq);
}

sl_status sl_buf_write(sl_buf_t *b, size_t off, const void *src, size_t n) {
  return buf_copy(b, off, (void *)src, n, true);
}

sl_status sl_buf_read(sl_buf_t *b, size_t off, void *dst, size_t n) {
  return buf_copy(b, off, dst, n, false);
}
