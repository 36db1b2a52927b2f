/* sluice — kv: what every tier implements (private to src/kv).
 *
 * A tier is a struct that starts with sl_kv_tier_t, whose ops the public
 * functions of kv_tier.h call (tier.c). Each op has the contract written
 * in kv_tier.h for the function of the same name.
 */
#ifndef SLUICE_KV_TIER_IMPL_H
#define SLUICE_KV_TIER_IMPL_H

#include "sluice/kv_tier.h"

typedef struct sl_kv_tier_ops {
  /* count: a miss counts in the stats (not for sl_kv_tier_peek) */
  bool (*contains)(sl_kv_tier_t *t, const sl_kv_block_key *key, bool count);
  sl_status (*get)(sl_kv_tier_t *t, const sl_kv_block_key *key, void *dst,
                   size_t n);
  sl_status (*put)(sl_kv_tier_t *t, const sl_kv_block_key *key, const void *src,
                   size_t n);
  sl_kv_tier_stats (*stats)(sl_kv_tier_t *t);
  void (*close)(sl_kv_tier_t *t);
  /* optional (NULL: SL_ERR_UNSUPPORTED) */
  sl_status (*get_ref)(sl_kv_tier_t *t, const sl_kv_block_key *key,
                       const void **p, size_t n, void **hold);
  void (*unref)(sl_kv_tier_t *t, void *hold);
} sl_kv_tier_ops;

struct sl_kv_tier {
  const sl_kv_tier_ops *ops;
};

#endif
