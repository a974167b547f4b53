#!/usr/bin/env python3
"""Exact reference logits for a llama-architecture GGUF (SmolLM2-135M-Instruct Q4_1): the weights
dequantized by gguf-py (the GGUF project's own Python package, independent of our dequantizer) and a
float64 numpy forward pass written from llama.cpp's graph for LLM_ARCH_LLAMA (RMSNorm, RoPE on adjacent
pairs as llama.cpp's "normal" rope mode, GQA, SwiGLU, tied output when output.weight is absent).

    .venv-ref/bin/python tests/model/gen_gguf_ref.py MODEL.gguf tests/model/golden/smollm2_llamacpp_tokens.i32 \
        tests/model/golden

Writes smollm2_exact_top.bin: for the first chunk of CTX tokens, every position: TOPK ids (int32), their
logits (float32), the row's max |logit| and log-sum-exp (float32) (the layout of smollm2_llamacpp_top.bin;
the log-sum-exp checks every logit of the row at once).
"""
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

CTX = 512
TOPK = 8


def main():
    path, tok_path, out = sys.argv[1], sys.argv[2], sys.argv[3]
    r = GGUFReader(path)
    f = {k: v for k, v in r.fields.items()}

    def kv(key):
        return f[key].contents()

    L = kv("llama.block_count")
    nh = kv("llama.attention.head_count")
    nkv = kv("llama.attention.head_count_kv")
    d = kv("llama.embedding_length")
    eps = kv("llama.attention.layer_norm_rms_epsilon")
    theta = kv("llama.rope.freq_base")
    hd = d // nh
    W = {}
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float64)
        W[t.name] = a.reshape([int(x) for x in reversed(t.shape)]) if a.ndim > 1 or len(t.shape) > 1 else a
    toks = np.fromfile(tok_path, dtype="<i4")[:CTX].astype(np.int64)
    T = len(toks)

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.outer(np.arange(T, dtype=np.float64), inv)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(x):  # x: T x heads x hd, pairs (2i, 2i+1)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        y = np.empty_like(x)
        y[..., 0::2] = x0 * cos - x1 * sin
        y[..., 1::2] = x0 * sin + x1 * cos
        return y

    h = W["token_embd.weight"][toks]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(L):
        p = f"blk.{l}."
        x = rms(h, W[p + "attn_norm.weight"])
        q = rope((x @ W[p + "attn_q.weight"].T).reshape(T, nh, hd))
        k = rope((x @ W[p + "attn_k.weight"].T).reshape(T, nkv, hd))
        v = (x @ W[p + "attn_v.weight"].T).reshape(T, nkv, hd)
        o = np.empty((T, nh, hd))
        for hh in range(nh):
            g = hh // (nh // nkv)
            s = q[:, hh] @ k[:, g].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(axis=1, keepdims=True))
            o[:, hh] = (s / s.sum(axis=1, keepdims=True)) @ v[:, g]
        h = h + o.reshape(T, nh * hd) @ W[p + "attn_output.weight"].T
        x = rms(h, W[p + "ffn_norm.weight"])
        gt = x @ W[p + "ffn_gate.weight"].T
        up = x @ W[p + "ffn_up.weight"].T
        h = h + (gt / (1 + np.exp(-gt)) * up) @ W[p + "ffn_down.weight"].T
        print(f"layer {l}", file=sys.stderr)
    head = W.get("output.weight", W["token_embd.weight"])
    lg = rms(h, W["output_norm.weight"]) @ head.T
    ids = np.argsort(-lg, axis=1, kind="stable")[:, :TOPK].astype("<i4")
    vals = np.take_along_axis(lg, ids, axis=1).astype("<f4")
    mx = lg.max(axis=1, keepdims=True)
    lse = (mx[:, 0] + np.log(np.exp(lg - mx).sum(axis=1))).astype("<f4")
    amax = np.abs(lg).max(axis=1).astype("<f4")
    open(f"{out}/smollm2_exact_top.bin", "wb").write(
        b"".join(ids[t].tobytes() + vals[t].tobytes() + amax[t:t + 1].tobytes() + lse[t:t + 1].tobytes()
                 for t in range(T)))
    print(f"logits {lg.shape}, max |logit| {np.abs(lg).max():.3f}", file=sys.stderr)


if __name__ == "__main__":
    main()
