/* sluice — engine pool: many models in one process.
 *
 * One entry per servable model (a GGUF file and its names). An entry is
 * loaded on first use: the model is mapped, its memory (weights, KV pool,
 * hot tier) is planned against the pool's budget, and an engine with its own
 * executor thread and stream starts. Requests hold leases; a leased model is
 * never unloaded. When a load would exceed the budget, the least recently
 * used idle, unpinned model is unloaded first. An idle TTL unloads models
 * nobody used for that long. Unloading is sl_engine_free: the engine's own
 * executor drains its stream and clears (I3, I5) before the pool frees the
 * weights, so no clear of one engine waits for another engine's work.
 *
 * Threading: every function is thread-safe. sl_pool_acquire may block while
 * the model loads (one load per entry at a time: concurrent first requests
 * share it) or while an unload of it ends.
 */
#ifndef SLUICE_POOL_H
#define SLUICE_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sluice/engine.h"
#include "sluice/model.h"
#include "sluice/status.h"
#include "sluice/tokenizer.h"

typedef struct sl_pool sl_pool_t;

typedef struct sl_pool_config {
  /* every engine's configuration. ssd_cache_dir, when set, is a parent: each
   * model's SSD tier is the subfolder named after it. max_memory is set to the
   * pool's. */
  sl_engine_config engine;
  bool n_ctx_fixed;      /* engine.n_ctx as given (else at most the model's
                            training context) */
  uint64_t max_memory;   /* the budget over every loaded model (0: none) */
  unsigned idle_ttl_s;   /* unload a model idle this long (0: never) */
  bool prefault;         /* touch a CPU model's weights at load */
  bool progress;         /* load progress on stderr when it is a terminal */
  unsigned reap_tick_ms; /* how often the TTL is checked (1000) */
  /* each stage of a load or unload, as a line of text (NULL: none); it
   * may be called with the pool's lock held: it must not call the pool */
  void (*on_stage)(void *ud, const char *model, const char *what);
  void *stage_ud;
} sl_pool_config;

sl_pool_config sl_pool_config_defaults(void);

typedef enum sl_pool_state {
  SL_POOL_UNLOADED = 0,
  SL_POOL_LOADING,
  SL_POOL_LOADED,
  SL_POOL_UNLOADING,
} sl_pool_state;

const char *sl_pool_state_name(sl_pool_state s);

/* One entry as seen at a moment (sl_pool_info_at). The strings live as long
 * as the pool. */
typedef struct sl_pool_info {
  const char *name, *path;
  const char *aliases[4]; /* other names (sl_pool_add_alias) */
  int n_aliases;
  sl_pool_state state;
  bool pinned;
  uint64_t file_bytes;     /* the GGUF file's size */
  uint64_t bytes;          /* planned while loading or loaded, else 0 */
  int in_use;              /* leases held now */
  uint64_t requests;       /* leases ever taken */
  uint64_t loads, unloads; /* completed loads and unloads */
  uint64_t evictions;      /* unloads to make room for another model */
  uint64_t reclaims;       /* unloads by the idle TTL */
  uint64_t load_failures;  /* loads that did not end loaded */
  double last_load_ms;     /* the last load's time, 0 before one */
  double idle_s;           /* since the last lease ended (loaded only) */
  int n_ctx;               /* the engine's context (loaded only) */
  const char *arch;        /* loaded only: "llama", "qwen2", ... */
} sl_pool_info;

/* What a request uses while it holds the lease. Valid until
 * sl_pool_release. */
typedef struct sl_pool_lease {
  sl_engine_t *engine;
  const sl_model_t *model;
  const sl_tokenizer_t *tok;
  const char *name;          /* the entry's name (not the alias asked for) */
  const char *chat_template; /* NUL-terminated; NULL: the model has none */
  int n_ctx;
  int index; /* the entry; -1: no lease */
  bool look; /* sl_pool_acquire_loaded's: not a use of the model */
} sl_pool_lease;

sl_status sl_pool_create(const sl_pool_config *cfg, sl_pool_t **out);

/* Stops the TTL thread and unloads every model. No lease may be held. */
void sl_pool_free(sl_pool_t *p);

/* Adds a model: `name` (unique among names and aliases), `path` (a GGUF
 * file that must exist; it is read at load). SL_ERR_INVALID_ARG for a name
 * taken, SL_ERR_IO for a file that cannot be opened; err says which. */
sl_status sl_pool_add(sl_pool_t *p, const char *name, const char *path,
                      char *err, size_t errcap);
/* Another name for an entry (at most four each). */
sl_status sl_pool_add_alias(sl_pool_t *p, const char *alias, const char *name,
                            char *err, size_t errcap);
/* Pinned models are never unloaded by eviction or the TTL. */
sl_status sl_pool_set_pinned(sl_pool_t *p, const char *name, bool pinned);

int sl_pool_count(sl_pool_t *p);
/* How many entries are LOADED now. */
int sl_pool_loaded_count(sl_pool_t *p);
/* The entry named `name` (a name or an alias), or -1. */
int sl_pool_find(sl_pool_t *p, const char *name);
bool sl_pool_info_at(sl_pool_t *p, int i, sl_pool_info *out);

/* Leases the model named `name`, loading it when needed (waiting for a load
 * under way, or for an unload to end and then loading again). Errors:
 * SL_ERR_NOT_FOUND (no such name), SL_ERR_MEMORY_LIMIT (it does not fit the
 * budget even with every idle unpinned model unloaded), or the load's own
 * status; err says why. Concurrent callers of one load all get its result. */
sl_status sl_pool_acquire(sl_pool_t *p, const char *name, sl_pool_lease *out,
                          char *err, size_t errcap);
/* Leases entry i only if it is loaded now (no load). */
bool sl_pool_acquire_loaded(sl_pool_t *p, int i, sl_pool_lease *out);
/* Ends a lease (index -1: no-op) and marks it released. */
void sl_pool_release(sl_pool_t *p, sl_pool_lease *l);

/* Loads `name` now (as a request would, without keeping a lease). */
sl_status sl_pool_load(sl_pool_t *p, const char *name, char *err,
                       size_t errcap);
/* Unloads `name`: SL_ERR_STATE when it is leased or pinned (err says
 * which), SL_OK when it is unloaded (also when it already was). */
sl_status sl_pool_unload(sl_pool_t *p, const char *name, char *err,
                         size_t errcap);

/* The bytes all loaded and loading models plan to use. */
uint64_t sl_pool_planned_bytes(sl_pool_t *p);

#endif
