/* test_gpu_train.c: whole training steps on the GPU against the CPU backend.
 *
 * Two small models (parsed from text with mgt_model_file_parse) cover every layer type and both
 * losses: convolutions with symmetric and asymmetric "same" padding, batchnorm, max and average
 * pooling, dropout (masks must match bit for bit for this to work at all), flatten, dense layers
 * with each activation, sparse and one-hot cross-entropy, Adam and SGD with Nesterov momentum.
 * The same initial weights and batches go through both backends, as the trainer drives them
 * (forward, loss and backward, optimizer step; one rank, so no all-reduce):
 *   - one step: loss sums, every parameter's gradient (relative error per tensor <= 1e-4) and
 *     the updated weights;
 *   - 20 steps: every weight within 1e-3 (absolute, or relative for weights above 1), and the
 *     batchnorm running statistics likewise.
 * Needs a GPU: without one it prints SKIPPED and exits 77. */
#include "gpu_test.h"
#include "model.h"
#include "optim.h"
#include "train_cfg.h"

static const char *model_a =
    "[input]\nshape = 12,12,3\n"
    "[conv2d]\nfilters = 8\nkernel = 3\npadding = same\nactivation = relu\n"
    "[batchnorm]\n"
    "[conv2d]\nfilters = 8\nkernel = 3\nstride = 2\npadding = same\nactivation = tanh\n"
    "[maxpool]\nsize = 2\n"
    "[dropout]\nrate = 0.25\n"
    "[flatten]\n"
    "[dense]\nunits = 32\nactivation = sigmoid\n"
    "[dense]\nunits = 10\n"
    "[train]\noptimizer = adam\nlearning_rate = 0.001\n"
    "loss = sparse_categorical_crossentropy\nbatch_size = 16\nepochs = 1\nseed = 7\n";

static const char *model_b =
    "[input]\nshape = 10,10,2\n"
    "[conv2d]\nfilters = 6\nkernel = 2\npadding = same\nactivation = relu\n"
    "[avgpool]\nsize = 2\n"
    "[batchnorm]\n"
    "[conv2d]\nfilters = 4\nkernel = 1\n"
    "[flatten]\n"
    "[dropout]\nrate = 0.1\n"
    "[dense]\nunits = 16\nactivation = relu\n"
    "[dense]\nunits = 5\nactivation = softmax\n"
    "[train]\noptimizer = sgd\nlearning_rate = 0.05\nmomentum = 0.9\nnesterov = true\n"
    "loss = categorical_crossentropy\nbatch_size = 12\nepochs = 1\nseed = 3\n";

typedef struct run {
    mgt_model m;
    mgt_train_cfg train; /* the model file's [train] */
    mgt_optim opt;
    mgt_backend *be;
    float *hx, *ht;
    int32_t *hl;
} run;

static void run_init(run *r, mgt_backend *be, const char *text) {
    mgt_err e;
    memset(r, 0, sizeof *r);
    r->be = be;
    if (mgt_model_file_parse(&r->m, &r->train, "gpu_test.cfg", text, &e) < 0 ||
        mgt_model_alloc(&r->m, be, (int)r->train.batch_size, &e) < 0) {
        fprintf(stderr, "model set-up failed: %s\n", e.msg);
        exit(2);
    }
    mgt_model *m = &r->m;
    if (r->train.lr < 0)
        r->train.lr = 0.001f;
    const mgt_optim_cfg optim = mgt_train_optim(&r->train);
    if (mgt_optim_init(&r->opt, &optim, be, r->m.param_count, &e) < 0) {
        fprintf(stderr, "model set-up failed: %s\n", e.msg);
        exit(2);
    }
    float *w = hf(m->param_count + 1), *buf = hf(m->buffer_count + 1);
    mgt_model_init_host(m, r->train.seed, w, buf);
    be->ops->to_device(be, m->w, w, m->param_count * sizeof(float));
    be->ops->to_device(be, m->buf, buf, m->buffer_count * sizeof(float));
    size_t in = (size_t)mgt_shape_elems(m->input), b = (size_t)r->train.batch_size;
    r->hx = hf(in * b);
    r->ht = hf((size_t)m->classes * b);
    r->hl = hbuf(sizeof(int32_t) * b);
}

/* One optimizer step on a batch drawn from (step) with the library's RNG. */
static void run_step(run *r, int64_t step) {
    mgt_model *m = &r->m;
    const mgt_ops *o = r->be->ops;
    const int n = (int)r->train.batch_size, k = m->classes;
    const size_t in = (size_t)mgt_shape_elems(m->input);
    const uint64_t key = mgt_key3(99, 1, (uint64_t)step);
    for (size_t i = 0; i < in * (size_t)n; i++)
        r->hx[i] = 2.0f * mgt_uniform(key, i) - 1.0f;
    memset(r->ht, 0, sizeof(float) * (size_t)k * n);
    for (int i = 0; i < n; i++) {
        r->hl[i] = (int32_t)(mgt_rand64(key, 1000000 + (uint64_t)i) % (uint64_t)k);
        r->ht[(size_t)i * k + (size_t)r->hl[i]] = 1.0f;
    }
    o->to_device(r->be, m->x, r->hx, sizeof(float) * in * (size_t)n);
    o->to_device(r->be, m->labels, r->hl, sizeof(int32_t) * (size_t)n);
    if (m->loss == MGT_LOSS_CE)
        o->to_device(r->be, m->targets, r->ht, sizeof(float) * (size_t)k * n);
    o->zero(r->be, m->sums, 2 * sizeof(float));
    mgt_step s = {.in = {m->x, m->labels, m->targets},
                  .be = r->be,
                  .n = n,
                  .training = 1,
                  .global_step = step,
                  .first_sample = 0,
                  .global_n = n,
                  .seed = r->train.seed,
                  .comm = NULL};
    mgt_model_forward(m, &s);
    mgt_model_loss_backward(m, &s, 1);
}

static float *fetch(run *r, const float *dev, size_t n) {
    float *h = hf(n + 1);
    r->be->ops->to_host(r->be, h, dev, n * sizeof(float));
    return h;
}

static void compare_steps(const char *name, const char *text) {
    pair p;
    pair_init(&p, 0);
    run c, g;
    run_init(&c, &p.cpu, text);
    run_init(&g, &p.gpu, text);
    mgt_model *m = &c.m;
    printf("  %s: %zu parameters\n", name, m->param_count);

    /* one step: loss, gradients, updated weights */
    run_step(&c, 0);
    run_step(&g, 0);
    float *cs = fetch(&c, c.m.sums, 2), *gs = fetch(&g, g.m.sums, 2);
    CHECK(fabs(gs[0] - cs[0]) <= 1e-4 * fabs(cs[0]), "%s: step loss sum GPU %.7g, CPU %.7g", name,
          gs[0], cs[0]);
    CHECK(gs[1] == cs[1], "%s: step correct count GPU %g, CPU %g", name, gs[1], cs[1]);
    float *cg = fetch(&c, c.m.g, m->param_count), *gg = fetch(&g, g.m.g, m->param_count);
    for (int i = 0; i < m->nparams; i++) {
        const mgt_param *pp = &m->params[i];
        double e = rel_err(gg + pp->offset, cg + pp->offset, pp->count, 1e-6);
        CHECK(e <= 1e-4, "%s: gradient of %s: relative error %.3g", name, pp->name, e);
    }
    mgt_optim_step(&c.opt, c.be, c.m.w, c.m.g, c.train.batch_size);
    mgt_optim_step(&g.opt, g.be, g.m.w, g.m.g, g.train.batch_size);
    float *cw = fetch(&c, c.m.w, m->param_count), *gw = fetch(&g, g.m.w, m->param_count);
    double e1 = rel_err(gw, cw, m->param_count, 1e-6);
    CHECK(e1 <= 1e-4, "%s: weights after one step: relative error %.3g", name, e1);

    /* 19 more */
    for (int64_t step = 1; step < 20; step++) {
        run_step(&c, step);
        mgt_optim_step(&c.opt, c.be, c.m.w, c.m.g, c.train.batch_size);
        run_step(&g, step);
        mgt_optim_step(&g.opt, g.be, g.m.w, g.m.g, g.train.batch_size);
    }
    cw = fetch(&c, c.m.w, m->param_count);
    gw = fetch(&g, g.m.w, m->param_count);
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < m->param_count; i++) {
        double d = fabs((double)gw[i] - cw[i]) / fmax(1.0, fabs(cw[i]));
        if (!(d <= worst)) { /* NaN counts as the worst */
            worst = isnan(d) ? INFINITY : d;
            at = i;
        }
    }
    CHECK(worst <= 1e-3, "%s: weights after 20 steps differ by %.3g at %zu (GPU %.7g, CPU %.7g)",
          name, worst, at, gw[at], cw[at]);
    float *cb = fetch(&c, c.m.buf, m->buffer_count), *gb = fetch(&g, g.m.buf, m->buffer_count);
    double eb = 0;
    for (size_t i = 0; i < m->buffer_count; i++) {
        double d = fabs((double)gb[i] - cb[i]) / fmax(1.0, fabs(cb[i]));
        eb = d > eb || isnan(d) ? (isnan(d) ? INFINITY : d) : eb;
    }
    CHECK(eb <= 1e-3, "%s: batchnorm running statistics after 20 steps differ by %.3g", name, eb);
    printf("  %s: one-step weight error %.3g, 20-step weight difference %.3g\n", name, e1, worst);

    mgt_optim_free(&c.opt, c.be);
    mgt_optim_free(&g.opt, g.be);
    mgt_model_free(&c.m);
    mgt_model_free(&g.m);
    pair_free(&p);
    hfree_all();
}

int main(void) {
    require_gpu();
    compare_steps("model A (conv/bn/maxpool/dropout/dense, adam, sparse CE)", model_a);
    compare_steps("model B (even kernel, avgpool, 1x1, softmax, nesterov, one-hot CE)", model_b);
    return finish("test_gpu_train");
}
