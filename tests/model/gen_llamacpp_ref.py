#!/usr/bin/env python3
"""Golden outputs of llama.cpp (llama-cpp-python, CPU) for SmolLM2-135M-Instruct Q4_1 on WikiText-2 test.

    .venv-ref/bin/python tests/model/gen_llamacpp_ref.py MODEL.gguf DATA/wikitext-2-raw/wiki.test.raw \
        tests/model/golden [--full]

Writes (little-endian):
  smollm2_llamacpp_tokens.i32   the first N_SUB_CHUNKS*CTX token ids of wiki.test.raw as llama.cpp's
                                perplexity tool tokenizes it (add_special = vocab default, parse_special off)
  smollm2_llamacpp_top.bin      for chunks 0..N_LOGIT_CHUNKS-1 (each evaluated from an empty cache, the raw
                                tokens), every position: TOPK ids (int32), their logits (float32), then
                                the row's max |logit| and log-sum-exp (float32)
  smollm2_llamacpp_rows.f16     full logit rows (float16) of the positions ROWS of chunk 0
  smollm2_llamacpp.txt          "key value" lines: ctx, counts, llama.cpp perplexity (its protocol: chunks
                                of CTX tokens, first one replaced by BOS when the vocabulary adds BOS,
                                positions CTX/2 .. CTX-2 scored) over the first N_SUB_CHUNKS chunks and,
                                with --full, over the whole file (--full-only: only that, appended to the
                                existing file, the goldens left as they are; with KVCAL_REF_CHUNKS=N the
                                first N chunks, as part_* lines)
"""
import hashlib
import math
import os
import sys
import time

import numpy as np
from llama_cpp import Llama

CTX = 512
N_SUB_CHUNKS = 16
N_LOGIT_CHUNKS = 4
TOPK = 8
ROWS = [0, 1, 255, 511]


def log_softmax_nll(row, tok):
    # llama.cpp perplexity: max in float, sum of expf(l - max) in double
    mx = np.float32(row.max())
    s = float(np.sum(np.exp((row - mx).astype(np.float32)), dtype=np.float64))
    return -(float(row[tok] - mx) - math.log(s))


def ppl_of(llm, toks, n_chunks, add_bos, bos):
    """llama.cpp's perplexity tool: chunk c is toks[c*CTX:(c+1)*CTX] from an empty cache, its first token
    replaced by BOS when the vocabulary adds BOS; positions CTX/2 .. CTX-2 predict the next original token."""
    nll, cnt, t0 = 0.0, 0, time.time()
    first = CTX // 2
    for c in range(n_chunks):
        chunk = list(toks[c * CTX:(c + 1) * CTX])
        if add_bos:
            chunk[0] = bos
        llm.reset()
        llm.eval(chunk)
        lg = np.array(llm.scores[:CTX], dtype=np.float32)
        for i in range(first, CTX - 1):
            nll += log_softmax_nll(lg[i], toks[c * CTX + i + 1])
            cnt += 1
        if c % 20 == 0:
            print(f"chunk {c}/{n_chunks}: ppl {math.exp(nll / cnt):.4f} ({time.time() - t0:.0f} s)", file=sys.stderr)
    return math.exp(nll / cnt), cnt, time.time() - t0


def main():
    model, text_path, out = sys.argv[1], sys.argv[2], sys.argv[3]
    full = "--full" in sys.argv
    threads = int(os.environ.get("KVCAL_REF_THREADS", "2"))
    llm = Llama(model_path=model, logits_all=True, n_ctx=CTX, n_batch=CTX, n_threads=threads, verbose=False)
    text = open(text_path, "rb").read()
    add_bos = llm._model.add_bos_token() if hasattr(llm._model, "add_bos_token") else False
    toks = llm.tokenize(text, add_bos=True, special=False)  # add_bos=True means "add special tokens"
    bos = llm.token_bos()
    print(f"tokens {len(toks)}, add_bos {add_bos}, bos {bos}", file=sys.stderr)
    if "--full-only" in sys.argv:
        # KVCAL_REF_CHUNKS=N: only the first N chunks (the whole file takes hours on a busy 2-core machine)
        n = min(len(toks) // CTX, int(os.environ.get("KVCAL_REF_CHUNKS", len(toks) // CTX)))
        p, cnt, secs = ppl_of(llm, toks, n, add_bos, bos)
        key = "full" if n == len(toks) // CTX else "part"  # part: the first n chunks
        lines = [l for l in open(f"{out}/smollm2_llamacpp.txt").read().splitlines() if not l.startswith(key + "_")]
        lines += [f"{key}_chunks {n}", f"{key}_scored {cnt}", f"{key}_ppl {p:.6f}", f"{key}_seconds {secs:.1f}"]
        open(f"{out}/smollm2_llamacpp.txt", "w").write("\n".join(lines) + "\n")
        print("\n".join(lines[-4:]))
        return
    np.array(toks[:N_SUB_CHUNKS * CTX], dtype="<i4").tofile(f"{out}/smollm2_llamacpp_tokens.i32")

    def eval_chunk(chunk):
        llm.reset()
        llm.eval(chunk)
        return np.array(llm.scores[:len(chunk)], dtype=np.float32)

    # logits golden: raw chunks
    tops = []
    for c in range(N_LOGIT_CHUNKS):
        lg = eval_chunk(toks[c * CTX:(c + 1) * CTX])
        ids = np.argsort(-lg, axis=1, kind="stable")[:, :TOPK].astype("<i4")
        vals = np.take_along_axis(lg, ids, axis=1).astype("<f4")
        mx = lg.max(axis=1, keepdims=True).astype(np.float64)
        lse = (mx[:, 0] + np.log(np.exp(lg - mx).sum(axis=1))).astype("<f4")
        amax = np.abs(lg).max(axis=1).astype("<f4")
        for t in range(CTX):
            tops.append(ids[t].tobytes() + vals[t].tobytes() + amax[t:t + 1].tobytes() + lse[t:t + 1].tobytes())
        if c == 0:
            lg[ROWS].astype("<f2").tofile(f"{out}/smollm2_llamacpp_rows.f16")
    open(f"{out}/smollm2_llamacpp_top.bin", "wb").write(b"".join(tops))
    if "--logits-only" in sys.argv:
        return

    def ppl(n_chunks):
        return ppl_of(llm, toks, n_chunks, add_bos, bos)

    lines = [f"ctx {CTX}", f"n_tokens {len(toks)}", f"add_bos {int(bool(add_bos))}",
             f"tokens_sha256 {hashlib.sha256(np.array(toks, dtype='<i4').tobytes()).hexdigest()}",
             f"logit_chunks {N_LOGIT_CHUNKS}", f"topk {TOPK}", "rows " + ",".join(map(str, ROWS))]
    import llama_cpp
    lines.append(f"llama_cpp_python {llama_cpp.__version__}")
    p, cnt, secs = ppl(N_SUB_CHUNKS)
    lines += [f"sub_chunks {N_SUB_CHUNKS}", f"sub_scored {cnt}", f"sub_ppl {p:.6f}"]
    open(f"{out}/smollm2_llamacpp.txt", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))
    if full:  # the whole file: ~600 chunks, slow on 2 threads; appended when it finishes
        n = len(toks) // CTX
        p, cnt, secs = ppl(n)
        lines += [f"full_chunks {n}", f"full_scored {cnt}", f"full_ppl {p:.6f}", f"full_seconds {secs:.1f}"]
        open(f"{out}/smollm2_llamacpp.txt", "w").write("\n".join(lines) + "\n")
        print("\n".join(lines[-4:]))


if __name__ == "__main__":
    main()
