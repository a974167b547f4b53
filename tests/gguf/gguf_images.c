/* The hand-built base GGUF image shared by the reader, writer and corrupt-file tests. */
#include "gguf_test_util.h"

static void base_t0(float *v) {
    for (int i = 0; i < 8; i++) v[i] = (float)i;
}

static void base_t1(uint8_t *blk) {
    kv_store_u16le(blk, kv_f32_to_f16(0.5f));
    for (int j = 0; j < 32; j++) blk[2 + j] = (uint8_t)(int8_t)(j - 16);
}

void gguf_base_image(bb *b, base_offsets *o) {
    memset(b, 0, sizeof *b);
    memset(o, 0, sizeof *o);
    bb_put(b, "GGUF", 4);
    o->version = bb_u32(b, 3);
    o->n_tensors = bb_u64(b, 2);
    o->n_kv = bb_u64(b, 5);
    /* kv0 */
    o->kv_key[0] = bb_str(b, "general.architecture");
    o->kv_type[0] = bb_u32(b, KV_GGUF_STRING);
    o->kv_val[0] = bb_str(b, "llama");
    /* kv1 */
    o->kv_key[1] = bb_str(b, "general.alignment");
    o->kv_type[1] = bb_u32(b, KV_GGUF_UINT32);
    o->kv_val[1] = bb_u32(b, 32);
    /* kv2 */
    o->kv_key[2] = bb_str(b, "test.u32s");
    o->kv_type[2] = bb_u32(b, KV_GGUF_ARRAY);
    o->kv_val[2] = o->u32s_elem_type = bb_u32(b, KV_GGUF_UINT32);
    o->u32s_count = bb_u64(b, 3);
    for (uint32_t i = 1; i <= 3; i++) bb_u32(b, i);
    /* kv3 */
    o->kv_key[3] = bb_str(b, "test.strs");
    o->kv_type[3] = bb_u32(b, KV_GGUF_ARRAY);
    o->kv_val[3] = bb_u32(b, KV_GGUF_STRING);
    o->strs_count = bb_u64(b, 2);
    o->strs_item0 = bb_str(b, "a");
    bb_str(b, "bc");
    /* kv4 */
    o->kv_key[4] = bb_str(b, "test.flag");
    o->kv_type[4] = bb_u32(b, KV_GGUF_BOOL);
    o->kv_val[4] = bb_u8(b, 1);
    /* tensor infos */
    o->t_name[0] = bb_str(b, "t0");
    o->t_ndims[0] = bb_u32(b, 2);
    o->t_ne0[0] = bb_u64(b, 4);
    bb_u64(b, 2);
    o->t_dtype[0] = bb_u32(b, KV_DTYPE_F32);
    o->t_offset[0] = bb_u64(b, 0);
    o->t_name[1] = bb_str(b, "t1");
    o->t_ndims[1] = bb_u32(b, 1);
    o->t_ne0[1] = bb_u64(b, 32);
    o->t_dtype[1] = bb_u32(b, KV_DTYPE_Q8_0);
    o->t_offset[1] = bb_u64(b, 32);
    o->infos_end = b->n;
    bb_pad(b, 32);
    o->data = b->n;
    float t0[8];
    base_t0(t0);
    for (int i = 0; i < 8; i++) {
        uint8_t f[4];
        kv_store_f32le(f, t0[i]);
        bb_put(b, f, 4);
    }
    uint8_t t1[34];
    base_t1(t1);
    bb_put(b, t1, sizeof t1);
    bb_pad(b, 32);
}

kv_gguf_writer *gguf_base_writer(void) {
    kv_gguf_writer *w = NULL;
    ck_assert_kv_ok(kv_gguf_writer_create(&w));
    ck_assert_kv_ok(kv_gguf_writer_set_str(w, "general.architecture", "llama"));
    ck_assert_kv_ok(kv_gguf_writer_set_u32(w, "general.alignment", 32));
    const uint32_t u32s[3] = {1, 2, 3};
    ck_assert_kv_ok(kv_gguf_writer_set_array(w, "test.u32s", KV_GGUF_UINT32, u32s, 3));
    const char *strs[2] = {"a", "bc"};
    ck_assert_kv_ok(kv_gguf_writer_set_str_array(w, "test.strs", strs, 2));
    ck_assert_kv_ok(kv_gguf_writer_set_bool(w, "test.flag", 1));
    float t0[8];
    base_t0(t0);
    const uint64_t ne0[2] = {4, 2};
    ck_assert_kv_ok(kv_gguf_writer_add_tensor(w, "t0", KV_DTYPE_F32, 2, ne0, t0));
    uint8_t t1[34];
    base_t1(t1);
    const uint64_t ne1[1] = {32};
    ck_assert_kv_ok(kv_gguf_writer_add_tensor(w, "t1", KV_DTYPE_Q8_0, 1, ne1, t1));
    return w;
}
