#!/usr/bin/env bash
# kvcal export (formats/export_hf.c): plans fitted on stories260K exported for compressed-tensors and
# modelopt into a copy of a Hugging Face checkpoint made here, read back with the `safetensors`
# package (numpy API; installed into a venv this test creates, skipped with 77 when pip cannot):
# tensor names, shapes, dtypes and values against the plan's scales (compressed-tensors: (1,) or
# (num_kv_heads, 1, 1) in the model's dtype; modelopt: self_attn.k_proj.k_scale / v_proj.v_scale,
# float32 scalars, and config.json's quantization_config with quant_method modelopt); config.json's
# kv_cache_scheme against compressed-tensors' QuantizationArgs; the index extended; the checkpoint's
# own files copied unchanged; the refusals of plans the formats cannot express; and the issue-32 cases:
# --out equal to / a symlink of --model or otherwise unusable (exit 2, the input untouched), another
# model's config.json (every fingerprint field), an existing quantization_config kept or refused,
# existing scale tensors replaced, a failed export leaving nothing behind, and a capped config.json.
#   test_export.sh TOOLS_DIR VENV_DIR   (data from $KVCAL_DATA_DIR; exit 77 = skipped)
set -u
tools="$1"; venv="$2"
kvcal="$tools/kvcal"; kvrun="$tools/kvrun"
data="${KVCAL_DATA_DIR:-}"
if [ -z "$data" ] || [ ! -f "$data/stories260K/stories260K.bin" ]; then
  echo "skipped: no stories260K in KVCAL_DATA_DIR"; exit 77
fi
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import safetensors.numpy, numpy" 2>/dev/null; then
  rm -rf "$venv"
  if ! { python3 -m venv "$venv" && "$venv/bin/pip" install -q safetensors numpy; } > /dev/null 2>&1; then
    echo "skipped: cannot install safetensors and numpy with pip"; rm -rf "$venv"; exit 77
  fi
fi
py="$venv/bin/python"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
head -c 40000 "$data/wikitext-2-raw/wiki.valid.raw" > "$tmp/corpus.txt"
common=(--model "$data/stories260K/stories260K.bin" --seq-len 260 --max-tokens 3000 --corpus "$tmp/corpus.txt"
        --no-checkpoint -q)
fail=0
fit() { local n="$1"; shift; "$kvcal" fit "${common[@]}" --out "$tmp/$n.kvplan" "$@" > /dev/null 2> "$tmp/$n.err" ||
  { echo "FAIL: fit $n"; cat "$tmp/$n.err"; fail=1; }
  "$kvrun" inspect --json "$tmp/$n.kvplan" > "$tmp/$n.json"; }
fit tensor --method fp8
fit head --method fp8 --scale-granularity head
fit nvfp4 --method nvfp4
fit e5m2 --method fp8 --set fp.fp8_format=e5m2
fit kivi --method kivi --set keys.group_size=32
fit aqua --method aqua-uniform
# a Hugging Face checkpoint of the plan's model shape (config, two shards and their index)
"$py" - "$tmp/hf" "$tmp/tensor.json" <<'PY'
import json, os, sys, numpy as np
from safetensors.numpy import save_file
d, plan = sys.argv[1], json.load(open(sys.argv[2]))
fp = plan["fingerprint"]
os.makedirs(d)
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": fp["n_layers"],
       "num_attention_heads": fp["n_heads"], "num_key_value_heads": fp["n_kv_heads"], "head_dim": fp["head_dim"],
       "hidden_size": fp["d_model"], "vocab_size": fp["vocab_size"], "rope_theta": fp["rope_theta"],
       "torch_dtype": "float32"}
json.dump(cfg, open(f"{d}/config.json", "w"))
save_file({"model.embed_tokens.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
           "model.layers.0.self_attn.k_proj.weight": np.ones((2, 2), dtype=np.float32)},
          f"{d}/model-00001-of-00002.safetensors")
save_file({"lm_head.weight": np.ones((2, 4), dtype=np.float32)}, f"{d}/model-00002-of-00002.safetensors")
json.dump({"metadata": {"total_size": 96}, "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
           "model.layers.0.self_attn.k_proj.weight": "model-00001-of-00002.safetensors",
           "lm_head.weight": "model-00002-of-00002.safetensors"}}, open(f"{d}/model.safetensors.index.json", "w"))
open(f"{d}/tokenizer.json", "w").write('{"version": "1.0"}\n')
# a single-file checkpoint in bfloat16 that already has KV scales (an earlier FP8 KV checkpoint) and
# a compressed-tensors weight scheme: the scales are replaced, the scheme kept
s = dict(cfg, torch_dtype="bfloat16", quantization_config={"quant_method": "compressed-tensors", "format": "float-quantized",
         "quantization_status": "compressed", "ignore": ["lm_head"],
         "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel",
                                                                          "symmetric": True, "dynamic": False}}}})
os.makedirs(f"{d}-single")
json.dump(s, open(f"{d}-single/config.json", "w"))
old = {"model.embed_tokens.weight": np.arange(12, dtype=np.float32).reshape(3, 4)}
for l in range(fp["n_layers"]):
    old[f"model.layers.{l}.self_attn.k_scale"] = np.full((1,), 7.0, dtype=np.float32)
    old[f"model.layers.{l}.self_attn.v_scale"] = np.full((1,), 7.0, dtype=np.float32)
    old[f"model.layers.{l}.self_attn.k_proj.weight"] = np.full((2, 2), l, dtype=np.float32)
save_file(old, f"{d}-single/model.safetensors")
# a ModelOpt checkpoint with FP8 weights (quant_algo FP8) and another with another method's quantization
os.makedirs(f"{d}-modelopt")
json.dump(dict(cfg, quantization_config={"quant_method": "modelopt", "quant_algo": "FP8", "ignore": ["lm_head"],
               "producer": {"name": "modelopt", "version": "0.40.0"}}), open(f"{d}-modelopt/config.json", "w"))
json.dump({"producer": {"name": "modelopt", "version": "0.40.0"},
           "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]}},
          open(f"{d}-modelopt/hf_quant_config.json", "w"))
save_file({"model.layers.0.self_attn.k_proj.weight": np.ones((2, 2), dtype=np.float32)}, f"{d}-modelopt/model.safetensors")
os.makedirs(f"{d}-fp8")
json.dump(dict(cfg, quantization_config={"quant_method": "fp8", "activation_scheme": "dynamic"}), open(f"{d}-fp8/config.json", "w"))
save_file({"model.layers.0.self_attn.k_proj.weight": np.ones((2, 2), dtype=np.float32)}, f"{d}-fp8/model.safetensors")
PY
export_ok() { # NAME FORMAT
  "$kvcal" export --plan "$tmp/$1.kvplan" --model "$tmp/hf" --format "$2" --out "$tmp/out-$1-$2" -q 2> "$tmp/e.err" ||
    { echo "FAIL: export $1 $2"; cat "$tmp/e.err"; fail=1; }
}
export_ok tensor compressed-tensors
export_ok head compressed-tensors
export_ok tensor modelopt
export_ok nvfp4 modelopt
grep -q "per-head scales" "$tmp/e.err" 2>/dev/null; true
"$kvcal" export --plan "$tmp/head.kvplan" --model "$tmp/hf" --format compressed-tensors --out "$tmp/out-head2" 2> "$tmp/w.err" > /dev/null
grep -q "SGLang ignores" "$tmp/w.err" || { echo "FAIL: no warning about per-head scales"; cat "$tmp/w.err"; fail=1; }
"$kvcal" export --plan "$tmp/tensor.kvplan" --model "$tmp/hf-single" --format compressed-tensors --out "$tmp/out-single" -q 2> "$tmp/e.err" ||
  { echo "FAIL: export into a single-file checkpoint"; cat "$tmp/e.err"; fail=1; }
"$kvcal" export --plan "$tmp/tensor.kvplan" --model "$tmp/hf-modelopt" --format modelopt --out "$tmp/out-modelopt" -q 2> "$tmp/e.err" ||
  { echo "FAIL: export into a ModelOpt checkpoint"; cat "$tmp/e.err"; fail=1; }
# an export into the exported copy replaces its scales (nothing stale beside them)
"$kvcal" export --plan "$tmp/head.kvplan" --model "$tmp/out-tensor-compressed-tensors" --format compressed-tensors \
  --out "$tmp/out-reexport" -q 2> "$tmp/e.err" || { echo "FAIL: export of an exported checkpoint"; cat "$tmp/e.err"; fail=1; }
refuse() { # NAME FORMAT PATTERN
  "$kvcal" export --plan "$tmp/$1.kvplan" --model "$tmp/hf" --format "$2" --out "$tmp/r-$1-$2" 2> "$tmp/r.err"
  local rc=$?
  { [ $rc -eq 1 ] && grep -q -- "$3" "$tmp/r.err"; } || { echo "FAIL: refusal $1 $2: exit $rc"; cat "$tmp/r.err"; fail=1; }
  [ -e "$tmp/r-$1-$2" ] && { echo "FAIL: refusal $1 $2 left an output"; fail=1; }
  echo "ok: refused $1 as $2"
}
refuse kivi compressed-tensors "layer 0 K is uniform (2 bits): only FP8 / NVFP4"
refuse aqua modelopt "layer 1 K has an AQUA-KV predictor"
refuse head modelopt "per-head scales"
refuse nvfp4 compressed-tensors "NVFP4"
refuse e5m2 modelopt "E5M2"
"$kvcal" export --plan "$tmp/tensor.kvplan" --model "$tmp/hf" --format gguf --out "$tmp/x" 2> "$tmp/r.err"
[ $? -eq 2 ] || { echo "FAIL: --format gguf is not a usage error"; fail=1; }
# another model's checkpoint: every field of the fingerprint that config.json states (issue 32, 4)
for kv in num_hidden_layers:9 hidden_size:96 num_attention_heads:4 num_key_value_heads:2 head_dim:16 vocab_size:32000 \
          rope_theta:500000.0; do
  k="${kv%%:*}"; v="${kv#*:}"
  rm -rf "$tmp/hf2" "$tmp/x2"; mkdir "$tmp/hf2"
  python3 -c "import json,sys; c=json.load(open(sys.argv[1])); c[sys.argv[2]]=json.loads(sys.argv[3]); json.dump(c,open(sys.argv[4],'w'))" \
    "$tmp/hf/config.json" "$k" "$v" "$tmp/hf2/config.json"
  "$kvcal" export --plan "$tmp/tensor.kvplan" --model "$tmp/hf2" --format modelopt --out "$tmp/x2" 2> "$tmp/r.err"
  rc=$?
  { [ $rc -eq 1 ] && grep -q "$k" "$tmp/r.err" && grep -q "not the plan's model" "$tmp/r.err" && [ ! -e "$tmp/x2" ]; } ||
    { echo "FAIL: a checkpoint with another $k: exit $rc"; cat "$tmp/r.err"; fail=1; }
done
echo "ok: another model's config.json refused field by field"
# the checkpoint's own quantization of another method: refused with the reason (issue 32, 5)
"$kvcal" export --plan "$tmp/tensor.kvplan" --model "$tmp/hf-fp8" --format compressed-tensors --out "$tmp/x3" 2> "$tmp/r.err"
{ [ $? -eq 1 ] && grep -q "quant_method 'fp8'" "$tmp/r.err" && [ ! -e "$tmp/x3" ]; } ||
  { echo "FAIL: a quant_method fp8 checkpoint not refused"; cat "$tmp/r.err"; fail=1; }
"$kvcal" export --plan "$tmp/tensor.kvplan" --model "$tmp/hf-fp8" --format modelopt --out "$tmp/x3" 2> "$tmp/r.err"
{ [ $? -eq 1 ] && grep -q "quant_method 'fp8'" "$tmp/r.err"; } || { echo "FAIL: fp8 checkpoint as modelopt"; fail=1; }
"$kvcal" export --plan "$tmp/tensor.kvplan" --model "$tmp/hf-modelopt" --format compressed-tensors --out "$tmp/x3" 2> "$tmp/r.err"
{ [ $? -eq 1 ] && grep -q "ModelOpt checkpoint" "$tmp/r.err"; } || { echo "FAIL: modelopt checkpoint as compressed-tensors"; cat "$tmp/r.err"; fail=1; }
# --out: the model itself, a symlink to it, inside it, an existing file or non-empty directory, a
# missing or read-only parent, empty: exit 2 before any work, the input untouched (issue 32, 2)
ln -s "$tmp/hf" "$tmp/hf-link"
mkdir "$tmp/used" && touch "$tmp/used/stale.txt" "$tmp/afile"
mkdir "$tmp/ro" && chmod 555 "$tmp/ro"
before="$(cd "$tmp/hf" && ls -l --time-style=full-iso; cat config.json model.safetensors.index.json | sha256sum)"
for o in "$tmp/hf" "$tmp/hf-link" "$tmp/hf/" "$tmp/hf/sub" "$tmp/afile" "$tmp/used" "$tmp/nodir/out" "" ; do
  "$kvcal" export --plan "$tmp/tensor.kvplan" --model "$tmp/hf" --format compressed-tensors --out "$o" 2> "$tmp/r.err"
  rc=$?
  { [ $rc -eq 2 ] && ! grep -q -e '\.tmp\.[0-9]' -e kvcal-tmp "$tmp/r.err"; } || { echo "FAIL: --out '$o': exit $rc"; cat "$tmp/r.err"; fail=1; }
done
if [ "$(id -u)" -ne 0 ]; then
  "$kvcal" export --plan "$tmp/tensor.kvplan" --model "$tmp/hf" --format compressed-tensors --out "$tmp/ro/x" 2> /dev/null
  [ $? -eq 2 ] || { echo "FAIL: --out in a read-only directory"; fail=1; }
fi
[ "$before" = "$(cd "$tmp/hf" && ls -l --time-style=full-iso; cat config.json model.safetensors.index.json | sha256sum)" ] ||
  { echo "FAIL: a refused export changed the input checkpoint"; fail=1; }
[ -e "$tmp/used/stale.txt" ] && [ "$(ls "$tmp/used")" = stale.txt ] || { echo "FAIL: a used --out was changed"; fail=1; }
echo "ok: unusable --out refused with exit 2, the input untouched"
# an empty directory is taken (replaced by the new one)
mkdir "$tmp/emptyout"
"$kvcal" export --plan "$tmp/tensor.kvplan" --model "$tmp/hf" --format compressed-tensors --out "$tmp/emptyout" -q 2> "$tmp/r.err" &&
  [ -f "$tmp/emptyout/config.json" ] || { echo "FAIL: export into an empty directory"; cat "$tmp/r.err"; fail=1; }
# a failure half-way (a garbled index, a truncated shard) leaves no output and no temporary directory (7)
mkdir "$tmp/hf-bad" && cp "$tmp/hf/"* "$tmp/hf-bad/" && echo '{"weight_map": ' > "$tmp/hf-bad/model.safetensors.index.json"
"$kvcal" export --plan "$tmp/tensor.kvplan" --model "$tmp/hf-bad" --format compressed-tensors --out "$tmp/x4" 2> "$tmp/r.err"
{ [ $? -eq 1 ] && [ ! -e "$tmp/x4" ]; } || { echo "FAIL: garbled index"; cat "$tmp/r.err"; fail=1; }
cp "$tmp/hf/model.safetensors.index.json" "$tmp/hf-bad/"
head -c 100 "$tmp/hf/model-00002-of-00002.safetensors" > "$tmp/hf-bad/model-00002-of-00002.safetensors"
"$kvcal" export --plan "$tmp/tensor.kvplan" --model "$tmp/hf-bad" --format compressed-tensors --out "$tmp/x4" 2> "$tmp/r.err"
{ [ $? -eq 1 ] && [ ! -e "$tmp/x4" ]; } || { echo "FAIL: truncated shard"; cat "$tmp/r.err"; fail=1; }
ls -d "$tmp"/*kvcal-tmp* > /dev/null 2>&1 && { echo "FAIL: a temporary directory was left behind"; fail=1; }
echo "ok: failed exports leave no output"
# a 400 MB shard is copied in bounded blocks: the export's peak RSS stays far below the shard (8)
mkdir "$tmp/hf-large" && cp "$tmp/hf/config.json" "$tmp/hf-large/"
python3 - "$tmp/hf-large/model.safetensors" <<'PY'
import json, os, struct, sys
n = 100 << 20  # floats: 400 MiB of zeros, written as a hole
h = json.dumps({"model.layers.0.self_attn.k_proj.weight": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    f.truncate(8 + len(h) + 4 * n)
PY
rss_kb=$(python3 - "$kvcal" "$tmp/tensor.kvplan" "$tmp/hf-large" "$tmp/out-large" <<'PY'
import resource, subprocess, sys
kvcal, plan, model, out = sys.argv[1:5]
rc = subprocess.call([kvcal, "export", "--plan", plan, "--model", model, "--format", "compressed-tensors", "--out", out, "-q"])
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if rc == 0 else -1)
PY
)
if [ "$rss_kb" -lt 0 ]; then echo "FAIL: export of a 400 MB shard"; fail=1
elif [ "$rss_kb" -gt 65536 ]; then echo "FAIL: export of a 400 MB shard peaked at $((rss_kb / 1024)) MiB RSS"; fail=1
else echo "ok: a 400 MB shard exported with a peak RSS of $((rss_kb / 1024)) MiB"; fi
rm -rf "$tmp/hf-large" "$tmp/out-large"
# a 20 MB config.json is refused without reading it whole (8)
mkdir "$tmp/hf-big" && cp "$tmp/hf/"* "$tmp/hf-big/"
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); c['pad']='x'*(20<<20); json.dump(c,open(sys.argv[2],'w'))" \
  "$tmp/hf/config.json" "$tmp/hf-big/config.json"
"$kvcal" export --plan "$tmp/tensor.kvplan" --model "$tmp/hf-big" --format compressed-tensors --out "$tmp/x5" 2> "$tmp/r.err"
{ [ $? -eq 1 ] && grep -q "larger than" "$tmp/r.err"; } || { echo "FAIL: a 20 MB config.json"; cat "$tmp/r.err"; fail=1; }

"$py" - "$tmp" <<'PY' || fail=1
import json, os, sys, numpy as np
from safetensors.numpy import load_file
from safetensors import safe_open
tmp = sys.argv[1]
ok = True
def check(c, what):
    global ok
    if not c:
        print("FAIL:", what); ok = False
# compressed-tensors QuantizationArgs (compressed_tensors.quantization.QuantizationArgs, as its
# documentation lists the fields): num_bits int; type "int" | "float"; symmetric bool; group_size int or
# null; strategy one of tensor, channel, group, block, token, tensor_group, attn_head; dynamic bool or
# "local"; block_structure, actorder null or their forms; observer str; observer_kwargs dict.
STRATEGIES = {"tensor", "channel", "group", "block", "token", "tensor_group", "attn_head"}
def check_scheme(q, want_strategy):
    check(q.get("quant_method") == "compressed-tensors", f"quant_method {q.get('quant_method')}")
    s = q.get("kv_cache_scheme")
    check(isinstance(s, dict), "kv_cache_scheme missing")
    if not isinstance(s, dict): return
    check(isinstance(s.get("num_bits"), int) and s["num_bits"] == 8, f"num_bits {s.get('num_bits')}")
    check(s.get("type") in ("int", "float") and s["type"] == "float", f"type {s.get('type')}")
    check(isinstance(s.get("symmetric"), bool) and s["symmetric"], "symmetric")
    check(s.get("strategy") in STRATEGIES and s["strategy"] == want_strategy, f"strategy {s.get('strategy')}")
    check(s.get("dynamic") in (False, True, "local") and s["dynamic"] is False, f"dynamic {s.get('dynamic')}")
    check(s.get("group_size") is None or isinstance(s.get("group_size"), int), "group_size")
    check(isinstance(s.get("observer", ""), str) and isinstance(s.get("observer_kwargs", {}), dict), "observer")
    check(set(s) <= {"num_bits", "type", "symmetric", "group_size", "strategy", "block_structure", "dynamic",
                     "actorder", "observer", "observer_kwargs", "scale_dtype", "zp_dtype"}, f"unknown keys {set(s)}")
def scales_of(plan, layer, st):
    return np.array(plan["layers"][layer][st]["scales"], dtype=np.float32)
def bf16(a):  # round to nearest even, as kvcal (and torch) convert f32 to bfloat16
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return (u.astype(np.uint32) << 16).view(np.float32)
def load_bf16(path):  # numpy has no bfloat16: read the raw safetensors
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little"); hdr = json.loads(raw[8:8 + n]); out = {}
    for k, v in hdr.items():
        if k == "__metadata__": continue
        b, e = v["data_offsets"]; data = raw[8 + n + b:8 + n + e]
        if v["dtype"] == "BF16":
            a = (np.frombuffer(data, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(data, dtype=np.float32)
        out[k] = (v["dtype"], tuple(v["shape"]), a.reshape(v["shape"]))
    return out
cases = (("tensor", "compressed-tensors", "out-tensor-compressed-tensors", "hf"),
         ("head", "compressed-tensors", "out-head-compressed-tensors", "hf"),
         ("tensor", "modelopt", "out-tensor-modelopt", "hf"), ("nvfp4", "modelopt", "out-nvfp4-modelopt", "hf"),
         ("head", "compressed-tensors", "out-reexport", "out-tensor-compressed-tensors"))
for name, fmt, outn, src in cases:
    out = f"{tmp}/{outn}"
    plan = json.load(open(f"{tmp}/{name}.json"))
    L, nkv = plan["fingerprint"]["n_layers"], plan["fingerprint"]["n_kv_heads"]
    t = load_file(f"{out}/kv_scales.safetensors")
    check(len(t) == 2 * L, f"{outn}: {len(t)} tensors, want {2 * L}")
    for l in range(L):
        for st, key in (("K", "k"), ("V", "v")):
            n = f"model.layers.{l}.self_attn.{key}_proj.{key}_scale" if fmt == "modelopt" else f"model.layers.{l}.self_attn.{key}_scale"
            check(n in t, f"{outn}: no {n}")
            if n not in t: continue
            a, want = t[n], scales_of(plan, l, st)
            shape = () if fmt == "modelopt" else (nkv, 1, 1) if name == "head" else (1,)
            check(a.dtype == np.float32, f"{n}: dtype {a.dtype}")
            check(a.shape == shape, f"{outn} {n}: shape {a.shape}, want {shape}")
            check(np.array_equal(a.reshape(-1), want), f"{n}: {a} vs plan {want}")
    idx = json.load(open(f"{out}/model.safetensors.index.json"))
    wm = idx["weight_map"]
    want_names = {n for n in t}
    got_names = {k for k, v in wm.items() if v == "kv_scales.safetensors"}
    check(got_names == want_names, f"{outn}: index names {sorted(got_names)[:3]} vs {sorted(want_names)[:3]}")
    check(wm.get("lm_head.weight") == "model-00002-of-00002.safetensors", "index lost an entry")
    check(idx["metadata"]["total_size"] == 96 + 4 * len(t) * (nkv if name == "head" else 1), f"{outn}: total_size {idx['metadata']}")
    with safe_open(f"{out}/kv_scales.safetensors", framework="numpy") as f:
        check(f.metadata().get("format") == "pt", "metadata format")
    for fn in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "tokenizer.json"):
        check(open(f"{out}/{fn}", "rb").read() == open(f"{tmp}/hf/{fn}", "rb").read(), f"{fn} not copied unchanged")
    check(sorted(os.listdir(out)) == sorted(os.listdir(f"{tmp}/{src}") + (["hf_quant_config.json"] if fmt == "modelopt" else [])
                                            + ([] if "kv_scales.safetensors" in os.listdir(f"{tmp}/{src}") else ["kv_scales.safetensors"])),
          f"{outn}: files {sorted(os.listdir(out))}")
    cfg = json.load(open(f"{out}/config.json"))
    check(cfg["num_hidden_layers"] == L and cfg["model_type"] == "llama", "config.json lost its fields")
    q = cfg.get("quantization_config", {})
    if fmt == "compressed-tensors":
        check_scheme(q, "attn_head" if name == "head" else "tensor")
    else:
        h = json.load(open(f"{out}/hf_quant_config.json"))
        algo = "NVFP4" if name == "nvfp4" else "FP8"
        check(h["producer"]["name"] == "modelopt", "producer")
        check(h["quantization"]["kv_cache_quant_algo"] == algo, "kv_cache_quant_algo")
        check(q.get("quant_method") == "modelopt", f"config.json quant_method {q.get('quant_method')}")
        check(q.get("kv_cache_scheme") == ({"dynamic": False, "num_bits": 8, "type": "float"} if algo == "FP8" else "NVFP4"),
              f"config.json kv_cache_scheme {q.get('kv_cache_scheme')}")
    print(f"ok: {name} as {fmt} ({outn}): {2 * L} scale tensors read back")
# the single-file bfloat16 checkpoint: scales in model.safetensors (loaders read it alone), bf16, the
# old ones replaced, the weight scheme kept
plan = json.load(open(f"{tmp}/tensor.json")); L = plan["fingerprint"]["n_layers"]
out = f"{tmp}/out-single"
check(sorted(os.listdir(out)) == ["config.json", "model.safetensors"], f"out-single: files {os.listdir(out)}")
t = load_bf16(f"{out}/model.safetensors")
check(len(t) == 1 + 3 * L, f"out-single: {len(t)} tensors (old scales left beside the new?)")
for l in range(L):
    for st, key in (("K", "k"), ("V", "v")):
        n = f"model.layers.{l}.self_attn.{key}_scale"
        dt, shape, a = t[n]
        check(dt == "BF16" and shape == (1,), f"out-single {n}: {dt} {shape}")
        check(np.array_equal(a.reshape(-1), bf16(scales_of(plan, l, st))), f"out-single {n}: {a} vs {scales_of(plan, l, st)}")
    check(np.array_equal(t[f"model.layers.{l}.self_attn.k_proj.weight"][2], np.full((2, 2), l, dtype=np.float32)), "weights moved")
check(np.array_equal(t["model.embed_tokens.weight"][2], np.arange(12, dtype=np.float32).reshape(3, 4)), "embedding moved")
q = json.load(open(f"{out}/config.json"))["quantization_config"]
check(q["format"] == "float-quantized" and "group_0" in q["config_groups"] and q["ignore"] == ["lm_head"], f"scheme lost: {q}")
check(q["kv_cache_scheme"]["strategy"] == "tensor", "kv_cache_scheme not added")
# the ModelOpt checkpoint keeps its quant_algo in both files
out = f"{tmp}/out-modelopt"
q = json.load(open(f"{out}/config.json"))["quantization_config"]
h = json.load(open(f"{out}/hf_quant_config.json"))
check(q["quant_algo"] == "FP8" and q["ignore"] == ["lm_head"] and q["producer"]["version"] == "0.40.0", f"modelopt config: {q}")
check(h["quantization"]["quant_algo"] == "FP8" and h["quantization"]["kv_cache_quant_algo"] == "FP8"
      and h["quantization"]["exclude_modules"] == ["lm_head"], f"hf_quant_config: {h}")
t = load_file(f"{out}/model.safetensors")
check(t["model.layers.0.self_attn.k_proj.k_scale"].shape == () and len(t) == 1 + 2 * L, "modelopt single file")
print("ok: single-file bf16 and ModelOpt checkpoints: scales replaced, quantization metadata kept")
sys.exit(0 if ok else 1)
PY
[ $fail -eq 0 ] && echo "test_export: all passed"
exit $fail
