/* kv_attn_math.h — the device attention of the runtime (RUNTIME.md §10): what one thread block of the CUDA
 * kernel computes, written once as KV_HD functions that the CUDA kernel runs with its threads and the host
 * model (the same backend with its kernels run on the CPU, KV_RT_DEVICE_CUDA_MODEL) runs with a loop over
 * thread indices. Internal to kernels/.
 *
 * Work decomposition (kv_da_configure): a launch covers up to KV_DA_MAX_BATCH sequences of one layer.
 * Thread block (x, y, z) takes sequence z, KV head y / n_rowblocks, query rows [rb * rows_per_block, ...)
 * (rb = y % n_rowblocks; all the GQA group's query heads of those rows: the KV head's codes are read once for
 * them), and the token range [x * split, (x + 1) * split) cut at the causal limit of its last row. It walks
 * the range a tile of at most `tile` tokens at a time: thread 0 lists the tile's pieces per stream (f16
 * rows of the sinks and the window, compressed blocks, reconstruction rows of predicted streams; at most
 * KV_DA_MAX_PIECES each, the tile ends early otherwise), every thread decodes its share of the tile's keys
 * into shared memory (units: a code word, a HIGGS piece, eight f16 channels...), applies RoPE to keys
 * stored before it, scores its (query vector, token) pairs, the softmax statistics are updated online
 * (maximum, correction, sum of exp), the values are decoded the same way and accumulated. HIGGS rows stay
 * in the rotated domain: keys are scored against the rotated query, values accumulate apart and are
 * transformed back once at the end. The block writes its partial result (maximum, sum, unnormalized
 * output) and a second kernel combines a query vector's partials in split order.
 *
 * Phases: every phase function below takes (launch, job, shared memory, thread index, thread count) and
 * lets thread `tid` write only its own items (`for (i = tid; i < n; i += nt)`); a barrier separates
 * phases (KV_DA_PROGRAM). So running the threads of a phase one after another (the host model) computes
 * the same bits as running them in parallel: the CUDA kernel and the host model agree bit for bit when the
 * kernel is compiled without FMA contraction (-fmad=false; the products that must be fused are written
 * with KV_DA_FMA, which is one correctly rounded operation on both sides). */
#ifndef KV_ATTN_MATH_H
#define KV_ATTN_MATH_H

#include "kv_quant_math.h"

#include <math.h>
#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif
/* One correctly rounded fused multiply-add on both sides (fma.rn.f32 on the device, the C library's fmaf on the
 * host), whatever the contraction flags say. */
#if defined(__CUDA_ARCH__)
#define KV_DA_FMA(a, b, c) __fmaf_rn((a), (b), (c))
#else
#define KV_DA_FMA(a, b, c) fmaf((a), (b), (c))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define KV_DA_THREADS 128      /* threads per attention block */
#define KV_DA_MAX_BATCH 32     /* sequences per launch (their descriptors travel as kernel parameters) */
#define KV_DA_MAX_PIECES 16    /* pieces of one stream in a tile */
#define KV_DA_TARGET_BLOCKS 256 /* splits are chosen so that a launch has at least this many blocks */
#define KV_DA_MAX_SPLIT 4096   /* tokens per split at most (bounds the float sums of a partial) */
#define KV_DA_MAX_HGROUP 256   /* HIGGS groups decoded to the real domain (a group is held per thread) */

/* Codec kinds, the runtime's rt_kind values (rt_dev.c asserts they agree). */
enum { KV_DC_F16 = 0, KV_DC_F32 = 1, KV_DC_UNIFORM = 2, KV_DC_HIGGS = 3, KV_DC_FLOAT = 4 };

/* One (layer, stream) codec as the kernels read it: plain values and device pointers. */
typedef struct kv_dcodec {
    int kind;
    int kv_dim, head_dim;
    int pre_rope;          /* keys stored before RoPE: rotated to their positions when read */
    int recon;             /* AQUA-KV predicted stream: compressed tokens are read from the reconstruction */
    int bits, per_word;    /* packing of codes / indices */
    int axis, group, ptype; /* uniform: groups along tokens or channels, group size, f16/f32 parameters */
    int word_aligned;      /* rows' codes start at word boundaries (channels-major layouts: kv_dim and head_dim
                              multiples of per_word): decode a word at a time */
    int hdim, hgroup, ntype; /* HIGGS: piece dimension d, group g (divides head_dim), norm storage */
    int rotated;           /* HIGGS read in the rotated domain (scores against H D q, values transformed back once);
                              0 for keys stored before RoPE, which must be rotated to their positions in the real
                              domain: decoded a group at a time (D H (grid * norm / g)) */
    const float *grid;     /* HIGGS grid, n x d */
    const float *signs;    /* HIGGS random signs of the kv_dim channels */
    int fformat, n_scales, scale_channels; /* FP8 / NVFP4 */
    const float *scales;   /* n_scales f32 */
    const float *lut;      /* value of every element code */
} kv_dcodec;

/* One compressed block of a stream (the device copy of rt_block's addresses). F16/F32 codecs: `codes` holds
 * the rows (m x kv_dim). */
typedef struct kv_dblock {
    const uint32_t *codes;  /* the codes it reads (its own, or the partner layer's: XQuant) */
    const uint8_t *params;  /* scales (uniform), norms (HIGGS), block scales (NVFP4) */
    const uint8_t *zeros;   /* uniform zero points */
    int32_t t0, m;          /* tokens [t0, t0 + m) */
} kv_dblock;

/* What one stream of a sequence holds (RUNTIME.md §2): f16 rows (min(n, sinks) sinks, then the window
 * [comp_end, n)), compressed blocks covering [sinks, comp_end) in order, or the reconstruction rows of
 * [sinks, comp_end) for a predicted stream. */
typedef struct kv_dstream {
    const uint16_t *fp;     /* row stride kv_dim */
    const kv_dblock *blocks;
    const float *recon;     /* row stride kv_dim; row 0 = token `sinks` */
    int n_blocks, comp_end;
} kv_dstream;

typedef struct kv_dseq {
    kv_dstream s[2];        /* K, V */
    int n;                  /* tokens held (positions 0 .. n-1) */
    const float *q;         /* n_q query rows of n_heads * head_dim (after RoPE), stride ldq */
    float *out;             /* n_q output rows, stride ldo */
    float *part;            /* partial results: H x n_q x G x n_splits x (head_dim + 2) floats */
} kv_dseq;

/* One launch: a layer of up to KV_DA_MAX_BATCH sequences with the same number of query rows. */
typedef struct kv_dattn {
    kv_dcodec codec[2];
    int n_seqs, n_q, H, G, hd, sinks;
    int ldq, ldo;
    float scale;
    int rows_per_block, n_rowblocks;
    int split, n_splits, tile;
    const float *rope_cos, *rope_sin; /* pre-RoPE keys: position p, pair i at p * (hd / 2) + i */
    int rope_adjacent;      /* pairs (2i, 2i+1); else (i, i + hd/2) */
    int window;             /* the layer's attention window: a row at p sees p - window + 1 .. p; 0 = all before it */
    kv_dseq seq[KV_DA_MAX_BATCH];
} kv_dattn;

/* ---- element math ---------------------------------------------------------------------------------- */
KV_HD float kv_da_h2f(uint16_t h) {
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(h)); /* exact, as kv_f16_to_f32 */
#else
    return kv_f16_to_f32(h);
#endif
}

/* The runtime's softmax exp (rt_math.c exp_le0), operation for operation: x <= 0, relative error below
 * 4e-7, 0 below -87.33. */
KV_HD float kv_da_exp(float x) {
    const float log2e = 1.44269504088896341f, c1 = 0.693359375f, c2 = -2.12194440e-4f;
    const float magic = 12582912.0f;
    const float lo = -87.33f;
    const float xc = x < lo ? lo : x;
    const float n = (xc * log2e + magic) - magic;
    const float r = (xc - n * c1) - n * c2;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float y = (p * (r * r) + r) + 1.0f;
    const float out = y * kv_qm_pow2((int)n);
    return x < lo ? 0.0f : out;
}

/* Dot product of n floats in four interleaved lanes of fused multiply-adds, lanes added pairwise. */
KV_HD float kv_da_dot(const float *a, const float *b, int n) {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    int c = 0;
    for (; c + 4 <= n; c += 4) {
        s0 = KV_DA_FMA(a[c], b[c], s0);
        s1 = KV_DA_FMA(a[c + 1], b[c + 1], s1);
        s2 = KV_DA_FMA(a[c + 2], b[c + 2], s2);
        s3 = KV_DA_FMA(a[c + 3], b[c + 3], s3);
    }
    for (; c < n; c++) s0 = KV_DA_FMA(a[c], b[c], s0);
    return (s0 + s1) + (s2 + s3);
}

/* RoPE of one pair, the model's arithmetic (rt_rope.c). */
KV_HD void kv_da_rope_pair(float *x0, float *x1, float cs, float sn) {
    const float a = *x0, b = *x1;
    *x0 = a * cs - b * sn;
    *x1 = a * sn + b * cs;
}

/* ---- decoding units ---------------------------------------------------------------------------------
 * A piece of a tile is decoded in units; each unit writes whole values of head h into rows of `dst` (row
 * stride ld; the piece's first row at row u0). add = 1 adds to what is there (reconstructions). */
enum { KV_DP_F16 = 0, KV_DP_F32 = 1, KV_DP_BLOCK = 2 };

typedef struct kv_dpiece {
    const void *rows;      /* F16 / F32: the row of the piece's first row, at head h's channel 0 (stride kv_dim) */
    kv_dblock blk;         /* BLOCK */
    int kind;
    int u0, u1;            /* destination rows [u0, u1) */
    int r0;                /* BLOCK: the block row of destination row u0 */
    int units, ustart;     /* decoding units, and the index of the first among the tile's */
    int rotated;           /* HIGGS: values in the rotated domain */
} kv_dpiece;

KV_HD void kv_da_put(float *dst, float v, int add) { *dst = add ? *dst + v : v; }

/* Uniform blocks grouped along tokens whose channel runs start at word boundaries (G and the last group's
 * rows multiples of the per-word count): a unit is one word, per_word consecutive tokens of one channel. */
KV_HD int kv_da_tok_aligned(const kv_dcodec *c, int m) {
    return c->group % c->per_word == 0 && (m % c->group) % c->per_word == 0;
}

KV_HD int kv_da_div_up(int a, int b) { return (a + b - 1) / b; }

/* Units of a piece (whole rows of head h). */
KV_HD int kv_da_piece_units(const kv_dcodec *c, const kv_dpiece *p) {
    const int rows = p->u1 - p->u0, hd = c->head_dim;
    if (p->kind == KV_DP_F16) return rows * kv_da_div_up(hd, 8);
    if (p->kind == KV_DP_F32) return rows * kv_da_div_up(hd, 4);
    if (c->kind == KV_DC_HIGGS) return rows * (hd / (c->rotated ? c->hdim : c->hgroup));
    if (c->kind == KV_DC_UNIFORM && c->axis == KV_AXIS_TOKENS) {
        if (!kv_da_tok_aligned(c, p->blk.m)) return rows * kv_da_div_up(hd, 8);
        const int pw = c->per_word, r0 = p->r0, r1 = p->r0 + rows;
        return (kv_da_div_up(r1, pw) - r0 / pw) * hd;
    }
    return c->word_aligned ? rows * (hd / c->per_word) : rows * kv_da_div_up(hd, 8);
}

/* A float code's value at absolute channel cc of token t (FP8: lut * S; NVFP4: lut * block scale * S), as
 * kv_fpq_decode_ref computes it. */
KV_HD float kv_da_float_value(const kv_dcodec *c, const kv_dblock *b, uint32_t code, size_t t, size_t cc) {
    const float S = kv_qm_fp_scale(c->scales, c->n_scales, c->scale_channels, cc);
    if (c->fformat != KV_FP_NVFP4) return c->lut[code] * S;
    const size_t nb = ((size_t)c->kv_dim + KV_NVFP4_BLOCK - 1) / KV_NVFP4_BLOCK;
    return c->lut[code] * kv_qm_nvfp4_block_mul(b->params[t * nb + cc / KV_NVFP4_BLOCK], S);
}

/* The value of element (block row t, absolute channel cc) of a uniform / float block, one at a time. */
KV_HD float kv_da_elem(const kv_dcodec *c, const kv_dblock *b, size_t t, size_t cc) {
    const size_t C = (size_t)c->kv_dim, m = (size_t)b->m;
    if (c->kind == KV_DC_FLOAT)
        return kv_da_float_value(c, b, kv_qm_unpack(b->codes, t * C + cc, c->bits, c->per_word), t, cc);
    const size_t G = (size_t)c->group;
    const uint32_t code = kv_qm_unpack(b->codes, kv_qm_uniform_stream_pos(c->axis, G, m, C, t, cc), c->bits, c->per_word);
    const size_t g = kv_qm_uniform_group(c->axis, G, m, C, t, cc);
    return KV_DA_FMA((float)code, kv_qm_param_load(b->params, g, c->ptype), kv_qm_param_load(b->zeros, g, c->ptype));
}

/* Decode unit u of piece p (head h) into dst. */
KV_HD void kv_da_decode_unit(const kv_dcodec *c, const kv_dpiece *p, int h, int u, float *dst, int ld, int add) {
    const int hd = c->head_dim;
    const size_t C = (size_t)c->kv_dim, c0 = (size_t)h * (size_t)hd;
    if (p->kind == KV_DP_F16 || p->kind == KV_DP_F32) {
        const int cw = p->kind == KV_DP_F16 ? 8 : 4, per_row = kv_da_div_up(hd, cw);
        const int i = u / per_row, k = (u - i * per_row) * cw, n = hd - k < cw ? hd - k : cw;
        float *o = dst + (size_t)(p->u0 + i) * (size_t)ld + (size_t)k;
        if (p->kind == KV_DP_F16) {
            const uint16_t *src = (const uint16_t *)p->rows + (size_t)i * C + (size_t)k;
            for (int e = 0; e < n; e++) kv_da_put(o + e, kv_da_h2f(src[e]), add);
        } else {
            const float *src = (const float *)p->rows + (size_t)i * C + (size_t)k;
            for (int e = 0; e < n; e++) kv_da_put(o + e, src[e], add);
        }
        return;
    }
    const kv_dblock *b = &p->blk;
    if (c->kind == KV_DC_HIGGS && !c->rotated) { /* group gi of the head, real domain */
        const int g = c->hgroup, d = c->hdim, per_row = hd / g, i = u / per_row, gi = u - i * per_row;
        const size_t t = (size_t)(p->r0 + i), cc = c0 + (size_t)gi * (size_t)g, per_group = (size_t)(g / d);
        const size_t grp = (t * C + cc) / (size_t)g;
        const float mul = kv_qm_higgs_dec_mul(kv_qm_param_load(b->params, grp, c->ntype), (size_t)g);
        float v[KV_DA_MAX_HGROUP];
        for (size_t q = 0; q < per_group; q++) {
            const uint32_t idx = kv_qm_unpack(b->codes, grp * per_group + q, c->bits, c->per_word);
            for (int k = 0; k < d; k++) v[q * (size_t)d + (size_t)k] = c->grid[idx * (uint32_t)d + (uint32_t)k] * mul;
        }
        kv_qm_fwht(v, (size_t)g);
        float *o = dst + (size_t)(p->u0 + i) * (size_t)ld + (size_t)gi * (size_t)g;
        for (int k = 0; k < g; k++) kv_da_put(o + k, v[k] * c->signs[cc + (size_t)k], add);
        return;
    }
    if (c->kind == KV_DC_HIGGS) { /* piece pc of d channels: grid point * norm / g (rotated domain) */
        const int d = c->hdim, per_row = hd / d, i = u / per_row, pc = u - i * per_row;
        const size_t t = (size_t)(p->r0 + i), cc = c0 + (size_t)pc * (size_t)d, g = (size_t)c->hgroup;
        const uint32_t idx = kv_qm_unpack(b->codes, (t * C + cc) / (size_t)d, c->bits, c->per_word);
        const float mul = kv_qm_higgs_dec_mul(kv_qm_param_load(b->params, (t * C + cc) / g, c->ntype), g);
        float *o = dst + (size_t)(p->u0 + i) * (size_t)ld + (size_t)pc * (size_t)d;
        for (int k = 0; k < d; k++) kv_da_put(o + k, c->grid[idx * (uint32_t)d + (uint32_t)k] * mul, add);
        return;
    }
    const int pw = c->per_word, bits = c->bits;
    if (c->kind == KV_DC_UNIFORM && c->axis == KV_AXIS_TOKENS && kv_da_tok_aligned(c, b->m)) {
        /* one word: tokens [R*pw, R*pw + pw) of channel ch (inside one token group) */
        const size_t G = (size_t)c->group, m = (size_t)b->m;
        const int R = p->r0 / pw + u / hd, ch = u % hd;
        const size_t t0 = (size_t)R * (size_t)pw, k = t0 / G, i0 = t0 - k * G, gs = kv_qm_tok_group_rows(G, m, k);
        const size_t cc = c0 + (size_t)ch, g = k * C + cc;
        const uint32_t word = b->codes[(k * G * C + cc * gs + i0) / (size_t)pw];
        const float s = kv_qm_param_load(b->params, g, c->ptype), z = kv_qm_param_load(b->zeros, g, c->ptype);
        const int rows_end = p->r0 + (p->u1 - p->u0);
        for (int e = 0; e < pw; e++) {
            const int t = (int)t0 + e;
            if (t < p->r0 || t >= rows_end) continue;
            const uint32_t code = (word >> (e * bits)) & kv_qm_slot_max(bits, pw, e);
            kv_da_put(dst + (size_t)(p->u0 + t - p->r0) * (size_t)ld + (size_t)ch, KV_DA_FMA((float)code, s, z), add);
        }
        return;
    }
    if (c->word_aligned && !(c->kind == KV_DC_UNIFORM && c->axis == KV_AXIS_TOKENS)) {
        /* one word of a row: channels [k*pw, k*pw + pw) of head h, token t (channels-major layouts) */
        const int per_row = hd / pw, i = u / per_row, k = u - i * per_row;
        const size_t t = (size_t)(p->r0 + i), cc0 = c0 + (size_t)k * (size_t)pw;
        const uint32_t word = b->codes[(t * C + cc0) / (size_t)pw];
        float *o = dst + (size_t)(p->u0 + i) * (size_t)ld + (size_t)k * (size_t)pw;
        if (c->kind == KV_DC_FLOAT) {
            for (int e = 0; e < pw; e++)
                kv_da_put(o + e, kv_da_float_value(c, b, (word >> (e * bits)) & ((1u << bits) - 1u), t, cc0 + (size_t)e), add);
            return;
        }
        const size_t G = (size_t)c->group, ncg = kv_qm_chan_groups(G, C);
        size_t g_cur = (size_t)-1;
        float s = 0.0f, z = 0.0f;
        for (int e = 0; e < pw; e++) {
            const size_t g = t * ncg + (cc0 + (size_t)e) / G;
            if (g != g_cur) {
                s = kv_qm_param_load(b->params, g, c->ptype);
                z = kv_qm_param_load(b->zeros, g, c->ptype);
                g_cur = g;
            }
            const uint32_t code = (word >> (e * bits)) & kv_qm_slot_max(bits, pw, e);
            kv_da_put(o + e, KV_DA_FMA((float)code, s, z), add);
        }
        return;
    }
    /* any other layout: eight channels of a row, element by element */
    const int per_row = kv_da_div_up(hd, 8), i = u / per_row, k = (u - i * per_row) * 8, n = hd - k < 8 ? hd - k : 8;
    const size_t t = (size_t)(p->r0 + i);
    float *o = dst + (size_t)(p->u0 + i) * (size_t)ld + (size_t)k;
    for (int e = 0; e < n; e++) kv_da_put(o + e, kv_da_elem(c, b, t, c0 + (size_t)(k + e)), add);
}

/* ---- pieces of a tile ---------------------------------------------------------------------------- */
/* The block holding token v (blocks sorted by t0 and consecutive). */
KV_HD int kv_da_find_block(const kv_dblock *blocks, int n_blocks, int v) {
    int lo = 0, hi = n_blocks - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (blocks[mid].t0 <= v) lo = mid; else hi = mid - 1;
    }
    return lo;
}

/* List the pieces of tokens [a, e) of stream `s` for head h (destination rows from 0 = token a), at most
 * KV_DA_MAX_PIECES; returns the end of what they cover (< e when the pieces ran out). */
KV_HD int kv_da_plan_stream(const kv_dcodec *c, const kv_dstream *st, int n, int sinks, int h, int a, int e,
                            kv_dpiece *pc, int *np_out) {
    const size_t kvd = (size_t)c->kv_dim, off = (size_t)h * (size_t)c->head_dim;
    const int sinks_held = n < sinks ? n : sinks;
    int v = a, np = 0, units = 0;
    while (v < e && np < KV_DA_MAX_PIECES) {
        kv_dpiece p;
        p.rows = 0;
        p.blk.codes = 0, p.blk.params = 0, p.blk.zeros = 0, p.blk.t0 = 0, p.blk.m = 0;
        p.r0 = 0;
        p.rotated = 0;
        p.u0 = v - a;
        int end;
        if (v < sinks_held) {
            end = e < sinks_held ? e : sinks_held;
            p.kind = KV_DP_F16;
            p.rows = st->fp + (size_t)v * kvd + off;
        } else if (v < st->comp_end) {
            end = e < st->comp_end ? e : st->comp_end;
            if (c->recon) {
                p.kind = KV_DP_F32;
                p.rows = st->recon + (size_t)(v - sinks) * kvd + off;
            } else {
                const kv_dblock *b = &st->blocks[kv_da_find_block(st->blocks, st->n_blocks, v)];
                end = end < b->t0 + b->m ? end : b->t0 + b->m;
                if (c->kind == KV_DC_F16 || c->kind == KV_DC_F32) { /* FP streams: blocks of rows */
                    p.kind = c->kind == KV_DC_F16 ? KV_DP_F16 : KV_DP_F32;
                    const size_t es = c->kind == KV_DC_F16 ? 2u : 4u;
                    p.rows = (const uint8_t *)b->codes + ((size_t)(v - b->t0) * kvd + off) * es;
                } else {
                    p.kind = KV_DP_BLOCK;
                    p.blk = *b;
                    p.r0 = v - b->t0;
                    p.rotated = c->kind == KV_DC_HIGGS && c->rotated;
                }
            }
        } else {
            end = e;
            p.kind = KV_DP_F16;
            p.rows = st->fp + (size_t)(sinks + (v - st->comp_end)) * kvd + off;
        }
        p.u1 = end - a;
        p.units = kv_da_piece_units(c, &p);
        p.ustart = units;
        units += p.units;
        pc[np++] = p;
        v = end;
    }
    *np_out = np;
    return v;
}

/* ---- the block's job ------------------------------------------------------------------------------- */
typedef struct kv_da_job {
    int z, h, row0, rows, nqv, sp;
    int a0, a1;            /* the block's tokens */
    int a;                 /* the current tile's first token */
} kv_da_job;

KV_HD void kv_da_job_of(const kv_dattn *A, int bx, int by, int bz, kv_da_job *J) {
    J->z = bz;
    J->h = by / A->n_rowblocks;
    const int rb = by - J->h * A->n_rowblocks;
    J->row0 = rb * A->rows_per_block;
    J->rows = A->n_q - J->row0 < A->rows_per_block ? A->n_q - J->row0 : A->rows_per_block;
    J->nqv = J->rows * A->G;
    J->sp = bx;
    const int n = A->seq[bz].n, lim = n - A->n_q + J->row0 + J->rows; /* the last row's causal limit */
    J->a0 = bx * A->split;
    J->a1 = J->a0 + A->split < lim ? J->a0 + A->split : lim;
    if (A->window > 0) { /* nothing before the first row's window is seen: start at its tile */
        const int lo = n - A->n_q + J->row0 + 1 - A->window, lo_tile = lo > 0 ? lo / A->tile * A->tile : 0;
        J->a0 = lo_tile > J->a0 ? lo_tile : J->a0;
    }
    J->a = J->a0;
}

/* Causal limit of query vector j of the job: tokens [0, lim) are visible. */
KV_HD int kv_da_limit(const kv_dattn *A, const kv_da_job *J, int j) {
    return A->seq[J->z].n - A->n_q + J->row0 + j / A->G + 1;
}

/* Whether token a is visible to query vector j: before its causal limit and, in a windowed layer, inside its
 * window (the model's mask, model/forward.c `attend`). */
KV_HD int kv_da_visible(const kv_dattn *A, const kv_da_job *J, int j, int a) {
    const int lim = kv_da_limit(A, J, j);
    return a < lim && (A->window <= 0 || a >= lim - A->window);
}

/* ---- shared memory --------------------------------------------------------------------------------- */
enum { KV_DA_META_NPK = 0, KV_DA_META_NPV = 1, KV_DA_META_END = 2, KV_DA_META_UK = 3, KV_DA_META_UV = 4, KV_DA_META_N = 8 };

typedef struct kv_da_smem {
    kv_dpiece *pk, *pv;    /* KV_DA_MAX_PIECES each */
    int *meta;             /* KV_DA_META_N */
    int *rotk, *rotv;      /* per tile row: HIGGS row (rotated domain) */
    float *q, *qr;         /* nqv x hdp: scaled queries, and rotated (HIGGS keys) or NULL */
    float *o, *orr;        /* nqv x hdp: accumulators (plain, and rotated for HIGGS values or NULL) */
    float *ks, *vs;        /* tile x ld */
    float *s;              /* nqv x tile: scores, then weights */
    float *mx, *l, *corr;  /* nqv */
    int hdp, ld;
} kv_da_smem;

KV_HD int kv_da_round4(int x) { return (x + 3) / 4 * 4; }

/* Bytes of shared memory a block with nqv query vectors needs (carve order below; every part 16-aligned). */
KV_HD size_t kv_da_smem_bytes(const kv_dattn *A, int nqv) {
    const size_t hdp = (size_t)kv_da_round4(A->hd), ld = hdp + 4, T = (size_t)A->tile, nv = (size_t)kv_da_round4(nqv);
    const size_t pieces = 2 * KV_DA_MAX_PIECES * ((sizeof(kv_dpiece) + 15) / 16 * 16);
    const size_t ints = (size_t)kv_da_round4(KV_DA_META_N) + 2 * (size_t)kv_da_round4((int)T);
    const size_t nvec = 2 + (size_t)(A->codec[0].kind == KV_DC_HIGGS && A->codec[0].rotated) +
                        (size_t)(A->codec[1].kind == KV_DC_HIGGS && A->codec[1].rotated);
    const size_t floats = nvec * nv * hdp + 2 * T * ld + nv * T + 3 * nv;
    return pieces + 4 * ints + 4 * floats;
}

KV_HD void kv_da_carve(const kv_dattn *A, int nqv, void *raw, kv_da_smem *S) {
    const int hdp = kv_da_round4(A->hd), ld = hdp + 4, T = A->tile, nv = kv_da_round4(nqv);
    const size_t psz = (sizeof(kv_dpiece) + 15) / 16 * 16;
    uint8_t *p = (uint8_t *)raw;
    S->pk = (kv_dpiece *)p;
    S->pv = (kv_dpiece *)(p + KV_DA_MAX_PIECES * psz);
    p += 2 * KV_DA_MAX_PIECES * psz;
    S->meta = (int *)p;
    S->rotk = S->meta + kv_da_round4(KV_DA_META_N);
    S->rotv = S->rotk + kv_da_round4(T);
    float *f = (float *)(S->rotv + kv_da_round4(T));
    S->hdp = hdp, S->ld = ld;
    S->q = f, f += (size_t)nv * hdp;
    S->o = f, f += (size_t)nv * hdp;
    S->qr = 0, S->orr = 0;
    if (A->codec[0].kind == KV_DC_HIGGS && A->codec[0].rotated) S->qr = f, f += (size_t)nv * hdp;
    if (A->codec[1].kind == KV_DC_HIGGS && A->codec[1].rotated) S->orr = f, f += (size_t)nv * hdp;
    S->ks = f, f += (size_t)T * ld;
    S->vs = f, f += (size_t)T * ld;
    S->s = f, f += (size_t)nv * T;
    S->mx = f, f += nv;
    S->l = f, f += nv;
    S->corr = f;
}

/* ---- phases ---------------------------------------------------------------------------------------- */
/* Scaled queries, zero accumulators, empty statistics. */
KV_HD void kv_da_ph_init(const kv_dattn *A, const kv_da_job *J, kv_da_smem *S, int tid, int nt) {
    const kv_dseq *sq = &A->seq[J->z];
    const int hd = A->hd, G = A->G;
    for (int i = tid; i < J->nqv * hd; i += nt) {
        const int j = i / hd, c = i - j * hd, row = J->row0 + j / G, hq = J->h * G + j % G;
        S->q[j * S->hdp + c] = sq->q[(size_t)row * (size_t)A->ldq + (size_t)hq * (size_t)hd + (size_t)c] * A->scale;
        S->o[j * S->hdp + c] = 0.0f;
        if (S->orr) S->orr[j * S->hdp + c] = 0.0f;
    }
    for (int j = tid; j < J->nqv; j += nt) {
        S->mx[j] = -INFINITY;
        S->l[j] = 0.0f;
        S->corr[j] = 1.0f;
    }
}

/* HIGGS keys: the rotated queries H (D q) per group (as kv_rti_higgs_prepare). */
KV_HD void kv_da_ph_rotate_queries(const kv_dattn *A, const kv_da_job *J, kv_da_smem *S, int tid, int nt) {
    const kv_dcodec *c = &A->codec[0];
    const int g = c->hgroup, ng = A->hd / g;
    for (int i = tid; i < J->nqv * ng; i += nt) {
        const int j = i / ng, gi = i - j * ng;
        float *qr = S->qr + j * S->hdp + gi * g;
        const float *q = S->q + j * S->hdp + gi * g, *sg = c->signs + (size_t)J->h * (size_t)A->hd + (size_t)(gi * g);
        for (int k = 0; k < g; k++) qr[k] = q[k] * sg[k];
        kv_qm_fwht(qr, (size_t)g);
    }
}

/* Thread 0: the pieces of the tile starting at J->a for both streams. */
KV_HD void kv_da_ph_plan(const kv_dattn *A, const kv_da_job *J, kv_da_smem *S, int tid, int nt) {
    (void)tid, (void)nt;
    const kv_dseq *sq = &A->seq[J->z];
    const int a = J->a, e = a + A->tile < J->a1 ? a + A->tile : J->a1;
    int npk = 0, npv = 0;
    const int ek = kv_da_plan_stream(&A->codec[0], &sq->s[0], sq->n, A->sinks, J->h, a, e, S->pk, &npk);
    const int ev = kv_da_plan_stream(&A->codec[1], &sq->s[1], sq->n, A->sinks, J->h, a, ek, S->pv, &npv);
    if (ev < ek) { /* the values' pieces ran out first: cut the keys' at the same token */
        int k = 0, units = 0;
        for (; k < npk && S->pk[k].u0 < ev - a; k++) {
            if (S->pk[k].u1 > ev - a) S->pk[k].u1 = ev - a;
            S->pk[k].units = kv_da_piece_units(&A->codec[0], &S->pk[k]);
            S->pk[k].ustart = units;
            units += S->pk[k].units;
        }
        npk = k;
    }
    int uk = 0, uv = 0;
    for (int k = 0; k < npk; k++) {
        uk += S->pk[k].units;
        for (int r = S->pk[k].u0; r < S->pk[k].u1; r++) S->rotk[r] = S->pk[k].rotated;
    }
    for (int k = 0; k < npv; k++) {
        uv += S->pv[k].units;
        for (int r = S->pv[k].u0; r < S->pv[k].u1; r++) S->rotv[r] = S->pv[k].rotated;
    }
    S->meta[KV_DA_META_NPK] = npk;
    S->meta[KV_DA_META_NPV] = npv;
    S->meta[KV_DA_META_UK] = uk;
    S->meta[KV_DA_META_UV] = uv;
    S->meta[KV_DA_META_END] = ev;
}

/* Decode the units [tid, units) step nt of a stream's pieces into dst. */
KV_HD void kv_da_load(const kv_dcodec *c, const kv_dpiece *pc, int np, int units, int h, float *dst, int ld, int tid,
                      int nt) {
    int k = 0;
    for (int u = tid; u < units; u += nt) {
        while (k + 1 < np && u >= pc[k + 1].ustart) k++; /* u grows: the piece index only moves forward */
        kv_da_decode_unit(c, &pc[k], h, u - pc[k].ustart, dst, ld, 0);
    }
}

KV_HD void kv_da_ph_load_k(const kv_dattn *A, const kv_da_job *J, kv_da_smem *S, int tid, int nt) {
    kv_da_load(&A->codec[0], S->pk, S->meta[KV_DA_META_NPK], S->meta[KV_DA_META_UK], J->h, S->ks, S->ld, tid, nt);
}

/* Keys stored before RoPE: rotate the tile's rows to their positions (row r = token a + r). */
KV_HD void kv_da_ph_rope(const kv_dattn *A, const kv_da_job *J, kv_da_smem *S, int tid, int nt) {
    const int T = S->meta[KV_DA_META_END] - J->a, half = A->hd / 2;
    for (int i = tid; i < T * half; i += nt) {
        const int r = i / half, pr = i - r * half;
        const size_t pos = (size_t)(J->a + r);
        const int i0 = A->rope_adjacent ? 2 * pr : pr, i1 = A->rope_adjacent ? 2 * pr + 1 : pr + half;
        float *row = S->ks + (size_t)r * (size_t)S->ld;
        kv_da_rope_pair(row + i0, row + i1, A->rope_cos[pos * (size_t)half + (size_t)pr],
                        A->rope_sin[pos * (size_t)half + (size_t)pr]);
    }
}

KV_HD void kv_da_ph_scores(const kv_dattn *A, const kv_da_job *J, kv_da_smem *S, int tid, int nt) {
    const int T = S->meta[KV_DA_META_END] - J->a;
    for (int i = tid; i < J->nqv * T; i += nt) {
        const int j = i / T, r = i - j * T;
        float v = -INFINITY;
        if (kv_da_visible(A, J, j, J->a + r)) {
            const float *qv = (S->rotk[r] ? S->qr : S->q) + j * S->hdp;
            v = kv_da_dot(qv, S->ks + (size_t)r * (size_t)S->ld, A->hd);
        }
        S->s[j * A->tile + r] = v;
    }
}

/* Per query vector: the tile's maximum, the new running maximum and the correction of what came before. */
KV_HD void kv_da_ph_max(const kv_dattn *A, const kv_da_job *J, kv_da_smem *S, int tid, int nt) {
    const int T = S->meta[KV_DA_META_END] - J->a;
    for (int j = tid; j < J->nqv; j += nt) {
        const float *s = S->s + j * A->tile;
        float mt = -INFINITY;
        for (int r = 0; r < T; r++) mt = s[r] > mt ? s[r] : mt;
        const float m_old = S->mx[j], m_new = mt > m_old ? mt : m_old;
        S->corr[j] = (m_old == -INFINITY || m_new == m_old) ? (m_old == -INFINITY ? 0.0f : 1.0f) : kv_da_exp(m_old - m_new);
        S->mx[j] = m_new;
    }
}

KV_HD void kv_da_ph_exp(const kv_dattn *A, const kv_da_job *J, kv_da_smem *S, int tid, int nt) {
    const int T = S->meta[KV_DA_META_END] - J->a;
    for (int i = tid; i < J->nqv * T; i += nt) {
        const int j = i / T, r = i - j * T;
        float *s = S->s + j * A->tile + r;
        const float m = S->mx[j];
        *s = (m == -INFINITY || *s == -INFINITY) ? 0.0f : kv_da_exp(*s - m);
    }
}

/* The sums of exp (one thread per vector, tokens in order) and, by every thread, the values' units. */
KV_HD void kv_da_ph_sum_load_v(const kv_dattn *A, const kv_da_job *J, kv_da_smem *S, int tid, int nt) {
    const int T = S->meta[KV_DA_META_END] - J->a;
    for (int j = tid; j < J->nqv; j += nt) {
        const float *s = S->s + j * A->tile;
        float sum = 0.0f;
        for (int r = 0; r < T; r++) sum += s[r];
        S->l[j] = S->l[j] * S->corr[j] + sum;
    }
    kv_da_load(&A->codec[1], S->pv, S->meta[KV_DA_META_NPV], S->meta[KV_DA_META_UV], J->h, S->vs, S->ld, tid, nt);
}

KV_HD void kv_da_ph_accum(const kv_dattn *A, const kv_da_job *J, kv_da_smem *S, int tid, int nt) {
    const int T = S->meta[KV_DA_META_END] - J->a, hd = A->hd;
    for (int i = tid; i < J->nqv * hd; i += nt) {
        const int j = i / hd, c = i - j * hd;
        const float corr = S->corr[j], *w = S->s + j * A->tile;
        float o = S->o[j * S->hdp + c] * corr, orot = S->orr ? S->orr[j * S->hdp + c] * corr : 0.0f;
        for (int r = 0; r < T; r++) {
            const float v = S->vs[(size_t)r * (size_t)S->ld + (size_t)c];
            if (S->rotv[r])
                orot = KV_DA_FMA(w[r], v, orot);
            else
                o = KV_DA_FMA(w[r], v, o);
        }
        S->o[j * S->hdp + c] = o;
        if (S->orr) S->orr[j * S->hdp + c] = orot;
    }
}

/* HIGGS values: the rotated accumulator transformed back, D H o_rot, added (as kv_rti_higgs_finish). */
KV_HD void kv_da_ph_unrotate(const kv_dattn *A, const kv_da_job *J, kv_da_smem *S, int tid, int nt) {
    const kv_dcodec *c = &A->codec[1];
    const int g = c->hgroup, ng = A->hd / g;
    for (int i = tid; i < J->nqv * ng; i += nt) {
        const int j = i / ng, gi = i - j * ng;
        float *r = S->orr + j * S->hdp + gi * g, *o = S->o + j * S->hdp + gi * g;
        const float *sg = c->signs + (size_t)J->h * (size_t)A->hd + (size_t)(gi * g);
        kv_qm_fwht(r, (size_t)g);
        for (int k = 0; k < g; k++) o[k] = o[k] + r[k] * sg[k];
    }
}

/* Partial result of query vector j for split sp: [max, sum, o_0 .. o_{hd-1}]. */
KV_HD size_t kv_da_part_index(const kv_dattn *A, int h, int row, int g, int sp) {
    return ((((size_t)h * (size_t)A->n_q + (size_t)row) * (size_t)A->G + (size_t)g) * (size_t)A->n_splits + (size_t)sp) *
           (size_t)(A->hd + 2);
}

KV_HD void kv_da_ph_store(const kv_dattn *A, const kv_da_job *J, kv_da_smem *S, int tid, int nt) {
    const int w = A->hd + 2;
    float *part = A->seq[J->z].part;
    for (int i = tid; i < J->nqv * w; i += nt) {
        const int j = i / w, e = i - j * w;
        const size_t at = kv_da_part_index(A, J->h, J->row0 + j / A->G, j % A->G, J->sp) + (size_t)e;
        part[at] = e == 0 ? S->mx[j] : e == 1 ? S->l[j] : S->o[j * S->hdp + (e - 2)];
    }
}

/* The program of one block. RUN(f): phase f on every thread, then a barrier; RUN1(f): on thread 0, then a
 * barrier; SYNC(): a barrier. A, J, S are pointers; the tile loop reads the tile's end after a barrier and
 * waits again before thread 0 plans the next tile. */
#define KV_DA_PROGRAM(RUN, RUN1, SYNC, A, J, S)                                                    \
    do {                                                                                           \
        RUN(kv_da_ph_init);                                                                        \
        if ((S)->qr) RUN(kv_da_ph_rotate_queries);                                                 \
        while ((J)->a < (J)->a1) {                                                                 \
            RUN1(kv_da_ph_plan);                                                                   \
            RUN(kv_da_ph_load_k);                                                                  \
            if ((A)->codec[0].pre_rope) RUN(kv_da_ph_rope);                                        \
            RUN(kv_da_ph_scores);                                                                  \
            RUN(kv_da_ph_max);                                                                     \
            RUN(kv_da_ph_exp);                                                                     \
            RUN(kv_da_ph_sum_load_v);                                                              \
            RUN(kv_da_ph_accum);                                                                   \
            (J)->a = (S)->meta[KV_DA_META_END];                                                    \
            SYNC();                                                                                \
        }                                                                                          \
        if ((S)->orr) RUN(kv_da_ph_unrotate);                                                      \
        RUN(kv_da_ph_store);                                                                       \
    } while (0)

/* ---- combine ---------------------------------------------------------------------------------------- */
/* Output channel c of query vector (row, g) of KV head h of sequence z from its splits' partials, in split
 * order: o = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s. */
KV_HD void kv_da_combine_channel(const kv_dattn *A, int z, int h, int row, int g, int c) {
    const kv_dseq *sq = &A->seq[z];
    const float *p0 = sq->part + kv_da_part_index(A, h, row, g, 0);
    const size_t w = (size_t)(A->hd + 2);
    float M = -INFINITY;
    for (int s = 0; s < A->n_splits; s++) M = p0[(size_t)s * w] > M ? p0[(size_t)s * w] : M;
    float l = 0.0f, o = 0.0f;
    for (int s = 0; s < A->n_splits && M != -INFINITY; s++) {
        const float *ps = p0 + (size_t)s * w;
        if (ps[0] == -INFINITY) continue;
        const float e = kv_da_exp(ps[0] - M);
        l = KV_DA_FMA(e, ps[1], l);
        o = KV_DA_FMA(e, ps[2 + c], o);
    }
    sq->out[(size_t)row * (size_t)A->ldo + (size_t)(h * A->G + g) * (size_t)A->hd + (size_t)c] = l > 0.0f ? o / l : 0.0f;
}

/* ---- reconstructions (AQUA-KV) ------------------------------------------------------------------------
 * A predicted stream's reconstruction is its prediction plus its decoded residual blocks; the decode adds
 * whole rows (every head, kv_dim channels, stride kv_dim) of a block in units. HIGGS groups are decoded to
 * the real domain here (D H (grid * norm / g), as kv_higgs_decode_ref), one group per unit. */

/* The whole block as a piece of head h (destination row 0 = the block's first token). */
KV_HD void kv_da_block_piece(const kv_dcodec *c, const kv_dblock *b, int h, kv_dpiece *p) {
    p->rows = 0;
    p->blk = *b;
    p->kind = KV_DP_BLOCK;
    p->u0 = 0;
    p->u1 = b->m;
    p->r0 = 0;
    p->rotated = 0;
    p->ustart = 0;
    if (c->kind == KV_DC_F16 || c->kind == KV_DC_F32) {
        const size_t es = c->kind == KV_DC_F16 ? 2u : 4u;
        p->kind = c->kind == KV_DC_F16 ? KV_DP_F16 : KV_DP_F32;
        p->rows = (const uint8_t *)b->codes + (size_t)h * (size_t)c->head_dim * es;
    }
    p->units = kv_da_piece_units(c, p);
}

KV_HD int kv_da_recon_units(const kv_dcodec *c, const kv_dblock *b) {
    if (c->kind == KV_DC_HIGGS) return b->m * (c->kv_dim / c->hgroup);
    kv_dpiece p;
    kv_da_block_piece(c, b, 0, &p);
    return (c->kv_dim / c->head_dim) * p.units;
}

/* out: the block's first row (stride kv_dim); out += decoded unit u. */
KV_HD void kv_da_recon_unit(const kv_dcodec *c, const kv_dblock *b, int u, float *out) {
    const size_t C = (size_t)c->kv_dim;
    if (c->kind == KV_DC_HIGGS) {
        const int ng = c->kv_dim / c->hgroup, i = u / ng, gi = u - i * ng, d = c->hdim;
        const size_t g = (size_t)c->hgroup, grp = (size_t)i * (size_t)ng + (size_t)gi, per_group = g / (size_t)d;
        const float mul = kv_qm_higgs_dec_mul(kv_qm_param_load(b->params, grp, c->ntype), g);
        float v[KV_DA_MAX_HGROUP];
        for (size_t p = 0; p < per_group; p++) {
            const uint32_t idx = kv_qm_unpack(b->codes, grp * per_group + p, c->bits, c->per_word);
            for (int k = 0; k < d; k++) v[p * (size_t)d + (size_t)k] = c->grid[idx * (uint32_t)d + (uint32_t)k] * mul;
        }
        kv_qm_fwht(v, g);
        float *o = out + (size_t)i * C + (size_t)gi * g;
        const float *sg = c->signs + (size_t)gi * g;
        for (size_t k = 0; k < g; k++) o[k] = o[k] + v[k] * sg[k];
        return;
    }
    kv_dpiece p;
    kv_da_block_piece(c, b, 0, &p);
    const int h = u / p.units;
    kv_da_block_piece(c, b, h, &p);
    kv_da_decode_unit(c, &p, h, u - h * p.units, out + (size_t)h * (size_t)c->head_dim, c->kv_dim, 1);
}

#ifdef __cplusplus
}
#endif
#endif /* KV_ATTN_MATH_H */
