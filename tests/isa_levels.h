/* The kernel ISA levels a CPU test puts under test: the one SLUICE_ISA (or
 * SLUICE_CPU_ISA) names, else every level this CPU has. */
#ifndef SLUICE_TEST_ISA_LEVELS_H
#define SLUICE_TEST_ISA_LEVELS_H

#include <stdio.h>
#include <stdlib.h>

#include "sluice/kern_cpu.h"

/* Fills out[] (SL_KERN_ISA_COUNT entries) and *n. Returns -1 to go on, else
 * the exit code for main: 1 for a name that is not a level or a level the
 * kernels did not pick, 77 (skipped) for a level this CPU cannot run. */
static inline int sl_test_isa_levels(sl_kern_isa *out, int *n) {
  sl_kern_isa want;
  sl_status st = sl_kern_cpu_isa_requested(&want);
  *n = 0;
  if (st == SL_ERR_INVALID_ARG) {
    fprintf(stderr, "SLUICE_ISA=%s: not a level name\n",
            getenv("SLUICE_ISA") && *getenv("SLUICE_ISA")
                ? getenv("SLUICE_ISA")
                : getenv("SLUICE_CPU_ISA"));
    return 1;
  }
  if (st == SL_OK) {
    if (!sl_kern_cpu_isa_supported(want)) {
      fprintf(stderr, "skipped: this CPU cannot run %s\n",
              sl_kern_isa_name(want));
      return 77;
    }
    if (sl_kern_cpu_isa() != want) {
      fprintf(stderr, "SLUICE_ISA=%s, but the kernels chose %s\n",
              sl_kern_isa_name(want), sl_kern_isa_name(sl_kern_cpu_isa()));
      return 1;
    }
    out[(*n)++] = want;
    return -1;
  }
  for (int i = 0; i < SL_KERN_ISA_COUNT; i++)
    if (sl_kern_cpu_isa_supported((sl_kern_isa)i))
      out[(*n)++] = (sl_kern_isa)i;
  return -1;
}

#endif
