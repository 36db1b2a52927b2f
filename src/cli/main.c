/* sluice — command-line entry point. exit() belongs here alone. */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "cli.h"
#include "sluice/rt.h"
#include "sluice/util.h"

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: sluice <command> [options]\n"
      "commands:\n"
      "  bench memsync [--backend cpu|cuda] [--trials N]\n"
      "                 the seed experiment: owning-stream cache clears\n"
      "  bench model [-m MODEL] [-t THREADS] [--peer llama-cpp]\n"
      "                 pp512 / tg128 tokens/s, decode bandwidth, peak RSS\n"
      "  bench serve [-m MODEL] [-t THREADS] [--clients 1,4,16] "
      "[--peer llama-cpp] ...\n"
      "                 N streaming clients against `sluice serve`: TTFT,\n"
      "                 TPOT, aggregate tokens/s (bench serve --help)\n"
      "  bench prefix --ssd-cache-dir DIR [-m MODEL] [--prompt-tokens N] ...\n"
      "                 TTFT of a long prompt: cold, prefix cache, SSD tier\n"
      "                 after a restart; DIR's disk bandwidth (--help)\n"
      "  serve [-m MODEL] [--host H] [--port P] [--api-key K] ...\n"
      "                 the OpenAI/Anthropic-compatible server (serve --help)\n"
      "  run [-m MODEL] [-p PROMPT | --chat] [-n N] [--temp T] ...\n"
      "                 generate text (sluice run --help)\n"
      "  tokenize [-m MODEL] [--decode]   text on stdin -> token ids\n"
      "  models [DIR|FILE]... [--json]    what GGUF files hold\n"
      "  version        print the version\n"
      "  help           this message\n");
}

static int bench_main(int argc, char **argv) {
  if (argc < 1) {
    fprintf(stderr, "sluice bench: which benchmark? (memsync)\n");
    return 2;
  }
  if (strcmp(argv[0], "memsync") == 0)
    return sl_bench_memsync_main(argc - 1, argv + 1);
  if (strcmp(argv[0], "model") == 0)
    return sl_bench_model_main(argc - 1, argv + 1);
  if (strcmp(argv[0], "serve") == 0)
    return sl_bench_serve_main(argc - 1, argv + 1);
  if (strcmp(argv[0], "prefix") == 0)
    return sl_bench_prefix_main(argc - 1, argv + 1);
  fprintf(stderr, "sluice bench: unknown benchmark '%s'\n", argv[0]);
  return 2;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  int rc;
  if (strcmp(cmd, "bench") == 0)
    rc = bench_main(argc - 2, argv + 2);
  else if (strcmp(cmd, "serve") == 0) {
#ifdef SLUICE_HAVE_SERVER
    rc = sl_cli_serve_main(argc - 2, argv + 2);
#else
    fprintf(stderr, "sluice serve: this sluice was built without libmicrohttpd "
                    "and jansson (run scripts/install-deps.sh and rebuild)\n");
    rc = 1;
#endif
  } else if (strcmp(cmd, "run") == 0)
    rc = sl_cli_run_main(argc - 2, argv + 2);
  else if (strcmp(cmd, "tokenize") == 0)
    rc = sl_cli_tokenize_main(argc - 2, argv + 2);
  else if (strcmp(cmd, "models") == 0)
    rc = sl_cli_models_main(argc - 2, argv + 2);
  else if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
    printf("sluice 0.1.0\n");
    rc = 0;
  } else if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0) {
    usage(stdout);
    rc = 0;
  } else {
    fprintf(stderr, "sluice: unknown command '%s'\n", cmd);
    usage(stderr);
    rc = 2;
  }
  sl_rt_shutdown();
  return rc;
}
