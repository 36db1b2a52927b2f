/* The SSD tier (src/kv/tier_ssd.c) on a real directory:
 *   - put then get gives the same bytes; a second open rebuilds the index
 *     from the headers and serves them again (a restart);
 *   - a flipped payload byte: get says FORMAT, the block is dropped (its
 *     tokens are recomputed), never served;
 *   - a flipped header byte, a truncated file, another model's file, a
 *     file renamed to another hash, a stray temporary file: skipped at
 *     open and counted, never served; the temporary file is removed;
 *   - the byte budget evicts the least recently used block;
 *   - a missing or read-only directory is an error at open;
 *   - on a 1 MiB tmpfs (where this may mount one): a budget past the
 *     filesystem is clamped at open; when something else fills the disk
 *     a put makes room from the tier's own oldest files and the tier
 *     stays on; a tier with nothing to evict turns off, puts then fail
 *     fast, and it turns back on when space returns. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "sluice/kv_tier.h"

enum { T = 16, LAYERS = 3, KVD = 8 };

static sl_kv_ssd_config cfg_for(const char *dir, uint64_t budget, uint64_t fp) {
  return (sl_kv_ssd_config){.dir = dir,
                            .budget = budget,
                            .fingerprint = fp,
                            .n_layer = LAYERS,
                            .kv_dim = KVD,
                            .block_tokens = T,
                            .quiet = true};
}

static void fill(uint8_t *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t)(seed * 131u + i * 7u + (i >> 8));
}

static void tokens_for(int32_t *t, unsigned seed) {
  for (int i = 0; i < T; i++)
    t[i] = (int32_t)(seed * 1000u + (unsigned)i);
}

static char *path_of(const char *dir, uint64_t h) {
  static char p[4096];
  snprintf(p, sizeof p, "%s/%016llx.slkv", dir, (unsigned long long)h);
  return p;
}

static void flip_byte(const char *path, long off) {
  int fd = open(path, O_RDWR);
  CHECK(fd >= 0);
  uint8_t b;
  CHECK(pread(fd, &b, 1, off) == 1);
  b ^= 0x10;
  CHECK(pwrite(fd, &b, 1, off) == 1);
  close(fd);
}

static void rm_rf(const char *dir) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    fprintf(stderr, "cannot remove %s\n", dir);
}

int main(void) {
  char dir[] = "/tmp/sl_kv_tier_XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  const uint64_t FP = 0x1234abcdULL;
  sl_kv_ssd_config cfg = cfg_for(dir, 1u << 30, FP);
  size_t n = sl_kv_ssd_payload_bytes(&cfg);
  CHECK(n == 2u * LAYERS * T * KVD * 2);
  uint8_t *src = malloc(n), *dst = malloc(n);
  int32_t toks[8][T];
  char err[256];
  sl_kv_tier_t *t;
  CHECK(sl_kv_ssd_open(&cfg, &t, err, sizeof err) == SL_OK);
  for (unsigned b = 0; b < 8; b++) {
    tokens_for(toks[b], b);
    fill(src, n, b);
    sl_kv_block_key k = {FP, 100 + b, toks[b]};
    CHECK(!sl_kv_tier_contains(t, &k));
    CHECK(sl_kv_tier_put(t, &k, src, n) == SL_OK);
    CHECK(sl_kv_tier_contains(t, &k));
  }
  /* the same bytes back; another token list under the same hash misses */
  fill(src, n, 3);
  sl_kv_block_key k3 = {FP, 103, toks[3]};
  CHECK(sl_kv_tier_get(t, &k3, dst, n) == SL_OK && !memcmp(src, dst, n));
  sl_kv_block_key wrong = {FP, 103, toks[4]};
  CHECK(!sl_kv_tier_contains(t, &wrong));
  CHECK(sl_kv_tier_get(t, &wrong, dst, n) == SL_ERR_FORMAT);
  /* that get read the file and found other tokens: the block is dropped */
  CHECK(!sl_kv_tier_contains(t, &k3));
  sl_kv_tier_stats st = sl_kv_tier_stats_of(t);
  CHECK(st.entries == 7 && st.puts == 8 && st.hits == 1 && st.corrupt == 1);
  sl_kv_tier_close(t);

  /* faults on disk, then a restart */
  flip_byte(path_of(dir, 100), 64 + 4 * T + 8 + 5); /* payload byte */
  flip_byte(path_of(dir, 101), 65);             /* a header byte: a token id */
  CHECK(truncate(path_of(dir, 102), 100) == 0); /* truncated */
  char moved[4096];
  snprintf(moved, sizeof moved, "%s", path_of(dir, 999));
  CHECK(rename(path_of(dir, 104), moved) == 0); /* named for another hash */
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s/.0000000000000069.1.2.tmp", dir);
  int fd = open(tmp, O_WRONLY | O_CREAT, 0644);
  CHECK(fd >= 0 && write(fd, "half", 4) == 4);
  close(fd);
  {
    /* another model's block: a valid file, foreign fingerprint */
    sl_kv_ssd_config other = cfg_for(dir, 1u << 30, FP + 1);
    sl_kv_tier_t *o;
    CHECK(sl_kv_ssd_open(&other, &o, err, sizeof err) == SL_OK);
    CHECK(sl_kv_tier_stats_of(o).entries == 0);
    int32_t ot[T];
    tokens_for(ot, 77);
    sl_kv_block_key ok = {FP + 1, 177, ot};
    CHECK(sl_kv_tier_put(o, &ok, src, n) == SL_OK);
    sl_kv_tier_close(o);
  }
  CHECK(sl_kv_ssd_open(&cfg, &t, err, sizeof err) == SL_OK);
  st = sl_kv_tier_stats_of(t);
  /* 100 (payload flip) passes the header check and is found bad on read;
   * 101, 102, 999 and the foreign 177 are skipped */
  CHECK(st.entries == 4);
  CHECK(st.skipped == 4);
  CHECK(access(tmp, F_OK) != 0); /* the temporary file is gone */
  sl_kv_block_key k0 = {FP, 100, toks[0]};
  CHECK(sl_kv_tier_contains(t, &k0));
  CHECK(sl_kv_tier_get(t, &k0, dst, n) == SL_ERR_FORMAT);
  CHECK(!sl_kv_tier_contains(t, &k0) && access(path_of(dir, 100), F_OK) != 0);
  for (unsigned b = 5; b < 8; b++) {
    sl_kv_block_key k = {FP, 100 + b, toks[b]};
    fill(src, n, b);
    CHECK(sl_kv_tier_get(t, &k, dst, n) == SL_OK && !memcmp(src, dst, n));
  }
  sl_kv_block_key k1 = {FP, 101, toks[1]};
  CHECK(sl_kv_tier_get(t, &k1, dst, n) == SL_ERR_NOT_FOUND);
  sl_kv_tier_close(t);

  /* the budget: room for three files; the least recently used goes */
  {
    uint64_t file = 64 + 4 * T + 8 + n;
    sl_kv_ssd_config small = cfg_for(dir, 3 * file, FP);
    CHECK(sl_kv_ssd_open(&small, &t, err, sizeof err) == SL_OK);
    /* open kept 3 of the 4 (105..107 and the moved one, 999, was skipped:
     * 103 dropped, 100 dropped, so 105, 106, 107) */
    CHECK(sl_kv_tier_stats_of(t).entries == 3);
    sl_kv_block_key k5 = {FP, 105, toks[5]}, k6 = {FP, 106, toks[6]},
                    k7 = {FP, 107, toks[7]};
    /* 105 and 107 used since the open (mtimes may tie: a coarse clock) */
    CHECK(sl_kv_tier_get(t, &k5, dst, n) == SL_OK);
    CHECK(sl_kv_tier_get(t, &k7, dst, n) == SL_OK);
    int32_t nt[T];
    tokens_for(nt, 50);
    sl_kv_block_key kn = {FP, 150, nt};
    CHECK(sl_kv_tier_put(t, &kn, src, n) == SL_OK);
    st = sl_kv_tier_stats_of(t);
    CHECK(st.entries == 3 && st.evictions == 1 && st.bytes <= 3 * file);
    CHECK(sl_kv_tier_contains(t, &k5) && sl_kv_tier_contains(t, &kn));
    CHECK(!sl_kv_tier_contains(t, &k6)); /* the least recently used */
    sl_kv_tier_close(t);
  }

  /* a missing directory, a read-only one */
  char missing[4200];
  snprintf(missing, sizeof missing, "%s/nope", dir);
  sl_kv_ssd_config mc = cfg_for(missing, 1u << 20, FP);
  CHECK(sl_kv_ssd_open(&mc, &t, err, sizeof err) == SL_ERR_IO &&
        strstr(err, "does not exist"));
  if (geteuid() != 0) { /* root writes anywhere */
    CHECK(chmod(dir, 0500) == 0);
    CHECK(sl_kv_ssd_open(&cfg, &t, err, sizeof err) == SL_ERR_IO &&
          strstr(err, "not readable and writable"));
    CHECK(chmod(dir, 0700) == 0);
  }

  /* a real full filesystem: a 1 MiB tmpfs (needs the right to mount) */
  char mnt[4200];
  snprintf(mnt, sizeof mnt, "%s/full", dir);
  CHECK(mkdir(mnt, 0700) == 0);
  if (mount("tmpfs", mnt, "tmpfs", 0, "size=1m") == 0) {
    /* a budget of 1 GiB is clamped to what the filesystem holds */
    sl_kv_ssd_config fc = cfg_for(mnt, 1u << 30, FP);
    CHECK(sl_kv_ssd_open(&fc, &t, err, sizeof err) == SL_OK);
    st = sl_kv_tier_stats_of(t);
    printf("1 MiB tmpfs: a budget of 1 GiB clamped to %llu bytes\n",
           (unsigned long long)st.budget);
    CHECK(st.budget > 0 && st.budget < (1u << 20));
    /* so many puts never fill it: the tier evicts, no write fails */
    int ok_puts = 0;
    for (unsigned b = 0; b < 1000; b++) {
      int32_t ft[T];
      tokens_for(ft, 300 + b);
      sl_kv_block_key k = {FP, 1000 + b, ft};
      ok_puts += sl_kv_tier_put(t, &k, src, n) == SL_OK;
    }
    st = sl_kv_tier_stats_of(t);
    CHECK(ok_puts == 1000 && st.enabled && st.faults == 0);
    CHECK(st.evictions > 0 && st.bytes <= st.budget);
    /* a second tier, empty, on the same filesystem */
    char two[4300];
    snprintf(two, sizeof two, "%s/two", mnt);
    CHECK(mkdir(two, 0700) == 0);
    sl_kv_tier_t *t2 = NULL;
    sl_kv_ssd_config fc2 = cfg_for(two, 1u << 30, FP);
    CHECK(sl_kv_ssd_open(&fc2, &t2, err, sizeof err) == SL_OK);
    /* something else fills the disk to the last byte */
    char filler[4300];
    snprintf(filler, sizeof filler, "%s/filler", mnt);
    int ffd = open(filler, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(ffd >= 0);
    static char page[4096];
    while (write(ffd, page, sizeof page) > 0)
      ;
    CHECK(errno == ENOSPC);
    close(ffd);
    /* the next put makes room from the tier's own oldest file, and the
     * tier stays on */
    uint64_t held = st.entries, ev = st.evictions;
    int32_t ft[T];
    tokens_for(ft, 5000);
    sl_kv_block_key kf = {FP, 5000, ft};
    CHECK(sl_kv_tier_put(t, &kf, src, n) == SL_OK);
    st = sl_kv_tier_stats_of(t);
    printf("full tmpfs: %llu blocks held, then %llu after a put that made "
           "room (%llu evicted)\n",
           (unsigned long long)held, (unsigned long long)st.entries,
           (unsigned long long)(st.evictions - ev));
    CHECK(st.enabled && st.faults == 1 && st.evictions > ev);
    CHECK(sl_kv_tier_contains(t, &kf));
    CHECK(sl_kv_tier_get(t, &kf, dst, n) == SL_OK && memcmp(src, dst, n) == 0);
    /* the empty tier has nothing to evict: it turns off, and puts then
     * fail fast */
    int32_t gt[T];
    tokens_for(gt, 6000);
    sl_kv_block_key kg = {FP, 6000, gt};
    CHECK(sl_kv_tier_put(t2, &kg, src, n) == SL_ERR_IO);
    sl_kv_tier_stats st2 = sl_kv_tier_stats_of(t2);
    CHECK(!st2.enabled && st2.faults == 1 && st2.entries == 0);
    CHECK(sl_kv_tier_put(t2, &kg, src, n) == SL_ERR_STATE); /* no I/O */
    CHECK(!sl_kv_tier_contains(t2, &kg));
    /* space returns: after a probe interval the tier is on again */
    CHECK(unlink(filler) == 0);
    usleep(1100 * 1000);
    CHECK(sl_kv_tier_put(t2, &kg, src, n) == SL_OK);
    st2 = sl_kv_tier_stats_of(t2);
    CHECK(st2.enabled && st2.entries == 1 && sl_kv_tier_contains(t2, &kg));
    sl_kv_tier_close(t2);
    sl_kv_tier_close(t);
    CHECK(umount(mnt) == 0);
  } else {
    printf("full filesystem: skipped (cannot mount a tmpfs: %s)\n",
           strerror(errno));
  }
  free(src);
  free(dst);
  rm_rf(dir);
  return sl_test_finish();
}
