#!/usr/bin/env python3
"""Golden outputs of llama.cpp (llama-cpp-python, CPU) on WikiText-2 test: SmolLM2-135M-Instruct Q4_1 (the
default) and Gemma 3 270M Q4_K_M (--name gemma3).

    .venv-ref/bin/python tests/model/gen_llamacpp_ref.py MODEL.gguf DATA/wikitext-2-raw/wiki.test.raw \
        tests/model/golden [--full] [--name gemma3]

Files are named <name>_llamacpp_* (name: smollm2 by default). With --name gemma3 the full rows are those of
positions 0 and 511 only (262144-entry rows), and two more files are written:
  gemma3_llamacpp_greedy.txt    for each of GREEDY_PROMPTS (prompt_N, tokenized by llama.cpp with BOS: prompt_ids_N)
                                the GREEDY_N tokens greedy decoding appends (generated_ids_N: argmax of each
                                step's logits, the lowest id on ties, one token per llama.cpp eval), their text
                                and the smallest top-2 margin of llama.cpp's logits on the way (--greedy-only:
                                this file alone)
and the txt file gets wiki_tokens / wiki_sha256: the whole of wiki.test.raw as llama.cpp tokenizes it.
Writes (little-endian):
  {name}_llamacpp_tokens.i32   the first N_SUB_CHUNKS*CTX token ids of wiki.test.raw as llama.cpp's
                                perplexity tool tokenizes it (add_special = vocab default, parse_special off)
  {name}_llamacpp_top.bin      for chunks 0..N_LOGIT_CHUNKS-1 (each evaluated from an empty cache, the raw
                                tokens), every position: TOPK ids (int32), their logits (float32), then
                                the row's max |logit| and log-sum-exp (float32)
  {name}_llamacpp_rows.f16     full logit rows (float16) of the positions ROWS of chunk 0
  {name}_llamacpp.txt          "key value" lines: ctx, counts, llama.cpp perplexity (its protocol: chunks
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
# Prompts written before any result was seen (the tests report which ones llama.cpp and kvcal decode alike).
GREEDY_PROMPTS = [b"The history of the Roman Empire",
                  b"Water boils at 100 degrees Celsius at sea level. At higher altitudes,",
                  b"Once upon a time, in a small village by the sea, there lived",
                  b'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
                  b"The mitochondria is the powerhouse of the cell. It produces",
                  b"The Eiffel Tower is a wrought-iron lattice tower in Paris. It was built"]
GREEDY_N = 64


def arg(flag, default):
    return sys.argv[sys.argv.index(flag) + 1] if flag in sys.argv else default


def greedy(llm, out, name):
    """Greedy decoding of each of GREEDY_PROMPTS by llama.cpp, one token per eval."""
    lines = [f"n_prompts {len(GREEDY_PROMPTS)}"]
    for i, p in enumerate(GREEDY_PROMPTS):
        prompt = llm.tokenize(p, add_bos=True, special=False)
        llm.reset()
        llm.eval(prompt)
        gen, margin = [], float("inf")
        for _ in range(GREEDY_N):
            row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            top2 = np.argsort(-row, kind="stable")[:2]  # the first (lowest) id of the maximum first
            margin = min(margin, float(row[top2[0]] - row[top2[1]]))
            tok = int(top2[0])
            if tok == llm.token_eos():
                break
            gen.append(tok)
            llm.eval([tok])
        text = llm.detokenize(gen).decode("utf-8", errors="replace")
        esc = lambda t: t.replace("\\", "\\\\").replace("\n", "\\n")
        lines += [f"prompt_{i} " + esc(p.decode()), f"prompt_ids_{i} " + ",".join(map(str, prompt)),
                  f"generated_ids_{i} " + ",".join(map(str, gen)), f"generated_text_{i} " + esc(text),
                  f"min_margin_{i} {margin:.4f}"]
    open(f"{out}/{name}_llamacpp_greedy.txt", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


def log_softmax_nll(row, tok):
    # llama.cpp perplexity: max in float, sum of expf(l - max) in double
    mx = np.float32(row.max())
    s = float(np.sum(np.exp((row - mx).astype(np.float32)), dtype=np.float64))
    return -(float(row[tok] - mx) - math.log(s))


def ppl_of(llm, toks, n_chunks, add_bos, bos, ctx=CTX):
    """llama.cpp's perplexity tool: chunk c is toks[c*ctx:(c+1)*ctx] from an empty cache, its first token
    replaced by BOS when the vocabulary adds BOS; positions ctx/2 .. ctx-2 predict the next original token."""
    nll, cnt, t0 = 0.0, 0, time.time()
    first = ctx // 2
    for c in range(n_chunks):
        chunk = list(toks[c * ctx:(c + 1) * ctx])
        if add_bos:
            chunk[0] = bos
        llm.reset()
        llm.eval(chunk)
        lg = np.array(llm.scores[:ctx], dtype=np.float32)
        for i in range(first, ctx - 1):
            nll += log_softmax_nll(lg[i], toks[c * ctx + i + 1])
            cnt += 1
        if c % 20 == 0:
            print(f"chunk {c}/{n_chunks}: ppl {math.exp(nll / cnt):.4f} ({time.time() - t0:.0f} s)", file=sys.stderr)
    return math.exp(nll / cnt), cnt, time.time() - t0


def main():
    model, text_path, out = sys.argv[1], sys.argv[2], sys.argv[3]
    full = "--full" in sys.argv
    name = arg("--name", "smollm2")
    rows = [0, CTX - 1] if name == "gemma3" else ROWS
    threads = int(os.environ.get("KVCAL_REF_THREADS", "2"))
    llm = Llama(model_path=model, logits_all=True, n_ctx=CTX, n_batch=CTX, n_threads=threads, verbose=False)
    text = open(text_path, "rb").read()
    add_bos = llm._model.add_bos_token() if hasattr(llm._model, "add_bos_token") else False
    toks = llm.tokenize(text, add_bos=True, special=False)  # add_bos=True means "add special tokens"
    bos = llm.token_bos()
    print(f"tokens {len(toks)}, add_bos {add_bos}, bos {bos}", file=sys.stderr)
    if "--greedy-only" in sys.argv:
        greedy(llm, out, name)
        return
    if "--full-only" in sys.argv:
        # KVCAL_REF_CHUNKS=N: only the first N chunks (the whole file takes hours on a busy 2-core machine)
        n = min(len(toks) // CTX, int(os.environ.get("KVCAL_REF_CHUNKS", len(toks) // CTX)))
        p, cnt, secs = ppl_of(llm, toks, n, add_bos, bos)
        key = "full" if n == len(toks) // CTX else "part"  # part: the first n chunks
        lines = [l for l in open(f"{out}/{name}_llamacpp.txt").read().splitlines() if not l.startswith(key + "_")]
        lines += [f"{key}_chunks {n}", f"{key}_scored {cnt}", f"{key}_ppl {p:.6f}", f"{key}_seconds {secs:.1f}"]
        open(f"{out}/{name}_llamacpp.txt", "w").write("\n".join(lines) + "\n")
        print("\n".join(lines[-4:]))
        return
    np.array(toks[:N_SUB_CHUNKS * CTX], dtype="<i4").tofile(f"{out}/{name}_llamacpp_tokens.i32")

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
            lg[rows].astype("<f2").tofile(f"{out}/{name}_llamacpp_rows.f16")
    open(f"{out}/{name}_llamacpp_top.bin", "wb").write(b"".join(tops))
    if "--logits-only" in sys.argv:
        return

    def ppl(n_chunks):
        return ppl_of(llm, toks, n_chunks, add_bos, bos)

    lines = [f"ctx {CTX}", f"n_tokens {len(toks)}", f"add_bos {int(bool(add_bos))}",
             f"tokens_sha256 {hashlib.sha256(np.array(toks, dtype='<i4').tobytes()).hexdigest()}",
             f"logit_chunks {N_LOGIT_CHUNKS}", f"topk {TOPK}", "rows " + ",".join(map(str, rows))]
    import llama_cpp
    lines.append(f"llama_cpp_python {llama_cpp.__version__}")
    if name == "gemma3":
        greedy(llm, out, name)
        # Gemma 3's local layers see 512 positions: chunks of 1024, whose scored second halves need the window
        big = Llama(model_path=model, logits_all=True, n_ctx=2 * CTX, n_batch=2 * CTX, n_threads=threads,
                    verbose=False)
        p, cnt, secs = ppl_of(big, toks, 8, add_bos, bos, 2 * CTX)
        lines += [f"win_ctx {2 * CTX}", "win_chunks 8", f"win_scored {cnt}", f"win_ppl {p:.6f}"]
        del big
    p, cnt, secs = ppl(N_SUB_CHUNKS)
    lines += [f"sub_chunks {N_SUB_CHUNKS}", f"sub_scored {cnt}", f"sub_ppl {p:.6f}"]
    open(f"{out}/{name}_llamacpp.txt", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))
    if full:  # the whole file: ~600 chunks, slow on 2 threads; appended when it finishes
        n = len(toks) // CTX
        p, cnt, secs = ppl(n)
        lines += [f"full_chunks {n}", f"full_scored {cnt}", f"full_ppl {p:.6f}", f"full_seconds {secs:.1f}"]
        open(f"{out}/{name}_llamacpp.txt", "w").write("\n".join(lines) + "\n")
        print("\n".join(lines[-4:]))


if __name__ == "__main__":
    main()
