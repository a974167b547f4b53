#!/usr/bin/env python3
"""llama.cpp's side of scripts/bench-model.sh: prefill and decode tokens/s of a GGUF through
llama-cpp-python on the CPU, measured like tests/model/bench_model.c (same token ids, best of R runs).

    python tests/model/bench_llamacpp.py MODEL.gguf [--threads T] [--prefill N] [--decode N] [--reps R]

prefill: one llama_decode of N tokens from an empty cache (logits of the last token only); decode: N
single-token steps after a 16-token prompt, greedy. Prints one JSON object (peak RSS of the process
included; the Python interpreter adds ~30 MB)."""
import argparse
import json
import resource
import time

import numpy as np
from llama_cpp import Llama


def splitmix(seed, counter):
    m = (1 << 64) - 1
    z = (seed + (counter + 1) * 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    t0 = time.time()
    llm = Llama(model_path=a.model, n_ctx=max(a.prefill, 16 + a.decode) + 16, n_batch=max(a.prefill, 16),
                n_ubatch=max(a.prefill, 16), n_threads=a.threads, n_threads_batch=a.threads, logits_all=False,
                verbose=False)
    load_s = time.time() - t0
    V = llm.n_vocab()
    toks = [splitmix(1, i) % V for i in range(a.prefill + a.decode + 16)]
    best_p = 0.0
    for _ in range(a.reps if a.prefill else 0):
        llm.reset()
        llm._ctx.kv_cache_clear() if hasattr(llm._ctx, "kv_cache_clear") else None
        t0 = time.perf_counter()
        llm.eval(toks[:a.prefill])
        best_p = max(best_p, a.prefill / (time.perf_counter() - t0))
    best_d = 0.0
    for _ in range(a.reps if a.decode else 0):
        llm.reset()
        llm._ctx.kv_cache_clear() if hasattr(llm._ctx, "kv_cache_clear") else None
        llm.eval(toks[:16])
        t0 = time.perf_counter()
        for _i in range(a.decode):
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            llm.eval([tok])
        best_d = max(best_d, a.decode / (time.perf_counter() - t0))
    import llama_cpp
    print(json.dumps({"engine": f"llama.cpp (llama-cpp-python {llama_cpp.__version__})", "threads": a.threads,
                      "prefill_tokens": a.prefill, "prefill_tps": round(best_p, 1), "decode_tokens": a.decode,
                      "decode_tps": round(best_d, 2), "load_s": round(load_s, 2),
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))


if __name__ == "__main__":
    main()
