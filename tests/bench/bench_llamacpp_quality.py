#!/usr/bin/env python3
"""llama.cpp's side of scripts/bench-llamacpp.sh: the quality of its KV cache types in the prompt + decode regime
of `kvrun eval --protocol continuation --step 1`, through llama-cpp-python on the CPU.

    python tests/bench/bench_llamacpp_quality.py MODEL.gguf TEXT --prompt-len N --score-len M [--samples S]
        [--types f16,q8_0,q4_0,q4_1,iq4_nl] [--threads T] [--flash-attn]

The samples are kvrun's: the text tokenized whole (llama.cpp's tokenizer, which tests/tokenizer holds kvcal's to),
sample c = tokens [c (N + M), (c + 1)(N + M)), fed as BOS + its first N - 1 tokens (the prompt, one llama_decode
per n_batch = 512 tokens, written to the cache in its type), then its next M tokens one at a time (decoding: each
token's K/V stored in the type and attended with the rest); the logits after fed token r predict token r + 1,
which is scored. Per type: perplexity of the M scored tokens per sample, and against the f16 cache (the first type,
which must be f16): the mean KL(p_f16 || p_type) and the top-1 agreement on the same positions (llama.cpp's own
reference: its f16 cache is what its quantized types replace; kvrun's KL is against the exact model). Prints one
JSON object per type, and the wall seconds of the prompt and of the scored tokens per sample."""
import argparse
import json
import math
import sys
import time

import numpy as np
import llama_cpp
from llama_cpp import Llama

TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0, "q4_0": llama_cpp.GGML_TYPE_Q4_0,
         "q4_1": llama_cpp.GGML_TYPE_Q4_1, "iq4_nl": llama_cpp.GGML_TYPE_IQ4_NL}
BITS = {"f16": 16.0, "q8_0": 8.5, "q4_0": 4.5, "q4_1": 5.0, "iq4_nl": 4.5}


def log_softmax(row):
    row = row.astype(np.float64)
    mx = row.max()
    return row - mx - math.log(np.exp(row - mx).sum())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("--prompt-len", type=int, required=True)
    ap.add_argument("--score-len", type=int, required=True)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--types", default="f16,q8_0,q4_0,q4_1,iq4_nl")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--flash-attn", action="store_true")
    a = ap.parse_args()
    types = a.types.split(",")
    if types[0] != "f16":
        sys.exit("bench_llamacpp_quality: the first type must be f16 (the reference)")
    N, M = a.prompt_len, a.score_len
    n_ctx = N + M + 8
    with open(a.text, "rb") as f:
        text = f.read()
    ref = {}  # sample -> M x V log-probabilities of the f16 cache
    for t in types:
        llm = Llama(model_path=a.model, n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=a.threads,
                    n_threads_batch=a.threads, type_k=TYPES[t], type_v=TYPES[t], flash_attn=a.flash_attn,
                    logits_all=False, verbose=False)
        V = llm.n_vocab()
        if t == types[0]:
            toks = llm.tokenize(text, add_bos=False, special=False)
            stride = N + M
            n_samples = min(a.samples, len(toks) // stride)
            bos = llm.token_bos()
        nll = kl = 0.0
        top1 = 0
        t_prompt = t_cont = 0.0
        for c in range(n_samples):
            ids = [bos] + toks[c * stride:(c + 1) * stride]
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(ids[:N])
            t1 = time.perf_counter()
            rows = np.empty((M, V), dtype=np.float64)
            for r in range(M):
                llm.eval([ids[N + r]])
                rows[r] = log_softmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(V,)).copy())
            t2 = time.perf_counter()
            t_prompt += t1 - t0
            t_cont += t2 - t1
            for r in range(M):
                nll -= rows[r, ids[N + r + 1]]
            if t == types[0]:
                ref[c] = rows
            else:
                p = np.exp(ref[c])
                kl += float(np.sum(p * (ref[c] - rows)))
                top1 += int(np.sum(np.argmax(ref[c], axis=1) == np.argmax(rows, axis=1)))
            if t == types[0]:
                top1 += M
        scored = n_samples * M
        print(json.dumps({"engine": f"llama.cpp (llama-cpp-python {llama_cpp.__version__})", "cache": t,
                          "flash_attn": a.flash_attn, "bits_per_value": BITS[t], "prompt_len": N, "score_len": M,
                          "samples": n_samples, "ppl": round(math.exp(nll / scored), 4),
                          "kl_mean_vs_f16": round(kl / scored, 6), "top1_vs_f16": round(top1 / scored, 4),
                          "prompt_seconds": round(t_prompt / n_samples, 3),
                          "decode_tokens_per_second": round(scored / t_cont, 3)}), flush=True)
        del llm


if __name__ == "__main__":
    main()
