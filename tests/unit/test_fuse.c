/* test_fuse.c: the fusion groups (fuse.c) and the planner's shared gradients change no result, on
 * the CPU backend, the reference.
 *
 * A graph with every kind of group: batchnorm -> relu; batchnorm -> add (a residual read by two
 * layers, so the group adds to its gradient) -> relu; two batchnorms summed by an add with
 * activation = relu (the later one heads the group); batchnorm -> add without a relu, whose
 * output feeds a stand-alone relu (one pass, adding into a gradient another layer wrote) and a
 * plain add (whose gradient one input takes over instead of a copy). Then:
 *   - the groups and the cancelled biases are the ones the rules give;
 *   - with the convolutions' biases off, the model with its groups and the one without
 *     (no_fusion) give the same loss, outputs, gradients and running statistics, bit for bit,
 *     in training and in evaluation; so does the plan without shared memory (share = 0);
 *   - the groups' inner tensors take no memory: fewer bytes are planned, the arena is no
 *     larger (ResNet-50 at 224x224x3, batch 32: 2,470 MiB instead of 2,556);
 *   - with the biases on, the CPU backend keeps them: the same bits again;
 *   - with the biases on and a backend that cancels them (each convolution's only reader a
 *     batchnorm), the cancelled biases get a gradient of exactly zero, everything else agrees
 *     with the unfused model within float rounding (the normalisation's input moves by a
 *     constant per channel), and the running means still include the biases;
 *   - the gradients' listener hears every layer with parameters once, from the last to the
 *     first, each range final when heard;
 *   - a layer's own ReLU taken over by its reader (test_relu_takeover) changes no bit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "model.h"
#include "modelstep.h"
#include "tally.h"
#include "train_cfg.h"

#define BIAS "BIAS"
/* the [train] section of the last model read */
static mgt_train_cfg cfg;
static const char *graph_text =
    "[input]\nshape = 6,6,3\n"
    "[conv2d]\nname = c0\nfilters = 8\nkernel = 3\npadding = same\nuse_bias = " BIAS "\n"
    "[batchnorm]\nname = b0\n"
    "[activation]\nname = a0\ntype = relu\n"
    "[conv2d]\nname = c1\nfilters = 8\nkernel = 3\npadding = same\nuse_bias = " BIAS "\n"
    "[batchnorm]\nname = b1\n"
    "[add]\nname = s1\ninputs = b1, a0\n"
    "[activation]\nname = a1\ntype = relu\n"
    "[conv2d]\nname = c2\nfilters = 8\nkernel = 1\nuse_bias = " BIAS "\n"
    "[batchnorm]\nname = b2\n"
    "[conv2d]\nname = c3\ninput = a1\nfilters = 8\nkernel = 1\nuse_bias = " BIAS "\n"
    "[batchnorm]\nname = b3\n"
    "[add]\nname = s2\ninputs = b2, b3\nactivation = relu\n"
    "[conv2d]\nname = c4\nfilters = 8\nkernel = 3\npadding = same\nuse_bias = " BIAS "\n"
    "[batchnorm]\nname = b4\n"
    "[add]\nname = s3\ninputs = s2, b4\n"
    "[activation]\nname = a3\ntype = relu\n"
    "[conv2d]\nname = c5\nfilters = 8\nkernel = 3\npadding = same\nactivation = tanh\n"
    "[add]\nname = s4\ninputs = c5, s3\n"
    "[global_avgpool]\nname = g\n"
    "[dense]\nname = out\nunits = 4\n"
    "[train]\noptimizer = sgd\nloss = sparse_categorical_crossentropy\nbatch_size = 5\n"
    "seed = 3\n";

static double step(mgt_model *m, mgt_backend *be, int training, heard *h) {
    return model_step(m, be, (int)cfg.batch_size, cfg.seed, training, training, h);
}

/* The graph `src` with use_bias = bias, fused or not, sharing memory or not, its convolutions'
 * algorithm algo (NULL: as written), filled alike. */
static int setup_from(mgt_model *m, mgt_backend *be, const char *src, int bias, int fuse,
                      int share, const char *algo) {
    char text[4096];
    size_t n = 0;
    while (*src && n + 8 < sizeof text) { /* every BIAS marker becomes true or false */
        if (!strncmp(src, BIAS, strlen(BIAS))) {
            n += (size_t)snprintf(text + n, sizeof text - n, "%s", bias ? "true" : "false");
            src += strlen(BIAS);
        } else {
            text[n++] = *src++;
        }
    }
    text[n] = 0;
    mgt_err e;
    if (mgt_model_file_parse(m, &cfg, "fuse.cfg", text, &e) < 0) {
        fprintf(stderr, "parse: %s\n", e.msg);
        return -1;
    }
    if (algo && mgt_conv2d_set_algo(m, algo, &e) < 0) {
        fprintf(stderr, "algo: %s\n", e.msg);
        return -1;
    }
    m->no_fusion = !fuse;
    m->no_memory_sharing = !share;
    if (mgt_model_alloc(m, be, (int)cfg.batch_size, &e) < 0) {
        fprintf(stderr, "alloc: %s\n", e.msg);
        return -1;
    }
    mgt_model_init_host(m, cfg.seed, m->w, m->buf);
    for (int i = 0; i < m->nparams; i++) /* biases, gammas, betas away from their defaults */
        if (m->params[i].init != MGT_INIT_GLOROT)
            for (size_t j = 0; j < m->params[i].count; j++)
                m->w[m->params[i].offset + j] += 0.3f * (2.0f * mgt_uniform(17, j + 97 * i) - 1.0f);
    const size_t in = (size_t)mgt_shape_elems(m->input) * (size_t)cfg.batch_size;
    for (size_t i = 0; i < in; i++)
        m->x[i] = 2.0f * mgt_uniform(11, i) - 1.0f;
    for (int i = 0; i < cfg.batch_size; i++)
        m->labels[i] = (i * 3) % m->classes;
    return 0;
}

static int setup(mgt_model *m, mgt_backend *be, int bias, int fuse, int share) {
    return setup_from(m, be, graph_text, bias, fuse, share, NULL);
}

static void test_groups(tally *t, const mgt_model *m) {
    const int q0 = m->group_of[layer_at(m, "b0")], q1 = m->group_of[layer_at(m, "b1")];
    const int q3 = m->group_of[layer_at(m, "b3")], q4 = m->group_of[layer_at(m, "b4")];
    CHECK(t, m->ngroups == 4);
    CHECK(t, q0 >= 0 && m->groups[q0].tail == layer_at(m, "a0") && m->groups[q0].add < 0 &&
                 m->group_of[layer_at(m, "a0")] == q0);
    CHECK(t, q1 >= 0 && m->groups[q1].add == layer_at(m, "s1") && m->groups[q1].res == 1 &&
                 m->groups[q1].tail == layer_at(m, "a1"));
    /* of the two batchnorms summed by s2, the later heads the group; s2's own ReLU ends it */
    CHECK(t, m->group_of[layer_at(m, "b2")] < 0 && q3 >= 0 &&
                 m->groups[q3].add == layer_at(m, "s2") && m->groups[q3].act == layer_at(m, "s2") &&
                 m->groups[q3].tail == layer_at(m, "s2"));
    /* s3 has two readers: no ReLU joins it, a3 runs alone; s4 sums no batchnorm */
    CHECK(t, q4 >= 0 && m->groups[q4].tail == layer_at(m, "s3") && m->groups[q4].act < 0);
    CHECK(t, m->group_of[layer_at(m, "a3")] < 0 && m->group_of[layer_at(m, "s4")] < 0);
    /* inner tensors have no memory; a group's output is its tail's */
    CHECK(t, !m->layers[layer_at(m, "b0")].y && !m->layers[layer_at(m, "b1")].y &&
                 !m->layers[layer_at(m, "s1")].y);
    CHECK(t, m->layers[layer_at(m, "a1")].y && m->layers[layer_at(m, "s3")].y);
}

static int same(const float *a, const float *b, size_t n) {
    return !memcmp(a, b, n * sizeof(float));
}

static double rel_diff(const float *a, const float *b, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        s = fmax(s, fabs((double)b[i]));
    }
    return s > 0 ? d / s : d;
}

/* An evaluation step of both models: their outputs' largest difference, relative to u's
 * largest value (0: the same bits, or values equal as floats). */
static double eval_diff(mgt_model *f, mgt_model *u, mgt_backend *be) {
    step(f, be, 0, NULL);
    step(u, be, 0, NULL);
    const size_t nout = (size_t)cfg.batch_size * (size_t)f->classes;
    const float *a = f->layers[f->nlayers - 1].y, *b = u->layers[u->nlayers - 1].y;
    return same(a, b, nout) ? 0.0 : fmax(rel_diff(a, b, nout), 1e-30);
}

static void test_same_bits(tally *t) {
    mgt_backend be;
    mgt_model f, u, z;
    if (mgt_cpu_backend_init(&be, 1) < 0 || setup(&f, &be, 0, 1, 1) < 0 ||
        setup(&u, &be, 0, 0, 1) < 0 || setup(&z, &be, 0, 1, 0) < 0)
        exit(2);
    test_groups(t, &f);
    CHECK(t, u.ngroups == 0 && f.plan.unplanned < u.plan.unplanned && f.plan.arena <= u.plan.arena);
    for (int i = 0; i < f.nlayers; i++)
        CHECK(t, !f.layers[i].bias_cancelled); /* no biases here */
    heard h = {.m = &f, .order_ok = 1};
    const double lf = step(&f, &be, 1, &h), lu = step(&u, &be, 1, NULL),
                 lz = step(&z, &be, 1, NULL);
    const size_t nout = (size_t)cfg.batch_size * (size_t)f.classes;
    CHECK(t, lf == lu && lf == lz);
    CHECK(t, same(f.g, u.g, f.param_count) && same(f.g, z.g, f.param_count));
    CHECK(t, same(f.layers[f.nlayers - 1].y, u.layers[u.nlayers - 1].y, nout));
    CHECK(t, same(f.buf, u.buf, f.buffer_count) && same(f.buf, z.buf, f.buffer_count));
    /* the listener: every layer with parameters, once, last to first, final when heard */
    int want = 0;
    for (int i = f.nlayers - 1; i >= 0; i--)
        if (f.layers[i].param[0] >= 0) {
            CHECK(t, want < h.n && h.layer[want] == i);
            want++;
        }
    CHECK(t, h.n == want && h.order_ok);
    for (int k = 0; k < h.n; k++) {
        CHECK(t, h.copy[k] && same(h.copy[k], f.g + h.offset[k], h.count[k]));
        free(h.copy[k]);
    }
    /* evaluation: the running statistics, the same bits */
    CHECK(t, eval_diff(&f, &u, &be) == 0.0);
    mgt_model_free(&f);
    mgt_model_free(&u);
    mgt_model_free(&z);
    mgt_backend_destroy(&be);
}

/* A training step and an evaluation of f and u give the same loss, gradients, statistics and
 * outputs, bit for bit; then both models and the backend are freed. */
static void same_step_then_free(tally *t, mgt_model *f, mgt_model *u, mgt_backend *be) {
    const double lf = step(f, be, 1, NULL), lu = step(u, be, 1, NULL);
    CHECK(t, lf == lu && same(f->g, u->g, f->param_count) && same(f->buf, u->buf, f->buffer_count));
    CHECK(t, eval_diff(f, u, be) == 0.0);
    mgt_model_free(f);
    mgt_model_free(u);
    mgt_backend_destroy(be);
}

/* The CPU backend, the reference, keeps the biases: with them on, the groups still give the
 * unfused model's bits. */
static void test_cpu_keeps_bias(tally *t) {
    mgt_backend be;
    mgt_model f, u;
    if (mgt_cpu_backend_init(&be, 1) < 0 || setup(&f, &be, 1, 1, 1) < 0 ||
        setup(&u, &be, 1, 0, 1) < 0)
        exit(2);
    CHECK(t, !be.cancel_bias && f.ngroups == 4);
    for (int i = 0; i < f.nlayers; i++)
        CHECK(t, !f.layers[i].bias_cancelled && f.bias_of[i] < 0);
    same_step_then_free(t, &f, &u, &be);
}

/* A backend that cancels the biases (the GPU's choice, asked of the CPU backend here). */
static void test_cancelled_bias(tally *t) {
    mgt_backend be;
    mgt_model f, u;
    if (mgt_cpu_backend_init(&be, 1) < 0)
        exit(2);
    be.cancel_bias = 1;
    if (setup(&f, &be, 1, 1, 1) < 0 || setup(&u, &be, 1, 0, 1) < 0)
        exit(2);
    static const char *const cancelled[] = {"c0", "c1", "c2", "c3", "c4"};
    CHECK(t, f.ngroups == 5 && f.group_of[layer_at(&f, "b2")] >= 0); /* b2: a group of itself */
    for (int k = 0; k < 5; k++)
        CHECK(t, f.layers[layer_at(&f, cancelled[k])].bias_cancelled &&
                     !u.layers[layer_at(&u, cancelled[k])].bias_cancelled);
    CHECK(t, !f.layers[layer_at(&f, "c5")].bias_cancelled); /* its reader is an add */
    /* Bounds: a float32 step of this size (sums of at most 6 x 6 x 5 terms per channel) rounds
     * its values by some 1e-6 of their size; moving the normalisation's input by a constant
     * changes only that rounding, so 1e-4 of each tensor's largest value has room to spare,
     * while a bias left out without the shift, or a lost residual, is off by far more. */
    const double lf = step(&f, &be, 1, NULL), lu = step(&u, &be, 1, NULL);
    CHECK(t, fabs(lf - lu) <= 1e-4 * fabs(lu));
    for (int p = 0; p < f.nparams; p++) {
        const mgt_param *q = &f.params[p];
        const float *gf = f.g + q->offset, *gu = u.g + q->offset;
        int is_cancelled = 0;
        for (int k = 0; k < 5; k++) {
            char name[64];
            snprintf(name, sizeof name, "%s.bias", cancelled[k]);
            is_cancelled |= !strcmp(q->name, name);
        }
        if (is_cancelled) {
            float zeros[8] = {0};
            CHECK(t, q->count <= 8 && same(gf, zeros, q->count));
            /* the unfused gradient is rounding noise around that zero */
            double big = 0;
            for (int i = 0; i < f.nparams; i++)
                for (size_t j = 0; j < f.params[i].count; j++)
                    big = fmax(big, fabs(u.g[f.params[i].offset + j]));
            double noise = 0;
            for (size_t j = 0; j < q->count; j++)
                noise = fmax(noise, fabs(gu[j]));
            CHECK(t, noise <= 1e-4 * big);
        } else {
            const double d = rel_diff(gf, gu, q->count);
            if (d > 1e-4)
                fprintf(stderr, "  %s: %.3g of its largest gradient\n", q->name, d);
            CHECK(t, d <= 1e-4);
        }
    }
    /* running means hold the biases: the same statistics as the unfused model's */
    CHECK(t, rel_diff(f.buf, u.buf, f.buffer_count) <= 1e-5);
    CHECK(t, eval_diff(&f, &u, &be) <= 1e-4);
    mgt_model_free(&f);
    mgt_model_free(&u);
    mgt_backend_destroy(&be);
}

/* A ReLU of a layer's own taken over by the layer reading its output (fuse.c): convolutions
 * whose ReLU is read by a batchnorm alone (padded, strided: im2col and a pass after it) or by a
 * max pooling alone, a dense layer's read by a batchnorm; not where a second layer reads the
 * output. The ReLU is stored by the convolution's kernel where it can (conv2d_fwd's act), and
 * its gradient is applied by the reader. With the direct kernels and with Winograd, the model
 * gives the bits of the same model run op by op (no_fusion). */
static const char *relu_text =
    "[input]\nshape = 8,8,3\n"
    "[conv2d]\nname = c0\nfilters = 32\nkernel = 3\npadding = same\nactivation = relu\n"
    "[batchnorm]\nname = b0\n"
    "[conv2d]\nname = c1\nfilters = 32\nkernel = 3\nactivation = relu\n"
    "[maxpool]\nname = p1\nsize = 2\n"
    "[conv2d]\nname = c2\nfilters = 8\nkernel = 3\npadding = same\nactivation = relu\n"
    "[batchnorm]\nname = b2\n"
    "[add]\nname = s2\ninputs = b2, c2\n"
    "[conv2d]\nname = c3\nfilters = 8\nkernel = 3\nstride = 2\npadding = same\n"
    "activation = relu\n"
    "[batchnorm]\nname = b3\n"
    "[flatten]\n"
    "[dense]\nname = d\nunits = 16\nactivation = relu\n"
    "[batchnorm]\nname = bd\n"
    "[dense]\nname = out\nunits = 4\n"
    "[train]\noptimizer = sgd\nloss = sparse_categorical_crossentropy\nbatch_size = 5\n"
    "seed = 5\n";

static void test_relu_takeover(tally *t) {
    static const char *const algos[] = {"direct", "auto"};
    for (int a = 0; a < 2; a++) {
        mgt_backend be;
        mgt_model f, u;
        if (mgt_cpu_backend_init(&be, 1) < 0 ||
            setup_from(&f, &be, relu_text, 1, 1, 1, algos[a]) < 0 ||
            setup_from(&u, &be, relu_text, 1, 0, 1, algos[a]) < 0)
            exit(2);
        static const char *const taken[][2] = {
            {"c0", "b0"}, {"c1", "p1"}, {"c3", "b3"}, {"d", "bd"}};
        for (int k = 0; k < 4; k++) {
            const mgt_layer *l = &f.layers[layer_at(&f, taken[k][0])];
            const mgt_layer *r = &f.layers[layer_at(&f, taken[k][1])];
            CHECK(t, l->relu_grad_by_reader && r->x_relu_grad && !l->x_relu_grad);
        }
        CHECK(t, !f.layers[layer_at(&f, "c2")].relu_grad_by_reader &&
                     !f.layers[layer_at(&f, "b2")].x_relu_grad);
        for (int i = 0; i < u.nlayers; i++)
            CHECK(t, !u.layers[i].relu_grad_by_reader && !u.layers[i].x_relu_grad);
        same_step_then_free(t, &f, &u, &be);
    }
}

/* A dense layer's own ReLU written with its product (dense_fwd_relu), each lane's part of the
 * output starting as the bias and rectified once its product is done, and its gradient applied
 * by the dense layer reading it, as its lanes write dx (dense_bwd_x_relu), or else (d2, read by
 * an activation layer) in the pass that sums the bias gradient (dense_bias_grad): on two lanes, over parts cut by rows
 * (256 x 192) and by columns (256 x 320, three parts of unequal width), the bits of the model
 * run op by op (no_fusion) and of one lane. */
static const char *mlp_text =
    "[input]\nshape = 10,10,1\n"
    "[flatten]\n"
    "[dense]\nname = d1\nunits = 320\nactivation = relu\n"
    "[dense]\nname = d2\nunits = 192\nactivation = relu\n"
    "[activation]\nname = a\ntype = tanh\n"
    "[dense]\nname = out\nunits = 4\n"
    "[train]\noptimizer = sgd\nloss = sparse_categorical_crossentropy\nbatch_size = 256\n"
    "seed = 9\n";

/* Layer `name`'s output after a step of m (without memory sharing, so it is still there) against
 * relu(x W^T + b) in double, x the model's input: within 2 (K + 1) 2^-24 (|b| + sum |x w|) of it,
 * a bound on float32 sums of K + 1 terms in any order (the ReLU moves no value farther). */
static int dense_relu_ok(const mgt_model *m, const char *name, int n) {
    const mgt_layer *l = &m->layers[layer_at(m, name)];
    const int in = l->in.c, out = l->out.c;
    const float *w = m->w + m->params[l->param[0]].offset;
    const float *b = m->w + m->params[l->param[1]].offset;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < out; j++) {
            double ref = b[j], mag = fabs(b[j]);
            for (int k = 0; k < in; k++) {
                const double p = (double)m->x[(size_t)i * in + k] * w[(size_t)j * in + k];
                ref += p;
                mag += fabs(p);
            }
            if (ref < 0.0)
                ref = 0.0;
            if (fabs(l->y[(size_t)i * out + j] - ref) > 2.0 * (in + 1) * ldexp(mag, -24))
                return 0;
        }
    return 1;
}

static void test_dense_relu(tally *t) {
    mgt_backend be, one;
    mgt_model f, u, o;
    if (mgt_cpu_backend_init(&be, 2) < 0 || mgt_cpu_backend_init(&one, 1) < 0 ||
        setup_from(&f, &be, mlp_text, 1, 1, 1, NULL) < 0 ||
        setup_from(&u, &be, mlp_text, 1, 0, 1, NULL) < 0 ||
        setup_from(&o, &one, mlp_text, 1, 1, 1, NULL) < 0)
        exit(2);
    CHECK(t, be.ops->dense_fwd_relu != NULL);
    /* d1's ReLU gradient taken over by d2, which reads it, as it writes dx; d2's (read by an
     * activation layer) applied by d2 itself with its bias gradient's sums */
    CHECK(t, f.layers[layer_at(&f, "d1")].relu_grad_by_reader &&
                 f.layers[layer_at(&f, "d2")].x_relu_grad &&
                 !u.layers[layer_at(&u, "d1")].relu_grad_by_reader);
    CHECK(t, !f.layers[layer_at(&f, "d2")].relu_grad_by_reader &&
                 !f.layers[layer_at(&f, "a")].x_relu_grad);
    mgt_model z;
    if (setup_from(&z, &be, mlp_text, 1, 1, 0, NULL) < 0)
        exit(2);
    step(&z, &be, 1, NULL);
    CHECK(t, dense_relu_ok(&z, "d1", (int)cfg.batch_size));
    mgt_model_free(&z);
    const double lo = step(&o, &one, 1, NULL);
    const size_t nw = o.param_count;
    float *g = malloc(sizeof(float) * nw);
    if (!g)
        exit(2);
    memcpy(g, o.g, sizeof(float) * nw);
    const double lf = step(&f, &be, 1, NULL);
    CHECK(t, lf == lo && same(f.g, g, nw));
    free(g);
    mgt_model_free(&o);
    mgt_backend_destroy(&one);
    same_step_then_free(t, &f, &u, &be);
}

int main(void) {
    tally t = {0, 0};
    test_dense_relu(&t);
    test_same_bits(&t);
    test_relu_takeover(&t);
    test_cpu_keeps_bias(&t);
    test_cancelled_bias(&t);
    printf("test_fuse: %d passed, %d failed\n", t.pass, t.fail);
    return t.fail ? 1 : 0;
}
