#!/usr/bin/env python3
"""Golden logits for the HF safetensors path: small random-weight checkpoints (Llama with llama3 RoPE
scaling, Llama with linear scaling and tied embeddings, Qwen2 with QKV bias, Mistral with head_dim !=
hidden/heads), evaluated by a numpy implementation written from the HF modeling equations
(modeling_llama.py / modeling_qwen2.py / modeling_mistral.py: RMSNorm, rotate_half RoPE with
rope_init_fn per rope_type, GQA with repeat_kv, causal softmax, SwiGLU MLP), in float64.

The weights are not stored: the C test (tests/model/test_model_hf.c) regenerates them with the same
counter-based generator (kv_rng_uniform of common/kv_common.h, seeded by FNV-1a of the tensor name),
writes config.json + model.safetensors, loads them through kv_model_open and compares its logits with
the files this script writes:

    .venv-ref/bin/python tests/model/gen_hf_ref.py tests/model/golden

Output: golden/hf_<name>.f32, little-endian float32 logits [n_seqs * n_tokens * vocab].
Keep MODELS, N_SEQS, N_TOKENS and the generator in sync with test_model_hf.c.
"""
import math
import os
import sys

import numpy as np

MASK = (1 << 64) - 1
N_SEQS, N_TOKENS = 2, 40

# name, model_type, hidden, inter, layers, heads, kv_heads, head_dim, vocab, theta, eps, tied, bias, scaling
MODELS = [
    dict(name="llama3", model_type="llama", hidden=64, inter=96, layers=2, heads=4, kv_heads=2, head_dim=16,
         vocab=97, theta=500000.0, eps=1e-5, tied=False, bias=False,
         scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=64)),
    dict(name="llama_linear", model_type="llama", hidden=48, inter=80, layers=3, heads=6, kv_heads=3, head_dim=8,
         vocab=61, theta=10000.0, eps=1e-6, tied=True, bias=False,
         scaling=dict(rope_type="linear", factor=4.0)),
    dict(name="qwen2", model_type="qwen2", hidden=64, inter=112, layers=2, heads=4, kv_heads=1, head_dim=16,
         vocab=83, theta=1000000.0, eps=1e-6, tied=True, bias=True, scaling=None),
    dict(name="mistral", model_type="mistral", hidden=64, inter=96, layers=2, heads=4, kv_heads=2, head_dim=32,
         vocab=73, theta=1000000.0, eps=1e-5, tied=False, bias=False, scaling=None),
]
MODEL_SEED = 0x5EED


def splitmix(seed, counter):
    z = (seed + (counter + 1) * 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def uniform(seed, counter):
    return (splitmix(seed, counter) >> 11) * (1.0 / 9007199254740992.0)


def fnv1a64(s):
    h = 0xCBF29CE484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001B3) & MASK
    return h


def tensor(name, shape, kind):
    """kind: 'w' (uniform +-1/sqrt(in)), 'norm' (1 +- 0.2), 'bias' (+-0.2), 'emb' (+-1)."""
    n = int(np.prod(shape))
    seed = fnv1a64(name) ^ MODEL_SEED
    if kind == "w":
        scale, offset = 1.0 / math.sqrt(shape[-1]), 0.0
    elif kind == "norm":
        scale, offset = 0.2, 1.0
    elif kind == "bias":
        scale, offset = 0.2, 0.0
    else:
        scale, offset = 1.0, 0.0
    vals = [offset + (2.0 * uniform(seed, i) - 1.0) * scale for i in range(n)]
    return np.array(vals, dtype=np.float64).astype(np.float32).reshape(shape)


def weights(m):
    d, ff, hd = m["hidden"], m["inter"], m["head_dim"]
    qd, kvd = m["heads"] * hd, m["kv_heads"] * hd
    w = {"model.embed_tokens.weight": tensor("model.embed_tokens.weight", (m["vocab"], d), "emb"),
         "model.norm.weight": tensor("model.norm.weight", (d,), "norm")}
    if not m["tied"]:
        w["lm_head.weight"] = tensor("lm_head.weight", (m["vocab"], d), "w")
    for l in range(m["layers"]):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = tensor(p + "input_layernorm.weight", (d,), "norm")
        w[p + "post_attention_layernorm.weight"] = tensor(p + "post_attention_layernorm.weight", (d,), "norm")
        for proj, shape in (("q_proj", (qd, d)), ("k_proj", (kvd, d)), ("v_proj", (kvd, d)), ("o_proj", (d, qd))):
            w[p + f"self_attn.{proj}.weight"] = tensor(p + f"self_attn.{proj}.weight", shape, "w")
            if m["bias"] and proj != "o_proj":
                w[p + f"self_attn.{proj}.bias"] = tensor(p + f"self_attn.{proj}.bias", (shape[0],), "bias")
        for proj, shape in (("gate_proj", (ff, d)), ("up_proj", (ff, d)), ("down_proj", (d, ff))):
            w[p + f"mlp.{proj}.weight"] = tensor(p + f"mlp.{proj}.weight", shape, "w")
    return w


def tokens(m):
    return np.array([splitmix(777, i) % m["vocab"] for i in range(N_SEQS * N_TOKENS)],
                    dtype=np.int64).reshape(N_SEQS, N_TOKENS)


def inv_freq(m):
    hd, base = m["head_dim"], m["theta"]
    inv = 1.0 / (base ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    sc = m["scaling"]
    if sc is None:
        return inv
    if sc["rope_type"] == "linear":
        return inv / sc["factor"]
    # _compute_llama3_parameters
    factor, lo, hi = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
    old = sc["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / lo, old / hi
    wavelen = 2 * math.pi / inv
    inv_llama = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * inv_llama / factor + smooth * inv_llama
    is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(is_medium, smoothed, inv_llama)


def rmsnorm(x, w, eps):
    var = np.mean(x * x, axis=-1, keepdims=True)
    return w * (x / np.sqrt(var + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def forward(m, w, toks):
    d, hd, nh, nkv = m["hidden"], m["head_dim"], m["heads"], m["kv_heads"]
    T = toks.shape[0]
    f = lambda name: w[name].astype(np.float64)
    h = f("model.embed_tokens.weight")[toks]
    freqs = np.outer(np.arange(T, dtype=np.float64), inv_freq(m))
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(m["layers"]):
        p = f"model.layers.{l}."
        x = rmsnorm(h, f(p + "input_layernorm.weight"), m["eps"])
        proj = lambda n: x @ f(p + f"self_attn.{n}.weight").T + (f(p + f"self_attn.{n}.bias") if m["bias"] else 0.0)
        q = proj("q_proj").reshape(T, nh, hd)
        k = proj("k_proj").reshape(T, nkv, hd)
        v = proj("v_proj").reshape(T, nkv, hd)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = nh // nkv
        k = np.repeat(k, rep, axis=1)  # repeat_kv
        v = np.repeat(v, rep, axis=1)
        out = np.zeros((T, nh, hd))
        for hh in range(nh):
            s = q[:, hh] @ k[:, hh].T / math.sqrt(hd) + mask
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            out[:, hh] = s @ v[:, hh]
        h = h + out.reshape(T, nh * hd) @ f(p + "self_attn.o_proj.weight").T
        x = rmsnorm(h, f(p + "post_attention_layernorm.weight"), m["eps"])
        g = x @ f(p + "mlp.gate_proj.weight").T
        u = x @ f(p + "mlp.up_proj.weight").T
        h = h + (g / (1 + np.exp(-g)) * u) @ f(p + "mlp.down_proj.weight").T
    h = rmsnorm(h, f("model.norm.weight"), m["eps"])
    head = f("model.embed_tokens.weight") if m["tied"] else f("lm_head.weight")
    return h @ head.T


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "golden")
    os.makedirs(out_dir, exist_ok=True)
    for m in MODELS:
        w = weights(m)
        toks = tokens(m)
        logits = np.stack([forward(m, w, toks[b]) for b in range(N_SEQS)])
        path = os.path.join(out_dir, f"hf_{m['name']}.f32")
        logits.astype("<f4").tofile(path)
        print(f"{path}: {logits.shape}, |logit| max {np.abs(logits).max():.3f}, tokens {toks[0, :8].tolist()}")


if __name__ == "__main__":
    main()
