"""`sluice bench prefix` (issue 11): the benchmark runs end to end on a
short prompt and its JSON says what each phase took from where. Only
counts are checked (cached tokens, blocks, a clean directory): timings are
a benchmark's business, never a test's (docs/PERF.md has the figures)."""
import json
import os
import subprocess
import tempfile

from conftest import _need_everything, model_path, sluice_bin


def run_bench(*args):
    return subprocess.run([sluice_bin(), "bench", "prefix", "-m",
                           model_path()] + list(args),
                          capture_output=True, text=True, timeout=600)


def test_phases_count_what_they_restore():
    _need_everything()
    with tempfile.TemporaryDirectory() as d:
        p = run_bench("--ssd-cache-dir", d, "--prompt-tokens", "300",
                      "--reps", "1", "--disk-mib", "8", "-t", "2")
        assert p.returncode == 0, p.stderr
        j = json.loads(p.stdout)
        ph = j["phases"]
        full = (300 - 1) // 16 * 16  # the last token's block is computed
        assert ph["cold"]["cached_tokens"] == 0
        for name in ("pool", "hot", "ssd", "ssd_warm"):
            assert ph[name]["cached_tokens"] == full, name
        # every full block read back from SSD, in both restarts
        got = ph["ssd"]["get_bytes"]
        assert got > 0 and got % (full // 16) == 0
        assert ph["ssd_warm"]["get_bytes"] == got
        # and from the hot tier, once another prompt pushed it out of the pool
        assert ph["hot"]["get_bytes"] == got
        assert j["disk"]["write_mb_s"] > 0 and j["disk"]["read_mb_s"] > 0
        assert os.listdir(d) == []  # its subdirectory and disk file are gone


def test_bad_arguments_exit_2():
    _need_everything()
    p = run_bench("--prompt-tokens", "300")
    assert p.returncode == 2 and "--ssd-cache-dir" in p.stderr
    p = run_bench("--ssd-cache-dir", "/nonexistent/dir")
    assert p.returncode == 2 and "/nonexistent/dir" in p.stderr
    with tempfile.TemporaryDirectory() as d:
        p = run_bench("--ssd-cache-dir", d, "--bogus")
        assert p.returncode == 2 and "--bogus" in p.stderr
