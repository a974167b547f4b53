#!/usr/bin/env bash
# kvcal export (formats/export_hf.c): plans fitted on stories260K exported for compressed-tensors and
# modelopt into a copy of a Hugging Face checkpoint made here, read back with the `safetensors`
# package (numpy API; installed into a venv this test creates, skipped with 77 when pip cannot):
# tensor names, shapes, dtypes and values against the plan's scales; config.json's kv_cache_scheme
# against compressed-tensors' QuantizationArgs as its documentation gives it; the index extended;
# the checkpoint's own files copied unchanged; and the refusals of plans the formats cannot express.
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
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": fp["n_layers"],
           "num_attention_heads": fp["n_heads"], "num_key_value_heads": fp["n_kv_heads"],
           "hidden_size": fp["d_model"], "torch_dtype": "float32"}, open(f"{d}/config.json", "w"))
save_file({"model.embed_tokens.weight": np.arange(12, dtype=np.float32).reshape(3, 4)}, f"{d}/model-00001-of-00002.safetensors")
save_file({"lm_head.weight": np.ones((2, 4), dtype=np.float32)}, f"{d}/model-00002-of-00002.safetensors")
json.dump({"metadata": {"total_size": 80}, "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
           "lm_head.weight": "model-00002-of-00002.safetensors"}}, open(f"{d}/model.safetensors.index.json", "w"))
open(f"{d}/tokenizer.json", "w").write('{"version": "1.0"}\n')
PY
export_ok() { # NAME FORMAT
  "$kvcal" export --plan "$tmp/$1.kvplan" --model "$tmp/hf" --format "$2" --out "$tmp/out-$1-$2" -q 2> "$tmp/e.err" ||
    { echo "FAIL: export $1 $2"; cat "$tmp/e.err"; fail=1; }
}
export_ok tensor compressed-tensors
export_ok head compressed-tensors
export_ok tensor modelopt
export_ok nvfp4 modelopt
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
# another model's checkpoint: refused by shape
sed 's/"num_key_value_heads": [0-9]*/"num_key_value_heads": 99/' "$tmp/hf/config.json" > "$tmp/c.json"
mkdir "$tmp/hf2" && cp "$tmp/c.json" "$tmp/hf2/config.json"
"$kvcal" export --plan "$tmp/tensor.kvplan" --model "$tmp/hf2" --format modelopt --out "$tmp/x2" 2> "$tmp/r.err"
{ [ $? -eq 1 ] && grep -q "99 KV heads" "$tmp/r.err"; } || { echo "FAIL: mismatched checkpoint"; cat "$tmp/r.err"; fail=1; }

"$py" - "$tmp" <<'PY' || fail=1
import json, sys, numpy as np
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
for name, fmt in (("tensor", "compressed-tensors"), ("head", "compressed-tensors"), ("tensor", "modelopt"),
                  ("nvfp4", "modelopt")):
    out = f"{tmp}/out-{name}-{fmt}"
    plan = json.load(open(f"{tmp}/{name}.json"))
    L, nkv = plan["fingerprint"]["n_layers"], plan["fingerprint"]["n_kv_heads"]
    t = load_file(f"{out}/kv_scales.safetensors")
    check(len(t) == 2 * L, f"{name}/{fmt}: {len(t)} tensors, want {2 * L}")
    for l in range(L):
        for st, key in (("K", "k_scale"), ("V", "v_scale")):
            n = f"model.layers.{l}.self_attn.{key}"
            check(n in t, f"{name}/{fmt}: no {n}")
            if n not in t: continue
            a, want = t[n], scales_of(plan, l, st)
            check(a.dtype == np.float32, f"{n}: dtype {a.dtype}")
            check(a.shape == ((nkv,) if name == "head" else ()), f"{n}: shape {a.shape}")
            check(np.array_equal(a.reshape(-1), want), f"{n}: {a} vs plan {want}")
    idx = json.load(open(f"{out}/model.safetensors.index.json"))
    check(idx["weight_map"].get("model.layers.0.self_attn.k_scale") == "kv_scales.safetensors", "index not extended")
    check(idx["weight_map"].get("lm_head.weight") == "model-00002-of-00002.safetensors", "index lost an entry")
    with safe_open(f"{out}/kv_scales.safetensors", framework="numpy") as f:
        check(f.metadata().get("format") == "pt", "metadata format")
    for fn in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "tokenizer.json"):
        check(open(f"{out}/{fn}", "rb").read() == open(f"{tmp}/hf/{fn}", "rb").read(), f"{fn} not copied unchanged")
    cfg = json.load(open(f"{out}/config.json"))
    check(cfg["num_hidden_layers"] == L and cfg["model_type"] == "llama", "config.json lost its fields")
    if fmt == "compressed-tensors":
        check_scheme(cfg.get("quantization_config", {}), "attn_head" if name == "head" else "tensor")
    else:
        h = json.load(open(f"{out}/hf_quant_config.json"))
        check(h["producer"]["name"] == "modelopt", "producer")
        check(h["quantization"]["kv_cache_quant_algo"] == ("NVFP4" if name == "nvfp4" else "FP8"), "kv_cache_quant_algo")
        check("quantization_config" not in cfg, "modelopt export changed config.json")
    print(f"ok: {name} as {fmt}: {2 * L} scale tensors read back")
sys.exit(0 if ok else 1)
PY
[ $fail -eq 0 ] && echo "test_export: all passed"
exit $fail
