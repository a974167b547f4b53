#!/usr/bin/env python3
"""Golden token ids for stories260K: a numpy port of karpathy/llama2.c's run.c forward pass
(legacy v0 checkpoint, float32 throughout) and its greedy loop (start at BOS = 1, argmax, stop when
BOS comes back or after `steps` positions).

    .venv-ref/bin/python tests/model/gen_stories_ref.py DATA/stories260K/stories260K.bin \
        DATA/stories260K/tok512.bin > tests/model/golden/stories260K_greedy.txt

Output: a comment line with the decoded text, then one token id per line (the generated ids, BOS
not included). The test compares kvrun's greedy ids with these.
"""
import struct
import sys

import numpy as np


def load_checkpoint(path):
    with open(path, "rb") as f:
        raw = f.read()
    dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len = struct.unpack("<7i", raw[:28])
    shared = vocab > 0
    vocab = abs(vocab)
    hs = dim // n_heads
    kv_dim = n_kv_heads * hs
    data = np.frombuffer(raw, dtype="<f4", offset=28)
    off = 0

    def take(*shape):
        nonlocal off
        n = int(np.prod(shape))
        a = data[off:off + n].reshape(shape)
        off += n
        return a

    w = {}
    w["emb"] = take(vocab, dim)
    w["rms_att"] = take(n_layers, dim)
    w["wq"] = take(n_layers, dim, dim)        # (out, in) per layer: matmul(W (d,n), x (n))
    w["wk"] = take(n_layers, kv_dim, dim)
    w["wv"] = take(n_layers, kv_dim, dim)
    w["wo"] = take(n_layers, dim, dim)
    w["rms_ffn"] = take(n_layers, dim)
    w["w1"] = take(n_layers, hidden, dim)
    w["w2"] = take(n_layers, dim, hidden)
    w["w3"] = take(n_layers, hidden, dim)
    w["rms_final"] = take(dim)
    take(seq_len, hs // 2)  # freq_cis_real (unused by run.c)
    take(seq_len, hs // 2)  # freq_cis_imag
    w["wcls"] = w["emb"] if shared else take(vocab, dim)
    cfg = dict(dim=dim, hidden=hidden, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
               vocab=vocab, seq_len=seq_len)
    return cfg, w


def rmsnorm(x, weight):
    ss = np.float32(np.sum(x * x, dtype=np.float32) / np.float32(x.size)) + np.float32(1e-5)
    return weight * (np.float32(1.0) / np.sqrt(ss) * x)


def forward(cfg, w, cache_k, cache_v, token, pos):
    dim, nh, nkv = cfg["dim"], cfg["n_heads"], cfg["n_kv_heads"]
    hs = dim // nh
    kv_dim = nkv * hs
    kv_mul = nh // nkv
    x = w["emb"][token].copy()
    for l in range(cfg["n_layers"]):
        xb = rmsnorm(x, w["rms_att"][l])
        q = w["wq"][l] @ xb
        k = w["wk"][l] @ xb
        v = w["wv"][l] @ xb
        for i in range(0, dim, 2):
            head_dim = i % hs
            freq = np.float32(1.0) / np.power(np.float32(10000.0), np.float32(head_dim) / np.float32(hs))
            val = np.float32(pos) * freq
            fcr, fci = np.cos(val, dtype=np.float32), np.sin(val, dtype=np.float32)
            for vec in ((q, k) if i < kv_dim else (q,)):
                v0, v1 = vec[i], vec[i + 1]
                vec[i] = v0 * fcr - v1 * fci
                vec[i + 1] = v0 * fci + v1 * fcr
        cache_k[l, pos] = k
        cache_v[l, pos] = v
        out = np.zeros(dim, dtype=np.float32)
        for h in range(nh):
            qh = q[h * hs:(h + 1) * hs]
            kvh = h // kv_mul
            keys = cache_k[l, :pos + 1, kvh * hs:(kvh + 1) * hs]
            att = (keys @ qh) / np.sqrt(np.float32(hs))
            att = np.exp(att - att.max())
            att = att / att.sum(dtype=np.float32)
            out[h * hs:(h + 1) * hs] = att @ cache_v[l, :pos + 1, kvh * hs:(kvh + 1) * hs]
        x = x + w["wo"][l] @ out
        xb = rmsnorm(x, w["rms_ffn"][l])
        hb = w["w1"][l] @ xb
        hb2 = w["w3"][l] @ xb
        hb = hb * (np.float32(1.0) / (np.float32(1.0) + np.exp(-hb))) * hb2
        x = x + w["w2"][l] @ hb
    x = rmsnorm(x, w["rms_final"])
    return w["wcls"] @ x


def load_tokenizer(path, vocab):
    pieces = []
    with open(path, "rb") as f:
        struct.unpack("<i", f.read(4))
        for _ in range(vocab):
            struct.unpack("<f", f.read(4))
            (n,) = struct.unpack("<i", f.read(4))
            pieces.append(f.read(n))
    return pieces


def decode(pieces, prev, tok):
    p = pieces[tok]
    if prev == 1 and p.startswith(b" "):
        p = p[1:]
    if p.startswith(b"<0x") and p.endswith(b">") and len(p) == 6:
        p = bytes([int(p[3:5], 16)])
    return p


def main():
    ckpt, tok = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    cfg, w = load_checkpoint(ckpt)
    pieces = load_tokenizer(tok, cfg["vocab"])
    kv_dim = cfg["n_kv_heads"] * (cfg["dim"] // cfg["n_heads"])
    cache_k = np.zeros((cfg["n_layers"], cfg["seq_len"], kv_dim), dtype=np.float32)
    cache_v = np.zeros_like(cache_k)
    token, ids, text = 1, [], b""
    for pos in range(min(steps, cfg["seq_len"]) - 1):
        logits = forward(cfg, w, cache_k, cache_v, token, pos)
        nxt = int(np.argmax(logits))
        if nxt == 1:
            break
        text += decode(pieces, token, nxt)
        ids.append(nxt)
        token = nxt
    print("# " + text.decode("utf-8", "replace").replace("\n", "\\n"))
    for i in ids:
        print(i)


if __name__ == "__main__":
    main()
