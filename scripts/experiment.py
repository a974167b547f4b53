#!/usr/bin/env python3
"""One experiment driver: fit each configured method on the calibration text, evaluate each plan on the
held-out text, write JSON and a table. What an experiment is lives in a configuration file
(configs/experiments/*.ini, format in configs/experiments/README.md); a method is a row there, not a script.

    scripts/experiment.sh CONFIG.ini [--KEY VALUE ...] [--set K=V ...] [--row NAME=ARGS ...] [-D KEY=VALUE ...]
                          [--reuse] [--update] [-t N] [-v] [--dry-run]

Stages, in order, each present only when the configuration asks for it:
  importance  kvprof importance on the calibration text, writing the allocations the rows read ([importance])
  rows        per row: kvcal fit (optionally timed, optionally under a launcher such as mpirun), then kvrun eval
              at every context (OUT/NAME.json, or OUT/ctxN/NAME.json with several contexts)
  table       a markdown table of the rows (printed and written to OUT/table.md; OUT/ctxN/table.md per context)
  search      one kvcal search at the grid budgets and each row's own honest bits, then the Pareto chart
              (scripts/pareto_chart.py; [search])
  compare     the results against checked-in baselines and tolerances (tests/regress/compare.py; `compare`)
Standard library only."""
import configparser
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# --KEY VALUE options of the command line that set an [experiment] key (aliases kept from the scripts this replaced)
ALIASES = {"contexts": "ctx", "configs": "run", "methods": "run", "out": "out", "build": "build"}
SEARCH_KEYS = {"budgets", "range", "candidates", "search-fit-tokens", "sens-ctx", "sens-samples", "prompts", "pruned",
               "pruned-layers", "select-chunks", "min-decode-speed", "search-args"}
IMPORTANCE_KEYS = {"prompts", "max-len", "random-seeds"}
NAMES = {"kivi": "KIVI", "higgs": "HIGGS", "aqua": "AQUA-KV", "aqua-uniform": "AQUA-KV (uniform)", "fp8": "FP8 E4M3",
         "nvfp4": "NVFP4"}


def die(msg, code=2):
    print(f"experiment: {msg}", file=sys.stderr)
    sys.exit(code)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def read_config(path):
    cp = configparser.ConfigParser(interpolation=None, delimiters=("=",), comment_prefixes=("#",),
                                   inline_comment_prefixes=None, strict=True)
    cp.optionxform = str
    with open(path) as f:
        cp.read_file(f, source=path)
    return cp


class Experiment:
    def __init__(self, path):
        self.path = path
        self.cp = read_config(path)
        if not self.cp.has_section("experiment"):
            die(f"{path}: no [experiment] section")
        self.settings = dict(self.cp["experiment"])
        self.catalogue = []  # (section name, dict), in precedence order: this file, then the included ones
        for sec in self.cp.sections():
            if sec not in ("experiment", "search", "importance"):
                self.catalogue.append((sec, dict(self.cp[sec])))
        for inc in self.settings.get("include", "").split():  # rows only: an included file's settings do not apply
            inc_cp = read_config(os.path.join(os.path.dirname(path), inc))
            self.catalogue += [(sec, dict(inc_cp[sec])) for sec in inc_cp.sections()
                               if sec not in ("experiment", "search", "importance")]
        self.search = dict(self.cp["search"]) if self.cp.has_section("search") else None
        self.importance = dict(self.cp["importance"]) if self.cp.has_section("importance") else None
        self.adhoc = {}

    # -- rows ---------------------------------------------------------------------------------------
    def lookup(self, name):
        """A row by name: an exact section first, then the first pattern section ({x} matches [A-Za-z0-9.]+) that
        matches; its values with the captures substituted. None when nothing matches."""
        if name in self.adhoc:
            return dict(self.adhoc[name])
        for sec, vals in self.catalogue:
            if sec == name:
                return dict(vals)
        for sec, vals in self.catalogue:
            if "{" not in sec:
                continue
            keys = re.findall(r"\{([A-Za-z0-9_-]+)\}", sec)
            rx = "".join(re.escape(p) if i % 2 == 0 else "([A-Za-z0-9.]+?)" for i, p in enumerate(_interleave(sec)))
            m = re.fullmatch(rx, name)
            if m:
                caps = dict(zip(keys, m.groups()))
                return {k: subst(v, caps, partial=True) for k, v in vals.items()}
        return None

    def row(self, name):
        """NAME or NAME@SUFFIX: the row, with the suffix row's fit arguments appended (token pruning: kivi-4@h2o0.125)."""
        base, at, suffix = name.partition("@")
        r = self.lookup(base)
        if r is None:
            die(f"no row '{base}' in {self.path} or its includes")
        if at:
            s = self.lookup("@" + suffix)
            if s is None:
                die(f"no row '@{suffix}' for '{name}' (e.g. kivi-4@h2o0.125)")
            r["fit"] = r.get("fit", "") + " " + s.get("fit", "")
        r.setdefault("label", label_of(name))
        return r


def _interleave(sec):
    """A pattern section's text and placeholders, alternating (text, {name}, text, ...)."""
    out, pos = [], 0
    for m in re.finditer(r"\{[A-Za-z0-9_-]+\}", sec):
        out += [sec[pos:m.start()], m.group(0)]
        pos = m.end()
    out.append(sec[pos:])
    return out


def subst(text, values, partial=False):
    """{key} -> values[key]; with partial, unknown keys stay for a later substitution."""
    def rep(m):
        k = m.group(1)
        if k in values:
            return str(values[k])
        if partial:
            return m.group(0)
        die(f"unknown placeholder {{{k}}} in '{text}'")
    return re.sub(r"\{([A-Za-z0-9_-]+)\}", rep, text)


def label_of(name):
    base, _, prune = name.partition("@")
    method, _, bits = base.rpartition("-")
    lab = f"{NAMES.get(method, method)}-{bits}" if method else base
    return lab + (f" @ {prune}" if prune else "")


def words(v):
    return shlex.split(v or "")


def truthy(v):
    return str(v).strip().lower() in ("1", "true", "yes", "on")


# -- the command line -------------------------------------------------------------------------------
def parse_args(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if argv else 2)
    exp = Experiment(argv[0])
    opts = {"set": [], "reuse": False, "update": False, "threads": None, "dry": False, "verbose": False,
            "argv": list(argv)}
    i = 1
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            print(__doc__)
            sys.exit(0)
        elif a == "--reuse":
            opts["reuse"] = True
        elif a == "--update":
            opts["update"] = True
        elif a == "--dry-run":
            opts["dry"] = True
        elif a in ("-v", "--verbose"):
            opts["verbose"] = True
        elif a in ("-t", "--threads"):
            opts["threads"] = argv[i + 1]
            i += 1
        elif a == "--set":
            opts["set"] += ["--set", argv[i + 1]]
            i += 1
        elif a == "-D":
            k, _, v = argv[i + 1].partition("=")
            section, dot, key = k.partition(".")
            if dot and section == "search" and exp.search is not None:
                exp.search[key] = v
            elif dot and section == "importance" and exp.importance is not None:
                exp.importance[key] = v
            else:
                exp.settings[k] = v
            i += 1
        elif a == "--row":
            name, _, args = argv[i + 1].partition("=")
            exp.adhoc[name] = {"fit": args, "label": name}
            i += 1
        elif a.startswith("--") and i + 1 < len(argv):
            key = ALIASES.get(a[2:], a[2:])
            if exp.search is not None and key in SEARCH_KEYS:
                exp.search[key] = argv[i + 1]
            elif exp.importance is not None and key in IMPORTANCE_KEYS:
                exp.importance[key] = argv[i + 1]
            else:
                exp.settings[key] = argv[i + 1]
            i += 1
        else:
            die(f"unknown argument '{a}' (see scripts/experiment.sh --help and configs/experiments/README.md)")
        i += 1
    return exp, opts


# -- running --------------------------------------------------------------------------------------
class Runner:
    def __init__(self, exp, opts):
        self.exp, self.opts = exp, opts
        s = exp.settings
        self.build = os.path.abspath(s.get("build") or os.path.join(ROOT, "build"))
        self.kvcal = os.path.join(self.build, "tools", "kvcal")
        self.kvrun = os.path.join(self.build, "tools", "kvrun")
        self.kvprof = os.path.join(self.build, "tools", "kvprof")
        for tool in (self.kvcal, self.kvrun):
            if not opts["dry"] and not os.access(tool, os.X_OK):
                die(f"build first (no {tool})")
        self.data = subprocess.run(["bash", os.path.join(ROOT, "scripts", "data-dir.sh")], capture_output=True,
                                   text=True, check=True).stdout.strip()
        self.vals = dict(s, data=self.data, root=ROOT, build=self.build)  # what {key} may name in a value
        self.vals["calib"] = subst(s.get("calib", "{data}/wikitext-2-raw/wiki.valid.raw"), self.vals)
        self.vals["heldout"] = subst(s.get("heldout", "{data}/wikitext-2-raw/wiki.test.raw"), self.vals)
        self.models = {}
        # the experiment's model; None when it cannot be had (rows may name their own, `optional` ones are skipped)
        self.default_model, self.default_tok = self.model(s.get("model", "default"), s.get("tokenizer", ""))
        self.vals["model"] = self.default_model or ""
        out = s.get("out") or os.path.join("{build}", "experiments", os.path.splitext(os.path.basename(exp.path))[0])
        self.out = os.path.abspath(subst(out, dict(self.vals, model_name=os.path.basename(self.default_model or ""))))
        self.vals["out"] = self.out
        for assignment in words(s.get("env", "")):  # e.g. SOURCE_DATE_EPOCH; the caller's environment wins
            k, _, v = assignment.partition("=")
            os.environ.setdefault(k, v)
        self.ctxs = words(s.get("ctx", "").replace(",", " "))
        self.run_list = words(s.get("run", ""))
        if not self.run_list:
            die(f"{exp.path}: nothing to run (`run` is empty)")
        self.single = os.path.join(self.out, "single") if exp.search is not None else self.out
        self.n_logs = 0  # OUT/logs/NN-TAG.log, numbered in the order the commands ran

    def model(self, spec, tok):
        """(model path, tokenizer path or ''): `default` is the fetched default model, `fetch:NAME` the model
        scripts/fetch-model.sh --model NAME fetches (None when it cannot be had), anything else a path with {data}."""
        spec = spec or "default"
        if spec not in self.models:
            if spec == "default" or spec.startswith("fetch:"):
                name = spec[len("fetch:"):] if spec.startswith("fetch:") else "smollm2"
                r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "fetch-model.sh"), "--model", name],
                                   capture_output=True, text=True)
                lines = r.stdout.strip().splitlines()
                path = lines[-1] if r.returncode == 0 and lines and os.path.isfile(lines[-1]) else None
            else:
                path = subst(spec, self.vals)
                path = path if os.path.exists(path) else None
            self.models[spec] = path
        return self.models[spec], subst(tok, self.vals) if tok else ""

    def sh(self, cmd, stdout=None, time_to=None, tag=None):
        """Run a command; stdout to a file when given. Quiet (the default): the command line and everything the tool
        prints on stderr (per-layer fit diagnostics, progress) go to OUT/logs/NN-TAG.log, and a failure prints the
        log's last lines; --verbose: echoed and passed through to the terminal."""
        line = "$ " + " ".join(shlex.quote(c) for c in cmd) + (f" > {stdout}" if stdout else "")
        if self.opts["dry"] or self.opts["verbose"]:
            log(line)
        if self.opts["dry"]:
            return 0
        if time_to:
            cmd = ["/usr/bin/time", "-f", "%M %e %U %S", "-o", time_to] + cmd
        self.n_logs += 1
        tag = tag or os.path.basename(cmd[0])
        log_path = os.path.join(self.out, "logs", "%02d-%s.log" % (self.n_logs, re.sub(r"[^A-Za-z0-9._@-]", "_", tag)))
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        with open(log_path, "w") as lf:
            lf.write(line + "\n")
            lf.flush()
            with open(stdout, "w") if stdout else open(os.devnull, "w") as f:
                r = subprocess.run(cmd, stdout=f if stdout else (None if self.opts["verbose"] else lf),
                                   stderr=None if self.opts["verbose"] else lf)
        if r.returncode != 0:
            if not self.opts["verbose"]:
                tail = open(log_path, errors="replace").read().splitlines()[-15:]
                sys.stderr.write("".join(f"  | {t}\n" for t in tail))
            die(f"command failed ({r.returncode}): {cmd[0]} ... (log: {log_path})", 1)
        return r.returncode

    def speed(self, plan, ctx, out_json, tag):
        """Decode speed of a plan against the runtime's f16 cache at ctx (`speed = true`): kvrun bench of the f16 cache
        then of the plan, back to back, so that both see the same machine load; writes {f16, plan, ratio} (decode
        tokens/s and their ratio) to out_json. A ratio below 1 is a plan that decodes slower than the cache it
        replaces (issue 35)."""
        if self.opts["reuse"] and os.path.exists(out_json) and os.path.getsize(out_json):
            return
        steps = self.exp.settings.get("speed-decode", "32")
        model, tok = self.default_model, self.default_tok
        tps = {}
        for kind, cache in (("f16", ["--cache", "f16"]), ("plan", ["--plan", plan])):
            cmd = ([self.kvrun, "bench", "--model", model] + (["--tokenizer", tok] if tok else []) + cache
                   + ["--context", str(ctx), "--decode", steps] + self.threads() + ["--json"])
            self.sh(cmd, stdout=out_json + "." + kind, tag=f"{tag}.bench-{kind}")
            if not self.opts["dry"]:
                tps[kind] = json.load(open(out_json + "." + kind))["decode_tokens_per_second"]
                os.remove(out_json + "." + kind)
        if not self.opts["dry"]:
            json.dump({"context": int(ctx), "decode_steps": int(steps), "f16": tps["f16"], "plan": tps["plan"],
                       "ratio": tps["plan"] / tps["f16"]}, open(out_json + ".part", "w"))
            os.replace(out_json + ".part", out_json)

    def threads(self):
        return ["-t", self.opts["threads"]] if self.opts["threads"] else []

    def need_model(self, what):
        if self.default_model is None:
            die(f"{what} needs the experiment's model, which is unavailable (scripts/fetch-model.sh)", 1)

    # stage: importance (KVmix)
    def importance(self):
        self.need_model("[importance]")
        imp = self.exp.importance
        out = self.out
        prompts, max_len = imp.get("prompts", "20"), imp.get("max-len", "512")
        log(f"== importance: {prompts} prompts x {max_len} tokens of {os.path.basename(self.vals['calib'])}")
        self.sh([self.kvprof, "importance", "--model", self.default_model, "--corpus", self.vals["calib"],
                 "--prompts", prompts, "--max-len", max_len, "--out", f"{out}/importance.yaml", "--svg",
                 f"{out}/importance.svg", "--config-out", f"{out}/kvmix.yaml", "--random-config-out",
                 f"{out}/random.yaml", "--compare-forward"] + words(imp.get("args", "")), stdout=f"{out}/importance.txt")
        if not self.opts["dry"] and self.opts["verbose"]:
            sys.stderr.write(open(f"{out}/importance.txt").read())
        # more random allocations: the draw depends only on the layer count, --high-frac and the seed, so a minimal
        # importance run (2 prompts of 16 tokens) is enough to have the tool write it
        seeds = words(imp.get("random-seeds", ""))
        for sd in seeds:
            self.sh([self.kvprof, "importance", "-q", "--model", self.default_model, "--corpus", self.vals["calib"],
                     "--prompts", "2", "--max-len", "16", "--out", f"{out}/random{sd}.importance.yaml",
                     "--random-config-out", f"{out}/random{sd}.yaml", "--random-seed", sd], tag=f"importance-random{sd}")
        if self.opts["dry"]:
            return
        # the same allocations without RPC: every per-layer ratio set to 0; and the uniform allocation
        for a in ["kvmix", "random"] + [f"random{sd}" for sd in seeds]:
            text = open(f"{out}/{a}.yaml").read()
            open(f"{out}/{a}-norpc.yaml", "w").write(re.sub(r"(rpc_ratio: )[0-9.]+", r"\g<1>0.0", text))
        open(f"{out}/uniform.yaml", "w").write("layers: {}\n")

    # stage: rows
    def fit_and_eval(self, name, plan_name=None):
        exp, s = self.exp, self.exp.settings
        r = exp.row(name)
        plan_name = plan_name or name
        model, tok = self.model(r.get("model", s.get("model", "default")), r.get("tokenizer", s.get("tokenizer", "")))
        if model is None:
            if truthy(r.get("optional", "false")):
                log(f"experiment: {name}: its model is unavailable; skipped")
                return None
            die(f"{name}: its model is unavailable", 1)
        vals = dict(self.vals, model=model, name=plan_name)
        tokargs = ["--tokenizer", tok] if tok else []
        out = self.single
        os.makedirs(out, exist_ok=True)
        plan = f"{out}/{plan_name}.kvplan"
        secs_file = f"{out}/{plan_name}.fit-seconds"
        fit_tokens = s.get("fit-tokens-nopred" if r.get("fit-budget") == "nopred" else "fit-tokens", "")
        budget = (["--seq-len", s["seq-len"]] if s.get("seq-len") else []) + (["--max-tokens", fit_tokens] if fit_tokens else [])
        launcher = words(subst(r.get("launcher", ""), vals))
        fit = (launcher + [self.kvcal, "fit", "--model", model] + tokargs + ["--corpus", self.vals["calib"], "--out", plan]
               + words(subst(s.get("fit-args", ""), vals)) + words(subst(r.get("fit", ""), vals)) + budget
               + self.opts["set"] + self.threads())
        timed = truthy(r.get("time", s.get("time", "false")))
        if self.opts["reuse"] and os.path.exists(plan) and os.path.getsize(plan) and os.path.exists(secs_file):
            log(f"== {plan_name}: reusing {plan}")
        else:
            log(f"== {plan_name}: fit on {os.path.basename(self.vals['calib'])} ({fit_tokens or 'configured'} tokens)")
            t0 = time.time()
            self.sh(fit, stdout=f"{out}/{plan_name}.fit.txt", time_to=f"{out}/{plan_name}.time" if timed else None,
                    tag=f"{plan_name}.fit")
            if not self.opts["dry"]:
                open(secs_file, "w").write(f"{time.time() - t0}\n")
        if timed and not self.opts["dry"]:
            print_time_line(out, plan_name)
        if truthy(r.get("inspect", s.get("inspect", "false"))):
            self.sh([self.kvrun, "inspect", "--json", plan], stdout=f"{out}/{plan_name}.plan.json", tag=f"{plan_name}.inspect")
        if not truthy(r.get("evaluate", s.get("evaluate", "true"))):
            return None
        ctxs = words(r.get("ctx", "").replace(",", " ")) or self.ctxs or [""]
        for c in ctxs:
            d = out if len(ctxs) == 1 else f"{out}/ctx{c}"
            os.makedirs(d, exist_ok=True)
            res = f"{d}/{plan_name}.json"
            if self.opts["reuse"] and os.path.exists(res) and os.path.getsize(res):
                continue
            log(f"== {plan_name}: evaluate on {os.path.basename(self.vals['heldout'])}"
                f" ({s.get('eval-tokens', 'configured')} tokens, ctx {c or 'configured'})")
            ev = ([self.kvrun, "eval", "--model", model] + tokargs + ["--text", self.vals["heldout"], "--plan", plan]
                  + (["--ctx", c] if c else []) + (["--max-tokens", s["eval-tokens"]] if s.get("eval-tokens") else [])
                  + words(subst(s.get("eval-args", ""), vals)) + words(subst(r.get("eval", ""), vals))
                  + self.threads() + ["--json"])
            self.sh(ev, stdout=res + ".part", tag=f"{plan_name}.eval{c}")
            if self.opts["dry"]:
                continue
            j = json.load(open(res + ".part"))
            j["fit_seconds"] = float(open(secs_file).read())
            json.dump(j, open(res + ".part", "w"))
            os.replace(res + ".part", res)
            if truthy(s.get("speed", "false")) and model == self.default_model:
                log(f"== {plan_name}: decode speed against the f16 cache (ctx {j['tokens_evaluated'] // j['chunks']})")
                self.speed(plan, j["tokens_evaluated"] // j["chunks"], f"{d}/{plan_name}.speed.json", plan_name)
        return r

    def rows(self):
        rounds = int(self.exp.settings.get("rounds", "1"))
        same = words(self.exp.settings.get("same-plans", ""))
        for rnd in range(1, rounds + 1):
            for name in self.run_list:
                self.fit_and_eval(name, f"r{rnd}-{name}" if rounds > 1 else None)
            if same and not self.opts["dry"]:
                pre = f"r{rnd}-" if rounds > 1 else ""
                plans = [open(f"{self.single}/{pre}{n}.kvplan", "rb").read() for n in same]
                if any(p != plans[0] for p in plans[1:]):
                    die(f"the plans of {', '.join(same)} differ", 1)
                print(f"plans of {', '.join(same)}: identical", flush=True)

    # stage: table
    def table(self):
        style = self.exp.settings.get("table", "results")
        if style == "none" or self.opts["dry"]:
            return
        ctxs = self.ctxs or [""]
        for c in ctxs:
            d = self.single if len(ctxs) == 1 else f"{self.single}/ctx{c}"
            if len(ctxs) > 1:
                print(f"\n### context {c}\n")
            text = TABLES[style](self, d)
            print(text, flush=True)
            if text:
                open(os.path.join(d, "table.md"), "w").write(text + "\n")

    # stage: search + chart
    def search(self):
        self.need_model("[search]")
        srch, s = self.exp.search, self.exp.settings
        lo, hi = map(float, srch.get("range", "2 5.5").split())
        pts = [str(float(b)).rstrip("0").rstrip(".") for b in words(srch.get("budgets", ""))]
        # the grid at every context, and each row's honest bits at its context (kvrun eval's JSON prints them to
        # 1e-9: the searched plan is at most 5e-10 bits above the method's)
        for path in sorted(glob.glob(os.path.join(self.single, "*.json")) +
                           glob.glob(os.path.join(self.single, "ctx*", "*.json"))):
            if path.endswith(".speed.json"):
                continue
            r = json.load(open(path))
            ctx, b = r["tokens_evaluated"] // r["chunks"], r["bits_per_value_total"]
            if lo <= b <= hi:
                pts.append("%.9f@%s" % (b, ctx))
        points = ",".join(dict.fromkeys(pts))
        out = self.out
        if not (self.opts["reuse"] and os.path.exists(f"{out}/search.json") and os.path.getsize(f"{out}/search.json")):
            log(f"== kvcal search at {points} (contexts {' '.join(self.ctxs)})")
            cmd = ([self.kvcal, "search", "--model", self.default_model]
                   + (["--tokenizer", self.default_tok] if self.default_tok else [])
                   + ["--corpus", self.vals["calib"], "--heldout", self.vals["heldout"], "--context", ",".join(self.ctxs),
                      "--budget-bits", points, "--candidates", srch["candidates"],
                      "--fit-tokens", srch.get("search-fit-tokens", "8192"), "--sens-ctx", srch.get("sens-ctx", "512"),
                      "--sens-samples", srch.get("sens-samples", "1"), "--prompts", srch.get("prompts", "4"),
                      "--eval-tokens", s["eval-tokens"], "--out-dir", f"{out}/search"]
                   + (["--pruned", srch["pruned"]] if srch.get("pruned") else [])
                   + (["--pruned-layers", srch["pruned-layers"]] if srch.get("pruned-layers") else [])
                   + (["--select-chunks", srch["select-chunks"]] if srch.get("select-chunks") else [])
                   + (["--min-decode-speed", srch["min-decode-speed"]] if srch.get("min-decode-speed") else [])
                   + words(srch.get("search-args", "")) + self.opts["set"] + self.threads() + ["--json"])
            self.sh(cmd, stdout=f"{out}/search.json.part", tag="search")
            if not self.opts["dry"]:
                os.replace(f"{out}/search.json.part", f"{out}/search.json")
        if truthy(s.get("speed", "false")) and not self.opts["dry"]:
            for p in json.load(open(f"{out}/search.json"))["plans"]:
                if p["feasible"]:
                    name = os.path.splitext(os.path.basename(p["plan"]))[0]
                    log(f"== {name}: decode speed against the f16 cache (ctx {p['context']})")
                    self.speed(p["plan"], p["context"], f"{out}/search/{name}.speed.json", name)
        if not self.opts["dry"]:
            subprocess.run([sys.executable, os.path.join(HERE, "pareto_chart.py"), out], check=True)

    # stage: compare
    def compare(self):
        base = os.path.join(ROOT, self.exp.settings["compare"])
        cmd = [sys.executable, os.path.join(ROOT, "tests", "regress", "compare.py"), base, self.single]
        if self.opts["update"]:
            cmd.append("--update")
        if self.opts["dry"]:
            return 0
        return subprocess.run(cmd).returncode

    def run(self):
        os.makedirs(self.out, exist_ok=True)
        if self.exp.settings.get("description"):
            log(f"experiment {os.path.basename(self.exp.path)}: {' '.join(self.exp.settings['description'].split())}")
        env = environment()
        log(f"experiment: {env}; output in {self.out}")
        if not self.opts["dry"]:  # what a record of this run needs besides the results: the command and the machine
            with open(os.path.join(self.out, "command.txt"), "a") as f:
                f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S %z')}: {env}\n$ " +
                        " ".join(shlex.quote(a) for a in ["scripts/experiment.sh"] + self.opts["argv"]) + "\n")
        if self.exp.importance is not None:
            self.importance()
        self.rows()
        self.table()
        if self.exp.search is not None:
            self.search()
        rc = self.compare() if self.exp.settings.get("compare") else 0
        if not self.opts["dry"]:
            self.where()
        return rc

    def where(self):
        """Where the run wrote its plans, results and logs: the last lines a user reads."""
        plans = sorted(glob.glob(os.path.join(self.single, "*.kvplan")))
        searched = sorted(glob.glob(os.path.join(self.out, "search", "*.kvplan")))
        print(f"plans: {len(plans)} in {self.single}/" + (f", {len(searched)} searched in {self.out}/search/"
                                                          if searched else ""))
        reports = [p for p in [os.path.join(self.out, "search.json"), os.path.join(self.single, "table.md")]
                   if os.path.exists(p)]
        print("results: " + ", ".join(reports + [f"{self.single}/NAME.json (kvrun eval per plan)"]))
        print(f"logs: {self.out}/logs/ (every command and what it printed)", flush=True)


def environment():
    """The commit, the CPUs and the load: a run's conditions, printed and kept in OUT/command.txt."""
    git = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()
    try:
        load = " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        load = "?"
    return f"commit {git or '?'}{' (modified)' if dirty else ''}, {os.cpu_count()} CPUs, load {load}"


def print_time_line(out, name):
    """One line per timed fit: wall time, CPU time (user + system, of every rank under mpirun), GNU time's peak RSS
    (the largest process), and the fit's own memory and time lines."""
    rss, wall, user, sys_ = open(f"{out}/{name}.time").read().split()[-4:]
    txt = open(f"{out}/{name}.fit.txt").read().splitlines()
    mem = next((l[len("memory: "):] for l in txt if l.startswith("memory:")), "")
    tm = next((l[len("time: "):] for l in txt if l.startswith("time:")), "")
    print("%-34s wall %7.1f s cpu %7.1f s | maxrss %7.1f MiB | %s | %s" %
          (name, float(wall), float(user) + float(sys_), float(rss) / 1024, mem, tm), flush=True)


# -- tables ---------------------------------------------------------------------------------------
def loaded(runner, d):
    rows = []
    for name in runner.run_list:
        p = os.path.join(d, name + ".json")
        if os.path.exists(p):
            rows.append((name, runner.exp.row(name), json.load(open(p))))
    return rows


def fmt_row(label, r, fit_s=True, speed=None):
    cells = (f"| {label} | {r['bits_per_value']:.3f} | {r['bits_per_value_total']:.3f} | {r['ppl']:.4f} | "
             f"{100 * r['ppl_relative_increase']:+.2f}% | {r['kl_mean']:.4f} | {r['top1_agreement']:.4f} |")
    if speed is not None:
        cells += f" {speed['ratio']:.2f}x{' (slower)' if speed['ratio'] < 1 else ''} |"
    return cells + (f" {r.get('fit_seconds', 0):.0f} |" if fit_s else "")


def speed_of(d, name):
    """NAME.speed.json beside NAME.json (Runner.speed), or None."""
    p = os.path.join(d, name + ".speed.json")
    return json.load(open(p)) if os.path.exists(p) else None


def table_results(runner, d):
    """method, bits, total bits, ppl, Δppl, KL, top-1, fit seconds; the uncompressed row first; then the protocol."""
    rows = loaded(runner, d)
    if not rows:
        return "no results"
    base = rows[0][2]
    speeds = [speed_of(d, name) for name, _, _ in rows]
    sp = all(v is not None for v in speeds)
    out = ["| method | bits/value | bits/value (total) | ppl | Δppl | KL (nats) | top-1 agree |" +
           (" decode vs f16 |" if sp else "") + " fit s |",
           "|---|---|---|---|---|---|---|---|" + ("---|" if sp else ""),
           f"| uncompressed (fp16 cache) | 16 | 16 | {base['ppl_uncompressed']:.4f} | — | 0 | 1 |" +
           (" 1x |" if sp else "") + " — |"]
    out += [fmt_row(row["label"], r, speed=v if sp else None) for (_, row, r), v in zip(rows, speeds)]
    out.append(f"\n{base['tokens_evaluated']} held-out tokens in {base['chunks']} chunks of "
               f"{base['tokens_evaluated'] // base['chunks']}; sinks {base['sinks']}, recent buffer {base['recent']} tokens "
               "in full precision." + (f" Decode: tokens/s of `kvrun bench` ({speeds[0]['decode_steps']} steps after "
                                       "a prompt of the context) with the plan over the runtime's f16 cache, measured "
                                       "back to back on this machine." if sp else ""))
    return "\n".join(out)


def table_groups(runner, d):
    """The results columns without fit seconds, then the mean of each `mean-group` with several rows (KVmix's random
    allocations), then the protocol (prompt + single-token decoding)."""
    rows = loaded(runner, d)
    if not rows:
        return "no results"
    out = ["| configuration | bits/value | bits/value (total) | ppl | Δppl | KL (nats) | top-1 agree |",
           "|---|---|---|---|---|---|---|"]
    out += [fmt_row(row["label"], r, fit_s=False) for _, row, r in rows]
    groups = {}
    for _, row, r in rows:
        if row.get("mean-group"):
            groups.setdefault(row["mean-group"], []).append(r)
    for g, rs in groups.items():
        if len(rs) > 1:
            m = {k: sum(r[k] for r in rs) / len(rs) for k in ("bits_per_value", "bits_per_value_total", "ppl",
                                                               "ppl_relative_increase", "kl_mean", "top1_agreement")}
            out.append(fmt_row(f"{g}: mean of {len(rs)} seeds", m, fit_s=False))
    b = rows[0][2]
    out.append(f"\nuncompressed ppl {b['ppl_uncompressed']:.4f}; {b['tokens_evaluated']} held-out tokens in {b['chunks']} "
               f"chunks" + (f", each a {b['prefill']}-token prompt then single-token decoding steps." if b.get("prefill")
                            else "."))
    return "\n".join(out)


def table_squat(runner, d):
    """SQuat: bits, ppl, KL, top-1, then the held-out attention errors the fit measured (mean over layers of the K
    rows' squat_out_err / squat_score_err of the plan's report; a row's `errors-from` and `errors-prefix` take them
    from another row's plan, e.g. KIVI-2's as the calibrated SQuat fit measured them)."""
    out = ["| plan | bits/value | ppl | KL | top-1 | softmax-output err | score err | fit s |", "|---|---|---|---|---|---|---|---|"]
    for name, row, ev in loaded(runner, d):
        src = os.path.join(d, row.get("errors-from", name) + ".plan.json")
        plan = json.load(open(src)) if os.path.exists(src) else {}
        pre = row.get("errors-prefix", "squat_")

        def mean(key):
            v = [x[key] for x in plan.get("report", {}).get("rows", []) if x["stream"] == "K" and x.get(key) is not None]
            return sum(v) / len(v) if v else float("nan")
        out.append("| %s | %.3f | %.4f | %.4f | %.4f | %.4f | %.4f | %.0f |" % (
            name, ev["bits_per_value"], ev["ppl"], ev["kl_mean"], ev["top1_agreement"], mean(pre + "out_err"),
            mean(pre + "score_err"), ev.get("fit_seconds", 0)))
    return "\n".join(out)


def table_json(runner, d):
    """Every row's kvrun eval JSON, as it is (what the regression prints before comparing)."""
    return "\n".join(f"== {name}\n{json.dumps(r)}" for name, _, r in loaded(runner, d))


def table_hidden(runner, d):
    """Two fits' held-out errors (kvcal fit --json) compared per layer, then each plan's evaluation: the accuracy
    effect of a setting that should not change the plan (f16 hidden states)."""
    names = runner.run_list
    fits = [json.load(open(os.path.join(d, n + ".fit.txt"))) for n in names[:2]]
    out = []
    for st in ("k", "v"):
        da = [l[st]["quant_rel_err"] for l in fits[0]["layers"]]
        db = [l[st]["quant_rel_err"] for l in fits[1]["layers"]]
        rel = [abs(x - y) / x for x, y in zip(da, db)]
        out.append(f"{st.upper()} held-out total error, mean over layers: {names[0]} {sum(da)/len(da):.6g}, {names[1]} "
                   f"{sum(db)/len(db):.6g}; per-layer relative change: max {max(rel):.3g}, mean {sum(rel)/len(rel):.3g}")
    for name, _, r in loaded(runner, d):
        out.append(f"{name}: ppl {r['ppl']:.4f} (uncompressed {r['ppl_uncompressed']:.4f}), KL {r['kl_mean']:.5f}, "
                   f"top-1 {r['top1_agreement']:.4f}")
    return "\n".join(out)


TABLES = {"results": table_results, "groups": table_groups, "squat": table_squat, "json": table_json,
          "hidden": table_hidden, "none": lambda *_: ""}


def main(argv):
    exp, opts = parse_args(argv)
    if exp.settings.get("table", "results") not in TABLES:
        die(f"unknown table '{exp.settings['table']}' (one of {', '.join(TABLES)})")
    return Runner(exp, opts).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
