/* test_graph.c: models beyond a layer list, on the CPU backend.
 *
 * A small graph with every graph feature: a tensor taken by three input slots (a batchnorm, and
 * twice by an [add]), a separable convolution, a depthwise one at stride 2, TensorFlow-"same"
 * average pooling, [concat], [zeropad], global average pooling, and an [activation] the planner
 * runs in place. Checked:
 *   - the gradient of the summed loss w.r.t. every parameter tensor against central finite
 *     differences of the model's own float32 loss (the sum of a consumer's share of a gradient
 *     into what another wrote is what this exercises);
 *   - the planned model against one whose every tensor has its own memory (share = 0): the same
 *     outputs, loss and gradients bit for bit, in training and in evaluation, with a smaller
 *     arena; the activation layer shares its input's memory, a layer whose backward reads its
 *     own output does not lend it;
 *   - grads_ready: every layer with parameters once, in reverse file order, its gradients final
 *     when heard;
 *   - the model file's graph errors: each names file:line and what to do. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "model.h"
#include "modelstep.h"
#include "tally.h"
#include "train_cfg.h"

static const char *graph_text =
    "[input]\nshape = 6,6,2\n"
    "[conv2d]\nname = c1\nfilters = 4\nkernel = 3\npadding = same\nactivation = tanh\n"
    "[batchnorm]\nname = bn1\n"
    "[activation]\nname = a1\ntype = tanh\n"
    "[separable_conv2d]\nname = s1\nfilters = 4\nkernel = 3\npadding = same\n"
    "[add]\nname = r1\ninputs = s1, c1, c1\n"
    "[depthwise_conv2d]\nname = d1\nkernel = 3\nstride = 2\npadding = same\nactivation = tanh\n"
    "[avgpool]\nname = p1\ninput = r1\nsize = 3\nstride = 2\npadding = same\n"
    "[concat]\nname = k1\ninputs = d1, p1\n"
    "[zeropad]\nname = z1\npad = 1,0,0,1\n"
    "[conv2d]\nname = c2\nfilters = 3\nkernel = 2\nstride = 2\nactivation = sigmoid\n"
    "[global_avgpool]\nname = g1\n"
    "[dense]\nname = out\nunits = 3\n"
    "[train]\noptimizer = sgd\nloss = sparse_categorical_crossentropy\nbatch_size = 4\n"
    "seed = 5\n";

/* The model file's [train] section: the batch and the seed. */
static mgt_train_cfg cfg;

/* One forward in training mode (and with `train`, backward) over the batch in m's buffers;
 * returns the loss sum. */
static double step(mgt_model *m, mgt_backend *be, int train, heard *h) {
    return model_step(m, be, (int)cfg.batch_size, cfg.seed, 1, train, h);
}

static int setup(mgt_model *m, mgt_backend *be, int share) {
    mgt_err e;
    if (mgt_model_file_parse(m, &cfg, "graph.cfg", graph_text, &e) < 0) {
        fprintf(stderr, "parse: %s\n", e.msg);
        return -1;
    }
    m->no_memory_sharing = !share;
    if (mgt_model_alloc(m, be, (int)cfg.batch_size, &e) < 0) {
        fprintf(stderr, "alloc: %s\n", e.msg);
        return -1;
    }
    mgt_model_init_host(m, cfg.seed, m->w, m->buf);
    const size_t in = (size_t)mgt_shape_elems(m->input) * (size_t)cfg.batch_size;
    for (size_t i = 0; i < in; i++)
        m->x[i] = 2.0f * mgt_uniform(11, i) - 1.0f;
    for (int i = 0; i < cfg.batch_size; i++)
        m->labels[i] = (i * 2) % m->classes;
    /* biases away from 0 so that their gradients are not trivially small */
    for (int i = 0; i < m->nparams; i++)
        if (m->params[i].init == MGT_INIT_ZERO)
            for (size_t j = 0; j < m->params[i].count; j++)
                m->w[m->params[i].offset + j] = 0.3f * (2.0f * mgt_uniform(12, j) - 1.0f);
    return 0;
}

/* Central differences of the float32 loss sum, per parameter tensor, on up to 12 components of
 * each. The step 1e-2 makes the truncation error (h^2/6 times the third derivative: the model is
 * smooth, tanh/sigmoid and no maximum) about 1e-5 and the float rounding of the loss (~1e-6
 * relative on a sum of ~4) about 1e-4 / h^-1 = 1e-4 absolute; 3e-2 of the tensor's largest
 * gradient (or 1e-3 where that is tiny) leaves a margin over both while a missing share of a
 * gradient is off by its whole size. */
static void fd_model(tally *t, mgt_model *m, mgt_backend *be) {
    step(m, be, 1, NULL);
    float *g = malloc(m->param_count * sizeof(float) + 1);
    if (!g)
        exit(2);
    memcpy(g, m->g, m->param_count * sizeof(float));
    const float h = 1e-2f;
    for (int p = 0; p < m->nparams; p++) {
        const mgt_param *q = &m->params[p];
        double scale = 1e-3, worst = 0;
        for (size_t j = 0; j < q->count; j++)
            scale = fabs(g[q->offset + j]) > scale ? fabs(g[q->offset + j]) : scale;
        for (size_t k = 0; k < 12 && k < q->count; k++) {
            const size_t j = q->offset + (k * 7919) % q->count;
            const float old = m->w[j];
            m->w[j] = old + h;
            const double up = step(m, be, 0, NULL);
            m->w[j] = old - h;
            const double down = step(m, be, 0, NULL);
            m->w[j] = old;
            const double num = (up - down) / (2.0 * h);
            const double err = fabs(num - g[j]) / scale;
            worst = err > worst ? err : worst;
        }
        if (worst > 3e-2)
            fprintf(stderr, "  %s: finite differences differ by %.3g of the largest gradient\n",
                    q->name, worst);
        CHECK(t, worst <= 3e-2);
    }
    free(g);
}

static void test_model(tally *t) {
    mgt_backend be, be0;
    mgt_model m, u;
    if (mgt_cpu_backend_init(&be, 1) < 0 || mgt_cpu_backend_init(&be0, 1) < 0 ||
        setup(&m, &be, 1) < 0 || setup(&u, &be0, 0) < 0)
        exit(2);
    /* the graph as written */
    const int c1 = layer_at(&m, "c1"), r1 = layer_at(&m, "r1"), p1 = layer_at(&m, "p1");
    CHECK(t, m.layers[r1].ninputs == 3 && m.layers[r1].inputs[1] == c1 &&
                 m.layers[r1].inputs[2] == c1);
    CHECK(t, m.layers[c1].consumers == 3 && m.layers[p1].inputs[0] == r1);
    CHECK(t, m.layers[layer_at(&m, "k1")].out.c == 8); /* 4 + 4 channels */
    CHECK(t, m.layers[p1].out.h == 3 && m.layers[layer_at(&m, "z1")].out.h == 4);

    /* the plan: in place where allowed, smaller than one buffer per tensor */
    const int a1 = layer_at(&m, "a1"), bn1 = layer_at(&m, "bn1");
    CHECK(t, m.plan.y_from[a1] == bn1 && m.layers[a1].y == m.layers[bn1].y);
    CHECK(t, m.plan.y_from[bn1] == bn1);
    /* c1's tanh reads its own output in backward: nothing may take over its memory */
    for (int i = 0; i < m.nlayers; i++)
        CHECK(t, i == c1 || m.plan.y_from[i] != c1);
    CHECK(t, m.plan.arena < u.plan.arena && u.plan.arena == m.plan.unplanned);
    CHECK(t, m.plan.live_peak <= m.plan.arena);
    for (int i = 0; i < u.nlayers; i++)
        CHECK(t, u.plan.y_from[i] == i);

    /* gradients against finite differences */
    fd_model(t, &m, &be);

    /* shared and unshared memory: the same numbers, bit for bit */
    memcpy(u.buf, m.buf, m.buffer_count * sizeof(float)); /* m's statistics moved under fd */
    heard h = {.m = &m};
    const double lm = step(&m, &be, 1, &h), lu = step(&u, &be0, 1, NULL);
    const size_t nout = (size_t)cfg.batch_size * (size_t)m.classes;
    CHECK(t, lm == lu);
    CHECK(t, !memcmp(m.g, u.g, m.param_count * sizeof(float)));
    CHECK(t, !memcmp(m.layers[m.nlayers - 1].y, u.layers[u.nlayers - 1].y, nout * sizeof(float)));
    CHECK(t, !memcmp(m.buf, u.buf, m.buffer_count * sizeof(float)));
    const mgt_step ev = {.in = {m.x, m.labels, m.targets},
                         .be = &be,
                         .n = 4,
                         .training = 0,
                         .global_n = 4,
                         .seed = 5};
    const mgt_step evu = {.in = {u.x, u.labels, u.targets},
                          .be = &be0,
                          .n = 4,
                          .training = 0,
                          .global_n = 4,
                          .seed = 5};
    const float *om = mgt_model_forward(&m, &ev), *ou = mgt_model_forward(&u, &evu);
    CHECK(t, !memcmp(om, ou, nout * sizeof(float)));

    /* grads_ready: the layers with parameters, last to first, final when heard */
    int want[MAX_HEARD], nwant = 0;
    for (int i = m.nlayers - 1; i >= 0; i--)
        if (m.layers[i].param[0] >= 0)
            want[nwant++] = i;
    CHECK(t, h.n == nwant);
    for (int k = 0; k < h.n && k < nwant; k++) {
        CHECK(t, h.layer[k] == want[k]);
        CHECK(t, h.copy[k] && !memcmp(h.copy[k], m.g + h.offset[k], h.count[k] * sizeof(float)));
        free(h.copy[k]);
    }
    mgt_model_free(&m);
    mgt_model_free(&u);
    mgt_backend_destroy(&be);
    mgt_backend_destroy(&be0);
}

/* ---- errors ---- */

/* The graph model with `from` replaced by `to` (first occurrence), parsed. */
static int parse_edit(const char *from, const char *to, mgt_err *e) {
    char text[4096];
    const char *at = strstr(graph_text, from);
    if (!at)
        return 0;
    snprintf(text, sizeof text, "%.*s%s%s", (int)(at - graph_text), graph_text, to,
             at + strlen(from));
    mgt_model m;
    const int rc = mgt_model_file_parse(&m, &cfg, "graph.cfg", text, e);
    if (rc == 0)
        mgt_model_free(&m);
    return rc;
}

static void test_errors(tally *t) {
    mgt_err e;
    /* line 21 holds "inputs = s1, c1, c1" (section [add] at 19), line 30 "input = r1", line 36
     * "inputs = d1, p1" ([concat] at 34); [depthwise_conv2d] d1 starts at 22, [conv2d] c2 at 40 */
    CHECK_ERR(t, parse_edit("inputs = s1, c1, c1", "inputs = s1, c2", &e), &e,
              "graph.cfg:21:", "[add] r1 takes 'c2', which comes later (line 40)",
              "move [add] r1 below it");
    CHECK_ERR(t, parse_edit("inputs = s1, c1, c1", "inputs = s1, r1", &e), &e,
              "graph.cfg:21:", "takes its own output");
    CHECK_ERR(t, parse_edit("inputs = s1, c1, c1", "inputs = s1, cc1", &e), &e,
              "graph.cfg:21:", "no layer above it has that name", "did you mean 'c1'");
    CHECK_ERR(t, parse_edit("inputs = s1, c1, c1", "inputs = s1", &e), &e,
              "graph.cfg:21:", "merges two or more inputs but is given 1");
    CHECK_ERR(t, parse_edit("inputs = s1, c1, c1", "# no inputs", &e), &e,
              "graph.cfg:19:", "needs its inputs: inputs = A, B");
    CHECK_ERR(t, parse_edit("inputs = s1, c1, c1", "inputs = s1,, c1", &e), &e,
              "graph.cfg:21:", "an empty name");
    CHECK_ERR(t, parse_edit("input = r1", "inputs = r1, d1", &e), &e,
              "graph.cfg:30:", "[avgpool] p1 takes one input but is given 2");
    CHECK_ERR(t, parse_edit("input = r1", "input = r1\ninputs = d1", &e), &e,
              "graph.cfg:31:", "both input and inputs");
    CHECK_ERR(t, parse_edit("name = a1", "name = input", &e), &e,
              "graph.cfg:12:", "'input' names the model's input");
    /* shapes that do not merge */
    CHECK_ERR(t, parse_edit("inputs = s1, c1, c1", "inputs = s1, input", &e), &e,
              "graph.cfg:19:", "inputs s1 (6, 6, 4) and input (6, 6, 2) differ in shape",
              "add needs equal shapes");
    CHECK_ERR(t, parse_edit("inputs = d1, p1", "inputs = d1, p1, r1", &e), &e,
              "graph.cfg:34:", "inputs d1 (3, 3, 4) and r1 (6, 6, 4) differ in height or width");
    /* a branch nothing takes: the concat leaves d1 out */
    CHECK_ERR(t, parse_edit("inputs = d1, p1", "inputs = p1, p1", &e), &e,
              "graph.cfg:22:", "the output of [depthwise_conv2d] d1 is used by no layer");
    /* --input-shape builds the layers again; one that no longer fits is named */
    char text[4096];
    const char *k2 = strstr(graph_text, "kernel = 2");
    snprintf(text, sizeof text, "%.*skernel = 4%s", (int)(k2 - graph_text), graph_text, k2 + 10);
    mgt_model m;
    CHECK(t, mgt_model_file_parse(&m, &cfg, "graph.cfg", text, &e) == 0);
    CHECK(t, mgt_model_set_input_shape(&m, "10,10,2", &e) == 0 &&
                 m.layers[layer_at(&m, "k1")].out.h == 5 && m.input.h == 10);
    CHECK_ERR(t, mgt_model_set_input_shape(&m, "10,10", &e), &e, "expected three positive");
    CHECK_ERR(t, mgt_model_set_input_shape(&m, "2,2,2", &e), &e,
              "graph.cfg:40:", "[conv2d] c2: kernel = 4,4 does not fit the 2x2 input");
    mgt_model_free(&m);
}

int main(void) {
    tally t = {0, 0};
    test_model(&t);
    test_errors(&t);
    printf("test_graph: %d passed, %d failed\n", t.pass, t.fail);
    return t.fail ? 1 : 0;
}
