/* kv_model_file_release_pages (kv_formats.h section 3): a model file's tensors live in private,
 * read-only file mappings (GGUF, safetensors shards, llama2.c checkpoints are all opened from
 * paths and mapped). Pages of a mapping that have been read count in the process's resident set
 * until they are unmapped; a caller that has copied or decoded a tensor (the model's layer
 * streaming) hands its pages back with MADV_DONTNEED, which for such a mapping only drops the
 * page-table entries: the next read faults the same bytes back in from the file (or the page cache). */
#define _DEFAULT_SOURCE
#include "model_file_internal.h"

#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

static void release_range(const void *data, size_t nbytes) {
    if (!data || nbytes == 0) return;
    const long ps = sysconf(_SC_PAGESIZE);
    const uintptr_t page = ps > 0 ? (uintptr_t)ps : 4096u;
    const uintptr_t a = (uintptr_t)data & ~(page - 1);
    const uintptr_t b = ((uintptr_t)data + nbytes + page - 1) & ~(page - 1);
    (void)madvise((void *)a, (size_t)(b - a), MADV_DONTNEED); /* advice: a failure only costs memory */
}

void kv_model_file_release_pages(const kv_model_file *mf, const kv_tensor_info *t) {
    if (!mf) return;
    if (t) {
        release_range(t->data, t->nbytes);
        return;
    }
    for (size_t i = 0; i < mf->n_tensors; i++) release_range(mf->tensors[i].data, mf->tensors[i].nbytes);
}
