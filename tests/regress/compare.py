#!/usr/bin/env python3
"""Compare held-out regression results (scripts/regress.sh) with the checked-in baselines.

baselines.json: {"tolerance": {...}, "cases": {NAME: {"ppl": x, "kl_mean": y, "bits_per_value": z, ...}}}.
A case fails when its perplexity or KL got worse than the baseline by more than the tolerance, or
its bits per value grew. Better results pass (and are reported, so the baseline can be tightened
with --update). A case in the baselines whose result file is missing fails, unless it is marked
"optional" (the default model's cases, which need the network to fetch the model).
"""
import json
import os
import sys


def main():
    if len(sys.argv) < 3:
        print("usage: compare.py BASELINES.json RESULTS_DIR [--update]", file=sys.stderr)
        return 2
    base_path, res_dir = sys.argv[1], sys.argv[2]
    update = "--update" in sys.argv[3:]
    with open(base_path) as f:
        base = json.load(f)
    tol = base["tolerance"]
    results = {}
    for name in sorted(os.listdir(res_dir)):
        if name.endswith(".json"):
            with open(os.path.join(res_dir, name)) as f:
                results[name[:-5]] = json.load(f)
    if update:
        cases = {}
        for name, r in results.items():
            cases[name] = {k: r[k] for k in ("ppl", "ppl_uncompressed", "kl_mean", "top1_agreement", "bits_per_value",
                                              "bits_per_value_total")}
            cases[name]["optional"] = name.startswith("smollm2")
        base["cases"] = cases
        with open(base_path, "w") as f:
            json.dump(base, f, indent=2, sort_keys=True)
            f.write("\n")
        print(f"regress: baselines rewritten with {len(cases)} cases")
        return 0
    failed = passed = skipped = 0
    for name, b in sorted(base["cases"].items()):
        r = results.get(name)
        if r is None:
            if b.get("optional"):
                print(f"SKIP {name}: no result")
                skipped += 1
            else:
                print(f"FAIL {name}: no result")
                failed += 1
            continue
        problems = []
        if r["ppl"] > b["ppl"] * (1 + tol["ppl_rel"]):
            problems.append(f"ppl {r['ppl']:.4f} > {b['ppl']:.4f} * (1 + {tol['ppl_rel']})")
        if r["kl_mean"] > b["kl_mean"] * (1 + tol["kl_rel"]) + tol["kl_abs"]:
            problems.append(f"KL {r['kl_mean']:.5g} > {b['kl_mean']:.5g} * (1 + {tol['kl_rel']}) + {tol['kl_abs']}")
        if r["bits_per_value"] > b["bits_per_value"] + tol["bits_abs"]:
            problems.append(f"bits/value {r['bits_per_value']:.4f} > {b['bits_per_value']:.4f} + {tol['bits_abs']}")
        if abs(r["ppl_uncompressed"] - b["ppl_uncompressed"]) > tol["ppl_rel"] * b["ppl_uncompressed"]:
            problems.append(f"uncompressed ppl {r['ppl_uncompressed']:.4f} moved from {b['ppl_uncompressed']:.4f}")
        status = "FAIL" if problems else "ok  "
        print(f"{status} {name}: ppl {r['ppl']:.4f} (base {b['ppl']:.4f}), KL {r['kl_mean']:.5g} (base "
              f"{b['kl_mean']:.5g}), bits {r['bits_per_value']:.3f} (base {b['bits_per_value']:.3f})"
              + ("" if not problems else ": " + "; ".join(problems)))
        if problems:
            failed += 1
        else:
            passed += 1
    print(f"regress: {passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
