#!/usr/bin/env python3
"""Print the markdown table of scripts/results.sh from its JSON results: RESULTS_DIR CONFIG..."""
import json
import os
import sys

NAMES = {"kivi": "KIVI", "higgs": "HIGGS", "aqua": "AQUA-KV", "aqua-uniform": "AQUA-KV (uniform)", "fp8": "FP8 E4M3",
         "nvfp4": "NVFP4"}


def main():
    out, configs = sys.argv[1], sys.argv[2:]
    rows = []
    base = None
    for cfg in configs:
        path = os.path.join(out, cfg + ".json")
        if not os.path.exists(path):
            continue
        r = json.load(open(path))
        base = base or r
        method, bits = cfg.rsplit("-", 1)
        rows.append((f"{NAMES.get(method, method)}-{bits}", r))
    if not rows:
        print("no results")
        return 1
    print(f"| method | bits/value | bits/value (total) | ppl | Δppl | KL (nats) | top-1 agree | fit s |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| uncompressed (fp16 cache) | 16 | 16 | {base['ppl_uncompressed']:.4f} | — | 0 | 1 | — |")
    for name, r in rows:
        print(f"| {name} | {r['bits_per_value']:.3f} | {r['bits_per_value_total']:.3f} | {r['ppl']:.4f} | "
              f"{100 * r['ppl_relative_increase']:+.2f}% | {r['kl_mean']:.4f} | {r['top1_agreement']:.4f} | "
              f"{r.get('fit_seconds', 0):.0f} |")
    r = rows[0][1]
    print(f"\n{r['tokens_evaluated']} held-out tokens in {r['chunks']} chunks of {r['tokens_evaluated'] // r['chunks']}; "
          f"sinks {r['sinks']}, recent buffer {r['recent']} tokens in full precision.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
