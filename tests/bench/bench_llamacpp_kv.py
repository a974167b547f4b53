#!/usr/bin/env python3
"""llama.cpp's side of scripts/bench-runtime.sh: decode speed at a given context with a given KV
cache type, through llama-cpp-python on the CPU, measured like `kvrun bench` (a prompt of N seeded
random tokens prefilled, then K single-token greedy steps; the decode time is the K steps).

    python tests/bench/bench_llamacpp_kv.py MODEL.gguf --context N [--decode K] [--threads T]
        [--type-k f16|q8_0|q4_0|q4_1|iq4_nl] [--type-v ...] [--flash-attn]

Quantized V caches need flash attention in llama.cpp. Prints one JSON object: decode and prefill
tokens/s, the KV cache's size as llama.cpp allocates it (n_ctx x layers x its type's bytes), peak RSS
of the process (the Python interpreter adds ~30 MB)."""
import argparse
import json
import os
import resource
import sys
import time

import numpy as np
import llama_cpp
from llama_cpp import Llama

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model"))
from bench_llamacpp import splitmix  # noqa: E402  (the same seeded token ids as the other benchmarks)

TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0, "q4_0": llama_cpp.GGML_TYPE_Q4_0,
         "q4_1": llama_cpp.GGML_TYPE_Q4_1, "iq4_nl": llama_cpp.GGML_TYPE_IQ4_NL}
# bytes per value of a type as stored (blocks of 32: q8_0 34 bytes, q4_0 18, q4_1 20 (scale and minimum), iq4_nl 18)
BYTES = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32, "iq4_nl": 18 / 32}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--context", type=int, required=True)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--type-k", default="f16", choices=sorted(TYPES))
    ap.add_argument("--type-v", default="f16", choices=sorted(TYPES))
    ap.add_argument("--flash-attn", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    n_ctx = a.context + a.decode + 8
    llm = Llama(model_path=a.model, n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=a.threads,
                n_threads_batch=a.threads, type_k=TYPES[a.type_k], type_v=TYPES[a.type_v],
                flash_attn=a.flash_attn, logits_all=False, verbose=False)
    V = llm.n_vocab()
    toks = [splitmix(a.seed, i) % V for i in range(a.context)]
    t0 = time.perf_counter()
    llm.eval(toks)
    prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(a.decode):
        # the last token's logits (llama-cpp-python keeps scores only with logits_all)
        tok = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(V,))))
        llm.eval([tok])
    decode_s = time.perf_counter() - t0
    meta = llm.metadata
    arch = meta.get("general.architecture", "llama")
    layers = int(meta.get(f"{arch}.block_count"))
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv"))
    d_model = int(meta.get(f"{arch}.embedding_length"))
    heads = int(meta.get(f"{arch}.attention.head_count"))
    kv_dim = kv_heads * (d_model // heads)
    cache_bytes = n_ctx * layers * kv_dim * (BYTES[a.type_k] + BYTES[a.type_v])
    print(json.dumps({"engine": f"llama.cpp (llama-cpp-python {llama_cpp.__version__})",
                      "cache": f"K {a.type_k} / V {a.type_v}" + (", flash attention" if a.flash_attn else ""),
                      "context": a.context, "decode": a.decode, "batch": 1, "threads": a.threads,
                      "decode_tokens_per_second": round(a.decode / decode_s, 3),
                      "prefill_tokens_per_second": round(a.context / prefill_s, 2),
                      "cache_bytes": int(cache_bytes), "n_ctx": n_ctx,
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


if __name__ == "__main__":
    main()
