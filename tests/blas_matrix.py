#!/usr/bin/env python3
"""Run the numerical tests under every OpenBLAS core type this CPU can execute, with 1 and 2 threads.

A result that depends on which BLAS kernel or how many threads ran (issue 12: the ridge fallback
passed with one OpenBLAS kernel and failed with another) should fail on the machine that runs this,
not on a user's. `.ci/run` runs it after the whole suite (scripts/test.sh --blas-matrix).

    tests/blas_matrix.py BUILD_DIR [--tests REGEX] [--threads 1,2] [--list]

How the core types are chosen: OpenBLAS (Debian's build is DYNAMIC_ARCH) picks its kernels by CPU
and honours OPENBLAS_CORETYPE. A core type is run when the CPU has the instruction-set extensions
its kernels use (the table below, from /proc/cpuinfo flags) and OpenBLAS confirms it loaded that
core (OPENBLAS_VERBOSE=2 prints "Core: NAME"; a name this OpenBLAS build lacks falls back to
another core and is reported as not available, not run twice). The default (no OPENBLAS_CORETYPE)
is always run. Each test runs with its CTest command, working directory and environment
(`ctest --show-only=json-v1`), with KVCAL_THREADS, OMP_NUM_THREADS and OPENBLAS_NUM_THREADS set to
the thread count; exit code 77 means skipped, as in CTest.
"""
import json
import os
import re
import subprocess
import sys
import time

# The numerical tests: ridge, fit, GPTQ (Cholesky and inverse through LAPACK), model, grad (backward), kernels, ccache and
# the runtime (libkvrt). The stories260K-based
# model and backward tests are quick; test_model_smollm (minutes) and test_fit_stories run once in
# the normal suite.
DEFAULT_TESTS = ("^(test_ridge|test_fit|test_gptq|test_model|test_model_hf|test_model_matmul|test_model_stories|"
                 "test_backward|test_backward_stories|test_kernels|test_grids|test_kv_stream|test_ccache|test_runtime)$")

# OpenBLAS x86-64 core types and the /proc/cpuinfo flags their kernels need (all of them).
CORES = [
    ("Prescott", ["pni"]),
    ("Core2", ["ssse3"]),
    ("Penryn", ["sse4_1"]),
    ("Dunnington", ["sse4_1"]),
    ("Nehalem", ["sse4_2"]),
    ("Atom", ["ssse3", "movbe"]),
    ("Opteron", ["3dnowext"]),
    ("Barcelona", ["sse4a"]),
    ("Bobcat", ["sse4a", "ssse3"]),
    ("Bulldozer", ["avx", "fma4", "xop"]),
    ("Piledriver", ["avx", "fma4", "xop", "fma"]),
    ("Steamroller", ["avx", "fma4", "xop", "fma"]),
    ("Excavator", ["avx2", "fma4", "xop", "fma"]),
    ("Sandybridge", ["avx"]),
    ("Haswell", ["avx2", "fma"]),
    ("Zen", ["avx2", "fma"]),
    ("SkylakeX", ["avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"]),
    ("Cooperlake", ["avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16"]),
    ("SapphireRapids", ["avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16", "avx512_fp16",
                        "amx_bf16"]),
]


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def load_tests(build, regex):
    out = subprocess.run(["ctest", "--show-only=json-v1", "-R", regex], cwd=build, check=True,
                         capture_output=True, text=True).stdout
    tests = []
    for t in json.loads(out)["tests"]:
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        env = dict(e.split("=", 1) for e in props.get("ENVIRONMENT", []))
        tests.append({"name": t["name"], "command": t["command"], "env": env,
                      "cwd": props.get("WORKING_DIRECTORY", build), "timeout": float(props.get("TIMEOUT", 600)),
                      "skip": int(props.get("SKIP_RETURN_CODE", 77))})
    return tests


def loaded_core(probe, coretype):
    """The core OpenBLAS loads for OPENBLAS_CORETYPE=coretype (None: default), as it reports it."""
    env = dict(os.environ, OPENBLAS_VERBOSE="2")
    env.pop("OPENBLAS_CORETYPE", None)
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    env.update(probe["env"])
    try:
        r = subprocess.run(probe["command"], cwd=probe["cwd"], env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return None
    m = re.findall(r"Core: (\w+)", r.stdout + r.stderr)
    return m[-1] if m else None


def run_one(t, coretype, threads):
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    env.update(t["env"])
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    for k in ("KVCAL_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[k] = str(threads)
    env.setdefault("GOMP_SPINCOUNT", "1000")  # busy CI cores: the default spin made 2 threads slower (README)
    t0 = time.time()
    try:
        r = subprocess.run(t["command"], cwd=t["cwd"], env=env, capture_output=True, text=True, timeout=t["timeout"])
        rc, out = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = -1, f"timeout after {t['timeout']} s\n{e.stdout or ''}{e.stderr or ''}"
    return rc, out, time.time() - t0


def main():
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    build, regex, threads, list_only = os.path.abspath(args[0]), DEFAULT_TESTS, [1, 2], False
    i = 1
    while i < len(args):
        if args[i] == "--tests":
            regex, i = args[i + 1], i + 2
        elif args[i] == "--threads":
            threads, i = [int(x) for x in args[i + 1].split(",")], i + 2
        elif args[i] == "--list":
            list_only, i = True, i + 1
        else:
            print(f"blas_matrix: unknown argument {args[i]}", file=sys.stderr)
            return 2
    tests = load_tests(build, regex)
    if not tests:
        print(f"blas_matrix: no tests match {regex} in {build}", file=sys.stderr)
        return 1
    flags = cpu_flags()
    probe = tests[0]
    default = loaded_core(probe, None)
    cores = [(None, default or "?")]
    print(f"blas matrix: default core {default or '(not reported)'}")
    for name, need in CORES:
        if not flags or not all(f in flags for f in need):
            continue
        got = loaded_core(probe, name)
        if got is None or got.lower() != name.lower():
            print(f"blas matrix: {name}: this OpenBLAS loads {got or 'nothing it reports'} instead; not run")
            continue
        if default and name.lower() == default.lower():
            continue  # the default run is this core
        cores.append((name, name))
    print("blas matrix: core types " + ", ".join(label + (" (default)" if c is None else "") for c, label in cores) +
          f"; threads {threads}; tests " + " ".join(t["name"] for t in tests))
    if list_only:
        return 0
    failures, t_all = [], time.time()
    for coretype, label in cores:
        for n in threads:
            counts, secs = {"passed": 0, "skipped": 0, "failed": 0}, 0.0
            for t in tests:
                rc, out, dt = run_one(t, coretype, n)
                secs += dt
                if rc == 0:
                    counts["passed"] += 1
                elif rc == t["skip"]:
                    counts["skipped"] += 1
                else:
                    counts["failed"] += 1
                    failures.append((label, n, t["name"]))
                    print(f"FAIL: {t['name']} with core {label}, {n} thread(s), exit {rc}:\n{out[-4000:]}")
            print(f"blas matrix: {label:<14} threads {n}: {counts['passed']} passed, {counts['skipped']} skipped, "
                  f"{counts['failed']} failed ({secs:.1f} s)", flush=True)
    print(f"blas matrix: {len(cores)} core types x {len(threads)} thread counts in {time.time() - t_all:.0f} s; "
          f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
