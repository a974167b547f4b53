#!/usr/bin/env python3
"""Write the dequantization goldens of tests/gguf/ with an independent reference: the numpy
dequantizers of the `gguf` Python package (gguf.quants.dequantize, llama.cpp's gguf-py).

  .venv-ref/bin/python tests/gguf/gen_dequant_golden.py [--model PATH] [--out DIR]

1. golden/dequant_<TYPE>.bin for every type the C code dequantizes and gguf-py knows: random
   blocks (random bytes, with the f16 scale fields replaced by sane finite values: normal and
   subnormal magnitudes of both signs, zero and -0), and the f32 values gguf-py computes.
     "KVDQ" | u32 format version 1 | u32 dtype | u32 n_blocks | u32 block_elems | u32 block_bytes
     | raw blocks (n_blocks * block_bytes) | f32 expected (n_blocks * block_elems)
2. golden/model_smollm2.bin (only with --model): for a few tensors of the default model, bit
   patterns of the first 256 values and of 256 strided samples, plus sum, sum of squares and a
   position-weighted sum of the whole dequantized tensor (float64, numpy).
     "KVDM" | u32 version 1 | u64 file size | u32 n_tensors | per tensor:
       u32 name_len | name | u32 dtype | u64 n_elems | f64 sum | f64 sumsq | f64 wsum | f64 sum_abs
       | f32 first[256] | f32 strided[256]
   sample k of the strided set is element (k * n) // 256 + 7 (clamped to n - 1); the weight of
   element i in wsum is ((i % 1009) + 1) / 1009.

Deterministic (fixed seeds); rerun only when the formats or this script change.
"""
import argparse
import os
import struct
import sys

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf import quants, GGUFReader

HERE = os.path.dirname(os.path.abspath(__file__))

# Byte offsets of the f16 scale fields inside one block (GGML layouts).
SCALE_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}
N_BLOCKS = {T.F32: 512, T.F16: 1024, T.BF16: 1024}  # elements for the plain types
N_BLOCKS_LEGACY = 48
N_BLOCKS_K = 12


def sane_f16(rng, n):
    """Finite f16 scales: mostly normal magnitudes 2^-12..2^2 of both signs, some subnormal, 0, -0."""
    mag = rng.uniform(0.5, 1.0, n) * np.exp2(rng.integers(-12, 3, n))
    val = (mag * rng.choice([-1.0, 1.0], n)).astype(np.float16)
    special = rng.random(n)
    val[special < 0.04] = np.float16(0.0)
    val[(special >= 0.04) & (special < 0.06)] = np.float16(-0.0)
    sub = (special >= 0.06) & (special < 0.12)
    val[sub] = (rng.integers(1, 1024, int(sub.sum())).astype(np.uint16)
                | rng.choice([0, 0x8000], int(sub.sum())).astype(np.uint16)).view(np.float16)
    assert np.all(np.isfinite(val.astype(np.float32)))
    return val


def gen_type(qtype, rng):
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    if qtype in N_BLOCKS:
        n = N_BLOCKS[qtype]
        if qtype == T.F32:
            raw = rng.standard_normal(n).astype(np.float32).view(np.uint8)
        elif qtype == T.F16:
            # random finite halves (NaN/Inf are covered by the exhaustive C test against kv_f16_to_f32)
            bits = rng.integers(0, 65536, n).astype(np.uint16)
            bits = bits[(bits & 0x7C00) != 0x7C00][: n - 8]
            bits = np.concatenate([bits, np.array([0, 0x8000, 1, 0x83FF, 0x3C00, 0x7BFF, 0x0400, 0xFBFF],
                                                  dtype=np.uint16)])
            n = bits.size
            raw = bits.view(np.uint8)
        else:  # BF16: every bit pattern is fine (the reference is an integer shift)
            raw = rng.integers(0, 65536, n).astype(np.uint16).view(np.uint8)
        n_blocks = n
        blocks = raw.reshape(n_blocks, block_bytes)
    else:
        n_blocks = N_BLOCKS_K if block_elems == 256 else N_BLOCKS_LEGACY
        blocks = rng.integers(0, 256, (n_blocks, block_bytes)).astype(np.uint8)
        for off in SCALE_FIELDS[qtype]:
            blocks[:, off:off + 2] = sane_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    expected = quants.dequantize(blocks.reshape(-1), qtype).astype(np.float32).reshape(-1)
    assert expected.size == n_blocks * block_elems, (qtype, expected.size)
    return n_blocks, block_elems, block_bytes, blocks.tobytes(), expected


def write_dequant_goldens(out_dir):
    rng = np.random.default_rng(20240611)
    types = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
             T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
    for qt in types:
        n_blocks, be, bb, raw, expected = gen_type(qt, rng)
        path = os.path.join(out_dir, f"dequant_{qt.name}.bin")
        with open(path, "wb") as f:
            f.write(b"KVDQ")
            f.write(struct.pack("<5I", 1, int(qt.value), n_blocks, be, bb))
            f.write(raw)
            f.write(expected.astype("<f4").tobytes())
        print(f"{path}: {n_blocks} blocks of {qt.name}", file=sys.stderr)


MODEL_TENSORS = [
    "token_embd.weight",       # Q8_0
    "blk.0.attn_q.weight",     # Q4_1
    "blk.0.attn_norm.weight",  # F32
    "blk.17.ffn_down.weight",  # Q4_1
    "blk.29.attn_v.weight",    # Q4_1
    "output_norm.weight",      # F32
]


def write_model_golden(model, out_dir):
    r = GGUFReader(model)
    by_name = {t.name: t for t in r.tensors}
    path = os.path.join(out_dir, "model_smollm2.bin")
    with open(path, "wb") as f:
        f.write(b"KVDM")
        f.write(struct.pack("<IQI", 1, os.path.getsize(model), len(MODEL_TENSORS)))
        for name in MODEL_TENSORS:
            t = by_name[name]
            x = quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
            n = x.size
            xd = x.astype(np.float64)
            w = ((np.arange(n, dtype=np.int64) % 1009) + 1).astype(np.float64) / 1009.0
            idx = np.minimum((np.arange(256, dtype=np.int64) * n) // 256 + 7, n - 1)
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)) + nb)
            f.write(struct.pack("<IQdddd", int(t.tensor_type.value), n, float(xd.sum()),
                                float((xd * xd).sum()), float((xd * w).sum()), float(np.abs(xd).sum())))
            f.write(x[:256].astype("<f4").tobytes())
            f.write(x[idx].astype("<f4").tobytes())
            print(f"{path}: {name} {t.tensor_type.name} n={n} sum={xd.sum():.6g}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "golden"))
    ap.add_argument("--model", default=None, help="the default model (SmolLM2-135M-Instruct.Q4_1.gguf)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    write_dequant_goldens(args.out)
    if args.model:
        write_model_golden(args.model, args.out)


if __name__ == "__main__":
    main()
