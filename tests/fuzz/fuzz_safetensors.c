/* fuzz_safetensors.c: the safetensors reader (src/tensor_io.c) and the loading of weights and
 * checkpoints into a model (mgt_model_take_weights, src/model.c).
 *
 * The input is a whole file. One that reads must be what the reader promises: the tensors tiling
 * the data section exactly (no overlap, no gap, nothing left over), names unique and found by
 * name, metadata strings within their entries. It is then offered to a small
 * model with every tensor kind (conv2d, batchnorm buffers, dense), as --init-weights and
 * --resume do, which takes it or says why; what it takes is finite. */
#include <math.h>
#include <string.h>

#include "fuzz.h"
#include "model.h"
#include "tensor_io.h"
#include "train_cfg.h"

static const char MODEL[] = "[input]\nshape = 3,3,1\n"
                            "[conv2d]\nfilters = 2\nkernel = 2\n"
                            "[batchnorm]\n"
                            "[flatten]\n"
                            "[dense]\nunits = 2\n"
                            "[train]\noptimizer = adam\nloss = sparse_categorical_crossentropy\n"
                            "batch_size = 4\n";

static int by_address(const void *a, const void *b) {
    const mgt_tensor_entry *x = a, *y = b;
    return x->data < y->data ? -1 : x->data > y->data;
}

/* dlen: the data section's size, from the file's length prefix. */
static void check_file(const mgt_safetensors *st, size_t dlen) {
    const char *lo = st->blob;
    /* The tensors tile the data: sorted by address, each ends where the next starts. */
    mgt_tensor_entry *sorted = malloc(sizeof *sorted * ((size_t)st->nt + 1));
    if (sorted) {
        memcpy(sorted, st->t, sizeof *sorted * (size_t)st->nt);
        qsort(sorted, (size_t)st->nt, sizeof *sorted, by_address);
        size_t at = 0;
        for (int i = 0; i < st->nt; i++) {
            size_t n = 4;
            for (int d = 0; d < sorted[i].ndim; d++)
                n *= (size_t)sorted[i].shape[d];
            if (n == 0)
                continue;
            FUZZ_CHECK((const char *)sorted[i].data == lo + at, "tensor %s at %td, not %zu",
                       sorted[i].name, (const char *)sorted[i].data - lo, at);
            at += n;
        }
        FUZZ_CHECK(at == dlen, "tensors hold %zu of %zu data bytes", at, dlen);
        free(sorted);
    }
    for (int i = 0; i < st->nt; i++) {
        const mgt_tensor_entry *t = &st->t[i];
        FUZZ_CHECK(t->ndim >= 0 && t->ndim <= MGT_MAX_DIMS, "%d dimensions", t->ndim);
        int64_t n = 1;
        for (int d = 0; d < t->ndim; d++)
            n *= t->shape[d];
        const char *p = (const char *)t->data;
        FUZZ_CHECK(n == 0 || (p >= lo && ((uintptr_t)p & 3) == 0), "tensor %s", t->name);
        FUZZ_CHECK(mgt_safetensors_find(st, t->name) == t, "%s is not unique", t->name);
        if (n > 0) { /* read the first and last values: ASan flags any outside the buffer */
            volatile float ends = t->data[0] + t->data[n - 1];
            (void)ends;
        }
    }
    for (int i = 0; i < st->nmeta; i++)
        FUZZ_CHECK(memchr(st->meta[i].key, 0, sizeof st->meta[i].key) &&
                       memchr(st->meta[i].value, 0, sizeof st->meta[i].value),
                   "metadata %d", i);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mgt_safetensors st;
    mgt_err e = {{0}};
    if (mgt_safetensors_parse("fuzz.safetensors", data, size, &st, &e) < 0) {
        FUZZ_CHECK(!strncmp(e.msg, "fuzz.safetensors", 16), "message \"%s\"", e.msg);
        FUZZ_CHECK(!st.t && !st.meta && !st.blob, "a failed read keeps memory");
        return 0;
    }
    uint64_t hlen = 0;
    for (int b = 0; b < 8; b++)
        hlen |= (uint64_t)data[b] << (8 * b);
    check_file(&st, size - 8 - (size_t)hlen);
    mgt_model m;
    mgt_train_cfg train;
    if (mgt_model_file_parse(&m, &train, "fuzz.cfg", MODEL, &e) == 0) {
        float *w = calloc(m.param_count + 1, sizeof *w);
        float *buf = calloc(m.buffer_count + 1, sizeof *buf);
        if (w && buf) {
            if (mgt_model_take_weights(&m, &st, "fuzz.safetensors", w, buf, &e) == 0) {
                for (size_t i = 0; i < m.param_count; i++)
                    FUZZ_CHECK(isfinite(w[i]), "weight %zu taken is %g", i, (double)w[i]);
                for (size_t i = 0; i < m.buffer_count; i++)
                    FUZZ_CHECK(isfinite(buf[i]), "buffer %zu taken is %g", i, (double)buf[i]);
            } else {
                FUZZ_CHECK(!strncmp(e.msg, "fuzz.safetensors", 16), "message \"%s\"", e.msg);
            }
        }
        free(w);
        free(buf);
        mgt_model_free(&m);
    }
    mgt_safetensors_free(&st);
    return 0;
}
