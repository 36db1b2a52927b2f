/* `sluice models [DIR|FILE]... [--json]`: what GGUF files hold, read from
 * their metadata only (no weights are touched): name, architecture, the
 * weights' main quantization, parameters, file size, training context, and
 * whether sluice serves that architecture. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "sluice/gguf.h"
#include "sluice/util.h"

static void usage(FILE *f) {
  fprintf(f, "usage: sluice models [DIR|FILE.gguf]... [--json]\n"
             "  lists each GGUF file (a folder: its *.gguf files): name,\n"
             "  architecture, quantization (the type of most weight bytes),\n"
             "  parameters, size, training context, and whether sluice\n"
             "  serves it. Default: the models/ folder. --json: one JSON\n"
             "  object per line. Exit 1 when a file cannot be read.\n");
}

static void json_str(const char *s, size_t n) {
  sl_fput_json_str(stdout, s, n);
}

static bool supported(sl_str arch) {
  return sl_str_eq(arch, "llama") || sl_str_eq(arch, "qwen2") ||
         sl_str_eq(arch, "qwen3");
}

/* One file's line; false when it cannot be read. */
static bool show(const char *path, bool json) {
  char err[256];
  sl_status st;
  sl_gguf_t *g = sl_gguf_open(path, &st, err, sizeof err);
  if (!g) {
    if (json) {
      printf("{\"path\":");
      json_str(path, strlen(path));
      printf(",\"error\":");
      json_str(err, strlen(err));
      printf("}\n");
    } else {
      printf("%-40s  error: %s\n", path, err);
    }
    return false;
  }
  sl_str arch = {"?", 1}, name = {NULL, 0};
  sl_gguf_get_str(g, "general.architecture", &arch);
  sl_gguf_get_str(g, "general.name", &name);
  char key[96];
  snprintf(key, sizeof key, "%.*s.context_length", (int)arch.len, arch.ptr);
  uint64_t ctx = 0;
  sl_gguf_get_u64(g, key, &ctx);
  /* the quantization: the type holding most bytes of 2-D weights */
  uint64_t by_type[64] = {0}, params = 0;
  for (int64_t i = 0; i < sl_gguf_n_tensors(g); i++) {
    const sl_gguf_tensor *t = sl_gguf_tensor_at(g, i);
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++)
      n *= t->ne[d];
    params += n;
    if (t->n_dims >= 2 && (unsigned)t->type < 64)
      by_type[t->type] += t->nbytes;
  }
  int q = 0;
  for (int k = 1; k < 64; k++)
    if (by_type[k] > by_type[q])
      q = k;
  const char *qn = sl_ggml_type_name((sl_ggml_type)q);
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  if (!name.ptr)
    name = (sl_str){base, strlen(base)};
  uint64_t size = sl_gguf_file_size(g);
  bool ok = supported(arch);
  if (json) {
    printf("{\"path\":");
    json_str(path, strlen(path));
    printf(",\"name\":");
    json_str(name.ptr, name.len);
    printf(",\"architecture\":");
    json_str(arch.ptr, arch.len);
    printf(",\"quantization\":\"%s\",\"parameters\":%llu,\"file_bytes\":%llu,"
           "\"context_length\":%llu,\"supported\":%s}\n",
           qn ? qn : "?", (unsigned long long)params, (unsigned long long)size,
           (unsigned long long)ctx, ok ? "true" : "false");
  } else {
    printf("%-40s  %-8.*s %-7s %7.1fM %8.1f MiB  ctx %-7llu%s\n", base,
           (int)arch.len, arch.ptr, qn ? qn : "?", (double)params / 1e6,
           (double)size / (1 << 20), (unsigned long long)ctx,
           ok ? "" : "  (architecture not served)");
  }
  sl_gguf_close(g);
  return true;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A folder's *.gguf files, sorted; false when it cannot be read. */
static bool show_dir(const char *dir, bool json, bool *all_ok) {
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "sluice models: cannot read '%s': %s\n", dir,
            strerror(errno));
    return false;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    size_t l = strlen(de->d_name);
    if (de->d_name[0] == '.' || l <= 5 || strcmp(de->d_name + l - 5, ".gguf"))
      continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      char **nn = realloc(names, cap * sizeof *nn);
      if (!nn)
        break;
      names = nn;
    }
    size_t pl = strlen(dir) + l + 2;
    if (!(names[n] = malloc(pl)))
      break;
    snprintf(names[n++], pl, "%s/%s", dir, de->d_name);
  }
  closedir(d);
  qsort(names, n, sizeof *names, cmp_str);
  if (!n && !json)
    printf("%s: no .gguf files\n", dir);
  for (size_t i = 0; i < n; i++) {
    *all_ok &= show(names[i], json);
    free(names[i]);
  }
  free(names);
  return true;
}

int sl_cli_models_main(int argc, char **argv) {
  bool json = false, all_ok = true;
  int n_paths = 0;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--json")) {
      json = true;
    } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "sluice models: unknown option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    } else {
      n_paths++;
    }
  }
  const char *def[] = {"models"};
  for (int i = 0; i < (n_paths ? argc : 1); i++) {
    const char *p = n_paths ? argv[i] : def[0];
    if (p[0] == '-')
      continue;
    struct stat sb;
    if (stat(p, &sb) != 0) {
      fprintf(stderr, "sluice models: cannot open '%s': %s\n", p,
              strerror(errno));
      all_ok = false;
    } else if (S_ISDIR(sb.st_mode)) {
      if (!show_dir(p, json, &all_ok))
        all_ok = false;
    } else {
      all_ok &= show(p, json);
    }
  }
  return all_ok ? 0 : 1;
}
