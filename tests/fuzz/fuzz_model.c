/* fuzz_model.c: the model-file parser (src/model_parse.c, the layers' build, src/model.c).
 *
 * The input is a model file's text. A file that parses must describe a model within the
 * capacities (model.h): layers, positive shapes, every tensor and activation within
 * MGT_MAX_TENSOR_ELEMS, tensors at aligned offsets that do not overlap; its summary prints and
 * the batch check answers for any batch; small models are initialised and their weights are
 * finite. A file that does not parse must say why, naming the file. */
#include <math.h>
#include <string.h>

#include "fuzz.h"
#include "model.h"
#include "train_cfg.h"

static void check_tensors(const mgt_param *t, int n, size_t total) {
    size_t end = 0;
    for (int i = 0; i < n; i++) {
        FUZZ_CHECK(t[i].count <= (size_t)MGT_MAX_TENSOR_ELEMS, "%s", t[i].name);
        FUZZ_CHECK(t[i].offset % 16 == 0 && t[i].offset >= end, "%s", t[i].name);
        end = t[i].offset + t[i].count;
        size_t c = 1;
        for (int d = 0; d < t[i].ndim; d++)
            c *= (size_t)t[i].shape[d];
        FUZZ_CHECK(c == t[i].count, "%s", t[i].name);
    }
    FUZZ_CHECK(end <= total, "tensors end at %zu of %zu", end, total);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_text(data, size);
    if (!text)
        return 0;
    mgt_model m;
    mgt_train_cfg train;
    mgt_err e = {{0}};
    if (mgt_model_file_parse(&m, &train, "fuzz.cfg", text, &e) < 0) {
        FUZZ_CHECK(!strncmp(e.msg, "fuzz.cfg", 8), "message \"%s\"", e.msg);
        free(text);
        return 0;
    }
    FUZZ_CHECK(m.nlayers >= 1 && m.nlayers <= MGT_MAX_LAYERS, "%d layers", m.nlayers);
    for (int i = 0; i < m.nlayers; i++) {
        mgt_shape s = m.layers[i].out;
        FUZZ_CHECK(s.h >= 1 && s.w >= 1 && s.c >= 1 && mgt_shape_elems(s) <= MGT_MAX_TENSOR_ELEMS,
                   "layer %s is %dx%dx%d", m.layers[i].name, s.h, s.w, s.c);
    }
    FUZZ_CHECK(m.classes >= 2, "%d classes", m.classes);
    check_tensors(m.params, m.nparams, m.param_count);
    check_tensors(m.buffers, m.nbuffers, m.buffer_count);

    FILE *null = fopen("/dev/null", "w");
    if (null) {
        mgt_model_summary(&m, null);
        mgt_train_summary(&train, null);
        mgt_model_summary_memory(&m, train.batch_size, 4, null);
        fclose(null);
    }
    const int batches[3] = {1, (int)train.batch_size, 1 << 24};
    for (int i = 0; i < 3; i++)
        if (mgt_model_check_batch(&m, batches[i], &e) < 0)
            FUZZ_CHECK(strstr(e.msg, "model too large"), "message \"%s\"", e.msg);

    if (m.param_count <= (1u << 20) && m.buffer_count <= (1u << 20)) {
        float *w = malloc(sizeof *w * (m.param_count + 1));
        float *buf = malloc(sizeof *buf * (m.buffer_count + 1));
        if (w && buf) {
            mgt_model_init_host(&m, train.seed, w, buf);
            for (size_t i = 0; i < m.param_count; i++)
                FUZZ_CHECK(isfinite(w[i]), "weight %zu is %g", i, (double)w[i]);
        }
        free(w);
        free(buf);
    }
    mgt_model_free(&m);
    free(text);
    return 0;
}
