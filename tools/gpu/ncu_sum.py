#!/usr/bin/env python3
"""Sums an `ncu --csv --print-units base` log by kernel (name and grid):
launches, total time, DRAM bytes read and GB/s per group, largest first.

    python3 tools/gpu/ncu_sum.py ncu.csv
"""
import csv
import re
import sys
from collections import defaultdict


def main():
    rows = defaultdict(dict)  # launch id -> {name, grid, metrics}
    with open(sys.argv[1], newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        d = rows[r["ID"]]
        d["name"] = re.sub(r"\(.*", "", r["Kernel Name"])[:70]
        d["grid"] = r.get("Grid Size", "")
        v = r["Metric Value"].replace(",", "")
        try:
            d[r["Metric Name"]] = float(v)
        except ValueError:
            pass
    g = defaultdict(lambda: [0, 0.0, 0.0])
    tot_t = tot_b = 0.0
    for d in rows.values():
        t = d.get("gpu__time_duration.sum", 0.0)
        b = d.get("dram__bytes_read.sum", 0.0)
        k = (d["name"], d["grid"])
        g[k][0] += 1
        g[k][1] += t
        g[k][2] += b
        tot_t += t
        tot_b += b
    print("launches %d, kernel time %.3f ms, DRAM read %.3f GB, %.0f GB/s"
          % (len(rows), tot_t / 1e6, tot_b / 1e9,
             tot_b / tot_t if tot_t else 0))
    print("%6s %9s %7s %9s %8s  %s" % ("n", "ms", "share", "GB", "GB/s",
                                      "kernel [grid]"))
    for (name, grid), (n, t, b) in sorted(g.items(), key=lambda x: -x[1][1]):
        print("%6d %9.3f %6.1f%% %9.4f %8.0f  %s [%s]"
              % (n, t / 1e6, 100 * t / tot_t, b / 1e9,
                 b / t if t else 0, name, grid))


if __name__ == "__main__":
    main()
