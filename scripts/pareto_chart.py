#!/usr/bin/env python3
"""The Pareto chart of scripts/pareto.sh: KL and perplexity against honest total bits per value, each single
method and the searched plans, at each context; the table behind it; and the equal-bits verdict.

    pareto_chart.py DIR      (DIR/single/*.json or DIR/single/ctxN/*.json from results.sh, DIR/search.json from kvcal search --json)

Writes DIR/pareto.svg (one row of two panels, KL and ppl, per context; a ring marks a plan that decodes slower than
the f16 cache, when experiment.py measured speeds: NAME.speed.json) and DIR/pareto.md (the table, with decode speed
against f16, and the verdict), and prints pareto.md. The verdict compares each single method m at context N with the searched plan
whose budget is m's own honest bits there (the B@N points pareto.sh asks for): the searched plan "beats" m when
its KL and its perplexity are both lower at bits <= m's; without such a point, or when it does not beat m, a
searched plan at fewer bits that does beat m is named. Standard library only."""
import glob
import json
import math
import os
import sys

NAMES = {"kivi": "KIVI", "higgs": "HIGGS", "aqua": "AQUA-KV", "fp8": "FP8", "nvfp4": "NVFP4", "xquant": "XQuant",
         "aqua+q": "AQUA-KV (GPTQ predictors)"}
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


def label(cfg):
    method, _, suffix = cfg.rpartition("-")
    return f"{NAMES.get(method, method)}-{suffix}" if method else cfg


def family(cfg):
    """One line per method, and per method and token policy: kivi-2 and kivi-4 are "kivi", kivi-4@h2o0.125 and
    kivi-2@h2o0.125 are "kivi@h2o" (scripts/results.sh's pruned configs), aqua-2q and aqua-4q (GPTQ predictors)
    "aqua+q"."""
    base, _, prune = cfg.partition("@")
    fam, _, bits = base.rpartition("-")
    fam = (fam or base) + ("+q" if fam and bits.endswith("q") else "")
    return fam + "@" + prune.rstrip("0123456789.") if prune else fam


def family_name(fam):
    """The legend's name of a family: KIVI, or KIVI @ H2O for KIVI under H2O's token pruning."""
    base, _, policy = fam.partition("@")
    return NAMES.get(base, base) + (" @ " + policy.upper() if policy else "")


def context_of(r):
    """kvrun eval --plan's JSON: whole chunks of ctx tokens."""
    return r["tokens_evaluated"] // r["chunks"]


def speed(path):
    """Decode tokens/s with the plan over the f16 cache's, measured back to back (experiment.py's `speed`), or None."""
    return json.load(open(path))["ratio"] if os.path.exists(path) else None


def speed_cell(r):
    v = r.get("speed")
    return "—" if v is None else f"{v:.2f}x" + (" (slower)" if v < 1 else "")


def load(d):
    single, search = {}, {}
    for path in sorted(glob.glob(os.path.join(d, "single", "*.json")) + glob.glob(os.path.join(d, "single", "ctx*", "*.json"))):
        if path.endswith(".speed.json"):
            continue
        r = json.load(open(path))
        ctx = context_of(r)
        cfg = os.path.basename(path)[:-5]
        single.setdefault(ctx, []).append({"name": label(cfg), "family": family(cfg),
                                           "bits": r["bits_per_value_total"], "kl": r["kl_mean"], "ppl": r["ppl"],
                                           "ppl_ref": r["ppl_uncompressed"], "top1": r["top1_agreement"],
                                           "speed": speed(path[:-5] + ".speed.json")})
    s = json.load(open(os.path.join(d, "search.json")))
    for p in s["plans"]:
        if not p["feasible"]:
            continue
        m = p["measured_heldout"]
        search.setdefault(p["context"], []).append({"budget": p["budget_bits"], "bits": m["bits_per_value_total"],
                                                    "kl": m["kl_mean"], "ppl": m["ppl"], "ppl_ref": m["ppl_ref"],
                                                    "top1": m["top1_agreement"], "predicted_kl": p["predicted"]["kl_sum"],
                                                    "plan": os.path.basename(p["plan"]),
                                                    "speed": speed(os.path.join(d, "search", os.path.splitext(
                                                        os.path.basename(p["plan"]))[0] + ".speed.json"))})
    for v in search.values():
        v.sort(key=lambda r: r["bits"])
    return single, search, s


def verdicts(single, search, floor=None):
    """Per (context, single method): the searched plan at that method's own bits (budget within 1e-3 below), and
    failing that any searched plan at fewer bits that is better on both KL and ppl (a plan within m's bits that
    beats m is a plan the search would meet m's budget with). With a decoding speed floor (kvcal search
    --min-decode-speed), a method measured slower than the floor is marked: the search could not have chosen it."""
    out = []
    def mark(r, v):
        if floor and r.get("speed") is not None and r["speed"] < floor:
            return v + " (the method decodes at %.2fx the f16 cache, below the search's floor %gx)" % (r["speed"], floor)
        return v
    for ctx in sorted(single):
        for r in sorted(single[ctx], key=lambda r: r["bits"]):
            # kvcal search's JSON prints KL and ppl to 6 significant digits: "lower" and "the same" are decided
            # beyond that precision (a relative 1e-5), else the method itself rounded down would "beat" itself
            def wins(p):
                return (p["bits"] <= r["bits"] + 1e-9 and p["kl"] < r["kl"] * (1 - 1e-5) and
                        p["ppl"] < r["ppl"] * (1 - 1e-5))
            # kvcal search's JSON before 2026-11-24 printed budgets to 6 significant digits (3.109375 as 3.10938)
            match = [p for p in search.get(ctx, []) if r["bits"] - 1e-3 <= p["budget"] <= r["bits"] * (1 + 1e-5)]
            below = [p for p in search.get(ctx, []) if p["bits"] <= r["bits"] + 1e-9 and p not in match]
            if match and wins(match[0]):
                out.append((ctx, r, match[0], mark(r, "beats")))
                continue
            cheaper = [p for p in below if wins(p)]
            if cheaper:
                p = min(cheaper, key=lambda p: p["bits"])
                out.append((ctx, r, p, mark(r, "beats (the searched plan at %.3f bits)" % p["bits"])))
                continue
            if match:
                p = match[0]
                same = abs(p["kl"] - r["kl"]) <= 1e-5 * r["kl"] and abs(p["ppl"] - r["ppl"]) <= 1e-5 * r["ppl"]
                # the method itself when it is the cheapest candidate: no other assembly fits its bits
                out.append((ctx, r, p, mark(r, "ties (the same plan)" if same else "does not beat")))
            elif below:
                out.append((ctx, r, None, mark(r, "not beaten by the searched plans below these bits")))
            else:
                out.append((ctx, r, None, mark(r, "no searched plan at or below these bits")))
    return out


def slow_ring(x, y, r):
    """A black ring around a point whose plan decodes slower than the f16 cache it replaces (speed < 1)."""
    v = r.get("speed")
    if v is None or v >= 1:
        return ""
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="7" fill="none" stroke="#000" stroke-width="1.5"/>'


def svg(single, search, path):
    ctxs = sorted(set(single) | set(search))
    W, H, ml, mr, mt, mb = 460, 300, 70, 150, 36, 46
    rows = []
    fam = sorted({r["family"] for c in single.values() for r in c})
    color = {f: COLORS[i % len(COLORS)] for i, f in enumerate(fam)}
    for ci, ctx in enumerate(ctxs):
        pts = single.get(ctx, []) + search.get(ctx, [])
        if not pts:
            continue
        for pi, (key, title, logy) in enumerate((("kl", "KL(exact || plan), nats", True),
                                                 ("ppl", "perplexity", False))):
            x0, y0 = pi * W, ci * H
            xs = [r["bits"] for r in pts]
            ys = [r[key] for r in pts] + ([pts[0]["ppl_ref"]] if key == "ppl" else [])
            xlo, xhi = math.floor(min(xs)), math.ceil(max(xs))
            # perplexity on a log axis too when a point is off by more than 10x (1-bit KIVI: ppl 1e5), which a
            # linear axis would squeeze every other point under
            logy = logy or max(ys) > 10 * min(ys)
            if logy:
                ys = [y for y in ys if y > 0]
                ylo, yhi = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
            else:
                ylo, yhi = min(ys) * 0.98, max(ys) * 1.02
            fx = lambda x: x0 + ml + (x - xlo) / max(xhi - xlo, 1e-9) * (W - ml - mr)
            fy = lambda y: y0 + H - mb - ((math.log10(y) if logy else y) - ylo) / max(yhi - ylo, 1e-9) * (H - mt - mb)
            rows.append(f'<rect x="{x0 + ml}" y="{y0 + mt}" width="{W - ml - mr}" height="{H - mt - mb}" '
                        f'fill="none" stroke="#888"/>')
            rows.append(f'<text x="{x0 + ml}" y="{y0 + 22}" font-size="13">context {ctx}: {title}</text>')
            for b in range(xlo, xhi + 1):
                rows.append(f'<line x1="{fx(b):.1f}" y1="{y0 + H - mb}" x2="{fx(b):.1f}" y2="{y0 + H - mb + 4}" stroke="#444"/>'
                            f'<text x="{fx(b):.1f}" y="{y0 + H - mb + 16}" font-size="11" text-anchor="middle">{b}</text>')
            rows.append(f'<text x="{x0 + ml + (W - ml - mr) / 2}" y="{y0 + H - 8}" font-size="11" text-anchor="middle">'
                        f'honest total bits per value</text>')
            ticks = [10 ** e for e in range(ylo, yhi + 1)] if logy else [ylo + (yhi - ylo) * i / 4 for i in range(5)]
            for t in ticks:
                rows.append(f'<text x="{x0 + ml - 4}" y="{fy(t) + 4:.1f}" font-size="11" text-anchor="end">'
                            f'{t:.0e}</text>' if logy else
                            f'<text x="{x0 + ml - 4}" y="{fy(t) + 4:.1f}" font-size="11" text-anchor="end">{t:.2f}</text>')
                rows.append(f'<line x1="{x0 + ml}" y1="{fy(t):.1f}" x2="{x0 + W - mr}" y2="{fy(t):.1f}" stroke="#ddd"/>')
            if key == "ppl":
                yr = fy(pts[0]["ppl_ref"])
                rows.append(f'<line x1="{x0 + ml}" y1="{yr:.1f}" x2="{x0 + W - mr}" y2="{yr:.1f}" stroke="#000" '
                            f'stroke-dasharray="4,3"/><text x="{x0 + W - mr + 4}" y="{yr + 4:.1f}" font-size="10">'
                            f'uncompressed</text>')
            for f in fam:
                line = sorted((r for r in single.get(ctx, []) if r["family"] == f), key=lambda r: r["bits"])
                line = [r for r in line if not logy or r[key] > 0]
                if not line:
                    continue
                d = " ".join(f'{fx(r["bits"]):.1f},{fy(r[key]):.1f}' for r in line)
                rows.append(f'<polyline points="{d}" fill="none" stroke="{color[f]}" stroke-width="1.2"/>')
                for r in line:
                    rows.append(f'<circle cx="{fx(r["bits"]):.1f}" cy="{fy(r[key]):.1f}" r="3" fill="{color[f]}">'
                                f'<title>{r["name"]}: {r["bits"]:.3f} bits, {key} {r[key]:.5g}, decode '
                                f'{speed_cell(r)}</title></circle>' + slow_ring(fx(r["bits"]), fy(r[key]), r))
            line = [r for r in search.get(ctx, []) if not logy or r[key] > 0]
            if line:
                d = " ".join(f'{fx(r["bits"]):.1f},{fy(r[key]):.1f}' for r in line)
                rows.append(f'<polyline points="{d}" fill="none" stroke="#d62728" stroke-width="2.2"/>')
                for r in line:
                    rows.append(f'<rect x="{fx(r["bits"]) - 3.5:.1f}" y="{fy(r[key]) - 3.5:.1f}" width="7" height="7" '
                                f'fill="#d62728"><title>searched, budget {r["budget"]:.4g}: {r["bits"]:.3f} bits, {key} '
                                f'{r[key]:.5g}, decode {speed_cell(r)}</title></rect>' +
                                slow_ring(fx(r["bits"]), fy(r[key]), r))
            ly = y0 + mt
            for name, col in [(family_name(f), color[f]) for f in fam] + [("searched plan", "#d62728")]:
                rows.append(f'<rect x="{x0 + W - mr + 8}" y="{ly}" width="10" height="10" fill="{col}"/>'
                            f'<text x="{x0 + W - mr + 22}" y="{ly + 9}" font-size="11">{name}</text>')
                ly += 15
            if any(r.get("speed") is not None and r["speed"] < 1 for r in pts):
                rows.append(slow_ring(x0 + W - mr + 13, ly + 5, {"speed": 0}) +
                            f'<text x="{x0 + W - mr + 22}" y="{ly + 9}" font-size="11">decodes slower than f16</text>')
    body = "\n".join(rows)
    with open(path + ".part", "w") as f:
        f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W}" height="{len(ctxs) * H}" '
                f'font-family="sans-serif">\n<rect width="100%" height="100%" fill="white"/>\n{body}\n</svg>\n')
    os.replace(path + ".part", path)


def table(single, search, s):
    lines = []
    for ctx in sorted(set(single) | set(search)):
        ref = (single.get(ctx) or search.get(ctx))[0]["ppl_ref"]
        lines += [f"### context {ctx} (uncompressed ppl {ref:.4f})", "",
                  "| plan | honest bits | KL | ppl | Δppl | top-1 | decode vs f16 |", "|---|---|---|---|---|---|---|"]
        rows = [(r["name"], r) for r in single.get(ctx, [])] + \
               [(f"searched, budget {r['budget']:.4g}", r) for r in search.get(ctx, [])]
        for name, r in sorted(rows, key=lambda t: t[1]["bits"]):
            lines.append(f"| {name} | {r['bits']:.3f} | {r['kl']:.4f} | {r['ppl']:.4f} | "
                         f"{100 * (r['ppl'] / r['ppl_ref'] - 1):+.2f}% | {r['top1']:.4f} | {speed_cell(r)} |")
        lines.append("")
    lines += ["### searched plan vs each single method at that method's honest bits", "",
              "| context | method | bits | KL | ppl | searched bits | searched KL | searched ppl | verdict |",
              "|---|---|---|---|---|---|---|---|---|"]
    floors = [p["decode_speed"]["floor"] for p in s["plans"] if p.get("feasible") and p.get("decode_speed")]
    for ctx, r, p, v in verdicts(single, search, floors[0] if floors else None):
        if p:
            lines.append(f"| {ctx} | {r['name']} | {r['bits']:.3f} | {r['kl']:.4f} | {r['ppl']:.4f} | {p['bits']:.3f} | "
                         f"{p['kl']:.4f} | {p['ppl']:.4f} | {v} |")
        else:
            lines.append(f"| {ctx} | {r['name']} | {r['bits']:.3f} | {r['kl']:.4f} | {r['ppl']:.4f} | — | — | — | {v} |")
    sec = s.get("seconds", {})
    lines += ["", "search: " + ", ".join(f"{k} {v:.0f} s" for k, v in sec.items())]
    return "\n".join(lines) + "\n"


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    d = sys.argv[1]
    single, search, s = load(d)
    svg(single, search, os.path.join(d, "pareto.svg"))
    md = table(single, search, s)
    with open(os.path.join(d, "pareto.md.part"), "w") as f:
        f.write(md)
    os.replace(os.path.join(d, "pareto.md.part"), os.path.join(d, "pareto.md"))
    sys.stdout.write(md)
    print(f"chart: {os.path.join(d, 'pareto.svg')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
