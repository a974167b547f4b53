"""Helper of test_export_transformers.sh (run in its venv).
  make DIR DTYPE                     a small random LlamaForCausalLM saved by transformers (vocab 512:
                                     stories260K's tokenizer fits it)
  load DIR PLAN_JSON DTYPE STRATEGY  load DIR with transformers + compressed-tensors on the CPU; every
                                     self_attn carries k_scale / v_scale of compressed-tensors' registered
                                     shape and dtype holding the plan's scales; a forward pass runs."""
import json
import sys

import numpy as np
import torch


def make(d, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(cfg).to(getattr(torch, dtype)).save_pretrained(d)


def load(d, plan_path, dtype, strategy):
    from transformers import AutoModelForCausalLM
    plan = json.load(open(plan_path))
    fp = plan["fingerprint"]
    L, nkv = fp["n_layers"], fp["n_kv_heads"]
    m = AutoModelForCausalLM.from_pretrained(d)
    qc = m.config.quantization_config
    ok = True
    want_dtype = getattr(torch, dtype)
    shape = (1,) if strategy == "tensor" else (nkv, 1, 1)
    for l in range(L):
        a = m.model.layers[l].self_attn
        for st, key in ((0, "k_scale"), (1, "v_scale")):
            t = getattr(a, key, None)
            if t is None:
                print(f"FAIL: layer {l} self_attn has no {key} after loading ({type(a).__name__})")
                ok = False
                continue
            want = torch.tensor(np.array(plan["layers"][l][["K", "V"][st]]["scales"], dtype=np.float32))
            want = want.to(want_dtype).reshape(shape)  # rounded as the registered parameter holds it
            if tuple(t.shape) != shape or t.dtype != want_dtype or not torch.equal(t.detach(), want):
                print(f"FAIL: layer {l} {key}: {tuple(t.shape)} {t.dtype} {t.detach().flatten().tolist()}, "
                      f"want {shape} {want_dtype} {want.flatten().tolist()}")
                ok = False
    ids = torch.tensor([[1, 5, 9, 200, 17, 33, 2]])
    with torch.no_grad():
        out = m(ids).logits
    if not torch.isfinite(out.float()).all():
        print("FAIL: the forward pass through the quantized KV cache gave non-finite logits")
        ok = False
    print(f"{'ok' if ok else 'FAIL'}: transformers {__import__('transformers').__version__} + compressed-tensors "
          f"{__import__('compressed_tensors').__version__} loaded {d}: {2 * L} scales, {strategy}, {dtype} "
          f"(quantization_config {type(qc).__name__})")
    return ok


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    else:
        sys.exit(0 if load(*sys.argv[2:6]) else 1)
