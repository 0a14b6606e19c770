/* mgt_graph_grads: one training-mode forward and backward pass of a model on a given batch, on
 * the CPU backend, for the cross-checks against PyTorch (tests/cli/graph_torch.sh).
 *
 *   mgt_graph_grads MODEL.cfg X.npy Y.npy OUT_DIR [SEED]
 *
 * X: float32 (N, H, W, C) in the model's input shape; Y: integer labels (N,). The weights are
 * the model's initialisation from SEED (default 1), convolutions with algo = direct (plain dot
 * products, as PyTorch's CPU convolution). Writes OUT_DIR/weights.safetensors (the trainer's own
 * names, layouts and order: what PyTorch loads with strict=True) and OUT_DIR/grads.safetensors:
 * each parameter's gradient under the parameter's name (the SUM over the batch of the
 * per-sample gradients, as the trainer all-reduces it), the model's output "output" [N][classes]
 * (probabilities where the last layer has a softmax, else logits), "loss" (the summed
 * cross-entropy), and the running statistics after the pass under their names. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "data/npy.h"
#include "model.h"
#include "tensor_io.h"
#include "train_cfg.h"

static void die(const char *what, const mgt_err *e) {
    fprintf(stderr, "mgt_graph_grads: %s: %s\n", what, e ? e->msg : "");
    exit(2);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: mgt_graph_grads MODEL.cfg X.npy Y.npy OUT_DIR [SEED]\n");
        return 2;
    }
    const uint64_t seed = argc > 5 ? strtoull(argv[5], NULL, 10) : 1;
    mgt_err e;
    mgt_model m;
    mgt_train_cfg train;
    mgt_npy x, y;
    if (mgt_model_file_parse(&m, &train, argv[1], NULL, &e) < 0)
        die("model", &e);
    if (mgt_conv2d_set_algo(&m, "direct", &e) < 0)
        die("algo", &e);
    if (mgt_npy_open(&x, argv[2], &e) < 0 || mgt_npy_open(&y, argv[3], &e) < 0)
        die("inputs", &e);
    const int64_t n = x.ndim ? x.shape[0] : 0;
    if (strcmp(x.descr, "<f4") || x.ndim != 4 || x.count != n * mgt_shape_elems(m.input) ||
        y.ndim != 1 || y.shape[0] != n || y.kind != 'i' || (y.itemsize != 4 && y.itemsize != 8))
        die("X must be float32 (N, H, W, C) in the model's shape and Y int32/int64 (N,)", NULL);
    mgt_backend be;
    if (mgt_cpu_backend_init(&be, 1) < 0)
        die("backend", NULL);
    if (mgt_model_alloc(&m, &be, (int)n, &e) < 0)
        die("alloc", &e);
    mgt_model_init_host(&m, seed, m.w, m.buf);
    memcpy(m.x, x.data, sizeof(float) * (size_t)x.count);
    for (int64_t i = 0; i < n; i++)
        m.labels[i] =
            y.itemsize == 4 ? ((const int32_t *)y.data)[i] : (int32_t)((const int64_t *)y.data)[i];
    char path[1024];
    snprintf(path, sizeof path, "%s/weights.safetensors", argv[4]);
    const int cap = m.nparams + m.nbuffers + 2;
    mgt_tensor_entry *t = calloc((size_t)cap, sizeof *t);
    if (!t)
        die("out of memory", NULL);
    int nt = mgt_model_weights_entries(&m, m.w, m.buf, t, cap);
    if (mgt_safetensors_write(path, t, nt, NULL, 0, &e) < 0)
        die("write", &e);

    const mgt_step s = {.in = {m.x, m.labels, m.targets},
                        .be = &be,
                        .n = (int)n,
                        .training = 1,
                        .global_n = n,
                        .seed = train.seed};
    be.ops->zero(&be, m.sums, 2 * sizeof(float));
    const float *out = mgt_model_forward(&m, &s);
    mgt_model_loss_backward(&m, &s, 1);
    /* gradients under the parameters' names (the g arena has w's layout), buffers as they are */
    nt = mgt_model_weights_entries(&m, m.g, m.buf, t, cap);
    t[nt] = (mgt_tensor_entry){.name = "output", .ndim = 2, .shape = {n, m.classes}, .data = out};
    t[nt + 1] = (mgt_tensor_entry){.name = "loss", .ndim = 1, .shape = {1}, .data = m.sums};
    snprintf(path, sizeof path, "%s/grads.safetensors", argv[4]);
    if (mgt_safetensors_write(path, t, nt + 2, NULL, 0, &e) < 0)
        die("write", &e);
    free(t);
    mgt_npy_close(&x);
    mgt_npy_close(&y);
    mgt_model_free(&m);
    mgt_backend_destroy(&be);
    return 0;
}
