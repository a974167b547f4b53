/* Plan format tests (formats/PLAN_FORMAT.md): round trip of every field, determinism, atomic
 * writes, the frozen golden v1.0 file, the hand-made list of corrupt plans (each with its own status
 * and message), every truncation and single-byte corruption, fingerprint checks, validation,
 * bits per value, dumps.
 *
 * Modes besides the test run (used once, results committed):
 *   test_plan --write-golden PATH    write the golden v1.0 plan (done once with the 1.0 writer; the
 *                                    current writer writes minor 1, so do not regenerate it)
 *   test_plan --write-golden-1.1 PATH  write the golden v1.1 plan (FP8 stream, tensor scales)
 *   test_plan --write-golden-1.2 PATH  write the golden v1.2 plan (SQuat with the static subspace)
 *   test_plan --write-golden-1.5 PATH  write the golden v1.5 plan (attention windows)
 *   test_plan --write-corpus DIR     write the fuzz seed corpus (valid plans + every corrupt variant) */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "kv_formats.h"
#include "kv_test.h"
#include "plan_sample.h"

static const kv_plan_write_options k_plain = {0, 0};       /* no compression */
static const kv_plan_write_options k_zlib = {1, 256};      /* compress sections >= 256 bytes */

static void serialize(uint8_t **buf, size_t *n, const kv_plan *p, const kv_plan_write_options *o) {
    ck_assert_kv_ok(kv_plan_write_memory(buf, n, p, o));
}

static kv_plan *sample(void) {
    kv_plan *p = NULL;
    ck_assert_kv_ok(plan_sample_make(&p));
    return p;
}

/* A golden file read back equals what its sample maker builds today (plan_sample.c). */
static void assert_is_sample(const kv_plan *p, kv_status (*make)(kv_plan **), const char *version) {
    kv_plan *s = NULL;
    ck_assert_kv_ok(make(&s));
    char why[256];
    ck_assert_msg(plan_equal(p, s, why, sizeof why), "golden %s vs sample: %s", version, why);
    kv_plan_free(s);
}

/* p written (no compression) and read back is p. */
static void assert_roundtrip(const kv_plan *p) {
    uint8_t *b = NULL;
    size_t n = 0;
    kv_plan *q = NULL;
    serialize(&b, &n, p, &k_plain);
    ck_assert_kv_ok(kv_plan_read_memory(&q, b, n));
    char why[256];
    ck_assert_msg(plan_equal(p, q, why, sizeof why), "round trip: %s", why);
    free(b);
    kv_plan_free(q);
}

/* ---- round trip -------------------------------------------------------------------------------- */
static void roundtrip_with(const kv_plan_write_options *o) {
    kv_plan *p = sample(), *q = NULL, *r = NULL;
    uint8_t *b1 = NULL, *b2 = NULL;
    size_t n1 = 0, n2 = 0;
    serialize(&b1, &n1, p, o);
    ck_assert_uint_eq(n1 % 64, 0);
    ck_assert_kv_ok(kv_plan_read_memory(&q, b1, n1));
    char why[256] = "";
    ck_assert_msg(plan_equal(p, q, why, sizeof why), "round trip: %s", why);
    /* file info */
    ck_assert_int_eq(q->file.version_major, 1);
    ck_assert_int_eq(q->file.version_minor, 4); /* the least minor that holds the content: 1.5 adds windows only */
    ck_assert_uint_eq(q->file.file_size, n1);
    const uint64_t req = KV_PLAN_FEAT_HIGGS | KV_PLAN_FEAT_PREDICTOR | KV_PLAN_FEAT_SHARED_CODES |
                         KV_PLAN_FEAT_SQUAT | KV_PLAN_FEAT_PRUNING | KV_PLAN_FEAT_PACK3_11 |
                         (o->compress ? KV_PLAN_FEAT_ZLIB : 0);
    ck_assert_uint_eq(q->file.required_features, req);
    ck_assert_uint_eq(q->file.optional_features, KV_PLAN_OPT_REPORT | KV_PLAN_OPT_SQUAT_BASIS | KV_PLAN_OPT_PROVENANCE);
    ck_assert_int_eq(q->file.n_sections, 8);
    static const char *tags[8] = {"FPRT", "GLOB", "GRID", "LAYR", "PRED", "SQAT", "PROV", "REPT"};
    int zlib_sections = 0;
    for (int i = 0; i < 8; i++) {
        ck_assert_str_eq(q->file.sections[i].tag, tags[i]);
        ck_assert_int_eq(q->file.sections[i].known, 1);
        ck_assert_uint_eq(q->file.sections[i].offset % 64, 0);
        zlib_sections += (q->file.sections[i].flags & KV_PLAN_SECTION_ZLIB) != 0;
    }
    ck_assert_int_eq(zlib_sections > 0, o->compress != 0);
    /* writing what was read gives the same bytes */
    serialize(&b2, &n2, q, o);
    ck_assert_uint_eq(n1, n2);
    ck_assert(memcmp(b1, b2, n1) == 0);
    ck_assert_kv_ok(kv_plan_read_memory(&r, b2, n2));
    ck_assert(plan_equal(q, r, why, sizeof why));
    free(b1);
    free(b2);
    kv_plan_free(p);
    kv_plan_free(q);
    kv_plan_free(r);
}

START_TEST(test_roundtrip_plain) { roundtrip_with(&k_plain); }
END_TEST
START_TEST(test_roundtrip_zlib) { roundtrip_with(&k_zlib); }
END_TEST

/* A minimal plan (every stream full precision, no grids, predictors, report) round-trips too. */
START_TEST(test_roundtrip_minimal) {
    kv_plan_fingerprint fp;
    plan_sample_fingerprint(&fp);
    kv_plan *p = NULL, *q = NULL;
    ck_assert_kv_ok(kv_plan_create(&p, &fp));
    uint8_t *b = NULL;
    size_t n = 0;
    serialize(&b, &n, p, NULL);
    ck_assert_kv_ok(kv_plan_read_memory(&q, b, n));
    char why[256];
    ck_assert_msg(plan_equal(p, q, why, sizeof why), "%s", why);
    ck_assert_int_eq(q->file.n_sections, 4); /* FPRT GLOB LAYR PROV */
    ck_assert_uint_eq(q->file.required_features, 0);
    ck_assert_int_eq(q->layers[2].stream[KV_PLAN_V].method, KV_PLAN_FP);
    ck_assert_int_eq(q->layers[2].stream[KV_PLAN_V].bits, 16);
    ck_assert_int_eq(q->global.sinks, 4);
    ck_assert_int_eq(q->global.recent, 128);
    free(b);
    kv_plan_free(p);
    kv_plan_free(q);
}
END_TEST

/* Deterministic bytes: the same plan twice, and every padding byte zero. */
START_TEST(test_deterministic_padding) {
    kv_plan *p = sample();
    uint8_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    serialize(&a, &na, p, &k_zlib);
    serialize(&b, &nb, p, &k_zlib);
    ck_assert_uint_eq(na, nb);
    ck_assert(memcmp(a, b, na) == 0);
    /* mark every byte the header, table and payloads cover; the rest must be zero */
    uint8_t *covered = calloc(na, 1);
    const uint32_t ns = kv_load_u32le(a + 20);
    memset(covered, 1, 64 + (size_t)ns * 40);
    for (uint32_t i = 0; i < ns; i++) {
        const uint8_t *e = a + 64 + 40 * i;
        memset(covered + kv_load_u64le(e + 8), 1, (size_t)kv_load_u64le(e + 16));
    }
    for (size_t i = 0; i < na; i++)
        if (!covered[i]) ck_assert_msg(a[i] == 0, "padding byte %zu is 0x%02x", i, a[i]);
    free(covered);
    free(a);
    free(b);
    kv_plan_free(p);
}
END_TEST

/* Atomic file write: the file appears whole, no temporary stays; a failed write leaves nothing. */
START_TEST(test_write_file_atomic) {
    char dir[256];
    kv_test_tmpdir(dir, sizeof dir);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[512];
    snprintf(path, sizeof path, "%s/a.kvplan", dir);
    kv_plan *p = sample(), *q = NULL;
    ck_assert_kv_ok(kv_plan_write(p, path, NULL));
    ck_assert_kv_ok(kv_plan_read(&q, path));
    char why[256];
    ck_assert_msg(plan_equal(p, q, why, sizeof why), "%s", why);
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int entries = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') {
            entries++;
            ck_assert_str_eq(e->d_name, "a.kvplan");
        }
    closedir(d);
    ck_assert_int_eq(entries, 1);
    snprintf(path, sizeof path, "%s/missing/b.kvplan", dir);
    kv_status s = kv_plan_write(p, path, NULL);
    ck_assert_int_eq(s, KV_EIO);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "b.kvplan"));
    /* an invalid plan is refused before anything is written */
    snprintf(path, sizeof path, "%s/c.kvplan", dir);
    p->layers[0].stream[KV_PLAN_V].higgs_grid = 9;
    ck_assert_int_eq(kv_plan_write(p, path, NULL), KV_EFORMAT);
    ck_assert_int_eq(access(path, F_OK), -1);
    snprintf(path, sizeof path, "%s/a.kvplan", dir);
    unlink(path);
    rmdir(dir);
    kv_plan_free(p);
    kv_plan_free(q);
}
END_TEST

/* ---- golden v1.0 ------------------------------------------------------------------------------ */
/* tests/plan/golden/v<version>.kvplan, under KVCAL_TEST_SRC when set */
static void golden_path(char *out, size_t n, const char *version) {
    const char *src = getenv("KVCAL_TEST_SRC");
    snprintf(out, n, "%s/plan/golden/v%s.kvplan", src && *src ? src : "tests", version);
}

/* Every later reader must accept this file and find these values (written once by
 * `test_plan --write-golden`, never regenerated). */
START_TEST(test_golden_v1_0) {
    char path[1024];
    golden_path(path, sizeof path, "1.0");
    kv_plan *p = NULL;
    ck_assert_kv_ok(kv_plan_read(&p, path));
    ck_assert_int_eq(p->file.version_major, 1);
    ck_assert_int_eq(p->file.version_minor, 0);
    ck_assert(p->file.required_features & KV_PLAN_FEAT_ZLIB); /* a compressed section is frozen too */
    const kv_plan_fingerprint *f = &p->fingerprint;
    ck_assert_str_eq(f->arch, "llama");
    ck_assert_int_eq(f->n_layers, 3);
    ck_assert_int_eq(f->d_model, 32);
    ck_assert_int_eq(f->n_heads, 4);
    ck_assert_int_eq(f->n_kv_heads, 2);
    ck_assert_int_eq(f->head_dim, 4);
    ck_assert_int_eq(f->vocab_size, 100);
    ck_assert(f->rope_theta == 10000.0f);
    ck_assert_uint_eq(f->kv_sha256[0], 0xA0);
    ck_assert_uint_eq(f->kv_sha256[31], 0xBF);
    ck_assert_int_eq(p->global.sinks, 4);
    ck_assert_int_eq(p->global.recent, 96);
    ck_assert_int_eq(p->global.prune_method, KV_PLAN_PRUNE_SNAPKV);
    ck_assert(p->global.prune_budget == 0.25f);
    ck_assert_int_eq(p->global.prune_window, 16);
    ck_assert_int_eq(p->global.prune_pool, 5);
    ck_assert_uint_eq(p->global.rht_seed, 0x0123456789ABCDEFull);
    ck_assert_int_eq(p->n_grids, 2);
    ck_assert_int_eq(p->grids[0].d, 2);
    ck_assert_int_eq(p->grids[0].n, 16);
    ck_assert(p->grids[0].points[0] == -1.0f);  /* (0*7 % 33 - 16) / 16 */
    ck_assert(p->grids[0].points[31] == 0.1875f); /* (217 % 33 - 16) / 16 */
    ck_assert(p->grids[1].points[3] == 1.5f);
    const kv_plan_stream *k0 = &p->layers[0].stream[KV_PLAN_K], *v0 = &p->layers[0].stream[KV_PLAN_V];
    ck_assert_int_eq(k0->method, KV_PLAN_HIGGS);
    ck_assert_int_eq(k0->higgs_grid, 0);
    ck_assert_int_eq(k0->group_size, 8);
    ck_assert_int_eq(k0->pre_rope, 1);
    ck_assert_int_eq(v0->higgs_grid, 1);
    ck_assert_int_eq(v0->scale_dtype, KV_DTYPE_F16);
    const kv_plan_stream *k1 = &p->layers[1].stream[KV_PLAN_K], *v1 = &p->layers[1].stream[KV_PLAN_V];
    ck_assert_int_eq(k1->method, KV_PLAN_UNIFORM);
    ck_assert_int_eq(k1->bits, 3);
    ck_assert_int_eq(k1->group_size, 32);
    ck_assert_int_eq(k1->group_axis, KV_PLAN_GROUP_TOKENS);
    ck_assert_int_eq(k1->pack, KV_PLAN_PACK_3BIT_11);
    ck_assert(k1->eta == 0.05f);
    ck_assert(k1->rpc_ratio == 0.2f);
    ck_assert_ptr_nonnull(k1->predictor);
    ck_assert_int_eq(k1->predictor->n_inputs, 1);
    ck_assert_int_eq(k1->predictor->inputs[0].layer, 0);
    ck_assert_int_eq(k1->predictor->inputs[0].stream, KV_PLAN_K);
    ck_assert_int_eq(k1->predictor->out_dim, 8);
    ck_assert_int_eq(k1->predictor->in_dim, 8);
    ck_assert(k1->predictor->weight[0] == 1.0f);
    ck_assert(k1->predictor->bias[7] == 7.0f / 32.0f);
    ck_assert_ptr_nonnull(k1->squat);
    ck_assert_int_eq(k1->squat->r, 2);
    ck_assert_int_eq(k1->squat->g, 2);
    ck_assert(k1->squat->lambda == 1e-3f);
    ck_assert_ptr_nonnull(k1->squat->basis);
    ck_assert(k1->squat->basis[0] == (float)((5 * 7) % 33 - 16) / 16.0f);
    ck_assert_int_eq(v1->predictor->n_inputs, 2);
    ck_assert_int_eq(v1->predictor->inputs[0].layer, 0);
    ck_assert_int_eq(v1->predictor->inputs[0].stream, KV_PLAN_V);
    ck_assert_int_eq(v1->predictor->inputs[1].layer, 1);
    ck_assert_int_eq(v1->predictor->inputs[1].stream, KV_PLAN_K);
    ck_assert_int_eq(v1->predictor->in_dim, 16);
    ck_assert(v1->eta == 0.125f);
    ck_assert(p->layers[1].prune_budget == 0.5f);
    ck_assert_int_eq(p->layers[2].stream[KV_PLAN_K].share_codes_with_layer, 1);
    ck_assert_int_eq(p->layers[2].stream[KV_PLAN_V].method, KV_PLAN_FP);
    ck_assert_int_eq(p->layers[2].stream[KV_PLAN_V].bits, 16);
    ck_assert_str_eq(p->provenance.tool_version, "kvcal 0.1.0");
    ck_assert_str_eq(p->provenance.git_hash, "0123456789abcdef0123456789abcdef01234567");
    ck_assert_uint_eq(p->provenance.seed, 42);
    ck_assert_int_eq(p->provenance.created, 1700000000);
    ck_assert_ptr_nonnull(strstr(p->provenance.config_yaml, "max_tokens: 262144\n"));
    ck_assert_int_eq(p->report.n_metrics, 3);
    ck_assert_str_eq(p->report.names[2], "quant_rel_err");
    ck_assert(isnan(p->report.values[0]));
    ck_assert(p->report.values[17] == 17.0f / 64.0f);
    /* and it is the content the sample builder makes today */
    kv_plan *s = sample();
    char why[256];
    ck_assert_msg(plan_equal(p, s, why, sizeof why), "golden vs sample: %s", why);
    kv_plan_free(s);
    kv_plan_free(p);
}
END_TEST

/* ---- the corrupt-plan list -------------------------------------------------------------------- */
typedef struct corrupt_case {
    const char *name;
    void (*mutate)(uint8_t **buf, size_t *n);
    kv_status want;
    const char *message; /* substring of kv_error_last() */
} corrupt_case;

static void set_u64_fix(uint8_t *b, size_t n, size_t at, uint64_t v) {
    kv_store_u64le(b + at, v);
    plan_bytes_repair_crcs(b, n);
}

static void m_bad_magic(uint8_t **b, size_t *n) { (*b)[1] = 'X'; }
static void m_future_major(uint8_t **b, size_t *n) {
    kv_store_u16le(*b + 8, 2);
    kv_store_u16le(*b + 10, 0);
    plan_bytes_repair_crcs(*b, *n);
}
static void m_unknown_required(uint8_t **b, size_t *n) {
    set_u64_fix(*b, *n, 32, kv_load_u64le(*b + 32) | (1ull << 40));
}
static void m_truncated(uint8_t **b, size_t *n) { *n -= 100; }
static void m_truncated_header(uint8_t **b, size_t *n) { *n = 10; }
static void m_bad_header_crc(uint8_t **b, size_t *n) { (*b)[40] ^= 0x80; } /* optional features, CRC not fixed */
static void m_bad_table_crc(uint8_t **b, size_t *n) {
    (*b)[64 + 36] ^= 1; /* a reserved field of entry 0, table CRC not fixed */
}
static void m_bad_section_crc(uint8_t **b, size_t *n) {
    const size_t e = plan_bytes_entry(*b, "LAYR");
    (*b)[kv_load_u64le(*b + e + 8) + 12] ^= 0x01;
}
static void m_section_past_end(uint8_t **b, size_t *n) {
    const size_t e = plan_bytes_entry(*b, "PRED");
    kv_store_u64le(*b + e + 16, *n);
    kv_store_u64le(*b + e + 24, *n);
    plan_bytes_repair_crcs(*b, *n);
}
static void m_overlap(uint8_t **b, size_t *n) {
    const size_t e = plan_bytes_entry(*b, "LAYR"), e2 = plan_bytes_entry(*b, "PRED");
    kv_store_u64le(*b + e2 + 8, kv_load_u64le(*b + e + 8) + 64); /* LAYR is 320 bytes */
    plan_bytes_repair_crcs(*b, *n);
}
static void m_out_of_order(uint8_t **b, size_t *n) {
    const size_t e = plan_bytes_entry(*b, "FPRT"), e2 = plan_bytes_entry(*b, "GLOB");
    kv_store_u64le(*b + e2 + 8, kv_load_u64le(*b + e + 8) - 64);
    plan_bytes_repair_crcs(*b, *n);
}
static void m_misaligned(uint8_t **b, size_t *n) {
    const size_t e = plan_bytes_entry(*b, "GLOB");
    kv_store_u64le(*b + e + 8, kv_load_u64le(*b + e + 8) + 4);
    plan_bytes_repair_crcs(*b, *n);
}
static void m_absurd_sections(uint8_t **b, size_t *n) {
    kv_store_u32le(*b + 20, 1000000);
    plan_bytes_repair_crcs(*b, *n);
}
static void m_absurd_layers(uint8_t **b, size_t *n) {
    const size_t e = plan_bytes_entry(*b, "FPRT");
    kv_store_u32le(*b + kv_load_u64le(*b + e + 8), 0xFFFFFFFFu);
    plan_bytes_repair_crcs(*b, *n);
}
static void m_absurd_grid(uint8_t **b, size_t *n) {
    const size_t e = plan_bytes_entry(*b, "GRID");
    kv_store_u32le(*b + kv_load_u64le(*b + e + 8) + 8, 0x40000000u); /* grid 0's n */
    plan_bytes_repair_crcs(*b, *n);
}
static void m_absurd_predictor(uint8_t **b, size_t *n) {
    const size_t e = plan_bytes_entry(*b, "PRED");
    kv_store_u32le(*b + kv_load_u64le(*b + e + 8) + 12, 100000u); /* first predictor's n_inputs */
    plan_bytes_repair_crcs(*b, *n);
}
static void m_absurd_zlib_size(uint8_t **b, size_t *n) {
    const size_t e = plan_bytes_entry(*b, "PROV");
    kv_store_u32le(*b + e + 4, KV_PLAN_SECTION_ZLIB);
    kv_store_u64le(*b + e + 24, 1ull << 40);
    plan_bytes_repair_crcs(*b, *n);
}
static void m_bad_enum(uint8_t **b, size_t *n) {
    const size_t e = plan_bytes_entry(*b, "LAYR");
    kv_store_u32le(*b + kv_load_u64le(*b + e + 8) + 8 + 8, 7); /* layer 0 K method */
    plan_bytes_repair_crcs(*b, *n);
}
static void m_bad_rule(uint8_t **b, size_t *n) {
    const size_t e = plan_bytes_entry(*b, "LAYR");
    /* layer 1 K eta (record 1 at 8 + 104, stream K at +8, eta at +20) = 0.75 */
    kv_store_f32le(*b + kv_load_u64le(*b + e + 8) + 8 + 104 + 8 + 20, 0.75f);
    plan_bytes_repair_crcs(*b, *n);
}
static void m_bad_crossref(uint8_t **b, size_t *n) {
    const size_t e = plan_bytes_entry(*b, "LAYR");
    /* layer 1 K shares codes with layer 2 (not earlier) */
    kv_store_u32le(*b + kv_load_u64le(*b + e + 8) + 8 + 104 + 8 + 28, 2);
    plan_bytes_repair_crcs(*b, *n);
}
/* Stream fields of layer l (records at LAYR + 8 + 104 l; K at +8, V at +56): XQuant's rules (§6.4). */
static size_t stream_at(const uint8_t *b, int l, int st) {
    return kv_load_u64le(b + plan_bytes_entry(b, "LAYR") + 8) + 8 + 104 * (size_t)l + (st ? 56 : 8);
}
static void m_share_not_previous(uint8_t **b, size_t *n) {
    kv_store_u32le(*b + stream_at(*b, 2, 0) + 28, 0); /* layer 2 K shares with layer 0 */
    plan_bytes_repair_crcs(*b, *n);
}
static void m_share_bits(uint8_t **b, size_t *n) {
    /* layer 2 K: 2-bit codes packed per word, sharing layer 1's 3-bit codes */
    kv_store_u32le(*b + stream_at(*b, 2, 0) + 4, 2);
    kv_store_u32le(*b + stream_at(*b, 2, 0) + 24, 0);
    plan_bytes_repair_crcs(*b, *n);
}
static void m_share_group(uint8_t **b, size_t *n) {
    kv_store_u32le(*b + stream_at(*b, 2, 0) + 8, 16); /* layer 2 K group_size 16, layer 1's is 32 */
    plan_bytes_repair_crcs(*b, *n);
}
static void m_share_axis(uint8_t **b, size_t *n) {
    kv_store_u32le(*b + stream_at(*b, 2, 0) + 12, 1); /* layer 2 K groups channels, layer 1's tokens */
    plan_bytes_repair_crcs(*b, *n);
}
static void m_one_bit_pack(uint8_t **b, size_t *n) {
    /* layer 1 V: 1-bit codes with the 11-per-word 3-bit packing */
    kv_store_u32le(*b + stream_at(*b, 1, 1) + 4, 1);
    kv_store_u32le(*b + stream_at(*b, 1, 1) + 24, 1);
    plan_bytes_repair_crcs(*b, *n);
}
static void m_eta_negative(uint8_t **b, size_t *n) {
    kv_store_f32le(*b + stream_at(*b, 1, 1) + 20, -0.01f); /* layer 1 V eta */
    plan_bytes_repair_crcs(*b, *n);
}
static void m_undeclared_feature(uint8_t **b, size_t *n) {
    set_u64_fix(*b, *n, 32, kv_load_u64le(*b + 32) & ~KV_PLAN_FEAT_HIGGS);
}
static void m_unknown_required_section(uint8_t **b, size_t *n) {
    const size_t e = plan_bytes_entry(*b, "PROV");
    memcpy(*b + e, "XTRA", 4);
    kv_store_u32le(*b + e + 4, KV_PLAN_SECTION_REQUIRED);
    plan_bytes_repair_crcs(*b, *n);
}
static void m_missing_section(uint8_t **b, size_t *n) {
    const size_t e = plan_bytes_entry(*b, "GLOB");
    memcpy(*b + e, "GLOX", 4);
    kv_store_u32le(*b + e + 4, 0); /* now an unknown optional section: skipped */
    plan_bytes_repair_crcs(*b, *n);
}
static void m_duplicate_tag(uint8_t **b, size_t *n) {
    const size_t e = plan_bytes_entry(*b, "GLOB");
    memcpy(*b + e, "FPRT", 4);
    plan_bytes_repair_crcs(*b, *n);
}
static void m_big_endian(uint8_t **b, size_t *n) {
    (*b)[16] = 0x0A, (*b)[17] = 0x0B, (*b)[18] = 0x0C, (*b)[19] = 0x0D;
    plan_bytes_repair_crcs(*b, *n);
}
static void m_trailing(uint8_t **b, size_t *n) {
    uint8_t *nb = realloc(*b, *n + 64);
    if (!nb) abort(); /* no ck_assert here: mutators also run outside the test runner (--write-corpus) */
    memset(nb + *n, 0, 64);
    *b = nb;
    *n += 64;
}
static void m_zlib_garbage(uint8_t **b, size_t *n) {
    const size_t e = plan_bytes_entry(*b, "PRED");
    if (!(kv_load_u32le(*b + e + 4) & KV_PLAN_SECTION_ZLIB)) abort();
    (*b)[kv_load_u64le(*b + e + 8) + 20] ^= 0x55;
    plan_bytes_repair_crcs(*b, *n);
}
static void m_section_tail(uint8_t **b, size_t *n) {
    /* GLOB claims 4 more bytes (the zero padding after it) */
    const size_t e = plan_bytes_entry(*b, "GLOB");
    kv_store_u64le(*b + e + 16, kv_load_u64le(*b + e + 16) + 4);
    kv_store_u64le(*b + e + 24, kv_load_u64le(*b + e + 24) + 4);
    plan_bytes_repair_crcs(*b, *n);
}
static void m_flag_without_data(uint8_t **b, size_t *n) {
    const size_t e = plan_bytes_entry(*b, "LAYR");
    /* layer 0 V gets the PREDICTOR flag (flags at stream +36; V at record +56) */
    const size_t at = kv_load_u64le(*b + e + 8) + 8 + 56 + 36;
    kv_store_u32le(*b + at, kv_load_u32le(*b + at) | 0x2u);
    plan_bytes_repair_crcs(*b, *n);
}

/* The SQAT entry of layer 1 K (the sample's only one): u32 n_entries, then layer, stream, r, lambda,
 * g, has_basis, basis[2 x r x 4] (§6.6). */
static size_t sqat_at(const uint8_t *b) { return kv_load_u64le(b + plan_bytes_entry(b, "SQAT") + 8) + 4; }
static void m_squat_r(uint8_t **b, size_t *n) {
    kv_store_u32le(*b + sqat_at(*b) + 8, 5); /* head_dim is 4 */
    plan_bytes_repair_crcs(*b, *n);
}
static void m_squat_lambda(uint8_t **b, size_t *n) {
    kv_store_f32le(*b + sqat_at(*b) + 12, -1e-3f);
    plan_bytes_repair_crcs(*b, *n);
}
static void m_squat_g(uint8_t **b, size_t *n) {
    kv_store_u32le(*b + sqat_at(*b) + 16, 3);
    plan_bytes_repair_crcs(*b, *n);
}
static void m_squat_basis_short(uint8_t **b, size_t *n) {
    kv_store_u32le(*b + sqat_at(*b) + 8, 3); /* r 3: 24 floats, the section holds 16 */
    plan_bytes_repair_crcs(*b, *n);
}
static void m_squat_basis_long(uint8_t **b, size_t *n) {
    kv_store_u32le(*b + sqat_at(*b) + 8, 1); /* r 1: 8 floats, the section holds 16 */
    plan_bytes_repair_crcs(*b, *n);
}
static void m_squat_static_no_basis(uint8_t **b, size_t *n) {
    /* layer 1 K gets SQUAT_STATIC (flags at stream +36; K at record +8), its basis is dropped, and the
     * header declares the feature: only the missing basis is wrong */
    const size_t e = plan_bytes_entry(*b, "LAYR");
    const size_t at = kv_load_u64le(*b + e + 8) + 8 + 104 + 8 + 36;
    kv_store_u32le(*b + at, kv_load_u32le(*b + at) | 0x10u);
    kv_store_u32le(*b + sqat_at(*b) + 20, 0);
    memset(*b + sqat_at(*b) + 24, 0, 2 * 2 * 4 * sizeof(float)); /* padding is zero (§1) */
    const size_t es = plan_bytes_entry(*b, "SQAT");
    kv_store_u64le(*b + es + 16, 4 + 24);
    kv_store_u64le(*b + es + 24, 4 + 24);
    kv_store_u64le(*b + 32, kv_load_u64le(*b + 32) | KV_PLAN_FEAT_SQUAT_STATIC);
    plan_bytes_repair_crcs(*b, *n);
}
static void m_squat_static_without_squat(uint8_t **b, size_t *n) {
    const size_t at = kv_load_u64le(*b + plan_bytes_entry(*b, "LAYR") + 8) + 8 + 8 + 36; /* layer 0 K */
    kv_store_u32le(*b + at, kv_load_u32le(*b + at) | 0x10u);
    plan_bytes_repair_crcs(*b, *n);
}

static void m_pred_f16_without_predictor(uint8_t **b, size_t *n) {
    const size_t at = kv_load_u64le(*b + plan_bytes_entry(*b, "LAYR") + 8) + 8 + 8 + 36; /* layer 0 K */
    kv_store_u32le(*b + at, kv_load_u32le(*b + at) | 0x20u);
    plan_bytes_repair_crcs(*b, *n);
}

static const corrupt_case k_corrupt[] = {
    {"bad magic", m_bad_magic, KV_EFORMAT, "bad magic"},
    {"future major", m_future_major, KV_EVERSION, "version 2.0 is newer than this reader"},
    {"unknown required feature", m_unknown_required, KV_EVERSION, "requires features 0x10000000000 unknown"},
    {"truncated", m_truncated, KV_EFORMAT, "truncated: the header says"},
    {"truncated header", m_truncated_header, KV_EFORMAT, "smaller than the 64-byte header"},
    {"bad header CRC", m_bad_header_crc, KV_ECHECKSUM, "header CRC mismatch"},
    {"bad table CRC", m_bad_table_crc, KV_ECHECKSUM, "section table CRC mismatch"},
    {"bad section CRC", m_bad_section_crc, KV_ECHECKSUM, "section 'LAYR' CRC mismatch"},
    {"section past the end", m_section_past_end, KV_EFORMAT, "extends past the end of the file"},
    {"overlapping sections", m_overlap, KV_EFORMAT, "overlaps section 'LAYR'"},
    {"sections out of order", m_out_of_order, KV_EFORMAT, "overlaps the header or the section table"},
    {"misaligned section", m_misaligned, KV_EFORMAT, "is not a multiple of 64"},
    {"absurd section count", m_absurd_sections, KV_EFORMAT, "section_count 1000000 out of range"},
    {"absurd layer count", m_absurd_layers, KV_EFORMAT, "n_layers = 4294967295 out of range"},
    {"absurd grid size", m_absurd_grid, KV_EFORMAT, "grid n = 1073741824 out of range"},
    {"absurd predictor inputs", m_absurd_predictor, KV_EFORMAT, "predictor n_inputs = 100000 out of range"},
    {"absurd inflated size", m_absurd_zlib_size, KV_EFORMAT, "is impossible for"},
    {"bad enum", m_bad_enum, KV_EFORMAT, "stream method = 7 out of range"},
    {"bad eta", m_bad_rule, KV_EFORMAT, "layer 1 K: eta 0.75 out of range"},
    {"bad cross reference", m_bad_crossref, KV_EFORMAT, "share_codes_with_layer 2 is not an earlier layer"},
    {"shared codes not from the previous layer", m_share_not_previous, KV_EFORMAT,
     "layer 2 K: share_codes_with_layer 0 is not the previous layer 1"},
    {"shared codes of another bit width", m_share_bits, KV_EFORMAT,
     "layer 2 K: shares codes with layer 1, whose K stream has 3-bit codes, not 2"},
    {"shared codes of another group size", m_share_group, KV_EFORMAT,
     "layer 2 K: shares codes with layer 1, whose K stream has another group layout (group_size 32 axis 0, here 16"},
    {"shared codes of another group axis", m_share_axis, KV_EFORMAT,
     "whose K stream has another group layout (group_size 32 axis 0, here 32 axis 1)"},
    {"1-bit codes packed 11 per word", m_one_bit_pack, KV_EFORMAT,
     "layer 1 V: 1-bit codes are packed 32 per word (pack 0); pack 1 is not supported"},
    {"negative eta", m_eta_negative, KV_EFORMAT, "layer 1 V: eta -0.01 out of range [0, 0.5)"},
    {"undeclared feature", m_undeclared_feature, KV_EFORMAT, "uses feature HIGGS but the header does not declare it"},
    {"unknown required section", m_unknown_required_section, KV_EVERSION, "required section 'XTRA' is unknown"},
    {"missing required section", m_missing_section, KV_EFORMAT, "missing required section 'GLOB'"},
    {"duplicate section", m_duplicate_tag, KV_EFORMAT, "section 'FPRT' appears twice"},
    {"big-endian", m_big_endian, KV_EFORMAT, "big-endian"},
    {"trailing bytes", m_trailing, KV_EFORMAT, "unexpected bytes after the end of the plan"},
    {"section tail", m_section_tail, KV_EFORMAT, "section 'GLOB' has 4 unexpected bytes"},
    {"flag without data", m_flag_without_data, KV_EFORMAT, "predictors but 3 streams have the PREDICTOR flag"},
    {"SQuat r above head_dim", m_squat_r, KV_EFORMAT, "layer 1 K: SQuat r 5 out of range [1, head_dim 4]"},
    {"SQuat lambda below 0", m_squat_lambda, KV_EFORMAT, "layer 1 K: SQuat lambda -0.001 must be >= 0"},
    {"SQuat g not dividing head_dim", m_squat_g, KV_EFORMAT, "layer 1 K: SQuat g 3 does not divide head_dim 4"},
    {"SQuat basis too small for r", m_squat_basis_short, KV_EFORMAT,
     "layer 1 K: the SQuat basis needs 2 x 3 x 4 floats (n_kv_heads x r x head_dim), the section has 64 bytes left"},
    {"SQuat basis too large for r", m_squat_basis_long, KV_EFORMAT,
     "section 'SQAT' has 32 bytes after its last entry: a SQuat basis is not n_kv_heads x r x head_dim floats"},
    {"SQuat static subspace without a basis", m_squat_static_no_basis, KV_EFORMAT,
     "layer 1 K: SQuat with a static subspace but no stored basis"},
    {"SQUAT_STATIC without SQuat", m_squat_static_without_squat, KV_EFORMAT,
     "layer 0 K: SQUAT_STATIC flag without the SQUAT flag"},
    {"PRED_F16 without a predictor", m_pred_f16_without_predictor, KV_EFORMAT,
     "layer 0 K: PRED_F16 flag without the PREDICTOR flag"},
};
enum { N_CORRUPT = sizeof k_corrupt / sizeof *k_corrupt };
/* The compressed-only case (its mutation needs a ZLIB section). */
static const corrupt_case k_corrupt_zlib = {"zlib garbage", m_zlib_garbage, KV_EFORMAT, "zlib stream is invalid"};

static void run_corrupt(const corrupt_case *c, const kv_plan_write_options *o) {
    kv_plan *p = sample(), *q = (kv_plan *)1;
    uint8_t *b = NULL;
    size_t n = 0;
    serialize(&b, &n, p, o);
    c->mutate(&b, &n);
    kv_error_clear();
    kv_status s = kv_plan_read_memory(&q, b, n);
    ck_assert_msg(s == c->want, "%s: got %s (%s), want %s", c->name, kv_status_name(s), kv_error_last(),
                  kv_status_name(c->want));
    ck_assert_ptr_null(q);
    ck_assert_msg(strstr(kv_error_last(), c->message) != NULL, "%s: message '%s' lacks '%s'", c->name,
                  kv_error_last(), c->message);
    free(b);
    kv_plan_free(p);
}

START_TEST(test_corrupt_list) { run_corrupt(&k_corrupt[_i], &k_plain); }
END_TEST

START_TEST(test_corrupt_zlib) { run_corrupt(&k_corrupt_zlib, &k_zlib); }
END_TEST

/* Every corrupt case also fails on disk, with the path in the message. */
START_TEST(test_corrupt_file_message) {
    char dir[256], path[512];
    kv_test_tmpdir(dir, sizeof dir);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/bad.kvplan", dir);
    kv_plan *p = sample(), *q = NULL;
    uint8_t *b = NULL;
    size_t n = 0;
    serialize(&b, &n, p, &k_plain);
    m_future_major(&b, &n);
    ck_assert_kv_ok(kv_write_file_atomic(path, b, n));
    ck_assert_int_eq(kv_plan_read(&q, path), KV_EVERSION);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "bad.kvplan"));
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "upgrade kvcal"));
    snprintf(path, sizeof path, "%s/none.kvplan", dir);
    ck_assert_int_eq(kv_plan_read(&q, path), KV_EIO);
    snprintf(path, sizeof path, "%s/bad.kvplan", dir);
    unlink(path);
    rmdir(dir);
    free(b);
    kv_plan_free(p);
}
END_TEST

/* Every prefix of a plan fails cleanly, and so does every single-byte change: the CRCs cover the
 * header, the table and the payloads, and the reader requires zero padding everywhere else. */
START_TEST(test_every_truncation_and_flip) {
    kv_plan *p = sample();
    uint8_t *b = NULL;
    size_t n = 0;
    serialize(&b, &n, p, _i ? &k_zlib : &k_plain);
    for (size_t len = 0; len < n; len++) {
        kv_plan *q = NULL;
        kv_status s = kv_plan_read_memory(&q, b, len);
        ck_assert_msg(s == KV_EFORMAT, "prefix %zu: %s", len, kv_status_name(s));
        ck_assert_ptr_null(q);
    }
    uint8_t *c = malloc(n);
    int accepted = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(c, b, n);
        c[i] ^= (uint8_t)((0x5A + i) % 255 + 1); /* never 0: every flip changes the byte */
        kv_plan *q = NULL;
        kv_status s = kv_plan_read_memory(&q, c, n);
        accepted += s == KV_OK;
        ck_assert_msg(s == KV_EFORMAT || s == KV_ECHECKSUM || s == KV_EVERSION || s == KV_OK, "byte %zu: %s", i,
                      kv_status_name(s));
        kv_plan_free(q);
    }
    ck_assert_int_eq(accepted, 0);
    free(c);
    free(b);
    kv_plan_free(p);
}
END_TEST

/* ---- forward compatibility ---------------------------------------------------------------------- */
START_TEST(test_newer_minor_and_unknown_optional) {
    kv_plan *p = sample(), *q = NULL;
    uint8_t *b = NULL;
    size_t n = 0;
    serialize(&b, &n, p, &k_plain);
    /* a newer minor of the same major is read */
    kv_store_u16le(b + 10, 7);
    plan_bytes_repair_crcs(b, n);
    ck_assert_kv_ok(kv_plan_read_memory(&q, b, n));
    ck_assert_int_eq(q->file.version_minor, 7);
    kv_plan_free(q);
    /* unknown optional bits and an unknown optional section are skipped */
    kv_store_u64le(b + 40, kv_load_u64le(b + 40) | (1ull << 50));
    const size_t e = plan_bytes_entry(b, "REPT");
    memcpy(b + e, "ZZZZ", 4);
    plan_bytes_repair_crcs(b, n);
    ck_assert_kv_ok(kv_plan_read_memory(&q, b, n));
    ck_assert_int_eq(q->report.n_metrics, 0);
    ck_assert_str_eq(q->file.sections[7].tag, "ZZZZ");
    ck_assert_int_eq(q->file.sections[7].known, 0);
    /* the dump lists the skipped section */
    char *text = NULL;
    ck_assert_kv_ok(kv_plan_dump(&text, q, 0, 0));
    ck_assert_ptr_nonnull(strstr(text, "ZZZZ"));
    ck_assert_ptr_nonnull(strstr(text, "bit50"));
    free(text);
    kv_plan_free(q);
    /* a section with an unknown flag bit: skipped when optional ... */
    kv_store_u32le(b + e + 4, 0x100u);
    plan_bytes_repair_crcs(b, n);
    ck_assert_kv_ok(kv_plan_read_memory(&q, b, n));
    kv_plan_free(q);
    /* ... rejected when required */
    kv_store_u32le(b + e + 4, 0x100u | KV_PLAN_SECTION_REQUIRED);
    plan_bytes_repair_crcs(b, n);
    ck_assert_int_eq(kv_plan_read_memory(&q, b, n), KV_EVERSION);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "flags 0x100 unknown"));
    free(b);
    kv_plan_free(p);
}
END_TEST

/* ---- fingerprint ------------------------------------------------------------------------------ */
START_TEST(test_wrong_model) {
    kv_plan *p = sample();
    kv_plan_fingerprint m;
    plan_sample_fingerprint(&m);
    ck_assert_kv_ok(kv_plan_check_fingerprint(p, &m));
    kv_plan_fingerprint f;
    f = m, f.n_layers = 30;
    ck_assert_int_eq(kv_plan_check_fingerprint(p, &f), KV_EMISMATCH);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "n_layers 3 in the plan, 30 in the model"));
    f = m, strcpy(f.arch, "qwen2");
    ck_assert_int_eq(kv_plan_check_fingerprint(p, &f), KV_EMISMATCH);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "arch 'llama' in the plan, 'qwen2' in the model"));
    f = m, f.head_dim = 8;
    ck_assert_int_eq(kv_plan_check_fingerprint(p, &f), KV_EMISMATCH);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "head_dim"));
    f = m, f.vocab_size = 101;
    ck_assert_int_eq(kv_plan_check_fingerprint(p, &f), KV_EMISMATCH);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "vocab_size"));
    f = m, f.rope_theta = 500000.0f;
    ck_assert_int_eq(kv_plan_check_fingerprint(p, &f), KV_EMISMATCH);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "rope_theta"));
    f = m, f.kv_sha256[17] ^= 1;
    ck_assert_int_eq(kv_plan_check_fingerprint(p, &f), KV_EMISMATCH);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "K/V projection weights differ"));
    kv_plan_free(p);
}
END_TEST

/* ---- validation of in-memory plans (the writer refuses them) -------------------------------------- */
typedef struct invalid_case {
    const char *name;
    void (*edit)(kv_plan *p);
    const char *message;
} invalid_case;

static void i_eta(kv_plan *p) { p->layers[1].stream[KV_PLAN_V].eta = 0.5f; }
static void i_bits(kv_plan *p) { p->layers[1].stream[KV_PLAN_V].bits = 9; }
static void i_fp_bits(kv_plan *p) { p->layers[2].stream[KV_PLAN_V].bits = 8; }
static void i_share_later(kv_plan *p) { p->layers[1].stream[KV_PLAN_K].share_codes_with_layer = 1; }
static void i_share_mismatch(kv_plan *p) { p->layers[2].stream[KV_PLAN_K].group_size = 16; }
static void i_share_pack(kv_plan *p) {
    p->layers[2].stream[KV_PLAN_K].pack = KV_PLAN_PACK_WORD; /* 3-bit codes 10 per word; layer 1 packs 11 */
}
static void i_share_fp(kv_plan *p) { p->layers[2].stream[KV_PLAN_V].share_codes_with_layer = 1; }
static void i_share_higgs(kv_plan *p) {
    p->layers[1].stream[KV_PLAN_K].share_codes_with_layer = 0;
}
static void i_grid(kv_plan *p) { p->layers[0].stream[KV_PLAN_K].higgs_grid = 2; }
static void i_higgs_group(kv_plan *p) { p->layers[0].stream[KV_PLAN_K].group_size = 12; }
static void i_pack(kv_plan *p) { p->layers[1].stream[KV_PLAN_V].pack = KV_PLAN_PACK_3BIT_11; }
static void i_pre_rope_v(kv_plan *p) { p->layers[1].stream[KV_PLAN_V].pre_rope = 1; }
static void i_rpc(kv_plan *p) { p->layers[1].stream[KV_PLAN_K].rpc_ratio = 1.5f; }
static void i_pred_input(kv_plan *p) { p->layers[1].stream[KV_PLAN_K].predictor->inputs[0].layer = 2; }
static void i_pred_nan(kv_plan *p) { p->layers[1].stream[KV_PLAN_V].predictor->bias[3] = NAN; }
static void i_squat_v(kv_plan *p) {
    p->layers[1].stream[KV_PLAN_V].squat = p->layers[1].stream[KV_PLAN_K].squat;
    p->layers[1].stream[KV_PLAN_K].squat = NULL;
}
static void i_squat_static_no_basis(kv_plan *p) {
    kv_plan_squat *q = p->layers[1].stream[KV_PLAN_K].squat;
    free(q->basis);
    q->basis = NULL;
    q->static_subspace = 1;
}
static void i_prune(kv_plan *p) { p->global.prune_budget = 0.0f; }
static void i_layer_prune(kv_plan *p) { p->layers[0].prune_budget = -0.5f; }
static void i_sha(kv_plan *p) {
    free(p->provenance.corpus_sha256);
    p->provenance.corpus_sha256 = strdup("ABC");
}
static void i_metric_dup(kv_plan *p) {
    free(p->report.names[1]);
    p->report.names[1] = strdup("rel_mse");
}
static void i_fp_heads(kv_plan *p) { p->fingerprint.n_kv_heads = 3; }
static void i_report_inf(kv_plan *p) { p->report.values[5] = INFINITY; }
static void i_arch(kv_plan *p) { p->fingerprint.arch[1] = '\n'; }

static const invalid_case k_invalid[] = {
    {"eta 0.5", i_eta, "layer 1 V: eta 0.5 out of range"},
    {"bits 9", i_bits, "layer 1 V: method uniform needs bits in [1, 8], not 9"},
    {"fp bits 8", i_fp_bits, "layer 2 V: method fp needs bits 16 or 32"},
    {"share with itself", i_share_later, "layer 1 K: share_codes_with_layer 1 is not an earlier layer"},
    {"share mismatch", i_share_mismatch, "layer 2 K: shares codes with layer 1, whose K stream has another group layout"},
    {"share packing", i_share_pack, "layer 2 K: shares codes with layer 1, whose K stream packs its codes with pack 1, not 0"},
    {"share on fp", i_share_fp, "layer 2 V: shares codes with layer 1 but is fp"},
    {"share with higgs", i_share_higgs, "layer 1 K: shares codes with layer 0, whose K stream is higgs, not uniform"},
    {"grid index", i_grid, "higgs_grid 2 is not one of the 2 grids"},
    {"higgs group", i_higgs_group, "higgs group_size 12 must be a power of two"},
    {"pack 11 with 2 bits", i_pack, "pack 1 is not valid with 2 bits"},
    {"pre-RoPE values", i_pre_rope_v, "layer 1 V: pre_rope 1"},
    {"rpc ratio", i_rpc, "rpc_ratio 1.5 out of range"},
    {"predictor input from the future", i_pred_input, "is not reconstructed before this stream"},
    {"predictor NaN", i_pred_nan, "predictor has a NaN"},
    {"SQuat on values", i_squat_v, "SQuat needs a uniform K stream"},
    {"SQuat static without basis", i_squat_static_no_basis, "layer 1 K: SQuat with a static subspace but no stored basis"},
    {"prune budget 0", i_prune, "prune_budget 0 out of range"},
    {"layer prune budget", i_layer_prune, "layer 0: prune_budget -0.5"},
    {"corpus sha", i_sha, "corpus_sha256 'ABC' is not 64 lowercase hex digits"},
    {"metric twice", i_metric_dup, "metric 'rel_mse' appears twice"},
    {"kv heads", i_fp_heads, "n_kv_heads 3 must divide n_heads 4"},
    {"report infinity", i_report_inf, "report: value 5 is infinite"},
    {"arch not printable", i_arch, "arch is not printable ASCII"},
};
enum { N_INVALID = sizeof k_invalid / sizeof *k_invalid };

START_TEST(test_invalid_plans) {
    const invalid_case *c = &k_invalid[_i];
    kv_plan *p = sample();
    c->edit(p);
    uint8_t *b = (uint8_t *)1;
    size_t n = 1;
    kv_status s = kv_plan_write_memory(&b, &n, p, NULL);
    ck_assert_msg(s == KV_EFORMAT, "%s: %s", c->name, kv_status_name(s));
    ck_assert_ptr_null(b);
    ck_assert_msg(strstr(kv_error_last(), c->message) != NULL, "%s: '%s' lacks '%s'", c->name, kv_error_last(),
                  c->message);
    kv_plan_free(p);
}
END_TEST

START_TEST(test_setters) {
    kv_plan *p = sample();
    const kv_plan_pred_input bad[1] = {{2, KV_PLAN_K}};
    float w[64] = {0};
    ck_assert_int_eq(kv_plan_set_predictor(p, 1, KV_PLAN_K, 1, bad, w, NULL), KV_EINVAL);
    ck_assert_int_eq(kv_plan_set_predictor(p, 3, KV_PLAN_K, 1, bad, w, NULL), KV_EINVAL);
    ck_assert_int_eq(kv_plan_set_predictor(p, 1, 2, 1, bad, w, NULL), KV_EINVAL);
    const kv_plan_pred_input ok_in[1] = {{0, KV_PLAN_V}};
    ck_assert_kv_ok(kv_plan_set_predictor(p, 2, KV_PLAN_K, 1, ok_in, w, NULL)); /* bias NULL = zeros */
    ck_assert(p->layers[2].stream[KV_PLAN_K].predictor->bias[7] == 0.0f);
    ck_assert_int_eq(kv_plan_set_squat(p, 0, 5, 0.1f, 2, NULL), KV_EINVAL);  /* r > head_dim */
    ck_assert_int_eq(kv_plan_set_squat(p, 0, 2, 0.1f, 3, NULL), KV_EINVAL);  /* g does not divide 4 */
    ck_assert_int_eq(kv_plan_set_squat(p, 0, 2, -1.0f, 2, NULL), KV_EINVAL);
    float pts[4] = {0};
    ck_assert_int_eq(kv_plan_add_grid(p, 0, 4, pts, NULL), KV_EINVAL);
    ck_assert_int_eq(kv_plan_set_report(p, 0, NULL, NULL), KV_OK);
    ck_assert_int_eq(p->report.n_metrics, 0);
    kv_plan_fingerprint fp;
    plan_sample_fingerprint(&fp);
    fp.n_layers = 0;
    kv_plan *q = (kv_plan *)1;
    ck_assert_int_eq(kv_plan_create(&q, &fp), KV_EINVAL);
    ck_assert_ptr_null(q);
    kv_plan_free(NULL);
    kv_plan_free(p);
}
END_TEST

/* ---- bits per value (§9) -------------------------------------------------------------------------- */
START_TEST(test_bits_per_value) {
    kv_plan *p = sample();
    /* HIGGS n=16 d=2: 4-bit indices, 8 per word -> 2 bits/value, + f32 norm / 8 */
    ck_assert_double_eq_tol(kv_plan_stream_bits(p, 0, KV_PLAN_K), 2.0 + 32.0 / 8.0, 1e-12);
    /* HIGGS n=4 d=1: 2 bits, + f16 norm / 4 */
    ck_assert_double_eq_tol(kv_plan_stream_bits(p, 0, KV_PLAN_V), 2.0 + 16.0 / 4.0, 1e-12);
    /* 3 bits 11/word, f16 scale+zero per 32 */
    ck_assert_double_eq_tol(kv_plan_stream_bits(p, 1, KV_PLAN_K), 32.0 / 11.0 + 32.0 / 32.0, 1e-12);
    /* 2 bits, f32 scale+zero per 8 */
    ck_assert_double_eq_tol(kv_plan_stream_bits(p, 1, KV_PLAN_V), 2.0 + 64.0 / 8.0, 1e-12);
    /* shared codes: only the f32 scale+zero per 32 */
    ck_assert_double_eq_tol(kv_plan_stream_bits(p, 2, KV_PLAN_K), 64.0 / 32.0, 1e-12);
    ck_assert_double_eq_tol(kv_plan_stream_bits(p, 2, KV_PLAN_V), 16.0, 1e-12);
    /* 3 bits packed 10/word */
    p->layers[1].stream[KV_PLAN_K].pack = KV_PLAN_PACK_WORD;
    ck_assert_double_eq_tol(kv_plan_stream_bits(p, 1, KV_PLAN_K), 3.2 + 1.0, 1e-12);
    ck_assert_double_eq(kv_plan_stream_bits(p, 5, KV_PLAN_K), 0.0);
    /* predictors: (64 + 8) + (128 + 8) floats */
    ck_assert_uint_eq(kv_plan_predictor_bytes(p), 4u * (72u + 136u));
    kv_plan_free(p);
}
END_TEST

START_TEST(test_creation_time) {
    int64_t t = 0;
    setenv("SOURCE_DATE_EPOCH", "1234567890", 1);
    ck_assert_kv_ok(kv_plan_creation_time(&t));
    ck_assert_int_eq(t, 1234567890);
    setenv("SOURCE_DATE_EPOCH", "12abc", 1);
    ck_assert_int_eq(kv_plan_creation_time(&t), KV_EINVAL);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "SOURCE_DATE_EPOCH"));
    unsetenv("SOURCE_DATE_EPOCH");
    ck_assert_kv_ok(kv_plan_creation_time(&t));
    ck_assert_int_gt(t, 1700000000);
}
END_TEST

/* ---- dumps ---------------------------------------------------------------------------------------- */
START_TEST(test_dump_json) {
    kv_plan *p = sample(), *q = NULL;
    uint8_t *b = NULL;
    size_t n = 0;
    serialize(&b, &n, p, &k_zlib);
    ck_assert_kv_ok(kv_plan_read_memory(&q, b, n));
    char *text = NULL;
    ck_assert_kv_ok(kv_plan_dump(&text, q, 1, 1));
    json_error_t err;
    json_t *root = json_loads(text, 0, &err);
    ck_assert_msg(root != NULL, "JSON: %s at line %d", err.text, err.line);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(root, "fingerprint"), "n_layers")), 3);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(root, "format"), "version")), "1.4");
    json_t *layers = json_object_get(root, "layers");
    ck_assert_uint_eq(json_array_size(layers), 3);
    json_t *k1 = json_object_get(json_array_get(layers, 1), "K");
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(k1, "squat"), "subspace")), "prompt");
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(k1, "record"), "method")), "uniform");
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(k1, "record"), "pack")), "3bit-11");
    ck_assert(json_real_value(json_object_get(json_object_get(k1, "record"), "eta")) == 0.05);
    json_t *w = json_object_get(json_object_get(k1, "predictor"), "weight");
    ck_assert_uint_eq(json_array_size(w), 64);
    ck_assert(json_real_value(json_array_get(w, 0)) == 1.0);
    ck_assert_str_eq(json_string_value(json_array_get(json_object_get(json_object_get(
                         json_object_get(json_array_get(layers, 1), "V"), "predictor"), "inputs"), 1)),
                     "L1.K");
    /* NaN report values are null in JSON */
    json_t *row0 = json_array_get(json_object_get(json_object_get(root, "report"), "rows"), 0);
    ck_assert(json_is_null(json_object_get(row0, "rel_mse")));
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(root, "provenance"), "created_utc")),
                     "2023-11-14T22:13:20Z");
    json_decref(root);
    free(text);
    /* without --full the matrices are summarized */
    ck_assert_kv_ok(kv_plan_dump(&text, q, 1, 0));
    ck_assert_ptr_null(strstr(text, "\"weight\""));
    ck_assert_ptr_nonnull(strstr(text, "\"weight_norm\""));
    free(text);
    free(b);
    kv_plan_free(p);
    kv_plan_free(q);
}
END_TEST

/* YAML: parses, and the provenance config survives as a literal block. */
START_TEST(test_dump_yaml) {
    kv_plan *p = sample();
    char *text = NULL;
    ck_assert_kv_ok(kv_plan_dump(&text, p, 0, 1));
    yaml_parser_t parser;
    yaml_document_t doc;
    ck_assert(yaml_parser_initialize(&parser));
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, strlen(text));
    ck_assert_msg(yaml_parser_load(&parser, &doc), "YAML does not parse: %s\n%s", parser.problem, text);
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    ck_assert_int_eq(root->type, YAML_MAPPING_NODE);
    const char *config = NULL;
    for (yaml_node_pair_t *pr = root->data.mapping.pairs.start; pr < root->data.mapping.pairs.top; pr++) {
        yaml_node_t *k = yaml_document_get_node(&doc, pr->key);
        if (strcmp((char *)k->data.scalar.value, "provenance") != 0) continue;
        yaml_node_t *v = yaml_document_get_node(&doc, pr->value);
        for (yaml_node_pair_t *q = v->data.mapping.pairs.start; q < v->data.mapping.pairs.top; q++) {
            yaml_node_t *k2 = yaml_document_get_node(&doc, q->key);
            if (strcmp((char *)k2->data.scalar.value, "config") == 0)
                config = (const char *)yaml_document_get_node(&doc, q->value)->data.scalar.value;
            if (strcmp((char *)k2->data.scalar.value, "git_hash") == 0) /* digits+letters: a string */
                ck_assert_str_eq((char *)yaml_document_get_node(&doc, q->value)->data.scalar.value,
                                 "0123456789abcdef0123456789abcdef01234567");
        }
    }
    ck_assert_ptr_nonnull(config);
    ck_assert_str_eq(config, p->provenance.config_yaml);
    ck_assert_ptr_nonnull(strstr(text, "bits_per_value"));
    ck_assert_ptr_nonnull(strstr(text, "method: higgs"));
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    free(text);
    kv_plan_free(p);
}
END_TEST

/* ---- format 1.1: FP8 / NVFP4 streams and their tensor scales (FSCL) ------------------------------ */
/* The frozen 1.1 file (written once by `test_plan --write-golden-1.1`, never regenerated). */
START_TEST(test_golden_v1_1) {
    char path[1024];
    golden_path(path, sizeof path, "1.1");
    kv_plan *p = NULL;
    ck_assert_kv_ok(kv_plan_read(&p, path));
    ck_assert_int_eq(p->file.version_major, 1);
    ck_assert_int_eq(p->file.version_minor, 1);
    ck_assert(p->file.required_features & KV_PLAN_FEAT_FLOAT);
    const kv_plan_stream *v2 = &p->layers[2].stream[KV_PLAN_V];
    ck_assert_int_eq(v2->method, KV_PLAN_FP8_E4M3);
    ck_assert_int_eq(v2->bits, 8);
    ck_assert_int_eq(v2->n_fp_scales, 2);
    ck_assert(v2->fp_scales[0] == 0.5f && v2->fp_scales[1] == 0.0625f);
    ck_assert_double_eq_tol(kv_plan_stream_bits(p, 2, KV_PLAN_V), 8.0, 1e-12);
    assert_is_sample(p, plan_sample_make_v1_1, "1.1");
    kv_plan_free(p);
}
END_TEST

/* A plan serialized with a required feature bit cleared (CRCs repaired) is refused, naming the feature. */
static void assert_refused_without_feature(const kv_plan *p, uint64_t bit, const char *name) {
    uint8_t *b = NULL;
    size_t n = 0;
    kv_plan *q = NULL;
    serialize(&b, &n, p, &k_plain);
    kv_store_u64le(b + 32, kv_load_u64le(b + 32) & ~bit);
    plan_bytes_repair_crcs(b, n);
    ck_assert_int_eq(kv_plan_read_memory(&q, b, n), KV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), name));
    free(b);
}

/* ---- format 1.2: the SQuat static subspace (stream flag SQUAT_STATIC, feature bit 8) ---------------- */
/* The frozen 1.2 file (written once by `test_plan --write-golden-1.2`, never regenerated); a plan
 * with the static subspace round-trips, declares SQUAT_STATIC, and without the bit is refused. */
START_TEST(test_golden_v1_2) {
    char path[1024];
    golden_path(path, sizeof path, "1.2");
    kv_plan *p = NULL;
    ck_assert_kv_ok(kv_plan_read(&p, path));
    ck_assert_int_eq(p->file.version_minor, 2);
    ck_assert(p->file.required_features & KV_PLAN_FEAT_SQUAT_STATIC);
    ck_assert_int_eq(p->layers[1].stream[KV_PLAN_K].squat->static_subspace, 1);
    ck_assert(p->file.required_features & KV_PLAN_FEAT_PRED_F16);
    ck_assert_int_eq(p->layers[1].stream[KV_PLAN_V].predictor->dtype, KV_DTYPE_F16);
    ck_assert_int_eq(p->layers[1].stream[KV_PLAN_K].predictor->dtype, KV_DTYPE_F32);
    /* K <- L0.K (8x8 + 8 in f32) and V <- [L0.V; L1.K] (8x16 + 8 in f16) */
    ck_assert_uint_eq(kv_plan_predictor_bytes(p), 4u * 72u + 2u * 136u);
    kv_plan *s = NULL;
    ck_assert_kv_ok(plan_sample_make_v1_2(&s));
    char why[256];
    ck_assert_msg(plan_equal(p, s, why, sizeof why), "golden 1.2 vs sample: %s", why);
    /* the prompt subspace (the 1.0 meaning) does not declare the bit */
    s->layers[1].stream[KV_PLAN_K].squat->static_subspace = 0;
    uint8_t *b = NULL;
    size_t n = 0;
    kv_plan *q = NULL;
    serialize(&b, &n, s, &k_plain);
    ck_assert_kv_ok(kv_plan_read_memory(&q, b, n));
    ck_assert_uint_eq(q->file.required_features & KV_PLAN_FEAT_SQUAT_STATIC, 0);
    ck_assert_int_eq(q->layers[1].stream[KV_PLAN_K].squat->static_subspace, 0);
    kv_plan_free(q);
    q = NULL;
    free(b);
    kv_plan_free(s);
    /* a reader must not apply the prompt subspace to a static plan: the bit cleared is refused */
    assert_refused_without_feature(p, KV_PLAN_FEAT_SQUAT_STATIC, "SQUAT_STATIC");
    kv_plan_free(p);
}
END_TEST

/* ---- format 1.3: low-rank predictors (stream flag PRED_LOWRANK, feature bit 10) ------------------- */
/* The frozen 1.3 file (written once by `test_plan --write-golden-1.3`, never regenerated): the factors read
 * back, the weight is their product, the bytes count the factors; without the feature bit it is refused. */
START_TEST(test_golden_v1_3) {
    char path[1024];
    golden_path(path, sizeof path, "1.3");
    kv_plan *p = NULL;
    ck_assert_kv_ok(kv_plan_read(&p, path));
    ck_assert_int_eq(p->file.version_minor, 3);
    ck_assert(p->file.required_features & KV_PLAN_FEAT_PRED_LOWRANK);
    const kv_plan_predictor *pk = p->layers[1].stream[KV_PLAN_K].predictor, *pv = p->layers[1].stream[KV_PLAN_V].predictor;
    ck_assert_int_eq(pk->rank, 2);
    ck_assert_int_eq(pv->rank, 3);
    ck_assert_int_eq(pv->dtype, KV_DTYPE_F16);
    /* the product, by hand for one entry: W[1][2] of K = sum_k left[1][k] right[k][2] */
    ck_assert(pk->weight[1 * 8 + 2] == pk->left[2] * pk->right[2] + pk->left[3] * pk->right[8 + 2]);
    /* K: rank 2 (8 + 8) + 8 bias in f32; V: rank 3 (8 + 16) + 8 bias in f16 */
    ck_assert_uint_eq(kv_plan_predictor_bytes(p), 4u * (2u * 16u + 8u) + 2u * (3u * 24u + 8u));
    assert_is_sample(p, plan_sample_make_v1_3, "1.3");
    assert_refused_without_feature(p, KV_PLAN_FEAT_PRED_LOWRANK, "PRED_LOWRANK");
    kv_plan_free(p);
}
END_TEST

/* Low-rank predictors: the setter's refusals, f16 rounding of the factors (not of the product), validation
 * of a weight that is not the factors' product, and a round trip through the file. */
START_TEST(test_predictor_lowrank) {
    kv_plan *p = sample();
    float l[8 * 2], r[2 * 8];
    for (int i = 0; i < 16; i++) l[i] = 0.1f * (float)(i + 1), r[i] = 0.3f - 0.05f * (float)i;
    ck_assert_int_eq(kv_plan_set_predictor_factors(p, 1, KV_PLAN_K, 9, l, r), KV_EINVAL); /* rank > 8 */
    ck_assert_int_eq(kv_plan_set_predictor_factors(p, 0, KV_PLAN_K, 2, l, r), KV_EINVAL); /* no predictor */
    ck_assert_kv_ok(kv_plan_set_predictor_factors(p, 1, KV_PLAN_K, 2, l, r));
    kv_plan_predictor *pr = p->layers[1].stream[KV_PLAN_K].predictor;
    ck_assert(pr->weight[3 * 8 + 5] == (float)((double)l[6] * r[5] + (double)l[7] * r[8 + 5]));
    ck_assert_kv_ok(kv_plan_set_predictor_dtype(p, 1, KV_PLAN_K, KV_DTYPE_F16));
    ck_assert(pr->left[0] == kv_f16_to_f32(kv_f32_to_f16(0.1f)));
    ck_assert(pr->weight[0] == (float)((double)pr->left[0] * pr->right[0] + (double)pr->left[1] * pr->right[8]));
    ck_assert_kv_ok(kv_plan_validate(p));
    const float keep = pr->weight[7];
    pr->weight[7] = keep + 1.0f;
    ck_assert_int_eq(kv_plan_validate(p), KV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "not the product"));
    pr->weight[7] = keep;
    assert_roundtrip(p);
    kv_plan_free(p);
}
END_TEST

/* ---- format 1.4: 4-bit predictor codes (stream flag PRED_Q4, feature bit 11) ----------------------- */
/* The frozen 1.4 file (written once by `test_plan --write-golden-1.4`, never regenerated): the codes read back,
 * the weight is their value (one entry by hand), the bytes count codes, scales, offsets and bias; without the
 * feature bit it is refused. */
START_TEST(test_golden_v1_4) {
    char path[1024];
    golden_path(path, sizeof path, "1.4");
    kv_plan *p = NULL;
    ck_assert_kv_ok(kv_plan_read(&p, path));
    ck_assert_int_eq(p->file.version_minor, 4);
    ck_assert(p->file.required_features & KV_PLAN_FEAT_PRED_Q4);
    const kv_plan_predictor *pv = p->layers[1].stream[KV_PLAN_V].predictor;
    ck_assert_int_eq(pv->qbits, 4);
    ck_assert_int_eq(pv->qgroup, 8);
    ck_assert_int_eq(pv->rank, 0);
    ck_assert_int_eq(pv->dtype, KV_DTYPE_F16);
    /* entry [2][12] = element 44: code (44*7+3) % 16 = 7, group 44/8 = 5: scale (5%5+1)/64, offset (5%7-3)/8 */
    ck_assert_uint_eq(pv->qcodes[44], 7u);
    ck_assert(pv->weight[44] == 7.0f / 64.0f + 2.0f / 8.0f);
    /* K: rank 2 (8 + 8) + 8 bias in f32; V: 128 codes in 64 bytes, 16 scales + 16 offsets + 8 bias in f16 */
    ck_assert_uint_eq(kv_plan_predictor_bytes(p), 4u * (2u * 16u + 8u) + 64u + 2u * (16u + 16u + 8u));
    assert_is_sample(p, plan_sample_make_v1_4, "1.4");
    assert_refused_without_feature(p, KV_PLAN_FEAT_PRED_Q4, "PRED_Q4");
    kv_plan_free(p);
}
END_TEST

/* 4-bit predictor codes: the setter's refusals, the weight as the codes' values, the bias rounded to f16,
 * validation of a weight that is not its code's value, a round trip through the file. */
START_TEST(test_predictor_q4) {
    kv_plan *p = sample();
    uint8_t codes[8 * 16];
    float sc[16], of[16];
    for (int i = 0; i < 8 * 16; i++) codes[i] = (uint8_t)(i % 16);
    for (int g = 0; g < 16; g++) sc[g] = 0.25f, of[g] = -1.0f;
    ck_assert_int_eq(kv_plan_set_predictor_quantized(p, 0, KV_PLAN_V, 4, 8, codes, sc, of), KV_EINVAL); /* none */
    ck_assert_int_eq(kv_plan_set_predictor_quantized(p, 1, KV_PLAN_V, 3, 8, codes, sc, of), KV_EINVAL); /* bits */
    ck_assert_int_eq(kv_plan_set_predictor_quantized(p, 1, KV_PLAN_V, 4, 5, codes, sc, of), KV_EINVAL); /* 16 % 5 */
    codes[3] = 16;
    ck_assert_int_eq(kv_plan_set_predictor_quantized(p, 1, KV_PLAN_V, 4, 8, codes, sc, of), KV_EINVAL); /* code */
    codes[3] = 3;
    sc[1] = 0.1f; /* not an f16 value */
    ck_assert_int_eq(kv_plan_set_predictor_quantized(p, 1, KV_PLAN_V, 4, 8, codes, sc, of), KV_EINVAL);
    sc[1] = 0.25f;
    kv_plan_predictor *pr = p->layers[1].stream[KV_PLAN_V].predictor;
    pr->bias[0] = 1.0f + 0x1p-11f; /* an f16 tie: to even, 1 */
    ck_assert_kv_ok(kv_plan_set_predictor_quantized(p, 1, KV_PLAN_V, 4, 8, codes, sc, of));
    ck_assert(pr->weight[5] == 0.25f * 5.0f - 1.0f);
    ck_assert(pr->bias[0] == 1.0f);
    ck_assert_int_eq(pr->dtype, KV_DTYPE_F16);
    ck_assert_int_eq(kv_plan_set_predictor_dtype(p, 1, KV_PLAN_V, KV_DTYPE_F32), KV_EINVAL); /* scales are f16 */
    ck_assert_kv_ok(kv_plan_validate(p));
    const float keep = pr->weight[9];
    pr->weight[9] = keep + 0.25f;
    ck_assert_int_eq(kv_plan_validate(p), KV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "not the value of its 4-bit code"));
    pr->weight[9] = keep;
    assert_roundtrip(p); /* the feature bit and its refusal: test_golden_v1_4 */
    /* a low-rank predictor cannot take codes */
    float l[8 * 2], r[2 * 8];
    for (int i = 0; i < 16; i++) l[i] = 0.125f, r[i] = 0.25f;
    ck_assert_kv_ok(kv_plan_set_predictor_factors(p, 1, KV_PLAN_K, 2, l, r));
    ck_assert_int_eq(kv_plan_set_predictor_quantized(p, 1, KV_PLAN_K, 4, 8, codes, sc, of), KV_EINVAL);
    kv_plan_free(p);
}
END_TEST

/* kv_plan_stream_copy: every stream of the 1.4 sample (HIGGS grids, shared codes, FP8 scales, SQuat with a static
 * basis, low-rank, f16 and 4-bit predictors) copied into the 1.0 sample makes the 1.4 sample exactly; the copy owns
 * its memory (the source freed, the copy still validates and round-trips: ASan checks the rest); a stream with a
 * predictor is refused without KV_PLAN_COPY_PREDICTOR and leaves the destination as it was; another shape is
 * refused. */
START_TEST(test_stream_copy) {
    kv_plan *src = NULL, *dst = sample(), *want = NULL;
    ck_assert_kv_ok(plan_sample_make_v1_4(&src));
    ck_assert_kv_ok(plan_sample_make_v1_4(&want));
    char why[256];
    ck_assert_int_eq(kv_plan_stream_copy(dst, src, 1, KV_PLAN_V, 0), KV_EUNSUPPORTED);
    kv_plan *orig = sample();
    ck_assert_msg(plan_equal(dst, orig, why, sizeof why), "a refused copy changed the plan: %s", why);
    kv_plan_free(orig);
    for (int l = 0; l < src->n_layers; l++)
        for (int st = 0; st < 2; st++) ck_assert_kv_ok(kv_plan_stream_copy(dst, src, l, st, KV_PLAN_COPY_PREDICTOR));
    ck_assert_msg(plan_equal(dst, want, why, sizeof why), "the copied plan differs: %s", why);
    kv_plan_free(src);
    ck_assert_kv_ok(kv_plan_validate(dst));
    assert_roundtrip(dst);
    kv_plan *other = sample();
    other->fingerprint.head_dim *= 2;
    ck_assert_int_eq(kv_plan_stream_copy(other, dst, 0, KV_PLAN_K, KV_PLAN_COPY_PREDICTOR), KV_EINVAL);
    kv_plan_free(other);
    kv_plan_free(dst);
    kv_plan_free(want);
}
END_TEST

/* f16 predictors: the setter rounds to the nearest f16 (checked against an independent rounding of
 * the f16 grid: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10 and rounds to even, 1), refuses a
 * value beyond the f16 range; validation refuses an f16 predictor holding a non-f16 value; the file
 * holds 2 bytes per value and reads back exactly. */
START_TEST(test_predictor_f16) {
    kv_plan *p = sample(), *q = NULL;
    kv_plan_predictor *pr = p->layers[1].stream[KV_PLAN_K].predictor;
    pr->weight[0] = 1.0f + 0x1p-11f;         /* tie: to even */
    pr->weight[1] = 1.0f + 0x1p-11f + 0x1p-20f; /* above the tie: up */
    pr->weight[2] = 0x1p-25f;                /* below half the smallest subnormal (2^-24): 0 */
    pr->bias[0] = -3.0e-5f;                  /* subnormal range: nearest multiple of 2^-24 */
    const uint64_t before = kv_plan_predictor_bytes(p);
    ck_assert_kv_ok(kv_plan_set_predictor_dtype(p, 1, KV_PLAN_K, KV_DTYPE_F16));
    ck_assert(pr->weight[0] == 1.0f);
    ck_assert(pr->weight[1] == 1.0f + 0x1p-10f);
    ck_assert(pr->weight[2] == 0.0f);
    ck_assert(pr->bias[0] == -roundf(3.0e-5f * 0x1p24f) * 0x1p-24f);
    ck_assert_uint_eq(before - kv_plan_predictor_bytes(p), 2u * 72u);
    uint8_t *b = NULL;
    size_t n = 0;
    serialize(&b, &n, p, &k_plain);
    ck_assert_kv_ok(kv_plan_read_memory(&q, b, n));
    char why[256];
    ck_assert_msg(plan_equal(p, q, why, sizeof why), "%s", why);
    ck_assert(q->file.required_features & KV_PLAN_FEAT_PRED_F16);
    kv_plan_free(q);
    q = NULL;
    /* the feature bit cleared: refused, naming it */
    kv_store_u64le(b + 32, kv_load_u64le(b + 32) & ~KV_PLAN_FEAT_PRED_F16);
    plan_bytes_repair_crcs(b, n);
    ck_assert_int_eq(kv_plan_read_memory(&q, b, n), KV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "PRED_F16"));
    free(b);
    /* a non-f16 value in an f16 predictor: invalid, the plan is not written */
    pr->weight[5] = 0.1f;
    ck_assert_int_eq(kv_plan_validate(p), KV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "layer 1 K: predictor is stored in f16 but value 5"));
    /* beyond the f16 range: refused by the setter, the values unchanged */
    pr->weight[5] = 1e6f;
    ck_assert_int_eq(kv_plan_set_predictor_dtype(p, 1, KV_PLAN_K, KV_DTYPE_F16), KV_EINVAL);
    ck_assert(pr->weight[5] == 1e6f);
    ck_assert_int_eq(kv_plan_set_predictor_dtype(p, 0, KV_PLAN_K, KV_DTYPE_F16), KV_EINVAL); /* no predictor */
    ck_assert_int_eq(kv_plan_set_predictor_dtype(p, 1, KV_PLAN_K, 7), KV_EINVAL);
    kv_plan_free(p);
}
END_TEST

/* Every float method, per tensor and per KV head: round trip, bits, feature bit, FSCL section; the
 * rules of §6.4 / §6.9 refused; an undeclared FLOAT feature refused. */
START_TEST(test_float_methods) {
    static const struct {
        kv_plan_method m;
        int bits, group, axis;
        double bpv;
    } k_m[3] = {{KV_PLAN_FP8_E4M3, 8, 0, KV_PLAN_GROUP_TOKENS, 8.0},
                {KV_PLAN_FP8_E5M2, 8, 0, KV_PLAN_GROUP_TOKENS, 8.0},
                {KV_PLAN_NVFP4, 4, 16, KV_PLAN_GROUP_CHANNELS, 4.5}};
    kv_plan_fingerprint fp;
    plan_sample_fingerprint(&fp);
    fp.head_dim = 16; /* NVFP4 per-head scales need whole blocks per head */
    for (int mi = 0; mi < 3; mi++)
        for (int per_head = 0; per_head < 2; per_head++) {
            kv_plan *p = NULL, *q = NULL;
            ck_assert_kv_ok(kv_plan_create(&p, &fp));
            kv_plan_stream *s = &p->layers[1].stream[KV_PLAN_K];
            s->method = k_m[mi].m, s->bits = k_m[mi].bits, s->group_size = k_m[mi].group;
            s->group_axis = (kv_plan_group_axis)k_m[mi].axis;
            /* without scales: invalid */
            ck_assert_int_eq(kv_plan_validate(p), KV_EFORMAT);
            ck_assert_ptr_nonnull(strstr(kv_error_last(), "layer 1 K"));
            const float sc[2] = {0.25f, 3.0f};
            ck_assert_kv_ok(kv_plan_set_fp_scales(p, 1, KV_PLAN_K, per_head ? 2 : 1, sc));
            ck_assert_kv_ok(kv_plan_validate(p));
            ck_assert_double_eq_tol(kv_plan_stream_bits(p, 1, KV_PLAN_K), k_m[mi].bpv, 1e-12);
            uint8_t *b = NULL;
            size_t n = 0;
            serialize(&b, &n, p, &k_plain);
            ck_assert_kv_ok(kv_plan_read_memory(&q, b, n));
            char why[256];
            ck_assert_msg(plan_equal(p, q, why, sizeof why), "%s", why);
            ck_assert_uint_eq(q->file.required_features, KV_PLAN_FEAT_FLOAT);
            ck_assert_int_eq(q->file.n_sections, 5); /* FPRT GLOB LAYR FSCL PROV */
            ck_assert_str_eq(q->file.sections[3].tag, "FSCL");
            kv_plan_free(q);
            /* the FLOAT bit cleared: the content uses an undeclared feature */
            kv_store_u64le(b + 32, kv_load_u64le(b + 32) & ~KV_PLAN_FEAT_FLOAT);
            plan_bytes_repair_crcs(b, n);
            ck_assert_int_eq(kv_plan_read_memory(&q, b, n), KV_EFORMAT);
            ck_assert_ptr_nonnull(strstr(kv_error_last(), "FLOAT"));
            free(b);
            /* wrong bits, a share, a scale of zero */
            s->bits = 7;
            ck_assert_int_eq(kv_plan_validate(p), KV_EFORMAT);
            s->bits = k_m[mi].bits;
            s->fp_scales[0] = 0.0f;
            ck_assert_int_eq(kv_plan_validate(p), KV_EFORMAT);
            s->fp_scales[0] = 1.0f;
            const float zero = 0.0f, three[3] = {1, 1, 1};
            ck_assert_int_eq(kv_plan_set_fp_scales(p, 1, KV_PLAN_K, 1, &zero), KV_EINVAL);
            ck_assert_int_eq(kv_plan_set_fp_scales(p, 1, KV_PLAN_K, 3, three), KV_EINVAL);
            ck_assert_int_eq(kv_plan_set_fp_scales(p, 0, KV_PLAN_K, 1, three), KV_EINVAL); /* an f16 stream */
            kv_plan_free(p);
        }
    /* NVFP4 per-head scales with head_dim 4: blocks would straddle heads */
    plan_sample_fingerprint(&fp);
    kv_plan *p = NULL;
    ck_assert_kv_ok(kv_plan_create(&p, &fp));
    kv_plan_stream *s = &p->layers[0].stream[KV_PLAN_V];
    s->method = KV_PLAN_NVFP4, s->bits = 4, s->group_size = 16, s->group_axis = KV_PLAN_GROUP_CHANNELS;
    const float sc[2] = {1.0f, 2.0f};
    ck_assert_kv_ok(kv_plan_set_fp_scales(p, 0, KV_PLAN_V, 2, sc));
    ck_assert_int_eq(kv_plan_validate(p), KV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(kv_error_last(), "multiple of 16"));
    ck_assert_kv_ok(kv_plan_set_fp_scales(p, 0, KV_PLAN_V, 1, sc));
    ck_assert_kv_ok(kv_plan_validate(p));
    /* scales on a uniform stream */
    kv_plan_stream *u = &p->layers[1].stream[KV_PLAN_V];
    u->method = KV_PLAN_UNIFORM, u->bits = 2, u->group_size = 8, u->group_axis = KV_PLAN_GROUP_CHANNELS;
    u->fp_scales = malloc(sizeof(float));
    u->fp_scales[0] = 1.0f;
    u->n_fp_scales = 1;
    ck_assert_int_eq(kv_plan_validate(p), KV_EFORMAT);
    kv_plan_free(p);
}
END_TEST

/* ---- modes ---------------------------------------------------------------------------------------- */
/* Write a golden file from a sample maker (once per format version; the files are never regenerated). */
static int write_golden(const char *path, kv_status (*make)(kv_plan **), const char *what) {
    kv_plan *p = NULL;
    kv_status s = make(&p);
    if (s == KV_OK) s = kv_plan_write(p, path, &k_zlib);
    kv_plan_free(p);
    if (s != KV_OK) fprintf(stderr, "%s: %s\n", what, kv_error_last());
    return s == KV_OK ? 0 : 1;
}

static int write_seed(const char *dir, const char *name, const uint8_t *b, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    for (char *c = path + strlen(dir) + 1; *c; c++)
        if (*c == ' ' || *c == '-') *c = '_';
    return kv_write_file_atomic(path, b, n) == KV_OK ? 0 : 1;
}

static int write_corpus(const char *dir) {
    int rc = 0;
    kv_plan *p = NULL;
    if (plan_sample_make(&p) != KV_OK) return 1;
    const kv_plan_write_options *opts[2] = {&k_plain, &k_zlib};
    for (int o = 0; o < 2; o++) {
        uint8_t *b = NULL;
        size_t n = 0;
        if (kv_plan_write_memory(&b, &n, p, opts[o]) != KV_OK) return 1;
        rc |= write_seed(dir, o ? "valid_zlib" : "valid_plain", b, n);
        for (int i = 0; i < N_CORRUPT; i++) {
            uint8_t *c = malloc(n);
            size_t cn = n;
            memcpy(c, b, n);
            k_corrupt[i].mutate(&c, &cn);
            char name[128];
            snprintf(name, sizeof name, "%s_%s", o ? "z" : "p", k_corrupt[i].name);
            rc |= write_seed(dir, name, c, cn);
            free(c);
        }
        free(b);
    }
    kv_plan_fingerprint fp;
    plan_sample_fingerprint(&fp);
    kv_plan *m = NULL;
    uint8_t *b = NULL;
    size_t n = 0;
    if (kv_plan_create(&m, &fp) == KV_OK && kv_plan_write_memory(&b, &n, m, NULL) == KV_OK)
        rc |= write_seed(dir, "valid_minimal", b, n);
    free(b);
    kv_plan_free(m);
    kv_plan_free(p);
    return rc;
}

/* ---- format 1.5: attention windows (section WNDW, feature bit 12) --------------------------------------- */
/* The frozen 1.5 file (written once by `test_plan --write-golden-1.5`, never regenerated): the windows read back;
 * without the feature bit it is refused. */
START_TEST(test_golden_v1_5) {
    char path[1024];
    golden_path(path, sizeof path, "1.5");
    kv_plan *p = NULL;
    ck_assert_kv_ok(kv_plan_read(&p, path));
    ck_assert_int_eq(p->file.version_minor, 5);
    ck_assert(p->file.required_features & KV_PLAN_FEAT_WINDOW);
    ck_assert_int_eq(p->layers[0].window, 512);
    ck_assert_int_eq(p->layers[1].window, 0);
    ck_assert_int_eq(p->layers[2].window, 7);
    assert_is_sample(p, plan_sample_make_v1_5, "1.5");
    assert_refused_without_feature(p, KV_PLAN_FEAT_WINDOW, "WINDOW");
    kv_plan_free(p);
}
END_TEST

/* Windows: a plan with them is written as 1.5 with a REQUIRED section WNDW after FSCL and round-trips; the same plan
 * without them is 1.4 byte for byte (no WNDW, no bit); the section's own refusals; windows in validation, in the
 * dump, and through kv_plan_stream_copy. */
START_TEST(test_windows) {
    kv_plan *p = NULL, *q = NULL;
    ck_assert_kv_ok(plan_sample_make_v1_5(&p));
    uint8_t *b = NULL, *b4 = NULL;
    size_t n = 0, n4 = 0;
    serialize(&b, &n, p, &k_plain);
    ck_assert_int_eq(kv_load_u16le(b + 10), 5);
    const size_t e = plan_bytes_entry(b, "WNDW");
    ck_assert_uint_ne(e, 0);
    ck_assert_uint_eq(kv_load_u32le(b + e + 4), KV_PLAN_SECTION_REQUIRED);
    ck_assert_uint_eq(kv_load_u64le(b + e + 24), 4u + 3u * 4u);
    ck_assert_kv_ok(kv_plan_read_memory(&q, b, n));
    char why[256] = "";
    ck_assert_msg(plan_equal(p, q, why, sizeof why), "round trip: %s", why);
    ck_assert_int_eq(q->file.version_minor, 5);
    kv_plan_free(q);
    assert_roundtrip(p);
    /* the section's refusals: a window out of range, every window 0, another layer count */
    const uint64_t off = kv_load_u64le(b + e + 8);
    static const struct { int field; uint32_t value; const char *msg; } bad[] = {
        {1, (1u << 24) + 1u, "window"}, {0, 4u, "section 'WNDW': 4 layers"}, {-1, 0u, "every layer's window is 0"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        uint8_t *c = malloc(n);
        memcpy(c, b, n);
        if (bad[i].field >= 0) {
            kv_store_u32le(c + off + 4u * (uint32_t)bad[i].field, bad[i].value);
        } else {
            kv_store_u32le(c + off + 4, 0), kv_store_u32le(c + off + 12, 0);
        }
        plan_bytes_repair_crcs(c, n);
        ck_assert_int_eq(kv_plan_read_memory(&q, c, n), KV_EFORMAT);
        ck_assert_msg(strstr(kv_error_last(), bad[i].msg), "case %zu: %s", i, kv_error_last());
        free(c);
    }
    /* validation */
    p->layers[1].window = -1;
    ck_assert_int_eq(kv_plan_validate(p), KV_EFORMAT);
    p->layers[1].window = (1 << 24) + 1;
    ck_assert_int_eq(kv_plan_validate(p), KV_EFORMAT);
    p->layers[1].window = 0;
    /* the dump shows every layer's window */
    char *y = NULL;
    ck_assert_kv_ok(kv_plan_dump(&y, p, 0, 0));
    ck_assert_ptr_nonnull(strstr(y, "window: 512"));
    ck_assert_ptr_nonnull(strstr(y, "window: 7"));
    free(y);
    /* without windows: a 1.4 file, byte for byte what the 1.4 sample writes */
    kv_plan *p4 = NULL;
    ck_assert_kv_ok(plan_sample_make_v1_4(&p4));
    uint8_t *b44 = NULL;
    size_t n44 = 0;
    serialize(&b44, &n44, p4, &k_plain);
    for (int l = 0; l < p->n_layers; l++) p->layers[l].window = 0;
    serialize(&b4, &n4, p, &k_plain);
    ck_assert_int_eq(kv_load_u16le(b4 + 10), 4);
    ck_assert_uint_eq(plan_bytes_entry(b4, "WNDW"), 0);
    ck_assert_uint_eq(kv_load_u64le(b4 + 32) & KV_PLAN_FEAT_WINDOW, 0);
    ck_assert_uint_eq(n4, n44);
    ck_assert(memcmp(b4, b44, n4) == 0);
    /* a stream of a windowed layer copied into a plan brings the window; different windows are refused */
    ck_assert_kv_ok(plan_sample_make_v1_5(&q));
    ck_assert_kv_ok(kv_plan_stream_copy(p4, q, 2, KV_PLAN_V, KV_PLAN_COPY_PREDICTOR));
    ck_assert_int_eq(p4->layers[2].window, 7);
    p4->layers[0].window = 16;
    ck_assert_int_eq(kv_plan_stream_copy(p4, q, 0, KV_PLAN_V, KV_PLAN_COPY_PREDICTOR), KV_EINVAL);
    kv_plan_free(q);
    kv_plan_free(p4);
    kv_plan_free(p);
    free(b), free(b4), free(b44);
}
END_TEST

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write-golden") == 0)
        return write_golden(argv[2], plan_sample_make, "write-golden");
    if (argc == 3 && strcmp(argv[1], "--write-golden-1.1") == 0)
        return write_golden(argv[2], plan_sample_make_v1_1, "write-golden-1.1");
    if (argc == 3 && strcmp(argv[1], "--write-golden-1.2") == 0)
        return write_golden(argv[2], plan_sample_make_v1_2, "write-golden-1.2");
    if (argc == 3 && strcmp(argv[1], "--write-golden-1.3") == 0)
        return write_golden(argv[2], plan_sample_make_v1_3, "write-golden-1.3");
    if (argc == 3 && strcmp(argv[1], "--write-golden-1.4") == 0)
        return write_golden(argv[2], plan_sample_make_v1_4, "write-golden-1.4");
    if (argc == 3 && strcmp(argv[1], "--write-golden-1.5") == 0)
        return write_golden(argv[2], plan_sample_make_v1_5, "write-golden-1.5");
    if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0) return write_corpus(argv[2]);
    Suite *s = suite_create("plan");
    TCase *tc = tcase_create("format");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_roundtrip_plain);
    tcase_add_test(tc, test_roundtrip_zlib);
    tcase_add_test(tc, test_roundtrip_minimal);
    tcase_add_test(tc, test_deterministic_padding);
    tcase_add_test(tc, test_write_file_atomic);
    tcase_add_test(tc, test_golden_v1_0);
    tcase_add_test(tc, test_golden_v1_1);
    tcase_add_test(tc, test_golden_v1_2);
    tcase_add_test(tc, test_golden_v1_3);
    tcase_add_test(tc, test_golden_v1_4);
    tcase_add_test(tc, test_golden_v1_5);
    tcase_add_test(tc, test_windows);
    tcase_add_test(tc, test_predictor_lowrank);
    tcase_add_test(tc, test_predictor_q4);
    tcase_add_test(tc, test_predictor_f16);
    tcase_add_test(tc, test_float_methods);
    tcase_add_test(tc, test_stream_copy);
    tcase_add_loop_test(tc, test_corrupt_list, 0, N_CORRUPT);
    tcase_add_test(tc, test_corrupt_zlib);
    tcase_add_test(tc, test_corrupt_file_message);
    tcase_add_loop_test(tc, test_every_truncation_and_flip, 0, 2);
    tcase_add_test(tc, test_newer_minor_and_unknown_optional);
    tcase_add_test(tc, test_wrong_model);
    tcase_add_loop_test(tc, test_invalid_plans, 0, N_INVALID);
    tcase_add_test(tc, test_setters);
    tcase_add_test(tc, test_bits_per_value);
    tcase_add_test(tc, test_creation_time);
    tcase_add_test(tc, test_dump_json);
    tcase_add_test(tc, test_dump_yaml);
    suite_add_tcase(s, tc);
    return kv_test_run(s);
}
