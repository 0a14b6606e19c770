/* test_reducer.c: the step's pipeline pieces that need no second rank (reducer.h, optim.h).
 *
 *   - bucket plans of a ConvNet and an MLP for caps from "one bucket" to "one part each", with
 *     and without the large dense layers' row blocks (model.h: grad_rows): the buckets tile
 *     [0, end) from the end down, each starts where a part starts, parts come in backward's
 *     order, a bucket of several parts keeps to its cap (the first to the smaller first cap),
 *     and a bucket was closed only when the next part did not fit;
 *   - ZeRO-1 slices: contiguous, in rank order, tiling the arena, 16-float aligned, balanced;
 *   - the optimizer's update by parts: every optimizer (SGD plain, momentum, Nesterov, RMSprop,
 *     Adam; with weight decay), over five steps, gives bit for bit the weights and state of the
 *     whole-arena update when applied range by range in any order, and when each of three
 *     sharded instances (ZeRO-1) updates its own slice with the state of that slice only;
 *   - accumulation: with three micro-batches, the gradient arena the last one leaves holds, bit
 *     for bit, C + (A + B) of the three micro-batches' own gradient sums (backward overwrites the
 *     arena; the reducer adds the earlier ones layer by layer as the last one's become final),
 *     and the metric sums add up over the micro-batches. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "comm.h"
#include "model.h"
#include "optim.h"
#include "reducer.h"
#include "tally.h"
#include "train_cfg.h"

static const char *convnet = "[input]\nshape = 12,12,2\n"
                             "[conv2d]\nfilters = 8\nkernel = 3\nactivation = relu\n"
                             "[conv2d]\nfilters = 16\nkernel = 3\nactivation = relu\n"
                             "[batchnorm]\n"
                             "[maxpool]\nsize = 2\n"
                             "[flatten]\n"
                             "[dropout]\nrate = 0.25\n"
                             "[dense]\nunits = 32\nactivation = relu\n"
                             "[dense]\nunits = 5\n"
                             "[train]\noptimizer = sgd\nloss = sparse_categorical_crossentropy\n"
                             "batch_size = 8\nseed = 5\n";

static const char *mlp = "[input]\nshape = 28,28,1\n"
                         "[flatten]\n"
                         "[dense]\nunits = 256\nactivation = relu\n"
                         "[dense]\nunits = 256\nactivation = relu\n"
                         "[dense]\nunits = 10\n"
                         "[train]\noptimizer = adam\nloss = sparse_categorical_crossentropy\n"
                         "batch_size = 8\n";

static int parse(mgt_model *m, const char *text) {
    mgt_err e;
    mgt_train_cfg train;
    memset(m, 0, sizeof *m);
    if (mgt_model_file_parse(m, &train, "test.cfg", text, &e) < 0) {
        fprintf(stderr, "model: %s\n", e.msg);
        return -1;
    }
    return 0;
}

/* The starts of the parts backward hands over (model.h: grads_ready, grad_rows), from the top
 * down: a layer whole, or the tensors above its first tensor, then that tensor's row blocks
 * from the last. Returns their number. */
static int part_starts(const mgt_model *m, const mgt_ops *ops, size_t *at, int max) {
    int n = 0;
    for (int i = m->nlayers - 1; i >= 0; i--) {
        const mgt_layer *l = &m->layers[i];
        size_t lo;
        const size_t count = mgt_layer_param_range(m, l, &lo);
        if (!count)
            continue;
        const int rows = ops && l->type->grad_rows ? l->type->grad_rows(l, ops) : 0;
        if (!rows) {
            if (n < max)
                at[n++] = lo;
            continue;
        }
        const mgt_param *p = &m->params[l->param[0]];
        const size_t row = p->count / (size_t)p->shape[0];
        if (p->offset + p->count < lo + count && n < max)
            at[n++] = p->offset + p->count;
        for (int64_t r = (p->shape[0] - 1) / rows * rows; r >= 0 && n < max; r -= rows)
            at[n++] = p->offset + (size_t)r * row;
    }
    return n;
}

static int check_plan(tally *t, const mgt_model *m, const mgt_ops *ops, double cap_mb) {
    mgt_bucket b[64];
    size_t at[64];
    const size_t end = m->param_count + 37; /* as if the metric sums followed */
    const int nb = mgt_bucket_plan(m, ops, MGT_FIRST_BUCKET_MB, cap_mb, end, b, 64);
    const int np = part_starts(m, ops, at, 64);
    CHECK(t, nb >= 1 && np >= 1 && np < 64);
    if (nb < 1 || np < 1)
        return 0;
    CHECK(t, b[0].lo + b[0].count == end);
    CHECK(t, b[nb - 1].lo == 0);
    for (int k = 0; k + 1 < nb; k++)
        CHECK(t, b[k + 1].lo + b[k + 1].count == b[k].lo && b[k].count > 0);
    if (cap_mb <= 0)
        CHECK(t, nb == 1);
    const double mib = 1048576.0;
    int j = 0; /* the parts, in step with the buckets */
    for (int k = 0; k < nb; k++) {
        /* Bucket k starts where a part starts (the lowest, at 0, takes what lies below). */
        int parts = 0;
        while (j < np && at[j] >= b[k].lo) {
            j++;
            parts++;
        }
        CHECK(t, parts >= 1);
        CHECK(t, k + 1 == nb || at[j - 1] == b[k].lo);
        const double cap = (k == 0 && MGT_FIRST_BUCKET_MB < cap_mb ? MGT_FIRST_BUCKET_MB : cap_mb);
        if (cap_mb > 0 && parts > 1 && k + 1 < nb) /* a part larger than the cap goes alone */
            CHECK(t, (double)b[k].count * sizeof(float) <= cap * mib);
        if (cap_mb > 0 && k + 1 < nb && j < np) /* closed because the next part did not fit */
            CHECK(t, (double)(b[k].lo + b[k].count - at[j]) * sizeof(float) > cap * mib);
    }
    CHECK(t, j == np); /* every part in a bucket */
    return nb;
}

static void check_slices(tally *t) {
    const size_t counts[] = {0, 1, 15, 16, 17, 1000, 269322, (size_t)1 << 20};
    const int worlds[] = {1, 2, 3, 4, 7, 8};
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
        for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
            const int W = worlds[w];
            size_t at = 0;
            int ok = 1;
            for (int r = 0; r < W; r++) {
                size_t lo, n;
                mgt_comm_slice(counts[c], r, W, &lo, &n);
                ok &= lo == at && lo % 16 == 0 && (double)n <= (double)counts[c] / W + 16.0 &&
                      (double)n + 16.0 >= (double)counts[c] / W;
                at = lo + n;
            }
            CHECK(t, ok && at == counts[c]);
        }
}

/* Random values in [-1, 1) from (key, i). */
static void fill(float *x, size_t n, uint64_t key, float scale) {
    for (size_t i = 0; i < n; i++)
        x[i] = (2.0f * mgt_uniform(key, i) - 1.0f) * scale;
}

static void check_update_parts(tally *t, mgt_backend *be, const char *what,
                               const mgt_optim_cfg *cfg) {
    enum { COUNT = 1003, W = 3, STEPS = 5 };
    float *wa = malloc(sizeof(float) * COUNT), *wb = malloc(sizeof(float) * COUNT),
          *wc = malloc(sizeof(float) * COUNT), *g = malloc(sizeof(float) * COUNT);
    mgt_optim oa, ob, oc[W];
    mgt_err e;
    int ok = wa && wb && wc && g && mgt_optim_init(&oa, cfg, be, COUNT, &e) == 0 &&
             mgt_optim_init(&ob, cfg, be, COUNT, &e) == 0;
    for (int r = 0; ok && r < W; r++)
        ok = mgt_optim_init_sharded(&oc[r], cfg, be, COUNT, r, W, &e) == 0;
    CHECK(t, ok);
    if (!ok)
        exit(1);
    fill(wa, COUNT, 1, 0.5f);
    memcpy(wb, wa, sizeof(float) * COUNT);
    memcpy(wc, wa, sizeof(float) * COUNT);
    const size_t parts[] = {COUNT, 700, 301, 300, 0}; /* descending, as buckets come */
    for (int s = 0; s < STEPS; s++) {
        fill(g, COUNT, 100 + (uint64_t)s, 40.0f); /* sums over a global batch of 64 */
        mgt_optim_step(&oa, be, wa, g, 64);
        mgt_optim_begin(&ob, 64);
        for (int k = 0; k + 1 < (int)(sizeof parts / sizeof parts[0]); k++)
            mgt_optim_update(&ob, be, wb, g, parts[k + 1], parts[k] - parts[k + 1]);
        for (int r = W - 1; r >= 0; r--) /* each rank its own slice */
            mgt_optim_step(&oc[r], be, wc, g, 64);
    }
    CHECK(t, !memcmp(wa, wb, sizeof(float) * COUNT));
    CHECK(t, !memcmp(wa, wc, sizeof(float) * COUNT));
    for (int i = 0; i < oa.nslots; i++) {
        CHECK(t, !memcmp(oa.slot[i], ob.slot[i], sizeof(float) * COUNT));
        for (int r = 0; r < W; r++)
            CHECK(t, oc[r].n == 0 ||
                         !memcmp(oa.slot[i] + oc[r].lo, oc[r].slot[i], sizeof(float) * oc[r].n));
    }
    CHECK(t, oa.t == STEPS && ob.t == STEPS && oc[0].t == STEPS);
    int moved = 0;
    for (size_t i = 0; i < COUNT; i++)
        moved |= wa[i] != wb[i] || wa[i] != 0;
    CHECK(t, moved);
    printf("update by parts and by ZeRO-1 slices = whole update, bit for bit: %s (%d state "
           "slots)\n",
           what, oa.nslots);
    mgt_optim_free(&oa, be);
    mgt_optim_free(&ob, be);
    for (int r = 0; r < W; r++)
        mgt_optim_free(&oc[r], be);
    free(wa);
    free(wb);
    free(wc);
    free(g);
}

/* One micro-batch's forward and backward on rows [first, first + n) of x/labels. */
static void micro(mgt_model *m, mgt_backend *be, mgt_reducer *r, int k, int of, const float *x,
                  const int32_t *labels, int first, int n) {
    const size_t in = (size_t)mgt_shape_elems(m->input);
    mgt_step s = {.in = {x + (size_t)first * in, labels + first, NULL},
                  .be = be,
                  .n = n,
                  .training = 1,
                  .global_step = 3,
                  .first_sample = first,
                  .global_n = n,
                  .seed = 9};
    if (r)
        mgt_reducer_listen(r, k, of, &s);
    mgt_model_forward(m, &s);
    mgt_model_loss_backward(m, &s, 1);
    if (r)
        mgt_reducer_backward_done(r);
}

static void check_accumulation(tally *t, mgt_backend *be) {
    enum { N = 8, K = 3 };
    mgt_model m;
    mgt_err e;
    if (parse(&m, convnet) < 0 || mgt_model_alloc(&m, be, N, &e) < 0) {
        CHECK(t, 0);
        return;
    }
    const size_t in = (size_t)mgt_shape_elems(m.input), P = m.param_count;
    float *buf = malloc(sizeof(float) * (m.buffer_count + 1)),
          *x = malloc(sizeof(float) * in * N * K);
    float *g[K], *want = malloc(sizeof(float) * P);
    int32_t labels[N * K];
    mgt_model_init_host(&m, 5, m.w, buf);
    fill(x, in * N * K, 77, 1.0f);
    for (int i = 0; i < N * K; i++)
        labels[i] = (int32_t)(mgt_rand64(78, (uint64_t)i) % 5);
    float sums[K][2];
    for (int k = 0; k < K; k++) { /* each micro-batch alone */
        g[k] = malloc(sizeof(float) * P);
        memset(m.sums, 0, 2 * sizeof(float));
        micro(&m, be, NULL, k, K, x, labels, k * N, N);
        memcpy(g[k], m.g, sizeof(float) * P);
        memcpy(sums[k], m.sums, sizeof sums[k]);
    }
    for (size_t i = 0; i < P; i++)
        want[i] = g[2][i] + (g[0][i] + g[1][i]);
    /* The same micro-batches through the reducer, in a world of one (nothing to reduce). */
    mgt_comm c;
    mgt_comm_init_mpi(&c, MPI_COMM_WORLD, 0);
    mgt_reducer r;
    const mgt_reducer_opts ro = {.bucket_mb = 0.0001, .zero = 0, .accum_steps = K};
    CHECK(t, mgt_reducer_init(&r, &m, be, &c, &ro, &e) == 0);
    CHECK(t, r.nb >= 3); /* a bucket per layer with parameters */
    for (size_t i = 0; i < P; i++)
        m.g[i] = NAN; /* nothing stale may survive */
    memset(m.sums, 0, 2 * sizeof(float));
    for (int k = 0; k < K; k++)
        micro(&m, be, &r, k, K, x, labels, k * N, N);
    int same = 1;
    for (int l = 0; l < m.nparams; l++)
        for (size_t i = m.params[l].offset; i < m.params[l].offset + m.params[l].count; i++)
            same &= !memcmp(&m.g[i], &want[i], sizeof(float));
    CHECK(t, same);
    const double loss = (double)sums[0][0] + sums[1][0] + sums[2][0];
    CHECK(t, fabs(m.sums[0] - loss) <= 1e-5 * fabs(loss)); /* float sums, in another grouping */
    CHECK(t, m.sums[1] == sums[0][1] + sums[1][1] + sums[2][1]); /* counts: exact */
    printf("accumulation over %d micro-batches: the last leaves C + (A + B) bit for bit: %s\n", K,
           same ? "yes" : "NO");
    mgt_reducer_free(&r);
    mgt_comm_destroy(&c);
    for (int k = 0; k < K; k++)
        free(g[k]);
    free(want);
    free(x);
    free(buf);
    mgt_model_free(&m);
}

int main(void) {
    tally t = {0, 0};
    mgt_model m;
    mgt_backend be;
    if (mgt_cpu_backend_init(&be, 1) < 0) {
        fprintf(stderr, "no CPU backend\n");
        return 1;
    }
    const char *texts[] = {convnet, mlp};
    const double caps[] = {0, 0.0001, 0.002, 0.3, 1, 25};
    for (int i = 0; i < 2; i++) {
        if (parse(&m, texts[i]) < 0) {
            CHECK(&t, 0);
            continue;
        }
        for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++) {
            check_plan(&t, &m, NULL, caps[c]);
            check_plan(&t, &m, be.ops, caps[c]);
        }
        if (texts[i] == mlp) {
            /* The MLP 784-256-256-10 on the CPU: the first layer's weight gradient (200,704
             * floats) in 4 blocks of 64 rows, the second's (65,536) in 2 of 128, the last whole;
             * so with a tiny cap a bucket per part (1 + 3 + 5), without parts one per layer. */
            const mgt_layer *d = m.layers;
            CHECK(&t, d[1].type->grad_rows(&d[1], be.ops) == 64 &&
                          d[2].type->grad_rows(&d[2], be.ops) == 128 &&
                          d[3].type->grad_rows(&d[3], be.ops) == 0);
            CHECK(&t, check_plan(&t, &m, be.ops, 0.0001) == 9);
            CHECK(&t, check_plan(&t, &m, NULL, 0.0001) == 3);
        }
        mgt_model_free(&m);
    }
    check_slices(&t);

    mgt_optim_cfg cfg = {0};
    mgt_opt_defaults(&cfg.opt);
    cfg.opt.weight_decay = 1e-4f;
    struct {
        const char *what;
        mgt_opt_kind kind;
        float momentum;
        int nesterov;
    } opts[] = {{"sgd", MGT_OPT_SGD, 0, 0},
                {"sgd, momentum 0.9", MGT_OPT_SGD, 0.9f, 0},
                {"sgd, Nesterov", MGT_OPT_SGD, 0.9f, 1},
                {"rmsprop", MGT_OPT_RMSPROP, 0, 0},
                {"adam", MGT_OPT_ADAM, 0, 0}};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        cfg.optimizer = opts[i].kind;
        cfg.lr = 0.01f;
        cfg.opt.momentum = opts[i].momentum;
        cfg.opt.nesterov = opts[i].nesterov;
        check_update_parts(&t, &be, opts[i].what, &cfg);
    }
    check_accumulation(&t, &be);
    mgt_backend_destroy(&be);
    printf("test_reducer: %d passed, %d failed\n", t.pass, t.fail);
    return t.fail ? 1 : 0;
}
