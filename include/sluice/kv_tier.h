/* sluice — kv: the tiers below the block pool (DESIGN.md, "KV cache").
 *
 * A tier keeps copies of full prefix blocks, keyed by the pool's chain hash
 * (sl_kv_hash_block) and checked against the block's token ids. The engine
 * looks a prefix up in the pool first, then in each tier, and restores the
 * longest chain it finds; the store worker puts finished blocks into the
 * tiers. One interface, so that a shared remote tier can stand behind it
 * later without touching the engine.
 *
 * A block's bytes, as a tier holds them: for each layer, K then V, each
 * block_tokens * kv_dim f16 values (sl_kv_block_bytes in all).
 *
 * Threading: every operation may be called from any thread; a tier locks
 * its own index, and does its I/O outside that lock.
 */
#ifndef SLUICE_KV_TIER_H
#define SLUICE_KV_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sluice/status.h"

typedef struct sl_kv_tier sl_kv_tier_t;

/* What a block is: the pool's fingerprint (model, KV dtype and layout, T),
 * its chain hash and its token ids. */
typedef struct sl_kv_block_key {
  uint64_t fingerprint;
  uint64_t hash;
  const int32_t *tokens; /* block_tokens of them */
} sl_kv_block_key;

typedef struct sl_kv_tier_stats {
  const char *name;    /* "hot", "ssd" */
  bool enabled;        /* false while a write fault has it off */
  uint64_t entries;    /* blocks held */
  uint64_t bytes;      /* bytes held (files, headers included) */
  uint64_t budget;     /* byte budget in effect (SSD: clamped to the disk) */
  uint64_t hits;       /* gets that returned a block */
  uint64_t misses;     /* lookups that found nothing */
  uint64_t puts;       /* blocks written */
  uint64_t put_bytes;  /* payload bytes written */
  uint64_t get_bytes;  /* payload bytes restored */
  uint64_t evictions;  /* blocks dropped for the budget */
  uint64_t corrupt;    /* blocks found bad when read, dropped */
  uint64_t skipped;    /* files skipped when the index was rebuilt */
  uint64_t faults;     /* write faults (ENOSPC, EIO, ...), recovered or not */
  uint64_t compressed; /* blocks stored lz4-compressed (hot tier) */
  double get_ms_total; /* time spent in get (restore latency) */
  double put_ms_total; /* time spent in put */
} sl_kv_tier_stats;

/* True when the tier holds `key` (no I/O). */
bool sl_kv_tier_contains(sl_kv_tier_t *t, const sl_kv_block_key *key);
/* The same answer, not counted as a lookup (a miss here is no miss of a
 * prefix: the store worker asks whether a block still needs writing). */
bool sl_kv_tier_peek(sl_kv_tier_t *t, const sl_kv_block_key *key);

/* Reads the block into dst (n bytes, the block's size). A block that is
 * missing returns SL_ERR_NOT_FOUND; one that fails its checksum or reads
 * short is dropped from the tier and returns SL_ERR_FORMAT: the caller
 * recomputes its tokens. */
sl_status sl_kv_tier_get(sl_kv_tier_t *t, const sl_kv_block_key *key, void *dst,
                         size_t n);

/* The block in place: *p points at the tier's own copy of its n bytes,
 * valid until sl_kv_tier_unref(t, *hold) (the block may leave the tier
 * meanwhile; its memory stays until then). For a caller that copies it
 * out later, such as a restore's asynchronous copy to the device.
 * SL_ERR_UNSUPPORTED where the tier cannot (the SSD tier; a block held
 * compressed): use sl_kv_tier_get. Counted as a get. */
sl_status sl_kv_tier_get_ref(sl_kv_tier_t *t, const sl_kv_block_key *key,
                             const void **p, size_t n, void **hold);
void sl_kv_tier_unref(sl_kv_tier_t *t, void *hold);

/* Stores a copy of the block (n bytes). A block already held is kept
 * (SL_OK). SL_ERR_IO: the write failed; a tier turns itself off on a fault
 * that will repeat (ENOSPC, EIO, EROFS), logs one line, and from then on
 * every put returns SL_ERR_STATE and every lookup misses. */
sl_status sl_kv_tier_put(sl_kv_tier_t *t, const sl_kv_block_key *key,
                         const void *src, size_t n);

sl_kv_tier_stats sl_kv_tier_stats_of(sl_kv_tier_t *t);
void sl_kv_tier_close(sl_kv_tier_t *t);

/* ---- the SSD tier ---------------------------------------------------------
 * One file per block under `dir`: <dir>/<hash as 16 hex digits>.slkv,
 * written under a temporary name, fsynced, then renamed. The file (all
 * integers little endian):
 *
 *   offset  size  field
 *   0       8     magic "SLKVBLK\0"
 *   8       4     version (1)
 *   12      4     header bytes H (64 + 4 * n_tokens)
 *   16      8     fingerprint
 *   24      8     block hash
 *   32      4     n_tokens (block_tokens)
 *   36      4     n_layer
 *   40      4     kv_dim
 *   44      4     dtype (1: f16)
 *   48      8     payload bytes P
 *   56      8     XXH3-64 of the payload
 *   64      4*n   token ids
 *   H       8     XXH3-64 of bytes 0..H-1 (the header's own checksum)
 *   H+8     P     payload
 *
 * At open the index is rebuilt from the headers (a progress line on stderr
 * when that takes more than a second). A file whose header checksum fails,
 * whose version, fingerprint or shape differs, whose size does not match,
 * or whose name is not its hash is skipped and counted, never served; a
 * payload that fails its checksum when read is dropped and recomputed.
 *
 * The budget is clamped to what the filesystem holds (at open, with a
 * warning; it grows back as space returns). A write that fails for space
 * evicts the tier's own oldest files and retries once; the tier turns off
 * only when that fails too, and back on when space returns (looked at
 * once a second, on puts). Other write faults turn it off until restart. */
typedef struct sl_kv_ssd_config {
  const char *dir;      /* must exist and be writable */
  uint64_t budget;      /* bytes; least recently used files go first */
  uint64_t fingerprint; /* the pool's (sl_kv_config.fingerprint) */
  int n_layer, kv_dim, block_tokens;
  bool quiet; /* no progress or fault lines on stderr */
} sl_kv_ssd_config;

/* Payload bytes of one block: sl_kv_block_bytes of the shape. */
size_t sl_kv_ssd_payload_bytes(const sl_kv_ssd_config *cfg);

/* Opens (and indexes) the tier. A missing, unreadable or read-only `dir` is
 * SL_ERR_IO with the reason in err. */
sl_status sl_kv_ssd_open(const sl_kv_ssd_config *cfg, sl_kv_tier_t **out,
                         char *err, size_t err_size);

/* Reads one block file's header from memory, as the index rebuild does:
 * SL_OK when it is whole and valid for cfg, SL_ERR_FORMAT otherwise. Pure;
 * for tests and the fuzz harness. *payload_at and *payload_bytes (may be
 * NULL) tell where the payload starts and how long it is. */
sl_status sl_kv_ssd_parse_header(const sl_kv_ssd_config *cfg, const void *buf,
                                 size_t n, uint64_t *hash, size_t *payload_at,
                                 uint64_t *payload_bytes);

/* ---- the hot RAM tier ------------------------------------------------------
 * Blocks in host memory, the least recently used leaving first when the
 * byte budget (entries, token ids and payloads) is passed; keyed like the
 * SSD tier, with the token ids compared in full. With lz4, a block is held
 * compressed when that saves at least an eighth of it, raw otherwise
 * (stats: compressed). Nothing survives close. */
typedef struct sl_kv_ram_config {
  uint64_t budget;      /* bytes, > 0 */
  uint64_t fingerprint; /* the pool's */
  int n_layer, kv_dim, block_tokens;
  bool lz4;
  /* Where payloads live: NULL (both) for the entry's own allocation; else
   * a slot of pay_alloc(pay_ctx, payload bytes) each, given back with
   * pay_free (the engine's page-locked memory on CUDA, so that a restore
   * copies the tier's own bytes to the device). A slot counts at the raw
   * size; compression is not used with slots. Called from any thread, pay_free
   * possibly under the tier's mutex: neither may call into the tier. */
  void *(*pay_alloc)(void *ctx, size_t n);
  void (*pay_free)(void *ctx, void *p);
  void *pay_ctx;
} sl_kv_ram_config;

sl_status sl_kv_ram_open(const sl_kv_ram_config *cfg, sl_kv_tier_t **out);

#endif
