/* libFuzzer harness: the SSD tier's block-file reader (src/kv/tier_ssd.c).
 * Each input is written as one block file, under the name its header's
 * hash would give (or a fixed one when it has none), in a scratch
 * directory; the tier is then opened (the index rebuild reads the header)
 * and, when the file was indexed, the block is read back. Oracles:
 *   - the rebuild indexes the file exactly when sl_kv_ssd_parse_header
 *     accepts its bytes and the size matches; otherwise it counts it
 *     skipped;
 *   - a get returns OK only with the payload the file holds (checked
 *     against the input's bytes), else FORMAT, and then the file is gone.
 * A small shape (T = 4, 2 layers, kv_dim 4) keeps valid inputs short; the
 * seeds in tests/fuzz/corpus/kv_block are valid files of that shape. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sluice/kv_tier.h"

static char g_dir[] = "/tmp/sl_fuzz_kv_XXXXXX";
static sl_kv_ssd_config g_cfg;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  if (!mkdtemp(g_dir))
    abort();
  g_cfg = (sl_kv_ssd_config){.dir = g_dir,
                             .budget = 1u << 30,
                             .fingerprint = 0x5eed5eed5eed5eedULL,
                             .n_layer = 2,
                             .kv_dim = 4,
                             .block_tokens = 4,
                             .quiet = true};
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 16)
    return 0;
  uint64_t h = 0x0123456789abcdefULL;
  size_t at = 0;
  uint64_t pb = 0;
  bool valid =
      sl_kv_ssd_parse_header(&g_cfg, data, size, &h, &at, &pb) == SL_OK;
  valid = valid && size == at + pb;
  if (size >= 32 && !valid)
    memcpy(&h, data + 24, 8); /* named as the header says, valid or not */
  if (!h)
    h = 1;
  char path[4096];
  snprintf(path, sizeof path, "%s/%016llx.slkv", g_dir, (unsigned long long)h);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || write(fd, data, size) != (ssize_t)size)
    abort();
  close(fd);
  sl_kv_tier_t *t;
  char err[256];
  if (sl_kv_ssd_open(&g_cfg, &t, err, sizeof err) != SL_OK)
    abort();
  sl_kv_tier_stats st = sl_kv_tier_stats_of(t);
  if (st.entries != (valid ? 1u : 0u) || st.skipped != (valid ? 0u : 1u))
    abort(); /* the rebuild and the parser disagree */
  if (valid) {
    int32_t toks[4];
    memcpy(toks, data + 64, sizeof toks);
    sl_kv_block_key k = {g_cfg.fingerprint, h, toks};
    if (!sl_kv_tier_contains(t, &k))
      abort();
    size_t n = sl_kv_ssd_payload_bytes(&g_cfg);
    uint8_t buf[2 * 2 * 4 * 4 * 2];
    if (n != sizeof buf || pb != n)
      abort();
    sl_status s = sl_kv_tier_get(t, &k, buf, n);
    if (s == SL_OK) {
      if (memcmp(buf, data + at, n) != 0)
        abort(); /* served bytes the file does not hold */
    } else if (s != SL_ERR_FORMAT || access(path, F_OK) == 0) {
      abort(); /* a bad block must be dropped */
    }
  }
  sl_kv_tier_close(t);
  unlink(path);
  return 0;
}
