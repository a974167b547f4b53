#!/usr/bin/env python3
"""Golden logits for the HF safetensors path of Qwen3 and Gemma 3, from Hugging Face transformers itself
(Qwen3ForCausalLM, Gemma3ForCausalLM on the CPU): an implementation independent of kvcal's, run on small
random-weight checkpoints.

The weights are not stored: they come from the counter-based generator of tests/model/model_test_util.h
(kv_rng_uniform seeded by FNV-1a of the tensor name, as gen_hf_ref.py computes it), which the C test
(tests/model/test_model_hft.c) uses to write the same config.json + model.safetensors before loading
them through kv_model_open. Run in a git-ignored venv (CPU torch, transformers):

    python3 -m venv .venv-hf && .venv-hf/bin/pip install torch transformers numpy
    .venv-hf/bin/python tests/model/gen_hf_transformers_ref.py tests/model/golden

Output: golden/hft_<name>.f32, little-endian float32 logits [n_seqs * n_tokens * vocab], and
golden/hft_versions.txt (the torch and transformers versions that made them).

The model runs in float64 (weights are the f32 values widened), so the reference's own rounding is far
below kvcal's f32 rounding, except where transformers computes in float32 by design: Gemma3RMSNorm
normalizes x.float() (modeling_gemma3.py:119-133) and the rotary tables are float32 (inv_freq, cos, sin).
Keep MODELS, the configs, N_SEQS, N_TOKENS and the generator in sync with test_model_hft.c.
"""
import json
import math
import os
import sys

import numpy as np
import torch

from gen_hf_ref import fnv1a64, splitmix, uniform  # the shared generator (same directory)

MODEL_SEED = 0x5EED
N_SEQS, N_TOKENS = 2, 40

# Qwen3: QK-norm, head_dim (32) != hidden / heads (16), GQA 4:2, no bias, separate lm_head.
QWEN3 = dict(
    architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=64, intermediate_size=96,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=89,
    max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
    hidden_act="silu", attention_bias=False, use_sliding_window=False, bos_token_id=1, eos_token_id=2,
    torch_dtype="float32")
# Gemma 3: four layers, local-local-global-local (sliding_window_pattern 3) with a window of 8 tokens (the
# test runs 40), local RoPE base 1e4 unscaled and global 1e6 with linear scaling x2 (as Gemma 3 4B+ scale
# their global layers), one KV head, head_dim (24) != hidden / heads (12), query_pre_attn_scalar (20) !=
# head_dim (so the attention scale is not 1/sqrt(head_dim)), final logit softcapping (Gemma 3 itself has
# none; exercised anyway), tied embeddings, GELU-tanh.
GEMMA3 = dict(
    architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", hidden_size=48, intermediate_size=80,
    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1, head_dim=24, vocab_size=101,
    max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
    rope_scaling={"rope_type": "linear", "factor": 2.0}, sliding_window=8, sliding_window_pattern=3,
    query_pre_attn_scalar=20, final_logit_softcapping=10.0, attn_logit_softcapping=None,
    hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, attention_bias=False, bos_token_id=2,
    eos_token_id=1, pad_token_id=0, torch_dtype="float32")
MODELS = [("qwen3", QWEN3), ("gemma3", GEMMA3)]


def tensor(name, shape, kind):
    """kind: 'w' (uniform +-1/sqrt(in)), 'norm' (1 +- 0.2), 'bias' (+-0.2: also Gemma's norms, used as 1 + w),
    'emb' (+-1). The same values as kv_test_fill (model_test_util.h)."""
    n = int(np.prod(shape))
    seed = fnv1a64(name) ^ MODEL_SEED
    scale, offset = {"w": (1.0 / math.sqrt(shape[-1]), 0.0), "norm": (0.2, 1.0), "bias": (0.2, 0.0),
                     "emb": (1.0, 0.0)}[kind]
    vals = [offset + (2.0 * uniform(seed, i) - 1.0) * scale for i in range(n)]
    return np.array(vals, dtype=np.float64).astype(np.float32).reshape(shape)


def weights(name, c):
    """The checkpoint's tensors (HF names); the order and kinds test_model_hft.c writes."""
    d, ff, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    qd, kvd = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    gemma = name == "gemma3"
    nk = "bias" if gemma else "norm"  # Gemma3RMSNorm multiplies by (1 + w): w around 0
    w = {"model.embed_tokens.weight": tensor("model.embed_tokens.weight", (c["vocab_size"], d), "emb"),
         "model.norm.weight": tensor("model.norm.weight", (d,), nk)}
    if not c["tie_word_embeddings"]:
        w["lm_head.weight"] = tensor("lm_head.weight", (c["vocab_size"], d), "w")
    norms = ["input_layernorm", "post_attention_layernorm"]
    if gemma:
        norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        for n in norms:
            w[p + n + ".weight"] = tensor(p + n + ".weight", (d,), nk)
        for proj, shape in (("q_proj", (qd, d)), ("k_proj", (kvd, d)), ("v_proj", (kvd, d)), ("o_proj", (d, qd))):
            w[p + f"self_attn.{proj}.weight"] = tensor(p + f"self_attn.{proj}.weight", shape, "w")
        for n in ("q_norm", "k_norm"):
            w[p + f"self_attn.{n}.weight"] = tensor(p + f"self_attn.{n}.weight", (hd,), nk)
        for proj, shape in (("gate_proj", (ff, d)), ("up_proj", (ff, d)), ("down_proj", (d, ff))):
            w[p + f"mlp.{proj}.weight"] = tensor(p + f"mlp.{proj}.weight", shape, "w")
    return w


def tokens(vocab):
    return np.array([splitmix(777, i) % vocab for i in range(N_SEQS * N_TOKENS)], dtype=np.int64).reshape(
        N_SEQS, N_TOKENS)


def build(name, c):
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.for_model(**{k: v for k, v in c.items() if k not in ("architectures", "torch_dtype")})
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float64)
    sd = {k: torch.from_numpy(v.astype(np.float64)) for k, v in weights(name, c).items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not (c["tie_word_embeddings"] and m == "lm_head.weight")]
    assert not missing and not unexpected, (missing, unexpected)
    if c["tie_word_embeddings"]:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model.eval(), cfg


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "golden")
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    import transformers
    for name, c in MODELS:
        model, cfg = build(name, c)
        if name == "gemma3":  # the windows and bases the test relies on, as transformers resolved them
            assert cfg.layer_types == ["sliding_attention", "sliding_attention", "full_attention",
                                       "sliding_attention"], cfg.layer_types
        toks = tokens(c["vocab_size"])
        with torch.no_grad():
            logits = model(input_ids=torch.from_numpy(toks)).logits.numpy()
        path = os.path.join(out_dir, f"hft_{name}.f32")
        logits.astype("<f4").tofile(path)
        print(f"{path}: {logits.shape}, |logit| max {np.abs(logits).max():.3f}, tokens {toks[0, :8].tolist()}")
    with open(os.path.join(out_dir, "hft_versions.txt"), "w") as f:
        f.write(f"torch {torch.__version__}\ntransformers {transformers.__version__}\nnumpy {np.__version__}\n")
        for name, c in MODELS:
            f.write(f"config_{name} {json.dumps(c, sort_keys=True)}\n")


if __name__ == "__main__":
    main()
