/* sluice — kv: the tier interface (kv_tier.h), dispatched to each tier's
 * ops (tier_impl.h): the SSD tier (tier_ssd.c) and the hot RAM tier
 * (tier_ram.c) today, a shared remote tier next. */
#include "tier_impl.h"

bool sl_kv_tier_contains(sl_kv_tier_t *t, const sl_kv_block_key *key) {
  return t->ops->contains(t, key, true);
}

bool sl_kv_tier_peek(sl_kv_tier_t *t, const sl_kv_block_key *key) {
  return t->ops->contains(t, key, false);
}

sl_status sl_kv_tier_get(sl_kv_tier_t *t, const sl_kv_block_key *key, void *dst,
                         size_t n) {
  return t->ops->get(t, key, dst, n);
}

sl_status sl_kv_tier_put(sl_kv_tier_t *t, const sl_kv_block_key *key,
                         const void *src, size_t n) {
  return t->ops->put(t, key, src, n);
}

sl_status sl_kv_tier_get_ref(sl_kv_tier_t *t, const sl_kv_block_key *key,
                             const void **p, size_t n, void **hold) {
  *p = NULL;
  *hold = NULL;
  return t->ops->get_ref ? t->ops->get_ref(t, key, p, n, hold)
                         : SL_ERR_UNSUPPORTED;
}

void sl_kv_tier_unref(sl_kv_tier_t *t, void *hold) {
  if (hold)
    t->ops->unref(t, hold);
}

sl_kv_tier_stats sl_kv_tier_stats_of(sl_kv_tier_t *t) {
  return t->ops->stats(t);
}

void sl_kv_tier_close(sl_kv_tier_t *t) {
  if (t)
    t->ops->close(t);
}
