/* sluice — kv: the SSD tier (one file per block; format in kv_tier.h).
 *
 * The index is an open-addressing table keyed by block hash, under one
 * mutex; file I/O runs outside it. Recency is a counter stamped at each
 * lookup and put; eviction removes the smallest stamp (a scan: the table
 * holds at most budget / block size entries, thousands, and eviction runs
 * once per put over budget).
 *
 * Space. The budget in effect (`limit`, st.budget) is the configured one
 * clamped to what the filesystem can hold: at open, the files held plus
 * SSD_FREE_SHARE of the free space (a warning when that clamps). A write
 * that fails for space (ENOSPC, EDQUOT: something else filled the disk)
 * evicts the tier's own least recently used files until one block's file
 * was freed, lowers the limit to the bytes then held, and retries once;
 * only when that fails too (or nothing was left to evict) does the tier
 * turn off. While the tier is off for space, or its limit is under the
 * configured budget, a put looks at the free space again (at most every
 * SSD_PROBE_MS): room for SSD_BACK_FILES files turns it back on, and the
 * limit grows back toward the budget. A fault of another kind (EIO,
 * EROFS, EFBIG) turns it off until restart.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "sluice/util.h"
#include "tier_impl.h"

#define SSD_MAGIC      "SLKVBLK"
#define SSD_VERSION    1u
#define SSD_FIXED      64u
#define SSD_DTYPE_F16  1u
#define SSD_SUFFIX     ".slkv"
#define SSD_FREE_SHARE 0.9  /* of the free space the tier may fill */
#define SSD_PROBE_MS   1000 /* free space looked at, at most this often */
#define SSD_BACK_FILES 4    /* free room that turns the tier back on */

typedef struct ssd_entry {
  uint64_t hash; /* 0: empty; tombstones are never left (backward shift) */
  uint64_t tok_hash;
  uint64_t file_bytes;
  uint64_t stamp;
} ssd_entry;

typedef struct ssd_tier {
  sl_kv_tier_t base; /* first: the ops */
  sl_kv_ssd_config cfg;
  char *dir;
  size_t payload_bytes, header_bytes; /* H, P of every block of this pool */
  pthread_mutex_t mu;
  ssd_entry *tab;
  size_t cap, n; /* cap: a power of two */
  uint64_t clock;
  uint64_t limit;    /* the budget in effect (st.budget): <= cfg.budget */
  int off_errno;     /* why it is off (0: on) */
  uint64_t t_probe;  /* when free space was last looked at (ns) */
  uint64_t fs_block; /* the filesystem's block (statvfs f_frsize) */
  sl_kv_tier_stats st;
} ssd_tier;

static uint32_t rd32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) {
  return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}
static void wr32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}
static void wr64(uint8_t *p, uint64_t v) {
  wr32(p, (uint32_t)v);
  wr32(p + 4, (uint32_t)(v >> 32));
}

static uint64_t tokens_hash(const int32_t *t, int n) {
  return XXH3_64bits(t, (size_t)n * sizeof *t);
}

/* ---- the index ------------------------------------------------------------
 */

static size_t slot_of(const ssd_tier *t, uint64_t h) {
  size_t i = (size_t)(h * 0x9E3779B97F4A7C15ull) & (t->cap - 1);
  while (t->tab[i].hash && t->tab[i].hash != h)
    i = (i + 1) & (t->cap - 1);
  return i;
}

static bool grow(ssd_tier *t) {
  size_t old_cap = t->cap;
  ssd_entry *old = t->tab;
  size_t cap = old_cap ? old_cap * 2 : 64;
  ssd_entry *tab = calloc(cap, sizeof *tab);
  if (!tab)
    return false;
  t->tab = tab;
  t->cap = cap;
  for (size_t i = 0; i < old_cap; i++)
    if (old[i].hash)
      t->tab[slot_of(t, old[i].hash)] = old[i];
  free(old);
  return true;
}

/* Removes the entry at slot i, shifting the probe chain back over it. */
static void remove_at(ssd_tier *t, size_t i) {
  size_t mask = t->cap - 1;
  t->st.bytes -= t->tab[i].file_bytes;
  t->tab[i].hash = 0;
  t->n--;
  size_t j = i;
  for (;;) {
    j = (j + 1) & mask;
    if (!t->tab[j].hash)
      return;
    size_t home = (size_t)(t->tab[j].hash * 0x9E3779B97F4A7C15ull) & mask;
    /* moves j back to i when its home is not in (i, j] cyclically */
    bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (!stays) {
      t->tab[i] = t->tab[j];
      t->tab[j].hash = 0;
      i = j;
    }
  }
}

static bool insert(ssd_tier *t, uint64_t h, uint64_t tok_hash,
                   uint64_t file_bytes, uint64_t stamp) {
  if ((t->n + 1) * 4 > t->cap * 3 && !grow(t))
    return false;
  size_t i = slot_of(t, h);
  if (t->tab[i].hash)
    return true; /* held already */
  t->tab[i] = (ssd_entry){h, tok_hash, file_bytes, stamp};
  t->n++;
  t->st.bytes += file_bytes;
  return true;
}

static void file_name(const ssd_tier *t, uint64_t h, char *out, size_t n) {
  snprintf(out, n, "%s/%016" PRIx64 SSD_SUFFIX, t->dir, h);
}

/* Under mu: drops least recently used entries (and their files) until the
 * bytes fit `limit`. */
static void evict_to(ssd_tier *t, uint64_t limit) {
  while (t->n && t->st.bytes > limit) {
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < t->cap; i++)
      if (t->tab[i].hash &&
          (best == SIZE_MAX || t->tab[i].stamp < t->tab[best].stamp))
        best = i;
    char path[4096];
    file_name(t, t->tab[best].hash, path, sizeof path);
    unlink(path);
    remove_at(t, best);
    t->st.evictions++;
  }
}

static void evict_to_budget(ssd_tier *t) {
  evict_to(t, t->limit);
}

/* One block file's bytes: the header, its XXH3, the payload. */
static uint64_t file_bytes(const ssd_tier *t) {
  return t->header_bytes + 8 + t->payload_bytes;
}

/* Bytes free to an unprivileged writer on the tier's filesystem (or
 * UINT64_MAX when that cannot be known). */
static uint64_t free_bytes(ssd_tier *t) {
  struct statvfs sv;
  if (statvfs(t->dir, &sv) != 0)
    return UINT64_MAX;
  if (sv.f_frsize)
    t->fs_block = sv.f_frsize;
  return (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
}

/* What the filesystem lets the tier hold: its files and as many more as
 * a share of the free space holds (each takes whole filesystem blocks),
 * at most the configured budget. Under mu. */
static uint64_t space_limit(const ssd_tier *t, uint64_t avail) {
  if (avail == UINT64_MAX)
    return t->cfg.budget;
  uint64_t file = file_bytes(t);
  uint64_t fb = t->fs_block ? t->fs_block : 4096;
  uint64_t on_disk = (file + fb - 1) / fb * fb;
  uint64_t more = (uint64_t)((double)avail * SSD_FREE_SHARE) / on_disk;
  uint64_t can = t->st.bytes + more * file;
  return can < t->cfg.budget ? can : t->cfg.budget;
}

/* ---- the header ------------------------------------------------------------
 */

sl_status sl_kv_ssd_parse_header(const sl_kv_ssd_config *cfg, const void *buf,
                                 size_t n, uint64_t *hash, size_t *payload_at,
                                 uint64_t *payload_bytes) {
  const uint8_t *p = buf;
  if (n < SSD_FIXED + 8 || memcmp(p, SSD_MAGIC, 8) != 0)
    return SL_ERR_FORMAT;
  uint32_t hb = rd32(p + 12);
  uint32_t nt = rd32(p + 32);
  if (rd32(p + 8) != SSD_VERSION || nt != (uint32_t)cfg->block_tokens ||
      hb != SSD_FIXED + 4u * nt || n < (size_t)hb + 8)
    return SL_ERR_FORMAT;
  if (XXH3_64bits(p, hb) != rd64(p + hb))
    return SL_ERR_FORMAT; /* a flipped header byte */
  uint64_t pb = rd64(p + 48);
  if (rd64(p + 16) != cfg->fingerprint ||
      rd32(p + 36) != (uint32_t)cfg->n_layer ||
      rd32(p + 40) != (uint32_t)cfg->kv_dim || rd32(p + 44) != SSD_DTYPE_F16 ||
      pb != sl_kv_ssd_payload_bytes(cfg))
    return SL_ERR_FORMAT; /* another model, layout or version */
  if (hash)
    *hash = rd64(p + 24);
  if (payload_at)
    *payload_at = (size_t)hb + 8;
  if (payload_bytes)
    *payload_bytes = pb;
  return SL_OK;
}

/* ---- open: the index rebuilt from the headers ------------------------------
 */

static bool hex16(const char *s, uint64_t *out) {
  uint64_t v = 0;
  for (int i = 0; i < 16; i++) {
    char c = s[i];
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                   : -1;
    if (d < 0)
      return false;
    v = v << 4 | (uint64_t)d;
  }
  *out = v;
  return true;
}

/* Reads one file's header; adds it to the index or counts it skipped. */
static void index_file(ssd_tier *t, const char *name, uint8_t *hbuf) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", t->dir, name);
  uint64_t named;
  size_t len = strlen(name);
  bool ok = len == 16 + strlen(SSD_SUFFIX) && hex16(name, &named) &&
            strcmp(name + 16, SSD_SUFFIX) == 0;
  int fd = ok ? open(path, O_RDONLY | O_CLOEXEC) : -1;
  struct stat sb;
  uint64_t h = 0, pb = 0;
  size_t at = 0;
  size_t want = t->header_bytes + 8;
  ok = fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) &&
       pread(fd, hbuf, want, 0) == (ssize_t)want &&
       sl_kv_ssd_parse_header(&t->cfg, hbuf, want, &h, &at, &pb) == SL_OK &&
       h == named && (uint64_t)sb.st_size == at + pb;
  if (fd >= 0)
    close(fd);
  if (!ok) {
    t->st.skipped++;
    return;
  }
  /* older files first out: the stamp follows the modification time */
  uint64_t stamp = (uint64_t)sb.st_mtim.tv_sec * 1000000000ull +
                   (uint64_t)sb.st_mtim.tv_nsec;
  const int32_t *toks = (const int32_t *)(hbuf + SSD_FIXED);
  int32_t tmp[4096];
  int nt = t->cfg.block_tokens;
  if (nt > 4096) {
    t->st.skipped++;
    return;
  }
  memcpy(tmp, toks, (size_t)nt * sizeof *tmp); /* aligned */
  if (!insert(t, h, tokens_hash(tmp, nt), (uint64_t)sb.st_size, stamp))
    t->st.skipped++;
}

size_t sl_kv_ssd_payload_bytes(const sl_kv_ssd_config *cfg) {
  return 2ull * (size_t)cfg->n_layer * (size_t)cfg->block_tokens *
         (size_t)cfg->kv_dim * sizeof(uint16_t);
}

static const sl_kv_tier_ops ssd_ops; /* defined at the end */
static void ssd_close(sl_kv_tier_t *bt);

sl_status sl_kv_ssd_open(const sl_kv_ssd_config *cfg, sl_kv_tier_t **out,
                         char *err, size_t err_size) {
  *out = NULL;
  struct stat sb;
  if (!cfg->dir || !*cfg->dir || stat(cfg->dir, &sb) != 0) {
    int e = cfg->dir && *cfg->dir ? errno : ENOENT;
    if (e == ENOENT)
      snprintf(err, err_size, "the SSD cache directory '%s' does not exist",
               cfg->dir ? cfg->dir : "");
    else
      snprintf(err, err_size, "the SSD cache directory '%s' cannot be used: %s",
               cfg->dir, strerror(e));
    return SL_ERR_IO;
  }
  if (!S_ISDIR(sb.st_mode)) {
    snprintf(err, err_size, "the SSD cache directory '%s' is not a directory",
             cfg->dir);
    return SL_ERR_IO;
  }
  if (access(cfg->dir, R_OK | W_OK | X_OK) != 0) {
    snprintf(err, err_size,
             "the SSD cache directory '%s' is not readable and writable (%s)",
             cfg->dir, strerror(errno));
    return SL_ERR_IO;
  }
  if (cfg->block_tokens <= 0 || cfg->block_tokens > 4096 || cfg->n_layer <= 0 ||
      cfg->kv_dim <= 0) {
    snprintf(err, err_size, "bad SSD tier shape");
    return SL_ERR_INVALID_ARG;
  }
  ssd_tier *t = calloc(1, sizeof *t);
  if (!t || !(t->dir = strdup(cfg->dir)) || !grow(t)) {
    if (t)
      free(t->dir);
    free(t);
    snprintf(err, err_size, "out of memory");
    return SL_ERR_NOMEM;
  }
  t->base.ops = &ssd_ops;
  t->cfg = *cfg;
  t->cfg.dir = t->dir;
  t->payload_bytes = sl_kv_ssd_payload_bytes(cfg);
  t->header_bytes = SSD_FIXED + 4u * (size_t)cfg->block_tokens;
  t->st.name = "ssd";
  t->st.enabled = true;
  t->st.budget = t->limit = cfg->budget;
  pthread_mutex_init(&t->mu, NULL);
  DIR *d = opendir(t->dir);
  uint8_t *hbuf = malloc(t->header_bytes + 8);
  if (!d || !hbuf) {
    snprintf(err, err_size, "cannot read the SSD cache directory '%s': %s",
             t->dir, strerror(errno));
    if (d)
      closedir(d);
    free(hbuf);
    ssd_close(&t->base);
    return SL_ERR_IO;
  }
  double t0 = sl_ns_to_ms(sl_now_ns()), last = t0;
  uint64_t seen = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.') {
      /* a temporary file left by a write that never finished (a kill -9
       * between write and rename): never served, removed */
      if (strstr(de->d_name, ".tmp")) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", t->dir, de->d_name);
        unlink(path);
      }
      continue;
    }
    if (!strstr(de->d_name, SSD_SUFFIX))
      continue;
    index_file(t, de->d_name, hbuf);
    seen++;
    double now = sl_ns_to_ms(sl_now_ns());
    if (!cfg->quiet && now - last > 1000) {
      fprintf(stderr, "sluice: SSD cache: indexed %llu block files...\n",
              (unsigned long long)seen);
      last = now;
    }
  }
  closedir(d);
  free(hbuf);
  t->st.entries = t->n;
  if (!cfg->quiet && sl_ns_to_ms(sl_now_ns()) - t0 > 1000)
    fprintf(stderr,
            "sluice: SSD cache: %llu blocks indexed, %llu files skipped, "
            "in %.1f s\n",
            (unsigned long long)t->n, (unsigned long long)t->st.skipped,
            (sl_ns_to_ms(sl_now_ns()) - t0) / 1e3);
  /* stamps from mtimes, then a clock above them all */
  for (size_t i = 0; i < t->cap; i++)
    if (t->tab[i].hash && t->tab[i].stamp > t->clock)
      t->clock = t->tab[i].stamp;
  /* a budget past what the filesystem can hold: clamped, with a warning */
  uint64_t avail = free_bytes(t);
  t->limit = space_limit(t, avail);
  t->st.budget = t->limit;
  t->t_probe = sl_now_ns();
  if (t->limit < cfg->budget && !cfg->quiet)
    fprintf(stderr,
            "sluice: SSD cache: the budget (%llu bytes, --ssd-cache-bytes) "
            "is more than '%s' can hold (%llu bytes of block files and "
            "%llu free): using %llu bytes\n",
            (unsigned long long)cfg->budget, t->dir,
            (unsigned long long)t->st.bytes, (unsigned long long)avail,
            (unsigned long long)t->limit);
  evict_to_budget(t);
  t->st.entries = t->n;
  *out = &t->base;
  return SL_OK;
}

static void ssd_close(sl_kv_tier_t *bt) {
  ssd_tier *t = (ssd_tier *)bt;
  if (!t)
    return;
  pthread_mutex_destroy(&t->mu);
  free(t->tab);
  free(t->dir);
  free(t);
}

/* ---- lookups, gets and puts ------------------------------------------------
 */

static bool ssd_contains(sl_kv_tier_t *bt, const sl_kv_block_key *key,
                         bool count) {
  ssd_tier *t = (ssd_tier *)bt;
  pthread_mutex_lock(&t->mu);
  bool ok = false;
  if (t->st.enabled && key->fingerprint == t->cfg.fingerprint) {
    size_t i = slot_of(t, key->hash);
    ok = t->tab[i].hash == key->hash &&
         t->tab[i].tok_hash == tokens_hash(key->tokens, t->cfg.block_tokens);
  }
  if (!ok && count)
    t->st.misses++;
  pthread_mutex_unlock(&t->mu);
  return ok;
}

static void drop(ssd_tier *t, uint64_t h, bool corrupt) {
  char path[4096];
  file_name(t, h, path, sizeof path);
  pthread_mutex_lock(&t->mu);
  size_t i = slot_of(t, h);
  if (t->tab[i].hash == h)
    remove_at(t, i);
  if (corrupt)
    t->st.corrupt++;
  t->st.entries = t->n;
  pthread_mutex_unlock(&t->mu);
  unlink(path);
}

static sl_status ssd_get(sl_kv_tier_t *bt, const sl_kv_block_key *key,
                         void *dst, size_t n) {
  ssd_tier *t = (ssd_tier *)bt;
  double t0 = sl_ns_to_ms(sl_now_ns());
  if (n != t->payload_bytes || key->fingerprint != t->cfg.fingerprint)
    return SL_ERR_INVALID_ARG;
  pthread_mutex_lock(&t->mu);
  size_t i = slot_of(t, key->hash);
  bool held = t->st.enabled && t->tab[i].hash == key->hash;
  if (held)
    t->tab[i].stamp = ++t->clock;
  pthread_mutex_unlock(&t->mu);
  if (!held)
    return SL_ERR_NOT_FOUND;
  char path[4096];
  file_name(t, key->hash, path, sizeof path);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    drop(t, key->hash, false);
    return SL_ERR_NOT_FOUND;
  }
  size_t hn = t->header_bytes + 8;
  uint8_t *hbuf = malloc(hn);
  uint64_t h = 0, pb = 0;
  size_t at = 0;
  bool ok = hbuf && pread(fd, hbuf, hn, 0) == (ssize_t)hn &&
            sl_kv_ssd_parse_header(&t->cfg, hbuf, hn, &h, &at, &pb) == SL_OK &&
            h == key->hash && pb == n &&
            memcmp(hbuf + SSD_FIXED, key->tokens,
                   (size_t)t->cfg.block_tokens * sizeof(int32_t)) == 0;
  uint64_t want_sum = ok ? rd64(hbuf + 56) : 0;
  free(hbuf);
  size_t got = 0;
  while (ok && got < n) {
    ssize_t k = pread(fd, (uint8_t *)dst + got, n - got, (off_t)(at + got));
    if (k <= 0)
      break;
    got += (size_t)k;
  }
  close(fd);
  ok = ok && got == n && XXH3_64bits(dst, n) == want_sum;
  if (!ok) {
    drop(t, key->hash, true);
    return SL_ERR_FORMAT;
  }
  pthread_mutex_lock(&t->mu);
  t->st.hits++;
  t->st.get_bytes += n;
  t->st.get_ms_total += sl_ns_to_ms(sl_now_ns()) - t0;
  pthread_mutex_unlock(&t->mu);
  return SL_OK;
}

static bool write_all(int fd, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n) {
    ssize_t k = write(fd, b, n);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0) {
      if (k == 0)
        errno = EIO;
      return false;
    }
    b += k;
    n -= (size_t)k;
  }
  return true;
}

static bool space_fault(int e) {
  return e == ENOSPC || e == EDQUOT;
}

static void turn_off(ssd_tier *t, int e) {
  pthread_mutex_lock(&t->mu);
  bool was = t->st.enabled;
  t->st.enabled = false;
  t->off_errno = e;
  t->t_probe = sl_now_ns();
  pthread_mutex_unlock(&t->mu);
  if (was && !t->cfg.quiet)
    fprintf(stderr,
            "sluice: SSD cache: writing to '%s' failed (%s)%s; the SSD tier "
            "is off %s, serving goes on\n",
            t->dir, strerror(e),
            space_fault(e) ? " with none of its own files left to evict" : "",
            space_fault(e) ? "until space returns" : "until restart");
}

/* Before a put: while the tier is off for space, or its limit is under
 * the budget, looks at the free space (at most every SSD_PROBE_MS) and
 * turns it back on or raises the limit. True when the tier is on. */
static bool probe_space(ssd_tier *t) {
  pthread_mutex_lock(&t->mu);
  bool on = t->st.enabled;
  bool want = on ? t->limit < t->cfg.budget : space_fault(t->off_errno);
  uint64_t now = sl_now_ns();
  if (!want || now - t->t_probe < SSD_PROBE_MS * 1000000ull) {
    pthread_mutex_unlock(&t->mu);
    return on;
  }
  t->t_probe = now;
  pthread_mutex_unlock(&t->mu);
  uint64_t avail = free_bytes(t); /* a system call: outside mu */
  pthread_mutex_lock(&t->mu);
  uint64_t file = file_bytes(t);
  bool back = !t->st.enabled && space_fault(t->off_errno) &&
              avail != UINT64_MAX && avail >= SSD_BACK_FILES * file;
  if (back) {
    t->st.enabled = true;
    t->off_errno = 0;
  }
  uint64_t lim = space_limit(t, avail);
  if (lim > t->limit)
    t->limit = t->st.budget = lim;
  on = t->st.enabled;
  pthread_mutex_unlock(&t->mu);
  if (back && !t->cfg.quiet)
    fprintf(stderr,
            "sluice: SSD cache: '%s' has room again (%llu bytes free); the "
            "SSD tier is on\n",
            t->dir, (unsigned long long)avail);
  return on;
}

/* Writes one block file (under a temporary name, then renamed). 0, or
 * the errno of the failure. */
static int write_block(const char *tmp, const char *path, const void *hbuf,
                       size_t hn, const void *src, size_t n) {
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && write_all(fd, hbuf, hn) && write_all(fd, src, n) &&
            fsync(fd) == 0;
  int e = ok ? 0 : errno;
  if (fd >= 0 && close(fd) != 0 && ok) {
    ok = false;
    e = errno;
  }
  if (ok && rename(tmp, path) != 0) {
    ok = false;
    e = errno;
  }
  if (!ok) {
    unlink(tmp);
    return e ? e : EIO;
  }
  return 0;
}

/* A write failed for space: drops the tier's least recently used files
 * until one block's file is freed, and keeps the limit at what is then
 * held with that one file (the filesystem holds no more). True when
 * anything was freed. */
static bool make_room(ssd_tier *t, uint64_t file) {
  pthread_mutex_lock(&t->mu);
  uint64_t before = t->st.bytes;
  evict_to(t, before > file ? before - file : 0);
  bool freed = t->st.bytes < before;
  t->limit = t->st.budget = t->st.bytes + file; /* with the one retried */
  t->t_probe = sl_now_ns();
  t->st.entries = t->n;
  pthread_mutex_unlock(&t->mu);
  return freed;
}

static sl_status ssd_put(sl_kv_tier_t *bt, const sl_kv_block_key *key,
                         const void *src, size_t n) {
  ssd_tier *t = (ssd_tier *)bt;
  double t0 = sl_ns_to_ms(sl_now_ns());
  if (n != t->payload_bytes || key->fingerprint != t->cfg.fingerprint ||
      !key->hash)
    return SL_ERR_INVALID_ARG;
  bool enabled = probe_space(t);
  pthread_mutex_lock(&t->mu);
  size_t i = slot_of(t, key->hash);
  bool held = t->tab[i].hash == key->hash;
  pthread_mutex_unlock(&t->mu);
  if (!enabled)
    return SL_ERR_STATE;
  if (held)
    return SL_OK;
  size_t hn = t->header_bytes + 8;
  uint8_t *hbuf = calloc(1, hn);
  if (!hbuf)
    return SL_ERR_NOMEM;
  memcpy(hbuf, SSD_MAGIC, 8);
  wr32(hbuf + 8, SSD_VERSION);
  wr32(hbuf + 12, (uint32_t)t->header_bytes);
  wr64(hbuf + 16, t->cfg.fingerprint);
  wr64(hbuf + 24, key->hash);
  wr32(hbuf + 32, (uint32_t)t->cfg.block_tokens);
  wr32(hbuf + 36, (uint32_t)t->cfg.n_layer);
  wr32(hbuf + 40, (uint32_t)t->cfg.kv_dim);
  wr32(hbuf + 44, SSD_DTYPE_F16);
  wr64(hbuf + 48, n);
  wr64(hbuf + 56, XXH3_64bits(src, n));
  for (int k = 0; k < t->cfg.block_tokens; k++)
    wr32(hbuf + SSD_FIXED + 4 * (size_t)k, (uint32_t)key->tokens[k]);
  wr64(hbuf + t->header_bytes, XXH3_64bits(hbuf, t->header_bytes));
  char tmp[4096], path[4096];
  snprintf(tmp, sizeof tmp, "%s/.%016" PRIx64 ".%d.%lu.tmp", t->dir, key->hash,
           (int)getpid(), (unsigned long)pthread_self());
  file_name(t, key->hash, path, sizeof path);
  int e = write_block(tmp, path, hbuf, hn, src, n);
  if (e) {
    pthread_mutex_lock(&t->mu);
    t->st.faults++;
    pthread_mutex_unlock(&t->mu);
    /* the disk is full: room from the tier's own oldest files, once */
    if (space_fault(e) && make_room(t, hn + n))
      e = write_block(tmp, path, hbuf, hn, src, n);
  }
  free(hbuf);
  if (e) {
    if (space_fault(e) || e == EIO || e == EROFS || e == EFBIG)
      turn_off(t, e);
    return SL_ERR_IO;
  }
  pthread_mutex_lock(&t->mu);
  insert(t, key->hash, tokens_hash(key->tokens, t->cfg.block_tokens), hn + n,
         ++t->clock);
  t->st.puts++;
  t->st.put_bytes += n;
  evict_to_budget(t);
  t->st.entries = t->n;
  t->st.put_ms_total += sl_ns_to_ms(sl_now_ns()) - t0;
  pthread_mutex_unlock(&t->mu);
  return SL_OK;
}

static sl_kv_tier_stats ssd_stats(sl_kv_tier_t *bt) {
  ssd_tier *t = (ssd_tier *)bt;
  pthread_mutex_lock(&t->mu);
  sl_kv_tier_stats s = t->st;
  pthread_mutex_unlock(&t->mu);
  return s;
}

static const sl_kv_tier_ops ssd_ops = {
    .contains = ssd_contains,
    .get = ssd_get,
    .put = ssd_put,
    .stats = ssd_stats,
    .close = ssd_close}; /* no get_ref: a block on disk is read by a copy */
