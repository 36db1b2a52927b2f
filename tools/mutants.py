#!/usr/bin/env python3
r"""Mutation check: applies one documented break at a time to a copy of the
tree and shows that the named test fails for each (a mutant "killed").
A surviving mutant means a test that cannot fail: the script exits 1.

Each mutant lives in tools/mutants/NN-name.txt:

    # break: what the mutant breaks (one line)
    # file: src/rt/memsync.c
    # test: ctest regex of the test(s) that must fail
    # target: the build targets it needs (optional; default: the test_\w+
    #         names in `test`, for a test named after its binary)
    # case: the case(s) of that test that fail (optional; default: all run):
    #       names of C harness cases (SL_TEST_ONLY) or pytest functions
    #       (-k); only they run, so a kill costs one case, not the file
    @@@ old
    exact text, which must occur exactly once in the file
    @@@ new
    its replacement
    @@@ end

A mutant whose `old` text is not found exactly once is reported as stale
and fails the run, so the list cannot rot silently as the code changes.

A mutant with `# requires: cuda` breaks GPU code: its test runs only with
--cuda, on a machine with a GPU (the build then has the CUDA backend, for
sm_90 unless CMAKE_CUDA_ARCHITECTURES says otherwise); without it the
mutant is only checked for staleness and reported SKIPPED.

Mutants run --workers at a time (default: --jobs), each worker in its own
copy of the tree and its own build folder, so that one mutant's build or
test never sees another's break.

Usage: tools/mutants.py [--keep] [--jobs N] [--workers N] [--cuda]
                        [NAME_SUBSTRING ...]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def parse(path):
    text = open(path, encoding="utf-8").read()
    meta = dict(re.findall(r"^# (\w+): (.*)$", text, re.M))
    m = re.search(r"^@@@ old\n(.*?)^@@@ new\n(.*?)^@@@ end", text, re.M | re.S)
    if not m or not all(k in meta for k in ("break", "file", "test")):
        sys.exit(f"mutants: {path}: malformed")
    return dict(name=os.path.basename(path)[:-4], old=m.group(1),
                new=m.group(2), **meta)


def targets_of(m):
    """The build targets mutant m's test needs."""
    if "target" in m:
        return m["target"].split()
    return re.findall(r"test_\w+", m["test"])


def case_env(case):
    """The environment of a mutant's test run: a hung death-test child is
    killed after 20 s; a pytest file stops at its first failure (a kill
    needs one); with `case` (names separated by spaces), only those cases
    run: C harness cases by SL_TEST_ONLY, pytest functions by -k."""
    env = dict(os.environ, SL_TEST_CHILD_TIMEOUT_S="20", PYTEST_ADDOPTS="-x")
    cases = case.split()
    if cases:
        env["SL_TEST_ONLY"] = " ".join(cases)
        env["PYTEST_ADDOPTS"] = "-x -k '" + " or ".join(cases) + "'"
    return env


def run(cmd, cwd, timeout=None, env=None):
    return subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True,
                          encoding="utf-8", errors="replace",
                          timeout=timeout, env=env)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", action="store_true", help="keep the copy")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--workers", type=int, default=0,
                    help="mutants at a time (default: --jobs)")
    ap.add_argument("--timeout", type=int, default=180,
                    help="seconds per test run of one mutant")
    ap.add_argument("--cuda", action="store_true",
                    help="build with CUDA and run the GPU mutants")
    ap.add_argument("--skip-baseline", action="store_true",
                    help="do not run the named tests unmutated first: the "
                    "caller has just run them green on this same source "
                    "(scripts/test.sh, after its normal ctest stage)")
    ap.add_argument("only", nargs="*")
    a = ap.parse_args()
    files = sorted(f for f in os.listdir(os.path.join(HERE, "mutants"))
                   if f.endswith(".txt"))
    muts = [parse(os.path.join(HERE, "mutants", f)) for f in files]
    if a.only:
        muts = [m for m in muts if any(o in m["name"] for o in a.only)]
    skipped = [m for m in muts
               if m.get("requires") == "cuda" and not a.cuda]
    for m in skipped:
        text = open(os.path.join(ROOT, m["file"]), encoding="utf-8").read()
        if text.count(m["old"]) != 1:
            sys.exit(f"mutants: STALE {m['name']}: the text to break occurs "
                     f"{text.count(m['old'])} times in {m['file']}")
        print(f"SKIPPED  {m['name']}: {m['break']} (needs a GPU: --cuda)")
    muts = [m for m in muts if m not in skipped]
    if not muts:
        print(f"mutants: nothing to run, {len(skipped)} skipped (GPU)")
        return 0
    work = tempfile.mkdtemp(prefix="sluice-mutants-")
    listed = run(["git", "ls-files", "-co", "--exclude-standard"], ROOT).stdout
    cuda = ["-DSLUICE_CUDA=ON"] if a.cuda else ["-DSLUICE_CUDA=OFF"]
    targets = sorted({t for m in muts for t in targets_of(m)})
    workers = max(1, min(a.workers or a.jobs, len(muts)))

    def tree(i):
        """Worker i's copy of the tree, configured and built."""
        src = os.path.join(work, f"src{i}")
        for rel in listed.splitlines():
            if not os.path.isfile(os.path.join(ROOT, rel)):
                continue
            dst = os.path.join(src, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, rel), dst)
        if os.path.isdir(os.path.join(ROOT, "models")):
            os.symlink(os.path.join(ROOT, "models"),
                       os.path.join(src, "models"))
        bld = os.path.join(work, f"build{i}")
        r = run(["cmake", "-S", src, "-B", bld, "-G", "Ninja",
                 "-DCMAKE_BUILD_TYPE=RelWithDebInfo"] + cuda, work)
        if r.returncode:
            sys.exit("mutants: configure failed\n" + r.stdout)
        r = run(["cmake", "--build", bld, "-j", str(a.jobs), "--target"] +
                targets, work)
        if r.returncode:
            sys.exit("mutants: the unmutated build failed\n" +
                     r.stdout[-4000:])
        return src, bld

    t0 = time.time()
    trees = [tree(0)]
    bld = trees[0][1]
    # the unmutated tests must pass, or a "kill" proves nothing: each named
    # test once (several mutants name the same one), in one ctest run
    for m in muts:
        r = run(["ctest", "--test-dir", bld, "-N", "-R", m["test"]], work)
        if "Total Tests: 0" in r.stdout:
            sys.exit(f"mutants: {m['test']} (of {m['name']}) names no test")
    regexes = sorted({m["test"] for m in muts if "case" not in m})
    if not a.skip_baseline and regexes:
        r = run(["ctest", "--test-dir", bld, "-R",
                 "|".join(f"({x})" for x in regexes), "--output-on-failure",
                 "-j", str(a.jobs), "--timeout", str(a.timeout)], work)
        if r.returncode:
            sys.exit("mutants: a named test fails without any mutant\n" +
                     r.stdout[-4000:])
    # a mutant that names its case(s) is killed by them alone: they must
    # pass alone, unmutated (a case that needs an earlier one's state would
    # fail here, not "kill")
    for test, case in sorted({(m["test"], m["case"]) for m in muts
                              if "case" in m}):
        if a.skip_baseline:
            break
        r = run(["ctest", "--test-dir", bld, "-R", test,
                 "--output-on-failure", "--timeout", str(a.timeout)], work,
                env=case_env(case))
        if r.returncode:
            sys.exit(f"mutants: {test} case {case} fails alone without any "
                     "mutant\n" + r.stdout[-4000:])
    trees += [tree(i) for i in range(1, workers)]
    print(f"mutants: baseline built"
          f"{'' if a.skip_baseline else ' and green'} in "
          f"{time.time() - t0:.0f} s; {workers} at a time", flush=True)
    survived, stale = [], []
    lock = threading.Lock()
    free = list(range(workers))
    build_jobs = str(max(1, a.jobs // workers))

    def one(m):
        with lock:
            i = free.pop()
        src, bld = trees[i]
        try:
            verdict, detail, secs = try_mutant(m, src, bld)
        finally:
            with lock:
                free.append(i)
        with lock:
            if verdict == "SURVIVED":
                survived.append(m["name"])
            if verdict in ("BROKEN", "STALE"):
                stale.append(m["name"])
            print(f"{verdict:8} {m['name']}: {m['break']} [{detail}] "
                  f"{secs:.0f} s", flush=True)

    def try_mutant(m, src, bld):
        path = os.path.join(src, m["file"])
        orig = open(path, encoding="utf-8").read()
        if orig.count(m["old"]) != 1:
            return ("STALE", f"the text to break occurs "
                    f"{orig.count(m['old'])} times in {m['file']}", 0)
        open(path, "w", encoding="utf-8").write(orig.replace(m["old"], m["new"]))
        t1 = time.time()
        try:
            b = run(["cmake", "--build", bld, "-j", build_jobs, "--target"] +
                    targets_of(m), work)
            if b.returncode:  # proves nothing: the mutant must be fixed
                verdict, detail = "BROKEN", "(does not build)"
            else:
                try:
                    r = run(["ctest", "--test-dir", bld, "-R", m["test"],
                             "--output-on-failure", "--timeout",
                             str(a.timeout)], work, timeout=a.timeout * 4,
                            env=case_env(m.get("case", "")))
                    failed = re.findall(r"\d+ - (\S+) \(", r.stdout)
                    # the failing cases: C harness lines, pytest's summary
                    which = sorted(set(
                        re.findall(r"^ +(test_\w+) FAILED$", r.stdout, re.M) +
                        re.findall(r"^FAILED \S+::(\w+)", r.stdout, re.M)))
                    if r.returncode:
                        verdict, detail = "KILLED", "by " + ", ".join(failed)
                        if which:
                            detail += " (" + ", ".join(which) + ")"
                    else:
                        verdict, detail = "SURVIVED", ""
                except subprocess.TimeoutExpired:
                    verdict, detail = "KILLED", "(timed out)"
        finally:
            open(path, "w", encoding="utf-8").write(orig)
            os.utime(path)
        return verdict, detail, time.time() - t1

    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(one, muts))
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    n = len(muts)
    print(f"mutants: {n - len(survived) - len(stale)} of {n} killed, "
          f"{len(survived)} survived, {len(stale)} stale or broken"
          + (f", {len(skipped)} skipped (GPU)" if skipped else ""))
    return 1 if survived or stale else 0


if __name__ == "__main__":
    sys.exit(main())
