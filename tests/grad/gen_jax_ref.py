#!/usr/bin/env python3
"""Independent autodiff reference for the backward pass (model/backward.c), with JAX in float64.

The model: a small Llama-family network (2 layers, GQA 4/2, adjacent-pair RoPE, SwiGLU, separate
output) whose weights come from a counter-based generator that the C test reproduces bit for bit
(SplitMix64 of FNV-1a(name) and the element index; uniform values, no transcendental functions, so
C and Python agree exactly). JAX differentiates the mean next-token cross-entropy; the golden file
holds the loss, the Frobenius norm of every parameter's gradient and a few gradient entries.

Run from the repository root with the reference venv:
    .venv-ref/bin/python tests/grad/gen_jax_ref.py > tests/grad/golden/jax_grad_ref.txt
"""
import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

L, D, NH, NKV, HD, FF, V = 2, 32, 4, 2, 8, 48, 40
EPS, THETA = 1e-5, 10000.0
TOKENS = [1, 17, 5, 33, 5, 22, 9, 0, 38, 12, 7, 7, 30, 2, 19, 25]
MASK64 = (1 << 64) - 1


def fnv1a(name):
    h = 0xCBF29CE484222325
    for c in name.encode():
        h = ((h ^ c) * 0x100000001B3) & MASK64
    return h


def splitmix(seed, counter):
    z = (seed + (counter + 1) * 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def tensor(name, shape):
    """float32 values: norms 1 + 0.2 (u - 1/2), matrices 0.6 (u - 1/2), as the C test makes them."""
    n = int(np.prod(shape))
    seed = fnv1a(name)
    u = np.array([(splitmix(seed, i) >> 11) * (1.0 / 9007199254740992.0) for i in range(n)])
    if "norm" in name:
        v = 1.0 + 0.2 * (u - 0.5)
    else:
        v = 0.6 * (u - 0.5)
    return np.float32(v).reshape(shape).astype(np.float64)


def params():
    p = {"token_embd.weight": tensor("token_embd.weight", (V, D)),
         "output_norm.weight": tensor("output_norm.weight", (D,)),
         "output.weight": tensor("output.weight", (V, D))}
    for l in range(L):
        b = f"blk.{l}."
        p[b + "attn_norm.weight"] = tensor(b + "attn_norm.weight", (D,))
        p[b + "attn_q.weight"] = tensor(b + "attn_q.weight", (NH * HD, D))
        p[b + "attn_k.weight"] = tensor(b + "attn_k.weight", (NKV * HD, D))
        p[b + "attn_v.weight"] = tensor(b + "attn_v.weight", (NKV * HD, D))
        p[b + "attn_output.weight"] = tensor(b + "attn_output.weight", (D, NH * HD))
        p[b + "ffn_norm.weight"] = tensor(b + "ffn_norm.weight", (D,))
        p[b + "ffn_gate.weight"] = tensor(b + "ffn_gate.weight", (FF, D))
        p[b + "ffn_up.weight"] = tensor(b + "ffn_up.weight", (FF, D))
        p[b + "ffn_down.weight"] = tensor(b + "ffn_down.weight", (D, FF))
    return p


def rmsnorm(x, g):
    return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS) * g


def rope_adjacent(x, n_heads):
    T = x.shape[0]
    x = x.reshape(T, n_heads, HD // 2, 2)
    inv = 1.0 / THETA ** (np.arange(0, HD, 2) / HD)
    ang = np.arange(T)[:, None] * inv[None, :]
    c, s = jnp.cos(ang)[:, None, :], jnp.sin(ang)[:, None, :]
    a, b = x[..., 0], x[..., 1]
    return jnp.stack([a * c - b * s, a * s + b * c], axis=-1).reshape(T, n_heads * HD)


def loss_fn(p, tokens):
    T = len(tokens)
    h = p["token_embd.weight"][jnp.array(tokens)]
    mask = np.tril(np.ones((T, T), dtype=bool))
    for l in range(L):
        b = f"blk.{l}."
        x = rmsnorm(h, p[b + "attn_norm.weight"])
        q = rope_adjacent(x @ p[b + "attn_q.weight"].T, NH).reshape(T, NH, HD)
        k = rope_adjacent(x @ p[b + "attn_k.weight"].T, NKV).reshape(T, NKV, HD)
        v = (x @ p[b + "attn_v.weight"].T).reshape(T, NKV, HD)
        k = jnp.repeat(k, NH // NKV, axis=1)
        v = jnp.repeat(v, NH // NKV, axis=1)
        s = jnp.einsum("thd,shd->hts", q, k) / np.sqrt(HD)
        s = jnp.where(mask[None], s, -jnp.inf)
        a = jnp.einsum("hts,shd->thd", jax.nn.softmax(s, axis=-1), v).reshape(T, NH * HD)
        h = h + a @ p[b + "attn_output.weight"].T
        x2 = rmsnorm(h, p[b + "ffn_norm.weight"])
        m = jax.nn.silu(x2 @ p[b + "ffn_gate.weight"].T) * (x2 @ p[b + "ffn_up.weight"].T)
        h = h + m @ p[b + "ffn_down.weight"].T
    logits = rmsnorm(h, p["output_norm.weight"]) @ p["output.weight"].T
    logp = jax.nn.log_softmax(logits[:-1], axis=-1)
    return -jnp.mean(logp[jnp.arange(T - 1), jnp.array(tokens[1:])])


def main():
    p = params()
    loss, grads = jax.value_and_grad(loss_fn)(p, TOKENS)
    print(f"# JAX {jax.__version__}, float64; model L={L} D={D} NH={NH} NKV={NKV} HD={HD} FF={FF} V={V}")
    print(f"loss {float(loss):.17g}")
    for name in sorted(grads):
        print(f"norm {name} {float(jnp.linalg.norm(grads[name].ravel())):.17g}")
    for name in ("blk.0.attn_k.weight", "blk.1.attn_v.weight", "token_embd.weight"):
        g = np.asarray(grads[name]).ravel()
        for i in (0, 7, 100, len(g) - 1):
            print(f"entry {name} {i} {g[i]:.17g}")


if __name__ == "__main__":
    main()
