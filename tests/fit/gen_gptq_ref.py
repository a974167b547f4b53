#!/usr/bin/env python3
"""Golden for tests/fit/test_gptq.c: GPTQ (Frantar et al. 2022) of a linear predictor's weights, written
in numpy from the algorithm (float64 throughout, np.linalg.cholesky / inv), independently of calib/gptq.c.

    python3 tests/fit/gen_gptq_ref.py            # rewrites tests/fit/golden/gptq_ref.bin (needs numpy)

The problem: W (ROWS x COLS) ~ N(0, 1) rounded to f32; inputs X (N x COLS) correlated Gaussian with a
non-zero mean, in blocks of near-duplicate columns (x_j = x_base + 0.1 noise) so that a column's rounding
error can be compensated on its neighbours: GPTQ's output error is far below round-to-nearest's.
H = X^T X - N mean mean^T (the centered scatter), rounded to f32 and read back as float64, so C and numpy
start from the same bits.

GPTQ as in kv_calib.h (kv_gptq_quantize): dead inputs (H[i][i] == 0) get Hd[i][i] = 1; then
Hd += damp * mean(diag Hd) I; Hinv = Hd^-1; U = upper Cholesky factor of Hinv (Hinv = U^T U). Column by
column: at a group's first column, per row, scale = f16(f32((max - min) / (2^bits - 1))), offset = f16(f32(min))
of the current (updated) weights; code = clamp(round_half_away((w - offset) / scale), 0, 2^bits - 1);
q = f32(scale * code + offset) (kv_plan_pred_qvalue); err = (w - q) / U[i][i]; w[:, j>i] -= err U[i][j].
RTN: the same group rule on the original weights, no error feedback. Output error of a quantized Q:
tr((W - Q) H (W - Q)^T) with the original W and the undamped H.

File format (little-endian, no padding), tests/fit/golden/gptq_ref.bin:
    char[8]   magic "KVGPTQ1\\0"
    int32     rows, cols, group, bits
    float64   damp, err_gptq, err_rtn
    float32   W[rows * cols]                    row-major, the input weights
    float32   Hu[cols * (cols + 1) / 2]         H's upper triangle, row by row (i <= j)
    uint8     codes[rows * cols]                GPTQ codes
    float32   scale[rows * cols / group]        GPTQ scales (f16 values)
    float32   offset[rows * cols / group]       GPTQ offsets (f16 values)
"""
import os
import struct

import numpy as np

ROWS, COLS, GROUP, BITS, N, DAMP, SEED = 24, 128, 32, 4, 500, 0.01, 20240611
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "gptq_ref.bin")


def f16round(x):
    """Round to f16 through f32, as kv_f16_to_f32(kv_f32_to_f16((float)x)) does."""
    return np.asarray(x, dtype=np.float64).astype(np.float32).astype(np.float16).astype(np.float64)


def round_half_away(x):
    return np.where(x < 0, -np.floor(-x + 0.5), np.floor(x + 0.5))


def qvalue(scale, offset, code):
    """kv_plan_pred_qvalue: scale * code + offset in float64, rounded once to f32."""
    return (scale * code + offset).astype(np.float32).astype(np.float64)


def group_params(wg, maxq):
    """Per row of wg (rows x group): f16 scale and offset from the row's min and max."""
    mn, mx = wg.min(axis=1), wg.max(axis=1)
    scale, offset = f16round((mx - mn) / maxq), f16round(mn)
    assert np.all(np.isfinite(scale)) and np.all(np.isfinite(offset))
    return scale, offset


def quantize_col(w, scale, offset, maxq):
    safe = np.where(scale > 0, scale, 1.0)
    code = np.where(scale > 0, np.clip(round_half_away((w - offset) / safe), 0, maxq), 0)
    return code, qvalue(scale, offset, code)


def gptq(W, H, bits, group, damp):
    rows, cols = W.shape
    maxq = 2 ** bits - 1
    Hd = H.copy()
    dead = np.diag(Hd) == 0
    Hd[dead, dead] = 1.0
    m = np.mean(np.diag(Hd))
    Hd += damp * (m if m != 0 else 1.0) * np.eye(cols)
    Hinv = np.linalg.inv(Hd)
    Hinv = (Hinv + Hinv.T) / 2
    U = np.linalg.cholesky(Hinv).T  # lower L with Hinv = L L^T, so U = L^T is upper with Hinv = U^T U
    Wk = W.copy()
    Q = np.zeros_like(W)
    codes = np.zeros(W.shape, dtype=np.uint8)
    ng = cols // group
    scales, offsets = np.zeros((rows, ng)), np.zeros((rows, ng))
    for i in range(cols):
        g = i // group
        if i % group == 0:
            scales[:, g], offsets[:, g] = group_params(Wk[:, i:i + group], maxq)
        code, q = quantize_col(Wk[:, i], scales[:, g], offsets[:, g], maxq)
        codes[:, i] = code
        Q[:, i] = q
        err = (Wk[:, i] - q) / U[i, i]
        Wk[:, i + 1:] -= np.outer(err, U[i, i + 1:])
    return Q, codes, scales, offsets


def rtn(W, bits, group):
    maxq = 2 ** bits - 1
    Q = np.zeros_like(W)
    for g in range(W.shape[1] // group):
        sl = slice(g * group, (g + 1) * group)
        scale, offset = group_params(W[:, sl], maxq)
        for i in range(sl.start, sl.stop):
            Q[:, i] = quantize_col(W[:, i], scale, offset, maxq)[1]
    return Q


def out_err(W, Q, H):
    D = W - Q
    return float(np.trace(D @ H @ D.T))


def main():
    rng = np.random.default_rng(SEED)
    W = rng.standard_normal((ROWS, COLS)).astype(np.float32).astype(np.float64)
    # Blocks of 8 near-duplicate inputs around a shared base, plus a mean and a global mixing.
    base = rng.standard_normal((N, COLS // 8)) @ (np.eye(COLS // 8) + 0.3 * rng.standard_normal((COLS // 8, COLS // 8)))
    X = np.repeat(base, 8, axis=1) + 0.1 * rng.standard_normal((N, COLS)) + rng.standard_normal(COLS)
    mu = X.mean(axis=0)
    H = X.T @ X - N * np.outer(mu, mu)
    H = np.triu(H) + np.triu(H, 1).T  # exactly symmetric from the upper triangle
    H = H.astype(np.float32).astype(np.float64)

    Q, codes, scales, offsets = gptq(W, H, BITS, GROUP, DAMP)
    e_gptq, e_rtn = out_err(W, Q, H), out_err(W, rtn(W, BITS, GROUP), H)
    print(f"GPTQ error {e_gptq:.6g}, RTN error {e_rtn:.6g}, ratio {e_gptq / e_rtn:.4f}")

    iu = np.triu_indices(COLS)
    with open(OUT, "wb") as f:
        f.write(b"KVGPTQ1\0")
        f.write(struct.pack("<4i3d", ROWS, COLS, GROUP, BITS, DAMP, e_gptq, e_rtn))
        f.write(W.astype("<f4").tobytes())
        f.write(H[iu].astype("<f4").tobytes())
        f.write(codes.astype(np.uint8).tobytes())
        f.write(scales.astype("<f4").tobytes())
        f.write(offsets.astype("<f4").tobytes())
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main()
