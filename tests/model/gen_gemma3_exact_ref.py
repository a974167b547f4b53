#!/usr/bin/env python3
"""Exact reference logits for Gemma 3 270M Q4_K_M: the GGUF's weights dequantized by gguf-py (the GGUF project's
own package, independent of kvcal's dequantizer) and run by Hugging Face transformers' Gemma3ForCausalLM
(an implementation independent of kvcal's forward) in float64, on the first SEQ tokens of wiki.test.raw as
llama.cpp tokenized them (gemma3_llamacpp_tokens.i32). SEQ = 768 > the local layers' window of 512, so the
window is exercised.

    .venv-hf/bin/pip install gguf   # besides torch, transformers, numpy
    .venv-hf/bin/python tests/model/gen_gemma3_exact_ref.py MODEL.gguf tests/model/golden/gemma3_llamacpp_tokens.i32 \
        tests/model/golden [--greedy-only | --window-ppl]

Writes gemma3_exact_top.bin: every position: TOPK ids (int32), their logits (float32), the row's max |logit|
and log-sum-exp (float32), the layout of smollm2_exact_top.bin; and gemma3_exact_greedy.txt: for each prompt
of gemma3_llamacpp_greedy.txt (its prompt_ids_N lines, as llama.cpp tokenized them), the GREEDY_N tokens greedy
decoding of the exact model appends (exact_generated_ids_N) and at each step the margin between its best and
second-best logit (exact_margins_N).
With --window-ppl, only gemma3_exact_window.txt: llama.cpp's perplexity protocol (chunks of 1024 tokens of
gemma3_llamacpp_tokens.i32, the first replaced by BOS, positions 512..1022 scored: beyond the local layers' window)
computed by the same model in float32 (float64 takes ~20 minutes on 2 cores; float32 differs from it by ~1e-6
of a logit), over the first 2 chunks (win2_ppl) and all 8 (win_ppl).

GGUF -> HF: the tensors keep their row order (llama.cpp's converter does not permute Gemma's Q/K:
NEOX RoPE); norm weights are stored as 1 + w in GGUF (conversion/gemma.py:124-125,166-171), so w = value - 1
for Gemma3RMSNorm's (1 + w). Config: the GGUF metadata, and query_pre_attn_scalar = 256 (head_dim; Gemma 3
270M's config.json, which GGUF does not carry). Two parts of transformers compute in float32 whatever the
model's dtype: Gemma3RMSNorm (x.float()) and the rotary tables (position * inv_freq in float32: at position
767 an angle is off by ~5e-5 rad); both are replaced below by the same formulas in float64, so that the
reference's own rounding is ~1e-12, far below kvcal's f32 rounding.
"""
import sys

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

SEQ = 768
TOPK = 8
GREEDY_N = 64


def window_ppl(model, toks, out, ctx=1024, n_chunks=8, bos=2):
    import math
    nll, cnt, lines = 0.0, 0, [f"win_ctx {ctx}", "dtype float32"]
    for c in range(n_chunks):
        ch = toks[c * ctx:(c + 1) * ctx].copy()
        ch[0] = bos
        with torch.no_grad():
            ls = torch.log_softmax(model(input_ids=torch.from_numpy(ch)[None]).logits[0].to(torch.float64), -1)
        for i in range(ctx // 2, ctx - 1):
            nll -= float(ls[i, toks[c * ctx + i + 1]])
            cnt += 1
        print(c, math.exp(nll / cnt), flush=True)
        if c == 1:
            lines += [f"win2_scored {cnt}", f"win2_ppl {math.exp(nll / cnt):.6f}"]
    lines += [f"win_chunks {n_chunks}", f"win_scored {cnt}", f"win_ppl {math.exp(nll / cnt):.6f}"]
    open(f"{out}/gemma3_exact_window.txt", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    path, tok_path, out = sys.argv[1], sys.argv[2], sys.argv[3]
    import transformers
    import transformers.models.gemma3.modeling_gemma3 as mg
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    r = GGUFReader(path)
    kv = {k: v.contents() for k, v in r.fields.items() if not k.startswith("tokenizer.")}
    a = "gemma3"
    d, L = kv[f"{a}.embedding_length"], kv[f"{a}.block_count"]
    cfg = Gemma3TextConfig(
        vocab_size=262144, hidden_size=d, intermediate_size=kv[f"{a}.feed_forward_length"], num_hidden_layers=L,
        num_attention_heads=kv[f"{a}.attention.head_count"], num_key_value_heads=kv[f"{a}.attention.head_count_kv"],
        head_dim=kv[f"{a}.attention.key_length"], max_position_embeddings=kv[f"{a}.context_length"],
        rms_norm_eps=kv[f"{a}.attention.layer_norm_rms_epsilon"], rope_theta=kv[f"{a}.rope.freq_base"],
        rope_local_base_freq=10000.0, sliding_window=kv[f"{a}.attention.sliding_window"], sliding_window_pattern=6,
        query_pre_attn_scalar=256, final_logit_softcapping=None, attn_logit_softcapping=None,
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True)
    cfg._attn_implementation = "eager"
    hd = cfg.head_dim

    def norm_fwd(self, x):  # Gemma3RMSNorm in float64
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)

    def rope_fwd(self, x, position_ids, layer_type):  # the default rope type, in float64
        base = self.config.rope_parameters[layer_type]["rope_theta"]
        inv = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        freqs = position_ids[..., None].to(torch.float64) * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    mg.Gemma3RMSNorm.forward = norm_fwd
    mg.Gemma3RotaryEmbedding.forward = rope_fwd
    for lt in set(cfg.layer_types):
        assert cfg.rope_parameters[lt].get("rope_type", "default") == "default"

    model = Gemma3ForCausalLM(cfg).to(torch.float64).eval()
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
    per = {"attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
           "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
           "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
           "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
           "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    for l in range(L):
        for g, h in per.items():
            names[f"blk.{l}.{g}.weight"] = f"model.layers.{l}.{h}.weight"
    sd = {}
    for t in r.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float64)
        w = w.reshape([int(x) for x in reversed(t.shape)])
        if t.name.endswith("norm.weight"):
            w = w - 1.0
        sd[names[t.name]] = torch.from_numpy(np.ascontiguousarray(w))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert missing == ["lm_head.weight"] and not unexpected, (missing, unexpected)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

    if "--window-ppl" in sys.argv:
        window_ppl(model.to(torch.float32), np.fromfile(tok_path, dtype="<i4").astype(np.int64), out)
        return
    toks = np.fromfile(tok_path, dtype="<i4")[:SEQ].astype(np.int64)
    with torch.no_grad():
        lg = model(input_ids=torch.from_numpy(toks)[None]).logits[0].numpy() if "--greedy-only" not in sys.argv else None
    recs = []
    for t in range(SEQ if lg is not None else 0):
        row = lg[t]
        ids = np.argsort(-row, kind="stable")[:TOPK]
        mx = row.max()
        lse = mx + np.log(np.exp(row - mx).sum())
        recs.append(ids.astype("<i4").tobytes() + row[ids].astype("<f4").tobytes() +
                    np.array([np.abs(row).max(), lse], dtype="<f4").tobytes())
    if lg is not None:
        open(f"{out}/gemma3_exact_top.bin", "wb").write(b"".join(recs))
    lines = []
    for line in open(f"{out}/gemma3_llamacpp_greedy.txt").read().splitlines():
        if not line.startswith("prompt_ids"):
            continue
        key, ids = line.split(" ", 1)
        cur = torch.tensor([[int(x) for x in ids.split(",")]])
        gen, margins, past = [], [], None
        with torch.no_grad():
            for _ in range(GREEDY_N):
                o = model(input_ids=cur if past is None else cur[:, -1:], past_key_values=past, use_cache=True)
                past = o.past_key_values
                row = o.logits[0, -1].numpy()
                best = np.argsort(-row, kind="stable")[:2]
                margins.append(float(row[best[0]] - row[best[1]]))
                if int(best[0]) == 1:  # <eos>
                    break
                gen.append(int(best[0]))
                cur = torch.cat([cur, torch.tensor([[gen[-1]]])], dim=1)
        lines += [key.replace("prompt_ids", "exact_generated_ids") + " " + ",".join(map(str, gen)),
                  key.replace("prompt_ids", "exact_margins") + " " + ",".join(f"{m:.4f}" for m in margins)]
    open(f"{out}/gemma3_exact_greedy.txt", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))
    if lg is not None:
        print(f"{SEQ} positions, |logit| max {np.abs(lg).max():.3f}, argmax[:8] {lg.argmax(axis=1)[:8].tolist()}; "
              f"torch {torch.__version__}, transformers {transformers.__version__}")


if __name__ == "__main__":
    main()
