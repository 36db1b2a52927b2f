#!/usr/bin/env python3
"""Time to first token for one long prompt: cold, from the device pool, and
from the SSD tier after a restart (page cache dropped where allowed).
A stopgap until `sluice bench prefix` (issue 11). Run from the source
tree with SLUICE_BIN and SLUICE_SOURCE_DIR set; prints one JSON line:
[seconds, prompt tokens, cached tokens] per case."""
import json, os, sys, time, tempfile, urllib.request, subprocess
sys.path.insert(0, "tests/py")
from conftest import Server
from test_kv_ssd import LONG, complete
d = tempfile.mkdtemp()
CTX = ["-c", "8192", "--max-seqs", "2", "--ssd-cache-dir", d]
def t1(s, p):
    t = time.time(); _, n, c = complete(s, p, 1); return time.time() - t, n, c
s = Server(CTX)
cold = t1(s, LONG)
pool = t1(s, LONG + " x")
s.stop()
drop = subprocess.run("sync; echo 3 > /proc/sys/vm/drop_caches", shell=True).returncode == 0
s = Server(CTX)
ssd = t1(s, LONG + " y")
s.stop()
print(json.dumps({"cold": cold, "device_pool": pool, "ssd_after_restart": ssd, "page_cache_dropped": drop}))
